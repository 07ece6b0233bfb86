"""Agents that delegate: an agent is a tool, and a runtime owns the tree of them.

An `Agent` is a system prompt, a filtered view of the runtime's toolkit and the model loop
(`loop.Client`, the same loop a single run uses). An agent that declares a `team` gets a
`task` tool (`{agent, prompt}`) that runs a member of that team as a child and returns the
child's final text as the tool's result.

A `Runtime` owns the handles (one per agent started: `root/coordinator.1/refund.2`, ids
counted per parent, never random), one `ConversationStore` for all their transcripts, the
budgets, and the suspension rules:

- A suspending child looks to its parent exactly like a suspending tool. The nearest
  `wait_for` up the chain (the asking agent's, its parent's, ..., the runtime's) answers it
  inline; with none, every level halts and the runtime returns `status="pending"` with the
  asking agent's own `Request`, stamped with `data.path` (the asker's handle id, split on
  "/"). Levels that wait spend no tokens.
- `resume(answer)` goes to the deepest suspended handle (the asker), which resumes from its
  checkpoint with the answer, exactly as `Client.run_with_answer` does. Each parent then
  runs again: its halted `task` call runs again and re-attaches to the existing child by
  (agent, prompt), never starting a duplicate.
- On a durable halt each handle's stored transcript is rewound to its state before the
  model turn that suspended; that turn (the assistant message and the results recorded at
  the halt) is kept in the handle's checkpoint, which resume completes.

Everything the runtime knows is plain JSON (`to_dict()`; `Runtime(..., state=...)`), so a
halt can be stored in a database row and resumed by another process.
"""

from .runtime import Runtime, current_handle
from .state import (
    STATUSES,
    Agent,
    AgentResult,
    Budget,
    ConversationStore,
    Handle,
)

__all__ = [
    "STATUSES",
    "Agent",
    "AgentResult",
    "Budget",
    "ConversationStore",
    "Handle",
    "Runtime",
    "current_handle",
]

"""toolnexus: tools that suspend a run until a human (or the host) answers.

The engine is framework-free and async-first; see the project README and contract.
"""

from .client import (
    Client,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    create_client,
    create_in_process_client,
)
from .toolkit import Toolkit, create_toolkit, define_tool
from .types import (
    Answer,
    ModelError,
    Request,
    ResumeError,
    RunCancelled,
    RunResult,
    RunTimeout,
    Tool,
    ToolContext,
    ToolResult,
    pending,
    pending_of,
)

__all__ = [
    "Answer",
    "Client",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "ModelError",
    "Request",
    "ResumeError",
    "RunCancelled",
    "RunResult",
    "RunTimeout",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Toolkit",
    "create_client",
    "create_in_process_client",
    "create_toolkit",
    "define_tool",
    "pending",
    "pending_of",
]

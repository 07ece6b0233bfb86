"""An agents module named by settings.TOOLNEXUS_AGENT_MODULES in tests: registers on import."""

from approvals import agents
from approvals.agents.demo import demo_generate
from toolnexus import create_in_process_client
from toolnexus.relay import relay_tool

agents.register(
    "extra",
    model=lambda: create_in_process_client(generate=demo_generate),
    tools=[relay_tool("refund", "refund", {"type": "object"})],
    description="registered by TOOLNEXUS_AGENT_MODULES",
    replace=True,
)

"""The agent registry: hosts register named agents in code (see the project's api.md).

from approvals import agents
agents.register("support", model=lambda: create_client(...), tools=lambda: [...],
                executors={"refund": do_refund}, system_prompt="...", description="...")
"""

from .registry import Agent, UnknownAgent, all, get, register, require, unregister

__all__ = ["Agent", "UnknownAgent", "all", "get", "register", "require", "unregister"]

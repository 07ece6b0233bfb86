"""toolnexus: tools that suspend a run until a human (or the host) answers.

The engine is framework-free and async-first; see the project README and contract.
"""

from .agents import Agent, AgentResult, Budget, ConversationStore, Handle, Runtime
from .client import create_client, create_in_process_client
from .in_process import InProcessRequest, InProcessResponse, InProcessToolCall
from .loop import HALT, Client
from .mcp_spec import McpServer, McpServerError
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
    "HALT",
    "Agent",
    "AgentResult",
    "Answer",
    "Budget",
    "Client",
    "ConversationStore",
    "Handle",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "McpServer",
    "McpServerError",
    "ModelError",
    "Request",
    "ResumeError",
    "RunCancelled",
    "RunResult",
    "RunTimeout",
    "Runtime",
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

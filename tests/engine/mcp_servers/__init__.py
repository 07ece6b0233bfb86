"""MCP servers the engine tests run as real subprocesses (stdio, or HTTP on 127.0.0.1)."""

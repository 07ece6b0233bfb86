"""Admin: everything visible, JSON shown pretty and read-only, changes only through services.

Runs, requests, events and executions of agents a staff user's groups may not see
(per-agent access, `permissions.hidden_agents`) are left out of every list and page; the
agent access rules themselves are edited here ("Agent access")."""

from . import access, reach, runs  # noqa: F401  (each registers its pages)
from .base import ReadOnlyAdmin, json_block

__all__ = ["ReadOnlyAdmin", "json_block"]

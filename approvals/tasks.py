"""Tasks queued before the app's layers moved name this module (`approvals.tasks.execute_run`
in their stored task path): it keeps them runnable. New tasks name the runner's own."""

from .execution.runner import execute_run

__all__ = ["execute_run"]

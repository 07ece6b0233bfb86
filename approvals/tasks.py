"""Background tasks (django-tasks, database backend: durable on SQLite and PostgreSQL)."""

from __future__ import annotations

from django_tasks import task


@task()
def execute_run(run_id: int) -> str:
    """Drive a run to its next stop; safe to run again for the same run (see runner)."""
    from .runner import execute_run as drive

    return drive(run_id)

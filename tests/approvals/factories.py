"""Small factories and helpers for app tests."""

from __future__ import annotations

import itertools

from django.contrib.auth import get_user_model

from approvals import services
from approvals.accounts import ensure_groups
from approvals.models import Run
from approvals.worker import Worker

_n = itertools.count(1)


def make_user(*, role: str = "reviewer", username: str | None = None, password: str = "pw"):
    """role: "reviewer" (can decide), "watcher" (view only), "nobody" (no permissions)."""
    groups = ensure_groups()
    user = get_user_model().objects.create_user(
        username=username or f"{role}{next(_n)}", password=password
    )
    if role == "reviewer":
        user.groups.add(groups["Reviewers"])
    elif role == "watcher":
        user.groups.add(groups["Watchers"])
    return get_user_model().objects.get(pk=user.pk)  # fresh: no cached permissions


def drain() -> int:
    """Run every queued task in this thread, as a worker would."""
    return Worker(maintenance_every=0).drain()


def start_and_halt(
    *, prompt: str = "Refund order A-1001, $120", agent: str = "demo", user=None
) -> Run:
    user = user or make_user()
    run = services.run_start(agent=agent, prompt=prompt, started_by=user)
    drain()
    run.refresh_from_db()
    return run

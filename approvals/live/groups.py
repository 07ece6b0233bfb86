"""The channel groups live pages listen on."""

from __future__ import annotations

INBOX_GROUP = "approvals.inbox"
# Every live page: told to catch up from the database after the layer dropped messages
# (`publisher`).
LIVE_GROUP = "approvals.live"


def run_group(run_id: int) -> str:
    return f"approvals.run.{run_id}"


def user_group(user_id: int) -> str:
    """Every live page of one user: told when a session of theirs ends or their access
    changed (`publisher.notify_user`)."""
    return f"approvals.user.{user_id}"

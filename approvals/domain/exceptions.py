"""Domain exceptions raised by services; views and the API map them to HTTP statuses."""

from __future__ import annotations

from datetime import datetime


class ServiceError(Exception):
    """Base class: the message is safe to show to the caller."""

    status = 400


class InvalidInput(ServiceError, ValueError):
    """The caller sent something that cannot be used (400)."""


class NotAllowed(ServiceError):
    """The caller lacks the permission for this action (403)."""

    status = 403


class InvalidTransition(ServiceError):
    """The object is not in a state that allows this action (409)."""

    status = 409


class AlreadyDecided(InvalidTransition):
    """Somebody decided this request first (409); says who and when."""

    def __init__(
        self, *, request_id: str, state: str, decided_by: str | None, decided_at: datetime | None
    ):
        self.request_id = request_id
        self.state = state
        self.decided_by = decided_by
        self.decided_at = decided_at
        who = decided_by or "the system"
        when = decided_at.isoformat(timespec="seconds") if decided_at else "earlier"
        super().__init__(f"request {request_id} was already {state} by {who} at {when}")


class LeaseLost(ServiceError):
    """A worker's hold on a run lapsed and another worker took the run over."""

    status = 409


class ClaimedByOther(InvalidTransition):
    """Another reviewer holds an active claim on this request (409); says who and since when.
    Taking it over (`takeover=True`) is the caller's explicit choice."""

    def __init__(self, *, request_id: str, claimed_by: str, claimed_at: datetime | None):
        self.request_id = request_id
        self.claimed_by = claimed_by
        self.claimed_at = claimed_at
        since = claimed_at.isoformat(timespec="seconds") if claimed_at else "earlier"
        super().__init__(
            f"request {request_id} is claimed by {claimed_by} since {since}; take it over to"
            " work on it yourself"
        )

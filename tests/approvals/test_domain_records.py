"""approvals.domain.records: the state machine's allowed transitions."""

from __future__ import annotations

import pytest

from approvals.domain import records
from approvals.domain.exceptions import InvalidTransition
from approvals.models import ApprovalRequest

pytestmark = pytest.mark.django_db(transaction=True)


def test_request_row_allows_only_terminal_transitions():
    assert records.ALLOWED_TRANSITIONS["request"]["declined"] == set()
    with pytest.raises(InvalidTransition):
        records.check_transition("request", "declined", "approved")
    with pytest.raises(InvalidTransition):
        records.check_transition("run", "done", "queued")
    assert ApprovalRequest.State.PENDING in records.ALLOWED_TRANSITIONS["request"]

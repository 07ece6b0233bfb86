"""Workers in other processes start a resume at once, not at their next poll.

On PostgreSQL the decision's transaction NOTIFYs the workers' listeners; polling is only the
fallback. The worker here polls once a minute, so a run that finishes within seconds of its
decision (twice, in a row: the listener keeps listening) proves the wake-up crossed processes;
and after the listener's connection is killed it reconnects and wakes the worker again.
"""

from __future__ import annotations

import time

import pytest

from .agents import prompt_for
from .conftest import pending_request_id, start_run

pytestmark = pytest.mark.faults

SLOW_POLL = "60"


def _decide_and_time(stack, server, api) -> float:
    run_id = start_run(api, prompt_for(tag=f"wake{time.monotonic_ns()}", flow="single"))
    request_id = pending_request_id(stack, run_id)  # the run itself was started by a wake-up
    started = time.monotonic()
    response = api.post(f"/api/requests/{request_id}/decline", json={"reason": "no"})
    assert response.status_code == 200, response.text
    stack.wait_status(run_id, {"done"}, timeout=15)
    return time.monotonic() - started


def test_a_decision_wakes_a_worker_of_another_process(stack):
    server = stack.server()
    stack.worker(interval=SLOW_POLL, TOOLNEXUS_MAINTENANCE_SECONDS="3600")
    with stack.client(server) as api:
        for _ in range(2):
            assert _decide_and_time(stack, server, api) < 10

        # the listener's connection dies: it reconnects and keeps waking the worker
        stack.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
        )
        time.sleep(2)
        assert _decide_and_time(stack, server, api) < 10

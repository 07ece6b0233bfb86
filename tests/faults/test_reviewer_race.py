"""50 reviewers race to decide the same 100 requests through four ASGI servers.

Each reviewer (its own API token) tries every request in its own shuffled order, all at once
(asyncio + httpx); even-numbered reviewers approve, odd-numbered ones decline. Exactly one
decision per request wins (200), every loser gets 409 naming the winner, and each run is
resumed exactly once: one decision event, one `run_resumed` event, one resume task, one
executor side effect per approved run, and every run done.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import defaultdict

import pytest

from approvals.models import ApprovalRequest, Event, Run

from .agents import prompt_for
from .conftest import REVIEWERS, WAIT, pending_request_id, start_run, tasks_for, wait_for

pytestmark = pytest.mark.faults

REQUESTS = 100
SERVERS = 4


async def _race(stack, servers, request_ids):
    """Every reviewer decides every request; [(request id, reviewer, status, detail)]."""
    results = []

    async def reviewer(index: int) -> None:
        user = f"rev{index:02d}"
        order = list(request_ids)
        random.Random(index).shuffle(order)
        async with stack.async_client(servers[index % len(servers)], user=user) as api:
            for request_id in order:
                if index % 2:
                    response = await api.post(
                        f"/api/requests/{request_id}/decline", json={"reason": f"by {user}"}
                    )
                else:
                    response = await api.post(f"/api/requests/{request_id}/approve", json={})
                detail = response.json().get("detail", "") if response.status_code != 200 else ""
                results.append((request_id, user, response.status_code, detail))

    # 5,000 decisions through four servers on the machine's cores: a bound on a stall, not
    # a speed goal (a slower machine took over 100 s where this test asserts correctness)
    await asyncio.wait_for(
        asyncio.gather(*(reviewer(i) for i in range(REVIEWERS))), timeout=2 * WAIT + 260
    )
    return results


def test_fifty_reviewers_racing_on_a_hundred_requests_decide_each_once(stack):
    # pooled connections, as a production deployment would run many servers
    servers = stack.servers(SERVERS, DATABASE_POOL="1", DATABASE_POOL_SIZE="4")
    stack.worker()
    tag = f"tpl{secrets.token_hex(4)}"
    with stack.client(servers[0]) as api:
        template_run = start_run(api, prompt_for(tag=tag, flow="single"))
    template_request = pending_request_id(stack, template_run)
    clones = stack.clone_pending(template_run, REQUESTS - 1, f"r{secrets.token_hex(3)}")
    run_of = {request_id: run_id for run_id, request_id, _ in clones}
    run_of[template_request] = template_run
    tag_of = {request_id: t for _, request_id, t in clones}
    tag_of[template_request] = tag

    results = asyncio.run(_race(stack, servers, sorted(run_of)))

    assert len(results) == REVIEWERS * REQUESTS
    by_request = defaultdict(list)
    for request_id, user, status, detail in results:
        by_request[request_id].append((user, status, detail))
    unexpected = [r for r in results if r[2] not in (200, 409)]
    assert unexpected == [], unexpected[:5]

    alias = stack.db()
    rows = {
        r.request_id: r for r in ApprovalRequest.objects.using(alias).select_related("decided_by")
    }
    for request_id, attempts in by_request.items():
        winners = [user for user, status, _ in attempts if status == 200]
        assert len(winners) == 1, (request_id, winners)
        winner = winners[0]
        row = rows[request_id]
        assert row.decided_by.username == winner
        assert row.state == ("declined" if int(winner[3:]) % 2 else "approved")
        losers = [detail for user, status, detail in attempts if status == 409]
        assert len(losers) == REVIEWERS - 1
        wrong = [d for d in losers if f"already {row.state} by {winner} at " not in d]
        assert wrong == [], (request_id, winner, wrong[:3])

    # one resume per run, whatever the race
    run_ids = sorted(run_of.values())
    decisions = defaultdict(int)
    resumed = defaultdict(int)
    for run_id, action in (
        Event.objects.using(alias).filter(run_id__in=run_ids).values_list("run_id", "action")
    ):
        if action in ("request_approved", "request_declined"):
            decisions[run_id] += 1
        elif action == "run_resumed":
            resumed[run_id] += 1
    assert set(decisions.values()) == {1} and len(decisions) == REQUESTS
    assert set(resumed.values()) == {1} and len(resumed) == REQUESTS
    tasks = tasks_for(stack, run_ids)
    assert tasks[template_run] == 2  # its start and its resume
    assert {tasks[r] for r in run_ids if r != template_run} == {1}

    # the worker resumes every run once; approved ones ran the executor once
    def all_done():
        statuses = (
            Run.objects.using(stack.db()).filter(pk__in=run_ids).values_list("status", flat=True)
        )
        return all(s == "done" for s in statuses)

    wait_for(all_done, "every raced run to finish", timeout=60)
    effects = stack.effects()
    for request_id, row in rows.items():
        if request_id in run_of:
            expected = 1 if row.state == "approved" else 0
            assert effects[(tag_of[request_id], "pay")] == expected, (request_id, row.state)

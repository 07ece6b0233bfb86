"""kill -9 every server with 1,000 requests pending; new servers list and decide all of them.

PostgreSQL holds everything durable, so a server process holds nothing a restart could lose:
after both servers die and two new ones start on the same ports, the API lists exactly the
1,000 pending requests across its pages, and a sample decided through the new servers resumes
to done in the worker.
"""

from __future__ import annotations

import random
import secrets

import pytest

from approvals.models import ApprovalRequest, Event

from .agents import prompt_for
from .conftest import pending_request_id, start_run, tasks_for

pytestmark = pytest.mark.faults

PENDING = 1000
PAGE = 200


def _list_pending(stack, server) -> tuple[list[str], set[int]]:
    """Every pending request id, page by page, and the counts the pages reported."""
    ids: list[str] = []
    counts: set[int] = set()
    with stack.client(server) as api:
        offset = 0
        while True:
            page = api.get(
                "/api/requests", params={"state": "pending", "limit": PAGE, "offset": offset}
            )
            assert page.status_code == 200, page.text
            body = page.json()
            counts.add(body["count"])
            ids += [item["request"]["id"] for item in body["items"]]
            assert all(item["state"] == "pending" for item in body["items"])
            if len(body["items"]) < PAGE:
                return ids, counts
            offset += PAGE
            assert offset <= 2 * PENDING, "the pages never end"


def test_killing_every_server_loses_no_pending_request(stack):
    servers = stack.servers(2)
    worker = stack.worker()
    tag = f"tpl{secrets.token_hex(4)}"
    with stack.client(servers[0]) as api:
        template_run = start_run(api, prompt_for(tag=tag, flow="single"))
    template_request = pending_request_id(stack, template_run)
    clones = stack.clone_pending(template_run, PENDING - 1, f"s{secrets.token_hex(3)}")
    by_request = {request_id: (run_id, t) for run_id, request_id, t in clones}
    by_request[template_request] = (template_run, tag)

    before, counts = _list_pending(stack, servers[1])
    assert counts == {PENDING} and len(before) == PENDING

    # every server dies at once, mid-life; new ones come up on the same ports
    ports = [s.port for s in servers]
    for server in servers:
        assert server.kill9() == -9
    servers = [stack.start_server(port=port) for port in ports]
    servers = [stack.ready(server) for server in servers]

    for server in servers:
        listed, counts = _list_pending(stack, server)
        assert counts == {PENDING}, counts
        assert len(listed) == len(set(listed)) == PENDING, "a request listed twice or missed"
        assert set(listed) == set(by_request)

    # a sample decided through the new servers: 200, and each run resumes to done
    rng = random.Random(7)
    sample = rng.sample(sorted(by_request), 10)
    decided = {}
    for i, request_id in enumerate(sample):
        with stack.client(servers[i % 2], user=f"rev{i:02d}") as api:
            if i % 2:
                response = api.post(f"/api/requests/{request_id}/decline", json={"reason": "no"})
            else:
                response = api.post(f"/api/requests/{request_id}/approve", json={})
        assert response.status_code == 200, response.text
        assert response.json()["decision"]["decided_by"] == f"rev{i:02d}"
        decided[request_id] = "declined" if i % 2 else "approved"

    assert worker.alive()
    runs = {
        request_id: stack.wait_status(by_request[request_id][0], {"done"}) for request_id in decided
    }
    effects = stack.effects()
    alias = stack.db()
    for request_id, state in decided.items():
        run_id, run_tag = by_request[request_id]
        row = ApprovalRequest.objects.using(alias).get(request_id=request_id)
        assert row.state == state and row.applied_at is not None
        assert effects[(run_tag, "pay")] == (1 if state == "approved" else 0)
        expected = (
            f"pay=paid 5 for {run_tag}" if state == "approved" else "relay declined for pay: no"
        )
        assert expected in runs[request_id].text, runs[request_id].text
        actions = list(
            Event.objects.using(alias).filter(run_id=run_id).values_list("action", flat=True)
        )
        assert actions.count("run_resumed") == 1 and actions.count("run_done") == 1, actions
    resumes = tasks_for(stack, [by_request[r][0] for r in decided if r != template_request])
    assert set(resumes.values()) == {1}, resumes  # clones: exactly the one resume task each

    remaining, counts = _list_pending(stack, servers[0])
    assert counts == {PENDING - len(decided)}
    assert set(remaining) == set(by_request) - set(decided)

"""A team run in the inbox: the row and the request page show the chain of agents the request
climbed (from its data.path), the run page the tree of agents (each one's status, turns,
tokens and transcript); a hidden agent's team run leaks through no page, API or socket."""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Group
from django.test import Client

from approvals import testing
from approvals.domain.teams import chain_of
from approvals.models import AgentAccess, AgentPolicy

from .factories import TIMEOUT, bearer, open_socket, session_client

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "SECRET-TEAM-77"


def _halted(prompt: str = "Plan a refund for order B-7, $40", user=None):
    run = testing.start_and_halt(agent="demo-team", prompt=prompt, user=user)
    assert run.status == "pending", run.error
    return run, run.requests.get()


def _chain(html: str) -> list[str]:
    found = re.search(r'<span class="chain">(.*?)</span>\s*(?:<span class="what|·)', html, re.S)
    assert found, "no chain shown"
    return re.findall(r'<span class="chain-agent">([^<]*)</span>', found.group(1))


def _tree(html: str) -> dict[str, str]:
    """Each agent node of the run page: its handle and its summary line's text."""
    nodes = re.findall(
        r'<li class="agent-node[^"]*" id="[^"]+" data-handle="([^"]+)">\s*<details[^>]*>\s*'
        r"<summary>(.*?)</summary>",
        html,
        re.S,
    )
    return {handle: " ".join(re.sub(r"<[^>]+>", " ", s).split()) for handle, s in nodes}


def test_chain_of_reads_data_path():
    assert chain_of({"path": ["root", "coordinator.1", "refunds.12"]}) == [
        "coordinator",
        "refunds",
    ]
    assert chain_of({"path": "root/x.1"}) == [] and chain_of(None) == []
    assert chain_of({"calls": []}) == []


def test_the_row_and_the_request_page_show_the_chain():
    reviewer = testing.make_user()
    _, row = _halted()
    client = session_client(reviewer)
    inbox = client.get("/").content.decode()
    row_html = inbox[inbox.index(f'id="row-{row.pk}"') :]
    assert _chain(row_html) == ["coordinator", "refunds"]
    page = client.get(f"/requests/{row.request_id}/").content.decode()
    assert _chain(page[page.index('class="meta"') :]) == ["coordinator", "refunds"]
    # a single agent's request shows no chain
    single = testing.start_and_halt(agent="demo", prompt="Refund order A-1, $5").requests.get()
    single_page = client.get(f"/requests/{single.request_id}/").content.decode()
    assert 'class="chain"' not in single_page


def test_the_run_page_shows_the_tree_of_agents_and_each_transcript():
    reviewer = testing.make_user()
    run, row = _halted()
    client = session_client(reviewer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    tree = _tree(page)
    assert list(tree) == ["root/coordinator.1", "root/coordinator.1/refunds.1"]
    assert tree["root/coordinator.1"].startswith("coordinator root/coordinator.1 waiting")
    assert "1 turn · 64 tokens" in tree["root/coordinator.1"]
    assert "asks for the open request" in tree["root/coordinator.1/refunds.1"]
    # nested: the refunds node sits inside the coordinator's
    coordinator = page.index('data-handle="root/coordinator.1"')
    refunds = page.index('data-handle="root/coordinator.1/refunds.1"')
    assert page.rindex('<ul class="agents">', 0, refunds) > coordinator
    # the coordinator's task call says whom it waits for; the refund call waits for a decision
    assert "Waiting for refunds: its result comes back here." in page
    refunds_part = page[refunds:]
    assert "<code>refund</code>" in refunds_part and "Waiting for a decision" in refunds_part

    run = testing.decline(run, "over policy")
    assert run.status == "done"
    tree = _tree(client.get(f"/runs/{run.pk}/").content.decode())
    assert tree["root/coordinator.1"].startswith("coordinator root/coordinator.1 done")
    assert tree["root/coordinator.1/refunds.1"].startswith(
        "refunds root/coordinator.1/refunds.1 done 2 turns"
    )
    page = client.get(f"/runs/{run.pk}/").content.decode()
    refunds_part = page[page.index('data-handle="root/coordinator.1/refunds.1"') :]
    assert "<strong>Declined</strong> by" in refunds_part
    assert "relay declined for refund: over policy" in refunds_part
    # the request page's "run so far" shows the tree too
    detail = client.get(f"/requests/{row.request_id}/").content.decode()
    assert list(_tree(detail)) == ["root/coordinator.1", "root/coordinator.1/refunds.1"]


def _restrict_demo_team_to_a_new_group(owner) -> None:
    group = Group.objects.create(name="Team owners")
    policy = AgentPolicy.objects.create(agent="demo-team")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    owner.groups.add(group)


def test_a_hidden_agents_team_run_leaks_through_no_page_or_api():
    owner, outsider = testing.make_user(), testing.make_user()
    _restrict_demo_team_to_a_new_group(owner)
    run, row = _halted(f"Plan a refund for order {SECRET}, $40", owner)
    client = session_client(outsider)
    for path in (f"/runs/{run.pk}/", f"/requests/{row.request_id}/", f"/?r={row.request_id}"):
        response = client.get(path)
        assert SECRET not in response.content.decode(), path
        assert "refunds.1" not in response.content.decode(), path
    assert client.get(f"/runs/{run.pk}/").status_code == 404
    assert client.get(f"/requests/{row.request_id}/").status_code == 404
    api = Client()
    for path in (f"/api/runs/{run.pk}", f"/api/requests/{row.request_id}"):
        assert api.get(path, headers=bearer(outsider)).status_code == 404, path
    listed = api.get("/api/requests", headers=bearer(outsider)).json()
    assert listed["count"] == 0
    owner_page = session_client(owner).get(f"/runs/{run.pk}/").content.decode()
    assert SECRET in owner_page and 'data-handle="root/coordinator.1/refunds.1"' in owner_page


@pytest.mark.usefixtures("in_memory_layer")
async def test_a_hidden_agents_team_run_socket_reads_as_a_missing_run():
    owner = await database_sync_to_async(testing.make_user)()
    outsider = await database_sync_to_async(testing.make_user)()
    await database_sync_to_async(_restrict_demo_team_to_a_new_group)(owner)
    run, _ = await database_sync_to_async(_halted)(f"Plan a refund for order {SECRET}, $40", owner)
    comm, snapshot = await open_socket(f"/ws/runs/{run.pk}/", outsider)
    close = await comm.receive_output(timeout=TIMEOUT)
    await comm.disconnect()
    assert SECRET not in snapshot and "refunds.1" not in snapshot
    assert close == {"type": "websocket.close", "code": 4404}
    allowed, body = await open_socket(f"/ws/runs/{run.pk}/", owner)
    await allowed.disconnect()
    assert 'data-handle="root/coordinator.1/refunds.1"' in body

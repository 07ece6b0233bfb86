"""A three-level chain decided through the HTTP API (issue 35): coordinator > refunds > refund,
where the refund agent's relay call needs a person. The API shows the run's tree of agents
and the request's chain; a decline's reason reaches the deepest agent, which recovers, and
each parent reports up; an approval runs the executor once. Runs on SQLite and, with
DATABASE_URL pointing at PostgreSQL, on PostgreSQL (the same file, both databases)."""

from __future__ import annotations

import json

import pytest

from approvals import testing
from approvals.domain import hostevents
from approvals.execution import webhooks
from approvals.models import Event, Run, ToolExecution, WebhookDelivery
from toolnexus import InProcessResponse
from toolnexus.agents import Agent, Budget
from toolnexus.relay import relay_tool

from .factories import bearer, drain, make_user, post_json, session_client
from .test_host_events import read_stream, subscribe

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = "chain-team"
COORDINATOR = "root/coordinator.1"
REFUNDS = "root/coordinator.1/refunds.1"
REFUND = "root/coordinator.1/refunds.1/refund.1"
REASON = "over the refund policy"
DECLINED = f"relay declined for refund: {REASON}"


def _team() -> list[Agent]:
    return [
        Agent("coordinator", system_prompt="agent:coordinator", tools=[], team=["refunds"]),
        Agent("refunds", system_prompt="agent:refunds", tools=[], team=["refund"]),
        Agent("refund", system_prompt="agent:refund", tools=["refund"]),
    ]


def _scripts() -> dict[str, list]:
    return {
        "coordinator": [
            testing.call("task", agent="refunds", prompt="refund A-1, $5"),
            "coordinator read: {results}",
        ],
        "refunds": [
            testing.call("task", agent="refund", prompt="issue the refund for A-1"),
            "refunds read: {results}",
        ],
        "refund": [
            testing.call("refund", order="A-1", amount=5),
            "refund read: {results}",
        ],
    }


@pytest.fixture
def chain():
    refunds: list[str] = []

    def refund(args) -> str:
        refunds.append(args["order"])
        return f"refunded {args['order']}"

    with testing.scripted_team(
        AGENT,
        _scripts(),
        team=_team(),
        tools=lambda: [relay_tool("refund", "Refund an order (a human approves).")],
        executors={"refund": refund},
    ) as model:
        model.refunds = refunds
        yield model


@pytest.fixture
def api():
    user = make_user()
    client = session_client()
    client.defaults.update({"HTTP_AUTHORIZATION": bearer(user)["Authorization"]})
    client.user = user
    return client


def _flat(tree: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    stack = list(tree)
    while stack:
        node = stack.pop(0)
        out[node["handle"]] = node
        stack.extend(node["children"])
    return out


def _halted(api) -> tuple[int, str]:
    response = post_json(api, "/api/runs", {"agent": AGENT, "prompt": "Customer wants A-1 back"})
    assert response.status_code == 201, response.content
    assert response.json()["agents"] == []  # queued: no agent started yet
    run_id = response.json()["id"]
    drain()
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "pending", run
    return run_id, run["pending"]["request"]["id"]


def test_the_run_shows_its_tree_and_the_request_its_chain(api, chain):
    run_id, request_id = _halted(api)
    run = api.get(f"/api/runs/{run_id}").json()
    # the tree, nested: each level waits on the one below, the deepest on its own request
    [top] = run["agents"]
    assert (top["handle"], top["agent"], top["status"], top["turns"]) == (
        COORDINATOR,
        "coordinator",
        "waiting",
        1,
    )
    [refunds] = top["children"]
    assert (refunds["handle"], refunds["agent"], refunds["status"]) == (
        REFUNDS,
        "refunds",
        "waiting",
    )
    [refund] = refunds["children"]
    assert (refund["handle"], refund["agent"], refund["status"]) == (REFUND, "refund", "waiting")
    assert refund["children"] == [] and refund["turns"] == 1
    assert all(node["tokens"] >= 0 for node in _flat(run["agents"]).values())

    assert run["pending"]["chain"] == ["coordinator", "refunds", "refund"]
    assert run["pending"]["handle"] == REFUND
    assert run["pending"]["request"]["data"]["path"] == REFUND.split("/")
    assert [c["name"] for c in run["pending"]["calls"]] == ["refund"]

    request = api.get(f"/api/requests/{request_id}").json()
    assert request["chain"] == ["coordinator", "refunds", "refund"]
    assert request["handle"] == REFUND
    [listed] = api.get("/api/requests").json()["items"]
    assert listed["chain"] == ["coordinator", "refunds", "refund"]
    [in_list] = api.get("/api/runs").json()["items"]
    assert _flat(in_list["agents"]).keys() == {COORDINATOR, REFUNDS, REFUND}


def test_host_events_name_the_chain_of_a_team_runs_request(api, chain):
    """The event stream and a webhook's body say where in the chain a request came from,
    as the API's request does (chain, handle)."""
    subscribe("http://127.0.0.1:9/hook", event_types=[hostevents.REQUEST_CREATED])
    _, request_id = _halted(api)
    created = [
        f["data"]["data"] for f in read_stream(api) if f["data"]["type"] == "request.created"
    ]
    assert [(e["request_id"], e["chain"], e["handle"]) for e in created] == [
        (request_id, ["coordinator", "refunds", "refund"], REFUND)
    ]
    webhooks.dispatch()
    delivery = WebhookDelivery.objects.get()
    body, _ = webhooks.signed_request(delivery)
    sent = json.loads(body)["data"]
    assert (sent["request_id"], sent["chain"], sent["handle"]) == (
        request_id,
        ["coordinator", "refunds", "refund"],
        REFUND,
    )


def test_each_agents_reply_is_streamed_named_by_its_agent(api, chain, settings):
    """A team run's replies reach its page live as a single agent's do, each named by the
    agent replying (the live entry reads "refunds", not "Assistant")."""
    from approvals import events
    from approvals.live import rendering

    settings.TOOLNEXUS_STREAM_REPLIES = True
    heard: list[tuple[str, str, bool]] = []

    def listen(sender, *, run_id, text, done, agent="", **rest):
        heard.append((agent, text, done))

    events.replied.connect(listen, dispatch_uid="test-team-replies")
    try:
        _, request_id = _halted(api)
        heard.clear()  # the halt's turns called tools only: nothing was said
        response = post_json(api, f"/api/requests/{request_id}/decline", {"reason": REASON})
        assert response.status_code == 200, response.content
        drain()
    finally:
        events.replied.disconnect(dispatch_uid="test-team-replies")
    done = [(agent, text) for agent, text, finished in heard if finished]
    assert [agent for agent, _ in done] == ["refund", "refunds", "coordinator"]
    assert done[0][1] == f"refund read: {DECLINED}"
    assert done[-1][1].startswith("coordinator read: ")
    entry = rendering.live_reply("refund read", done=False, agent="refund")
    assert '<span class="chain-agent">refund</span>' in entry and "Assistant" not in entry


def test_a_decline_reaches_the_deepest_agent_and_each_parent_reports_up(api, chain):
    run_id, request_id = _halted(api)
    response = post_json(api, f"/api/requests/{request_id}/decline", {"reason": REASON})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "declined"
    assert response.json()["chain"] == ["coordinator", "refunds", "refund"]
    drain()

    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done", run["error"]
    assert run["pending"] is None
    # the deepest agent read the reason and answered; each parent read its child's text
    assert run["text"] == f"coordinator read: refunds read: refund read: {DECLINED}"
    assert chain.refunds == []  # declined: the executor never ran
    nodes = _flat(run["agents"])
    assert list(nodes) == [COORDINATOR, REFUNDS, REFUND]  # no child started twice
    assert {h: n["status"] for h, n in nodes.items()} == dict.fromkeys(nodes, "done")
    assert {h: n["turns"] for h, n in nodes.items()} == dict.fromkeys(nodes, 2)
    stored = Run.objects.get(pk=run_id).team_state["conversations"][REFUND]
    assert [m["content"] for m in stored if m.get("role") == "tool"] == [DECLINED]
    assert Event.objects.filter(run_id=run_id, action="run_done").count() == 1
    request = api.get(f"/api/requests/{request_id}").json()
    assert request["decision"]["reason"] == REASON
    assert request["decision"]["decided_by"] == api.user.username


def test_an_approval_runs_the_executor_once_and_the_chain_reports_it(api, chain):
    run_id, request_id = _halted(api)
    response = post_json(api, f"/api/requests/{request_id}/approve", {})
    assert response.status_code == 200, response.content
    drain()
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done", run["error"]
    assert run["text"] == "coordinator read: refunds read: refund read: refunded A-1"
    assert chain.refunds == ["A-1"]
    executed = ToolExecution.objects.get(run_id=run_id, tool_name="refund")
    assert executed.handle == REFUND and executed.output == "refunded A-1"
    assert list(_flat(run["agents"])) == [COORDINATOR, REFUNDS, REFUND]
    # deciding again is refused and changes nothing
    again = post_json(api, f"/api/requests/{request_id}/decline", {"reason": "late"})
    assert again.status_code == 409
    drain()
    assert chain.refunds == ["A-1"]


def test_a_team_budget_ends_the_run_incomplete_naming_the_limit(api):
    """The team's budget bounds the whole tree: the tokens spent below count against it, and
    the coordinator's next turn is refused; the run ends incomplete, the limit named in its
    record, the work done so far kept."""
    scripts = {
        "coordinator": [
            testing.call("task", agent="refunds", prompt="refund A-1, $5"),
            "never said",
        ],
        "refunds": [
            testing.reply("refunds: nothing to refund", prompt_tokens=400, completion_tokens=100)
        ],
    }
    team = [
        Agent("coordinator", system_prompt="agent:coordinator", tools=[], team=["refunds"]),
        Agent("refunds", system_prompt="agent:refunds", tools=[]),
    ]
    with testing.scripted_team(AGENT, scripts, team=team, team_budget=Budget(max_tokens=100)):
        response = post_json(api, "/api/runs", {"agent": AGENT, "prompt": "go"})
        run_id = response.json()["id"]
        drain()
        run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "incomplete", run
    event = Event.objects.get(run_id=run_id, action="run_incomplete")
    assert event.detail["limit"] == "maxTokens", event.detail
    nodes = _flat(run["agents"])
    assert nodes[COORDINATOR]["status"] == "incomplete"
    assert nodes[REFUNDS]["status"] == "done" and nodes[REFUNDS]["tokens"] == 500


def test_a_team_budget_reached_after_a_decline_ends_incomplete_keeping_the_recovery(api):
    """The tokens spent before the halt count after it: the deepest agent reads the decline
    and answers, then the team's budget refuses its parent's next turn."""
    turn = {"prompt_tokens": 40, "completion_tokens": 10}  # 50 a turn: 150 before the halt
    scripts = _scripts()
    scripts["coordinator"][0] = InProcessResponse(
        tool_calls=[scripts["coordinator"][0]], usage=turn
    )
    scripts["refunds"][0] = InProcessResponse(tool_calls=[scripts["refunds"][0]], usage=turn)
    scripts["refund"][0] = InProcessResponse(tool_calls=[scripts["refund"][0]], usage=turn)
    scripts["refund"][1] = testing.reply("refund read: declined", **turn)
    budget = Budget(max_tokens=160)  # the refund agent's turn may start (150), no more after
    with testing.scripted_team(
        AGENT,
        scripts,
        team=_team(),
        tools=lambda: [relay_tool("refund", "Refund an order (a human approves).")],
        team_budget=budget,
    ):
        run_id, request_id = _halted(api)
        response = post_json(api, f"/api/requests/{request_id}/decline", {"reason": REASON})
        assert response.status_code == 200, response.content
        drain()
        run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "incomplete", run
    event = Event.objects.get(run_id=run_id, action="run_incomplete")
    assert event.detail["limit"] == "maxTokens", event.detail
    nodes = _flat(run["agents"])
    assert list(nodes) == [COORDINATOR, REFUNDS, REFUND]
    assert nodes[REFUND]["status"] == "done" and nodes[REFUND]["turns"] == 2
    assert nodes[REFUNDS]["status"] == "incomplete" and nodes[REFUNDS]["turns"] == 1
    stored = Run.objects.get(pk=run_id).team_state
    assert stored["handles"][2]["outcome"]["limit"] == "maxTokens"
    said = [m["content"] for m in stored["conversations"][REFUND] if m.get("role") == "tool"]
    assert said == [DECLINED]  # the recovery is kept


def test_a_single_agents_run_has_no_tree_and_its_request_no_chain(api):
    response = post_json(api, "/api/runs", {"agent": "demo", "prompt": "Refund A-1001 $80"})
    run_id = response.json()["id"]
    drain()
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["agents"] == []
    assert run["pending"]["chain"] == [] and run["pending"]["handle"] is None
    request = api.get(f"/api/requests/{run['pending']['request']['id']}").json()
    assert request["chain"] == [] and request["handle"] is None


def test_the_openapi_schema_describes_the_tree_and_the_chain(api):
    schemas = api.get("/api/openapi.json").json()["components"]["schemas"]
    agent = schemas["AgentOut"]["properties"]
    assert set(agent) == {"handle", "agent", "status", "turns", "tokens", "children"}
    assert agent["children"]["items"]["$ref"].endswith("/AgentOut")
    assert schemas["RunOut"]["properties"]["agents"]["items"]["$ref"].endswith("/AgentOut")
    for name in ("RequestOut", "OpenRequestOut"):
        assert {"chain", "handle"} <= set(schemas[name]["properties"]), name

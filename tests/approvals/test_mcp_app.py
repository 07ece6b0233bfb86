"""MCP servers in the app: agents registered with `mcp_servers`, elicitations stored and
decided like any request (services, pages, API), answers reaching the server.

Against real servers, never mocks: the demo's own MCP server
(`approvals.agents.demo_mcp_server`, over stdio, logging what it saw to a file), the engine
tests' server (`tests/engine/mcp_servers/demo_server.py`, for url mode) and the published
`mcp-server-time`. Every step runs through the worker (`drain()`); each step starts the
servers and stops them at its end, so a resume is always answered by a new server process.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals import agents, services
from approvals.agents.demo import (
    DEMO_MCP_MODULE,
    demo_generate,
    demo_mcp_servers,
    demo_tools,
    issue_refund,
    tables_server,
    wants_a_table,
)
from approvals.agents.demo_mcp_server import LOG_ENV, QUESTION
from approvals.domain.exceptions import InvalidInput
from approvals.domain.records import MCP_SERVER_TOLD as TOLD
from approvals.execution import elicitations, recovery, store
from approvals.execution.elicitations import tell
from approvals.models import ApprovalRequest, Event, Run, ToolExecution
from approvals.presenters.cards import request_card
from tests.engine.mcp_servers.harness import (
    demo as engine_demo_server,
)
from tests.engine.mcp_servers.harness import (
    no_leaked_servers,  # noqa: F401  (an autouse fixture: no server outlives its test)
)
from toolnexus import (
    Answer,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Request,
    create_in_process_client,
)
from toolnexus.mcp import McpServer, answer_to_elicit_result

from .factories import (
    bearer,
    drain,
    fresh,
    make_user,
    post_json,
    session_client,
    tool_output,
)

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}
BOOK = "Book a table for tonight at 20:00"


# -- helpers -------------------------------------------------------------------------------


def events(log: Path, event: str | None = None) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if event is None or r["event"] == event]


def answers(log: Path) -> list[tuple[str, Any]]:
    """What the server's question was answered, as the server saw it: (action, content)."""
    return [(r["action"], r.get("content")) for r in events(log, "answer")]


def scripted(tool: str, args: dict[str, Any]):
    """An in-process model: it calls `tool` once, then replies with what the tool returned."""

    def generate(request: InProcessRequest) -> InProcessResponse:
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        if not any(m.get("role") == "assistant" for m in request.messages):
            return InProcessResponse(tool_calls=[InProcessToolCall("call_1", tool, args)])
        return InProcessResponse(content="tool said: " + " | ".join(results))

    return generate


@pytest.fixture
def log(tmp_path) -> Path:
    return tmp_path / "tables.jsonl"


@pytest.fixture
def booker(log):
    """`booker`: the demo agent (same model and tools), its MCP server logging to `log`."""
    agents.register(
        "booker",
        model=lambda: create_in_process_client(generate=demo_generate, model="booker"),
        tools=demo_tools,
        executors={"refund": issue_refund},
        mcp_servers=[tables_server(env={LOG_ENV: str(log)})],
        replace=True,
    )
    yield "booker"
    agents.unregister("booker")


@pytest.fixture
def reviewer():
    return make_user()


def halt(agent: str, user, prompt: str = BOOK) -> tuple[Run, ApprovalRequest]:
    run = services.run_start(agent=agent, prompt=prompt, started_by=user)
    drain()
    run = fresh(run)
    assert run.status == "pending", (run.status, run.error)
    return run, run.requests.get(state="pending")


# -- registering ---------------------------------------------------------------------------


def test_register_takes_mcp_servers_as_objects_dicts_or_the_common_mapping():
    model = lambda: create_in_process_client(generate=demo_generate)  # noqa: E731
    try:
        agent = agents.register(
            "mcp-reg",
            model=model,
            mcp_servers=[
                McpServer.stdio("time", "mcp-server-time"),
                {"name": "crm", "url": "http://127.0.0.1:9/mcp", "approval": ["delete_*"]},
            ],
        )
        time_server, crm = agent.mcp_servers_for(None)
        assert (time_server.name, time_server.transport) == ("time", "stdio")
        assert (crm.name, crm.url, crm.approval) == ("crm", "http://127.0.0.1:9/mcp", ("delete_*",))
        agent = agents.register(
            "mcp-reg",
            model=model,
            mcp_servers={"mcpServers": {"time": {"command": "mcp-server-time"}}},
            replace=True,
        )
        assert [s.name for s in agent.mcp_servers_for(None)] == ["time"]
        with pytest.raises(ValueError, match=r"agent 'mcp-reg2'.*needs a name"):
            agents.register("mcp-reg2", model=model, mcp_servers=[{"command": "x"}])
        with pytest.raises(
            ValueError, match=r"agent 'mcp-reg2'.*unknown configuration key 'comand'"
        ):
            agents.register("mcp-reg2", model=model, mcp_servers=[{"name": "x", "comand": "y"}])
        with pytest.raises(ValueError, match="used twice"):
            agents.register(
                "mcp-reg2",
                model=model,
                mcp_servers=[McpServer.stdio("a", "x"), McpServer.stdio("a", "y")],
            )
        assert agents.get("mcp-reg2") is None  # nothing half-registered
    finally:
        agents.unregister("mcp-reg")


def test_the_demo_starts_its_mcp_server_only_for_a_booking():
    assert wants_a_table(BOOK) and wants_a_table("Please reserve a table for 2")
    assert not wants_a_table("Refund order A-1001, $250")
    assert not wants_a_table("Please ask the customer a question first")
    demo = agents.require("demo")
    assert demo.mcp_servers_for(Run(prompt="Refund order A-1001")) == []
    (server,) = demo.mcp_servers_for(Run(prompt=BOOK))
    assert (server.name, server.command, server.args) == (
        "tables",
        sys.executable,
        ("-m", DEMO_MCP_MODULE),
    )
    assert demo_mcp_servers(Run(prompt=BOOK)) == [server]


# -- the demo's booking flow, through the worker --------------------------------------------


def test_a_booking_halts_on_the_servers_question_stored_as_an_elicitation_request(reviewer):
    run, row = halt("demo", reviewer)
    assert row.kind == "elicitation" and row.prompt == QUESTION
    assert row.data["server"] == "tables" and row.data["tool"] == "book_table"
    assert row.data["mode"] == "form"
    assert row.data["input"] == {"restaurant": "Trattoria Demo", "time": "20:00"}
    schema = row.data["schema"]
    assert schema["required"] == ["party_size", "name"]
    assert schema["properties"]["party_size"]["maximum"] == 12
    # the order the server asked in survives a database that does not keep a JSON object's
    assert row.data["fieldOrder"] == ["party_size", "name"]
    (call,) = row.calls.all()
    assert (call.call_id, call.tool_name) == ("call_book", "book_table")
    # the engine's placeholder is stored, nothing ran (the halted call is not journaled)
    assert tool_output(run, "call_book") == QUESTION
    assert not ToolExecution.objects.filter(run=run).exists()
    card = request_card(row, can_decide=True)
    assert card.kind_label == "MCP question" and card.source == "tables · book_table"
    assert [(f.name, f.widget, f.label, f.required) for f in card.input_fields] == [
        ("party_size", "integer", "Party size", True),
        ("name", "text", "Name on the booking", True),
    ]
    assert card.summary.startswith("MCP question from demo: tables · book_table ")
    assert "Trattoria Demo" in card.summary


def test_accept_after_a_worker_restart_reaches_a_new_server_process(booker, log, reviewer):
    run, row = halt(booker, reviewer)
    first = events(log, "call")
    assert [e["event"] for e in events(log) if e["event"] != "start"] == ["call", "cancelled"]
    services.request_approve(
        request_id=row.request_id, user=reviewer, input={"party_size": 4, "name": "Ada"}
    )
    row.refresh_from_db()
    assert row.state == "answered"
    assert row.answer == {
        "id": row.request_id,
        "ok": True,
        "data": {"party_size": 4, "name": "Ada"},
    }
    assert drain() == 1  # a fresh worker and client: nothing kept from the halted step
    run = fresh(run)
    assert run.status == "done", run.error
    assert answers(log) == [("accept", {"party_size": 4, "name": "Ada"})]
    resumed = events(log, "call")[-1]
    assert resumed["pid"] != first[0]["pid"]  # answered by a server that never saw the halt
    output = tool_output(run, "call_book")
    assert output.startswith("Booked a table for 4 at Trattoria Demo, 20:00, under Ada")
    assert "The booking service answered: Booked a table for 4" in run.text
    # journaled like the agent's own tools, under the server's name
    (execution,) = ToolExecution.objects.filter(run=run)
    assert execution.tool_name == "tables · book_table" and execution.output == output
    row = fresh(run).requests.get()
    assert row.applied_at is not None
    # the record reads the answer as the form asked it
    outcome = request_card(row, can_decide=True).outcome
    assert (outcome.verb, outcome.answers) == (
        "Answered",
        [("Party size", "4"), ("Name on the booking", "Ada")],
    )


def test_decline_is_decline_for_the_server_and_the_reason_stays_in_the_record(
    booker, log, reviewer
):
    run, row = halt(booker, reviewer)
    services.request_decline(request_id=row.request_id, user=reviewer, reason="not a real guest")
    row.refresh_from_db()
    assert row.state == "declined" and row.reason == "not a real guest"
    assert row.answer == {"id": row.request_id, "ok": False, "reason": "declined"}
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert answers(log) == [("decline", None)]
    assert tool_output(run, "call_book") == (
        f"declined/expired: {QUESTION} (reason: declined)\n"
        "No table booked at Trattoria Demo: the guest said decline."
    )
    assert "the guest said decline" in run.text


def test_expiry_is_cancel_for_the_server(booker, log, reviewer):
    run, row = halt(booker, reviewer)
    ApprovalRequest.objects.filter(pk=row.pk).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    assert recovery.requests_expire_overdue() == 1
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert answers(log) == [("cancel", None)]
    assert "the guest said cancel" in tool_output(run, "call_book")


def test_cancelling_a_run_waiting_on_a_question_tells_its_server_cancel(booker, log, reviewer):
    run, row = halt(booker, reviewer)
    first = events(log, "call")[0]["pid"]
    services.run_cancel(run_id=run.pk, user=reviewer, reason="the guest left")
    row.refresh_from_db()
    assert row.state == "cancelled"
    assert answer_to_elicit_result(Answer.from_dict(row.answer)).action == "cancel"
    assert answers(log) == []  # the cancel itself waits for no server
    # the task committed with the cancel: whichever worker runs next (a crash of the one
    # that cancelled loses nothing) starts the server and answers its question `cancel`
    (queued,) = DBTaskResult.objects.ready()
    assert queued.task_path.endswith("tell_server") and queued.args_kwargs["args"] == [row.pk]
    assert drain() == 1
    assert answers(log) == [("cancel", None)]
    assert events(log, "call")[-1]["pid"] != first  # a server process of its own
    run = fresh(run)
    assert run.status == "cancelled"  # no model step ran: the transcript is as it halted
    assert tool_output(run, "call_book") == QUESTION
    (told,) = row.events.filter(action=TOLD)
    assert told.detail["server"] == "tables" and told.detail["told"] == "cancel"
    assert told.detail["output"] == "declined/expired: " + QUESTION + (
        " (reason: cancelled)\nNo table booked at Trattoria Demo: the guest said cancel."
    )
    # run again (a task row run twice): the server is not told twice
    assert tell(row.pk) == "already told" and answers(log) == [("cancel", None)]


@pytest.mark.parametrize(
    ("decide", "heard"),
    [
        (lambda row, user: recovery.request_expire(request_id=row.request_id), "cancel"),
        (
            lambda row, user: services.request_decline(request_id=row.request_id, user=user),
            "decline",
        ),
        (
            lambda row, user: services.request_approve(
                request_id=row.request_id, user=user, input={"party_size": 2, "name": "Lin"}
            ),
            "cancel",  # the run will not resume: an accepted answer is never acted on
        ),
    ],
    ids=["expired", "declined", "accepted"],
)
def test_a_run_cancelled_before_its_decided_question_reached_the_server(
    booker, log, reviewer, decide, heard
):
    run, row = halt(booker, reviewer)
    decide(row, reviewer)
    assert fresh(run).status == "queued"
    services.run_cancel(run_id=run.pk, user=reviewer)
    assert drain() == 2  # the resume (skipped: the run is cancelled) and telling the server
    assert fresh(run).status == "cancelled"
    assert answers(log) == [(heard, None)]
    assert not ToolExecution.objects.filter(run=run).exists()  # nothing was booked
    # the record names what the server heard: a reviewer's decline stays "decline"
    (told,) = row.events.filter(action=TOLD)
    assert told.detail["told"] == heard
    assert f"the guest said {heard}" in told.detail["output"]


def test_a_run_cancelled_while_its_step_halts_on_a_question_tells_the_server_cancel(
    booker, log, reviewer, monkeypatch
):
    """The cancel lands while a step runs: the step halts on the server's question (the
    server's call is cancelled at the halt), but the run is no longer the step's to store it
    in, so no request exists for a cancel to tell. The worker queues the telling itself (a
    task of its own: the step does not wait for the server), which a second run repeats not."""
    original = store.run_store_result

    def cancelled_first(**kwargs: Any) -> Any:
        services.run_cancel(run_id=kwargs["run"].pk, user=reviewer, reason="changed my mind")
        return original(**kwargs)

    monkeypatch.setattr(store, "run_store_result", cancelled_first)
    run = services.run_start(agent=booker, prompt=BOOK, started_by=reviewer)
    assert drain() == 2  # the step, then the telling it queued
    run = fresh(run)
    assert run.status == "cancelled"
    assert not run.requests.exists()  # the question was never stored
    assert [e["event"] for e in events(log) if e["event"] != "start"] == [
        "call",
        "cancelled",  # at the halt
        "call",
        "answer",  # replayed, and its question answered
    ]
    assert answers(log) == [("cancel", None)]
    (told,) = Event.objects.filter(run=run, action=TOLD)
    assert told.request_id is None and told.detail["request_id"].startswith("elc-")
    assert (told.detail["server"], told.detail["told"]) == ("tables", "cancel")
    assert told.detail["output"].endswith("the guest said cancel.")
    assert not ToolExecution.objects.filter(run=run).exists()  # nothing was booked
    request = Request.from_dict({"id": told.detail["request_id"], "kind": "elicitation"})
    assert elicitations.tell_unstored(run.pk, request) == "already told"
    assert answers(log) == [("cancel", None)]  # the server is not asked again


@pytest.mark.parametrize(
    ("decline_first", "heard"), [(False, "cancel"), (True, "decline")], ids=["open", "declined"]
)
def test_a_cancelled_runs_question_reads_that_it_never_resumed_and_what_the_server_heard(
    booker, log, reviewer, decline_first, heard
):
    run, row = halt(booker, reviewer)
    if decline_first:
        services.request_decline(request_id=row.request_id, user=reviewer, reason="no show")
    services.run_cancel(run_id=run.pk, user=reviewer, reason="the guest left")
    client = session_client(reviewer)
    page = client.get(f"/requests/{row.request_id}/").content.decode()
    assert "the run resumes with this decision" not in page
    assert "Not carried out: the run was cancelled before it resumed." in page
    drain()  # the server is told
    told = (
        f"MCP server “tables” was told “{heard}”; the tool returned: declined/expired: "
        f"{QUESTION} (reason: {'declined' if decline_first else 'cancelled'})"
    )
    page = client.get(f"/requests/{row.request_id}/").content.decode()
    assert "the run resumes with this decision" not in page
    assert page.count(told) == 2, page  # the call in the transcript, and the history
    assert f"the guest said {heard}." in page
    assert "Mcp server told" not in page
    assert told in client.get(f"/runs/{run.pk}/").content.decode()


def test_content_that_does_not_fit_the_form_is_refused_naming_the_field(booker, reviewer):
    run, row = halt(booker, reviewer)
    cases = [
        ({"party_size": 0, "name": "Ada"}, "input.party_size: must be at least 1"),
        ({"party_size": "4", "name": "Ada"}, "input.party_size: expected integer, got string"),
        ({"party_size": 4}, "input.name: is required"),
        ({"party_size": 4, "name": "Ada", "table": 9}, "input.table: is not a field of the form"),
        (None, "input.party_size: is required; input.name: is required"),
    ]
    for content, message in cases:
        with pytest.raises(InvalidInput, match=message.replace(".", r"\.")):
            services.request_approve(request_id=row.request_id, user=reviewer, input=content)
    with pytest.raises(InvalidInput, match="output: tables asked a question"):
        services.request_approve(request_id=row.request_id, user=reviewer, output="4, Ada")
    row.refresh_from_db()
    assert row.state == "pending" and row.answer is None
    assert fresh(run).status == "pending"


# -- the API -------------------------------------------------------------------------------


def test_the_api_answers_an_elicitation_with_approve_answer_and_decline(booker, log, reviewer):
    client = session_client()
    headers = bearer(reviewer)
    run, row = halt(booker, reviewer)
    base = f"/api/requests/{row.request_id}"
    shown = client.get(base, headers=headers).json()
    assert shown["request"]["kind"] == "elicitation"
    assert shown["request"]["data"]["server"] == "tables"
    assert shown["calls"][0]["name"] == "book_table"

    bad = post_json(client, f"{base}/approve", {"input": {"party_size": 13}}, headers=headers)
    assert bad.status_code == 400
    assert bad.json()["detail"] == ("input.name: is required; input.party_size: must be at most 12")
    bad = post_json(
        client,
        f"{base}/answer",
        {"id": row.request_id, "ok": True, "data": {"party_size": 2.5, "name": "Lin"}},
        headers=headers,
    )
    assert bad.status_code == 400
    assert bad.json()["detail"].startswith("data.party_size: expected integer")
    row.refresh_from_db()
    assert row.state == "pending"

    good = post_json(
        client,
        f"{base}/answer",
        {"id": row.request_id, "ok": True, "data": {"party_size": 2, "name": "Lin"}},
        headers=headers,
    )
    assert good.status_code == 200, good.text
    assert good.json()["state"] == "answered"
    drain()
    assert answers(log) == [("accept", {"party_size": 2, "name": "Lin"})]
    assert fresh(run).status == "done"

    run, row = halt(booker, reviewer, prompt="Book a table for two")
    declined = post_json(
        client, f"/api/requests/{row.request_id}/decline", {"reason": "spam"}, headers=headers
    )
    assert declined.status_code == 200
    assert declined.json()["decision"]["reason"] == "spam"
    drain()
    assert answers(log)[-1] == ("decline", None)


@pytest.mark.parametrize(
    ("refusal", "state", "heard"),
    [
        ({"reason": "cancelled"}, "cancelled", "cancel"),
        ({"reason": "not a real guest"}, "cancelled", "cancel"),
        ({"reason": "declined"}, "declined", "decline"),
        ({}, "declined", "decline"),  # no reason: the default, "declined"
    ],
    ids=["cancelled", "free-text", "declined", "no-reason"],
)
def test_a_refusal_through_answer_is_stored_and_reported_as_what_the_server_hears(
    booker, log, reviewer, refusal, state, heard
):
    """`/answer` with `ok: false` hands the engine the Answer as given; the engine's rule
    (`elicit_action`) says what the server hears, and the state, the history and the API say
    the same."""
    client = session_client()
    headers = bearer(reviewer)
    run, row = halt(booker, reviewer)
    body = {"id": row.request_id, "ok": False, **refusal}
    response = post_json(client, f"/api/requests/{row.request_id}/answer", body, headers=headers)
    assert response.status_code == 200, response.text
    reason = refusal.get("reason", "declined")
    shown = response.json()
    assert shown["state"] == state
    assert shown["decision"]["answer"] == {"id": row.request_id, "ok": False, "reason": reason}
    assert shown["decision"]["reason"] == reason
    row.refresh_from_db()
    assert answer_to_elicit_result(Answer.from_dict(row.answer)).action == heard
    assert row.events.filter(action=f"request_{state}").exists()
    drain()
    run = fresh(run)
    assert run.status == "done", run.error  # the run goes on either way
    assert answers(log) == [(heard, None)]
    assert tool_output(run, "call_book") == (
        f"declined/expired: {QUESTION} (reason: {reason})\n"
        f"No table booked at Trattoria Demo: the guest said {heard}."
    )
    assert client.get(f"/api/requests/{row.request_id}", headers=headers).json()["state"] == state


# -- pages ---------------------------------------------------------------------------------


def test_the_inbox_renders_the_form_keeps_typing_on_errors_and_sends_the_answer(
    booker, log, reviewer
):
    run, row = halt(booker, reviewer)
    client = session_client(reviewer)
    html = client.get(f"/?r={row.request_id}").content.decode()  # selected: its card
    assert "MCP question" in html and QUESTION in html
    assert 'title="MCP server">tables</span> · <code>book_table</code>' in html
    assert 'name="field.party_size"' in html and 'type="number" step="1"' in html
    assert 'name="field.name"' in html and "Name on the booking" in html
    assert "Send answer" in html
    assert "the server is told “decline”" in html
    respond = f"/requests/{row.request_id}/respond/"

    # htmx: the card again, the problem named, what was typed kept
    html = client.post(
        respond, {"field.party_size": "40", "field.name": "Ada Lovelace"}, headers=HX
    ).content.decode()
    assert "Not sent: party_size: must be at most 12" in html
    assert 'value="40"' in html and 'value="Ada Lovelace"' in html
    # without JavaScript: the request's page, status 400, the same
    response = client.post(respond, {"field.party_size": "x", "field.name": "Ada"})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Not sent: party_size: not a valid number" in page
    assert 'value="x"' in page and 'value="Ada"' in page
    row.refresh_from_db()
    assert row.state == "pending"

    response = client.post(respond, {"field.party_size": "3", "field.name": "Grace", "next": "/"})
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.state == "answered"
    assert row.answer["data"] == {"party_size": 3, "name": "Grace"}
    drain()
    assert answers(log) == [("accept", {"party_size": 3, "name": "Grace"})]
    page = client.get(f"/runs/{run.pk}/").content.decode()
    # the run page names the server of the call and of its result
    assert page.count('title="MCP server">tables</span> · <code>book_table</code>') == 2
    assert "Booked a table for 3" in page
    assert "Party size" in client.get(f"/requests/{row.request_id}/").content.decode()


def test_the_run_page_names_the_server_of_an_mcp_tool_call(reviewer):
    """A tool that asks nothing: the published time server, journaled and shown as
    "time · get_current_time"."""
    agents.register(
        "clock",
        model=lambda: create_in_process_client(
            generate=scripted("get_current_time", {"timezone": "UTC"})
        ),
        mcp_servers=[
            McpServer.stdio(
                "time", sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"
            )
        ],
        replace=True,
    )
    try:
        run = services.run_start(agent="clock", prompt="What time is it?", started_by=reviewer)
        drain()
        run = fresh(run)
        assert run.status == "done", run.error
        assert '"timezone": "UTC"' in tool_output(run, "call_1")
        (execution,) = ToolExecution.objects.filter(run=run)
        assert execution.tool_name == "time · get_current_time"
        page = session_client(reviewer).get(f"/runs/{run.pk}/").content.decode()
        assert page.count('title="MCP server">time</span> · <code>get_current_time</code>') == 2
    finally:
        agents.unregister("clock")


# -- url mode, and a server that does not start ---------------------------------------------


def test_url_mode_shows_the_link_and_approving_is_consent(tmp_path, reviewer):
    log = tmp_path / "engine-demo.jsonl"
    agents.register(
        "signer",
        model=lambda: create_in_process_client(generate=scripted("login", {})),
        mcp_servers=[engine_demo_server(log, name="auth")],
        replace=True,
    )
    try:
        run, row = halt("signer", reviewer, prompt="sign me in")
        assert row.kind == "elicitation" and row.url == "https://auth.example/login"
        assert row.data["mode"] == "url" and "schema" not in row.data
        card = request_card(row, can_decide=True)
        assert card.asks_consent and card.source == "auth · login"
        html = session_client(reviewer).get(f"/?r={row.request_id}").content.decode()
        assert "Consent and continue" in html and 'href="https://auth.example/login"' in html
        with pytest.raises(InvalidInput, match="input: auth asks for consent"):
            services.request_approve(request_id=row.request_id, user=reviewer, input={"x": 1})
        services.request_approve(request_id=row.request_id, user=reviewer)
        row.refresh_from_db()
        assert row.state == "approved"
        drain()
        assert fresh(run).status == "done"
        assert tool_output(fresh(run), "call_1") == "login accept"
        assert [(r["action"]) for r in events(log, "answer")] == ["accept"]
    finally:
        agents.unregister("signer")


def test_a_server_that_does_not_start_is_a_tool_error_and_the_run_finishes(reviewer):
    gone = McpServer.stdio("gone", sys.executable, "-c", "import sys; sys.exit('no licence')")
    agents.register(
        "broken",
        model=lambda: create_in_process_client(generate=scripted("gone__lookup", {})),
        mcp_servers=[gone],  # required (the default): still never a failed run
        replace=True,
    )
    try:
        run = services.run_start(agent="broken", prompt="go", started_by=reviewer)
        with pytest.warns(UserWarning, match='MCP server "gone" failed to start'):
            drain()
        run = fresh(run)
        assert run.status == "done", run.error
        output = tool_output(run, "call_1")
        assert output.startswith(
            'gone__lookup was not run: MCP server "gone" is unavailable, so its tools are not '
            'offered (MCP server "gone" failed to start'
        )
        assert "no licence" in output  # its stderr
        assert run.text == "tool said: " + output  # the model read it and replied
    finally:
        agents.unregister("broken")


def test_a_resume_whose_server_does_not_start_reads_an_error_and_finishes(
    booker, log, reviewer, tmp_path
):
    run, row = halt(booker, reviewer)
    down = tmp_path / "down"
    agents.register(  # the same server, now unable to start
        "booker",
        model=lambda: create_in_process_client(generate=demo_generate, model="booker"),
        tools=demo_tools,
        executors={"refund": issue_refund},
        mcp_servers=[
            McpServer.stdio(
                "tables",
                sys.executable,
                "-c",
                f"import sys; open({str(down)!r}, 'w'); sys.exit('booking service down')",
            )
        ],
        replace=True,
    )
    services.request_approve(
        request_id=row.request_id, user=reviewer, input={"party_size": 4, "name": "Ada"}
    )
    with pytest.warns(UserWarning, match='MCP server "tables" failed to start'):
        drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert down.exists()
    output = tool_output(run, "call_book")
    assert output.startswith('book_table was not run: MCP server "tables" is unavailable')
    assert "booking service down" in output
    assert answers(log) == []

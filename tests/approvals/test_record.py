"""The record reviewers read: every decision shown as it was made, on the card, the run page,
the request page, the admin and the API; decisions made through `POST .../answer` recorded
per call like approve and decline."""

from __future__ import annotations

import html as htmllib
import re

import pytest

from approvals import services
from approvals.domain.exceptions import InvalidInput
from approvals.live import rendering
from approvals.models import ApprovalRequest, Event, Run

from .factories import (
    drain,
    fresh,
    make_user,
    post_json,
    session_client,
    start_and_halt,
    tool_output,
)

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "<img src=x onerror=window.__xss=1>"


def pending(run: Run) -> ApprovalRequest:
    return run.requests.get(state="pending")


def text_of(html: str) -> str:
    """The page's text with tags dropped and whitespace collapsed."""
    return htmllib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip())


@pytest.fixture
def reviewer():
    return make_user(username="rita")


def two_call_run(reviewer) -> tuple[Run, ApprovalRequest]:
    run = start_and_halt(user=reviewer, prompt="Refund A-2002 $40 and email the customer")
    return run, pending(run)


# -- 1. a per-call decline is shown as a decline -------------------------------------------


def test_a_per_call_decline_reads_declined_on_the_run_page_and_the_card(reviewer):
    run, request = two_call_run(reviewer)
    client = session_client(reviewer)
    response = client.post(
        f"/requests/{request.request_id}/calls/",
        {
            "decision.call_refund": "approve",
            "decision.call_email": "decline",
            "reason.call_email": "wrong address",
        },
    )
    assert response.status_code == 302
    drain()
    page = text_of(client.get(f"/runs/{run.pk}/").content.decode())
    assert "Declined by rita" in page and "“ wrong address ”" in page
    assert "Approved by rita" in page  # the refund, which ran
    # The decline is never labelled approved: the note next to send_email's result.
    email_result = page[page.index("Result of send_email") :]
    assert email_result.index("Declined by rita") < email_result.index("relay declined")
    assert "Approved by rita" not in email_result[: email_result.index("relay declined")]
    # The decided card: each call with its own outcome, the whole request "decided per call".
    card = text_of(client.get(f"/requests/{request.request_id}/card/").content.decode())
    assert "Decided per call by rita" in card
    assert card.count("Declined by rita") == 1 and card.count("Approved by rita") == 1


def test_decline_all_reads_declined_with_the_reason(reviewer):
    run, request = two_call_run(reviewer)
    services.request_decline(request_id=request.request_id, user=reviewer, reason="fraud")
    drain()
    page = text_of(session_client(reviewer).get(f"/runs/{run.pk}/").content.decode())
    assert page.count("Declined by rita") == 2
    assert "Approved" not in page


# -- 2. an empty typed result is refused, naming the call -----------------------------------


def test_submitting_the_two_call_form_without_a_result_is_refused_naming_the_call(reviewer):
    run, request = two_call_run(reviewer)
    client = session_client(reviewer)
    response = client.post(
        f"/requests/{request.request_id}/calls/",
        {
            "decision.call_refund": "approve",
            "decision.call_email": "output",
            "output.call_email": "  ",
        },
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert "calls.call_email.output: type the result for send_email" in body
    request.refresh_from_db()
    assert request.state == "pending"
    assert fresh(run).status == "pending"


@pytest.mark.parametrize(
    "payload",
    [
        {"calls": {"call_refund": {"decision": "approve"}, "call_email": {"output": ""}}},
        {"calls": {"call_refund": {"decision": "approve"}, "call_email": {"decision": "output"}}},
    ],
)
def test_an_empty_typed_result_is_400_through_the_api(reviewer, payload):
    run, request = two_call_run(reviewer)
    response = post_json(
        session_client(reviewer), f"/api/requests/{request.request_id}/approve", payload
    )
    assert response.status_code == 400
    assert "calls.call_email.output" in response.json()["detail"]
    assert "send_email" in response.json()["detail"]
    assert pending(run) == request


def test_an_empty_answer_to_a_question_is_refused(reviewer):
    run = start_and_halt(user=reviewer, prompt="ask a question")
    with pytest.raises(InvalidInput, match="output: type the answer"):
        services.request_approve(request_id=pending(run).request_id, user=reviewer, output=" ")


def test_the_two_call_form_offers_no_typed_result_for_a_call_that_runs(reviewer):
    _run, request = two_call_run(reviewer)
    html = session_client(reviewer).get(f"/?r={request.request_id}").content.decode()
    assert 'name="output.call_email"' in html
    assert 'name="output.call_refund"' not in html  # refund has an executor


def test_an_agent_that_allows_it_takes_a_typed_result_for_a_call_that_runs(
    reviewer, typed_output_agent
):
    run = start_and_halt(user=reviewer, agent=typed_output_agent, prompt="Refund A-7 $5")
    request = pending(run)
    page = session_client(reviewer).get(f"/?r={request.request_id}").content.decode()
    assert 'data-request-id="' + request.request_id in page  # the card is open
    assert 'name="output.call_refund"' not in page
    response = post_json(
        session_client(reviewer),
        f"/api/requests/{request.request_id}/answer",
        {"id": request.request_id, "ok": True, "data": {"output": "refunded in the shop"}},
    )
    assert response.status_code == 200, response.content
    call = response.json()["calls"][0]
    assert (call["decision"], call["output"]) == ("output", "refunded in the shop")
    drain()
    assert tool_output(fresh(run), "call_refund") == "refunded in the shop"


# -- 3. edits leave a trace; answers are recorded per call ----------------------------------


def _approve_delete_edited(reviewer) -> tuple[Run, ApprovalRequest]:
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    services.request_approve(
        request_id=request.request_id, user=reviewer, input={"account": "acct-43"}
    )
    drain()
    return fresh(run), request


def test_an_edit_shows_old_and_new_on_the_card_the_run_page_and_the_api(reviewer):
    run, request = _approve_delete_edited(reviewer)
    assert tool_output(run, "call_delete") == "account acct-43 scheduled for deletion"
    client = session_client(reviewer)
    for path in (f"/runs/{run.pk}/", f"/requests/{request.request_id}/card/"):
        html = client.get(path).content.decode()
        assert "Approved with edits by rita" in text_of(html), path
        assert re.search(r"<del><code>&quot;acct-42&quot;</code></del>", html), path
        assert re.search(r"<ins><code>&quot;acct-43&quot;</code></ins>", html), path
    call = client.get(f"/api/requests/{request.request_id}").json()["calls"][0]
    assert call["decision"] == "edit"
    assert call["changes"] == [
        {"key": "account", "before": "acct-42", "after": "acct-43", "change": "changed"}
    ]


def test_an_edit_shows_in_the_admin(reviewer):
    _run, request = _approve_delete_edited(reviewer)
    admin = make_user(role="superuser", username="root")
    html = session_client(admin).get(f"/admin/approvals/approvalrequest/{request.pk}/change/")
    page = text_of(html.content.decode())
    assert 'account: "acct-42" → "acct-43"' in page


def test_approving_with_the_same_arguments_is_a_plain_approval(reviewer):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    services.request_approve(
        request_id=request.request_id, user=reviewer, input={"account": "acct-42"}
    )
    assert request.calls.get().decision == "approve"


def test_an_answer_with_edited_input_is_recorded_as_an_edit(reviewer):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    response = post_json(
        session_client(reviewer),
        f"/api/requests/{request.request_id}/answer",
        {"id": request.request_id, "ok": True, "data": {"input": {"account": "acct-43"}}},
    )
    assert response.status_code == 200, response.content
    call = response.json()["calls"][0]
    assert call["decision"] == "edit" and call["edited_input"] == {"account": "acct-43"}
    drain()
    assert tool_output(fresh(run), "call_delete") == "account acct-43 scheduled for deletion"


def test_an_answer_with_invalid_edited_input_is_refused(reviewer):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    response = post_json(
        session_client(reviewer),
        f"/api/requests/{request.request_id}/answer",
        {"id": request.request_id, "ok": True, "data": {"input": {"account": ""}}},
    )
    assert response.status_code == 400
    assert "input" in response.json()["detail"]
    assert pending(run) == request


def test_an_answer_with_per_call_results_is_recorded_per_call(reviewer):
    run, request = two_call_run(reviewer)
    response = post_json(
        session_client(reviewer),
        f"/api/requests/{request.request_id}/answer",
        {
            "id": request.request_id,
            "ok": True,
            "data": {"results": [{"id": "call_email", "output": "sent at 10:02"}]},
        },
    )
    assert response.status_code == 200, response.content
    calls = {c["id"]: c for c in response.json()["calls"]}
    assert calls["call_email"]["decision"] == "output"
    assert calls["call_email"]["output"] == "sent at 10:02"
    assert calls["call_refund"]["decision"] == "approve"  # left out: approved, its executor runs
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "refund issued: $40 to order A-2002"
    assert tool_output(run, "call_email") == "sent at 10:02"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"results": [{"id": "call_refund", "output": "done"}]}, "data.results[0].output: refund"),
        ({"results": [{"id": "nope", "output": "x"}]}, "unknown call id(s) nope"),
        ({"results": [{"id": "call_email", "output": 3}]}, "data.results[0].output: must be"),
        ({"results": "x"}, "data.results: must be a list"),
        ({"results": [{"id": "call_email", "output": ""}]}, "type the result for send_email"),
        ({"bogus": 1}, "data: unexpected key(s) bogus"),
        ({"output": "x"}, "data.output: this request carries 2 calls"),
    ],
)
def test_bad_answers_for_a_relay_request_are_400_and_change_nothing(reviewer, data, message):
    run, request = two_call_run(reviewer)
    events = Event.objects.count()
    response = post_json(
        session_client(reviewer),
        f"/api/requests/{request.request_id}/answer",
        {"id": request.request_id, "ok": True, "data": data},
    )
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert pending(run) == request
    assert Event.objects.count() == events
    assert all(c.decision == "" for c in request.calls.all())


def test_a_declining_answer_is_recorded_like_decline(reviewer):
    _run, request = two_call_run(reviewer)
    response = post_json(
        session_client(reviewer),
        f"/api/requests/{request.request_id}/answer",
        {"id": request.request_id, "ok": False, "reason": "not today"},
    )
    assert response.status_code == 200
    calls = response.json()["calls"]
    assert {(c["decision"], c["reason"]) for c in calls} == {("decline", "not today")}
    assert {c["output"] for c in calls} == {
        "relay declined for refund: not today",
        "relay declined for send_email: not today",
    }


# -- 4. a waiting call does not look as if it ran -------------------------------------------


def test_a_waiting_call_shows_waiting_for_a_decision(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-1001 $250")
    client = session_client(reviewer)
    page = text_of(client.get(f"/runs/{run.pk}/").content.decode())
    assert "Result of refund Waiting for a decision" in page
    assert "to the caller for execution" not in page
    admin = make_user(role="superuser", username="root")
    listing = text_of(
        session_client(admin).get("/admin/approvals/approvalrequest/").content.decode()
    )
    assert "The agent wants to run refund (waiting for a decision)" in listing
    assert "to the caller for execution" not in listing


def test_a_decided_call_not_yet_resumed_says_so(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-1001 $250")
    services.request_decline(request_id=pending(run).request_id, user=reviewer, reason="no")
    page = text_of(session_client(reviewer).get(f"/runs/{run.pk}/").content.decode())
    assert "Decided: the run resumes with this decision." in page
    assert "to the caller for execution" not in page


# -- 5. question answers -------------------------------------------------------------------


def test_question_answers_read_as_answers_on_the_run_page_and_the_card(reviewer):
    run = start_and_halt(user=reviewer, prompt="ask a question")
    request = pending(run)
    client = session_client(reviewer)
    client.post(f"/requests/{request.request_id}/respond/", {"q.0": "pro"})
    drain()
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert '{"answers"' not in page and "{&quot;answers" not in page
    assert re.search(r"<dt>Plan</dt><dd>pro</dd>", page)
    card = client.get(f"/requests/{request.request_id}/card/").content.decode()
    assert "Answered by rita" in text_of(card)
    assert re.search(r"<dt>Plan</dt><dd>pro</dd>", card)


def test_a_pending_question_prints_its_text_once(reviewer):
    run = start_and_halt(user=reviewer, prompt="ask a question")
    html = session_client(reviewer).get(f"/?r={pending(run).request_id}").content.decode()
    # the card, open in the detail pane (the list's row and the transcript show it too)
    card = re.search(
        r'<article id="request-\d+"[^>]*class="card state-pending".*?</article>', html, re.S
    )
    assert card, html
    assert card.group(0).count("Which plan should the customer move to?") == 1


# -- 10. every request has a full page -------------------------------------------------------


def test_the_request_page_is_a_full_page_with_its_run_and_history(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-1001 $250")
    request = pending(run)
    services.request_decline(request_id=request.request_id, user=reviewer, reason="too much")
    drain()
    response = session_client(reviewer).get(f"/requests/{request.request_id}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<!doctype html>" in html and 'aria-label="Approvals"' in html
    page = text_of(html)
    assert "Declined by rita" in page and "too much" in page
    assert f"run #{run.pk}" in page
    assert "History" in page
    assert "Request created" in page and "Declined by rita" in page
    # htmx still gets the bare card (the edit preview's Back button swaps it in place).
    fragment = session_client(reviewer).get(
        f"/requests/{request.request_id}/", headers={"HX-Request": "true"}
    )
    assert "<!doctype html>" not in fragment.content.decode()


def test_the_request_page_of_an_unknown_request_is_404(reviewer):
    assert session_client(reviewer).get("/requests/nope/").status_code == 404


# -- 11. an edit error keeps what was typed --------------------------------------------------


def test_an_edit_error_keeps_the_editor_open_with_the_typed_values(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-1001 $250")
    request = pending(run)
    response = session_client(reviewer).post(
        f"/requests/{request.request_id}/edit/",
        {"field.order": "A-1001-typed", "field.amount": "-5"},
        headers={"HX-Request": "true"},
    )
    html = response.content.decode()
    assert re.search(r'<details class="edit" open', html)
    assert 'value="A-1001-typed"' in html
    assert 'value="-5"' in html
    assert "amount: must be at least 0" in html


def test_length_messages_are_singular_for_one():
    from toolnexus.schema import schema_errors

    problems = schema_errors({"account": ""}, {"properties": {"account": {"minLength": 1}}})
    assert problems and all("1 characters" not in p for p in problems)
    assert any("at least 1 character" in p for p in problems)


# -- 13. irreversible actions are confirmed --------------------------------------------------


def test_approving_an_irreversible_approval_asks_for_confirmation_first(reviewer):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    client = session_client(reviewer)
    html = client.get(f"/?r={request.request_id}").content.decode()
    assert "hx-confirm=" in html
    response = client.post(f"/requests/{request.request_id}/approve/")
    assert response.status_code == 200
    assert "cannot be undone" in text_of(response.content.decode())
    assert pending(run) == request  # nothing decided yet
    client.post(f"/requests/{request.request_id}/approve/", {"confirmed": "1"})
    request.refresh_from_db()
    assert request.state == "approved"


def test_cancelling_a_run_asks_for_confirmation_first(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-1001 $250")
    client = session_client(reviewer)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'name="confirmed"' not in html  # the page's Cancel never confirms by itself
    response = client.post(f"/runs/{run.pk}/cancel/")
    assert response.status_code == 200
    assert "Cancel run" in text_of(response.content.decode())
    assert fresh(run).status == "pending"
    client.post(f"/runs/{run.pk}/cancel/", {"confirmed": "1"})
    assert fresh(run).status == "cancelled"


# -- 15. labels ----------------------------------------------------------------------------


def test_the_badge_and_the_filter_use_the_same_label(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-1001 $250")
    html = session_client(reviewer).get(f"/?r={pending(run).request_id}").content.decode()
    assert '<span class="badge kind-tool_call">relay call</span>' in html
    # The menu's option reads the same label, with the count the list would show.
    assert re.search(r'<option id="[^"]+" value="tool_call">relay call \(1\)</option>', html)


# -- 17. titles built from model-chosen arguments are escaped --------------------------------


def test_a_hostile_account_in_an_approval_title_is_escaped_on_the_page_and_in_pushes(reviewer):
    run = start_and_halt(user=reviewer, prompt=f"Delete account {HOSTILE}")
    request = pending(run)
    assert HOSTILE in request.prompt  # the title is the request's own prompt
    for path in (
        "/",
        f"/?r={request.request_id}",
        f"/runs/{run.pk}/",
        f"/requests/{request.request_id}/",
    ):
        html = session_client(reviewer).get(path).content.decode()
        assert HOSTILE not in html, path
        assert "&lt;img src=x onerror=window.__xss=1&gt;" in html, path
    request = ApprovalRequest.objects.get(pk=request.pk)
    for can_decide in (True, False):
        pushed = rendering.card_html(request, can_decide=can_decide)
        assert HOSTILE not in pushed
        assert "Delete account &lt;img src=x onerror=window.__xss=1&gt;?" in pushed
    body = rendering.run_body(run.pk, can_decide=True)
    assert HOSTILE not in body


# -- screen readers --------------------------------------------------------------------------


def test_cards_and_buttons_have_names_that_say_what_they_act_on(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund A-2002 $40")
    html = session_client(reviewer).get(f"/?r={pending(run).request_id}").content.decode()
    assert 'aria-label="relay call from demo: refund A-2002, 40"' in html
    assert re.search(r"Approve<span class=\"visually-hidden\"> refund A-2002</span>", html)
    assert re.search(r"Decline<span class=\"visually-hidden\"> refund A-2002</span>", html)


def test_your_own_typed_result_is_confirmed_as_a_result_not_an_approval(
    reviewer, typed_output_agent
):
    run = start_and_halt(user=reviewer, agent=typed_output_agent, prompt="Refund A-7 $5")
    response = session_client(reviewer).post(
        f"/requests/{pending(run).request_id}/output/",
        {"output": "refunded by hand"},
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert "You sent the result for refund" in body
    assert "You approved" not in body and "You answered" not in body


# -- deep JSON is refused the same way everywhere, permission first -------------------------

DEEP = "[" * 2000 + "]" * 2000


def test_deep_json_from_a_watcher_is_403_before_it_is_parsed(reviewer):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    watcher = make_user(role="watcher")
    response = session_client(watcher).post(
        f"/requests/{request.request_id}/approve/", {"input": DEEP, "confirmed": "1"}
    )
    assert response.status_code == 403
    assert "approvals.decide_request" in response.content.decode()
    assert pending(run) == request


@pytest.mark.parametrize("htmx", [False, True])
def test_deep_json_from_a_reviewer_is_a_clear_error_and_decides_nothing(reviewer, htmx):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    headers = {"HX-Request": "true"} if htmx else {}
    response = session_client(reviewer).post(
        f"/requests/{request.request_id}/approve/",
        {"input": DEEP, "confirmed": "1"},
        headers=headers,
        follow=not htmx,
    )
    assert response.status_code == 200
    assert "nested more than 64 levels deep" in response.content.decode()
    assert pending(run) == request


def test_deep_json_through_the_api_is_400(reviewer):
    run = start_and_halt(user=reviewer, prompt="Delete account acct-42")
    request = pending(run)
    response = session_client(reviewer).post(
        f"/api/requests/{request.request_id}/approve",
        data='{"input": {"account": ' + DEEP + "}}",
        content_type="application/json",
    )
    assert response.status_code == 400
    assert pending(run) == request

"""approvals.web.views: reviewer pages through Django's test client (no browser): forms
with post/redirect/get, the same POSTs with htmx answering the card in place, escaping,
edits, per-call decisions, questions, the run page, the start page, filters, pagination and
query counts."""

from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.models import ApprovalRequest, Event, RequestCall, Run

from .factories import (
    drain,
    fresh,
    make_user,
    registered_mock_agent,
    session_client,
    start_and_halt,
    tool_output,
)

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}
HOSTILE_SCRIPT = "<script>window.__xss=1</script>"
HOSTILE_IMG = "<img src=x onerror=window.__xss=1>"
ESCAPED_SCRIPT = "&lt;script&gt;window.__xss=1&lt;/script&gt;"
ESCAPED_IMG = "&lt;img src=x onerror=window.__xss=1&gt;"


def pending(run: Run) -> ApprovalRequest:
    return run.requests.get(state="pending")


def decisions_of(row: ApprovalRequest) -> list[Event]:
    return list(
        Event.objects.filter(
            request=row,
            action__in=[
                "request_approved",
                "request_answered",
                "request_declined",
                "request_expired",
                "request_cancelled",
            ],
        )
    )


def url(row: ApprovalRequest, action: str) -> str:
    return f"/requests/{row.request_id}/{action}/"


def toasts(html: str) -> str:
    match = re.search(r'<div id="toasts"[^>]*>(.*?)</div>', html, re.S)
    assert match, "no #toasts region on the page"
    return match.group(1)


@pytest.fixture
def reviewer():
    return make_user(role="reviewer")


@pytest.fixture
def halted(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund order A-1001, $250")
    return run, pending(run)


@pytest.fixture
def mock_agent():
    """`mocked`: an OpenAI-style model on httpx.MockTransport with the demo's tools; set
    `.tool_input` before starting a run, `.fail = True` to make the endpoint answer 500."""
    with registered_mock_agent("mocked", tool_input={"order": "B-7", "amount": 9}) as model:
        yield model


# -- access --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/runs/", "/runs/new/"])
def test_pages_require_login(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_run_page_requires_login(client, halted):
    run, _ = halted
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next=/runs/{run.pk}/"


def test_anonymous_decline_is_redirected_to_login_and_changes_nothing(client, halted):
    _, row = halted
    response = client.post(url(row, "decline"), {"reason": "no"})
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert fresh_row(row).state == "pending"


def fresh_row(row: ApprovalRequest) -> ApprovalRequest:
    row.refresh_from_db()
    return row


def test_user_without_permissions_gets_403_on_the_inbox():
    client = session_client(make_user(role="nobody"))
    assert client.get("/").status_code == 403


def test_watcher_sees_the_inbox_but_cannot_decide(halted):
    _, row = halted
    client = session_client(make_user(role="watcher"))
    page = client.get(f"/?r={row.request_id}")  # the selected request, in the detail pane
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="request-{row.pk}"' in html
    assert "You can watch but not decide." in html
    assert url(row, "decline") not in html
    assert url(row, "approve") not in html

    for action, data in [
        ("decline", {"reason": "watchers cannot"}),
        ("approve", {}),
        ("output", {"output": "x"}),
        ("calls", {}),
        ("edit", {"field.order": "A-1", "field.amount": "1"}),
    ]:
        response = client.post(url(row, action), data)
        assert response.status_code == 403, action
        response = client.post(url(row, action), data, headers=HX)
        assert response.status_code == 403, action
    row = fresh_row(row)
    assert row.state == "pending"
    assert row.decided_by is None
    assert decisions_of(row) == []


def test_watcher_cannot_start_runs():
    client = session_client(make_user(role="watcher"))
    assert client.get("/runs/new/").status_code == 403
    assert client.post("/runs/new/", {"agent": "demo", "prompt": "hi"}).status_code == 403
    assert Run.objects.count() == 0


# -- declining: forms and htmx -------------------------------------------------------------


def test_decline_without_htmx_redirects_to_next_with_a_flash_message(reviewer, halted):
    run, row = halted
    client = session_client(reviewer)
    response = client.post(
        url(row, "decline"), {"reason": "over the limit", "next": "/?state=pending&kind=tool_call"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/?state=pending&kind=tool_call"

    row = fresh_row(row)
    assert row.state == "declined"
    assert row.reason == "over the limit"
    assert row.decided_by == reviewer
    assert fresh(run).status == "queued"

    page = client.get(response["Location"]).content.decode()
    assert '<p class="toast success">Declined.</p>' in toasts(page)
    assert f'id="request-{row.pk}"' not in page  # no longer pending


def test_decline_with_an_empty_reason_stores_the_default(reviewer, halted):
    _, row = halted
    session_client(reviewer).post(url(row, "decline"), {"reason": "   "})
    assert fresh_row(row).reason == "declined"


def test_decline_with_htmx_answers_the_card_in_place(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).post(
        url(row, "decline"), {"reason": "no refunds on Sundays"}, headers=HX
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<article id="request-{row.pk}"')
    assert "<html" not in html
    assert "state-declined" in html
    # said once: the footer and the toast, no "Declined." notice besides them
    assert "Declined.</p>" not in html and "<strong>Declined</strong> by" in html
    assert "You declined: no refunds on Sundays" in html
    assert reviewer.username in html
    assert url(row, "decline") not in html  # decided: no forms left


def test_stale_double_decline_tells_who_won_and_changes_nothing(reviewer, halted):
    _, row = halted
    other = make_user(role="reviewer")
    first = session_client(reviewer).post(url(row, "decline"), {"reason": "first"})
    assert first.status_code == 302

    late = session_client(other)
    response = late.post(url(row, "decline"), {"reason": "", "next": "/"})
    assert response.status_code == 302
    assert response["Location"] == "/"
    page = late.get("/").content.decode()
    message = toasts(page)
    assert re.search(
        rf"Already declined by {reviewer.username} at \d\d:\d\d:\d\d UTC: nothing was changed\.",
        message,
    ), message
    assert 'class="toast warning"' in message

    row = fresh_row(row)
    assert row.decided_by == reviewer
    assert row.reason == "first"
    assert len(decisions_of(row)) == 1


def test_a_late_decline_without_javascript_keeps_the_typed_reason_on_the_page(reviewer, halted):
    _, row = halted
    session_client(reviewer).post(url(row, "decline"), {"reason": "first"})
    typed = "Customer <b>called</b> twice;\nrefund is not due"
    response = session_client(make_user(role="reviewer")).post(
        url(row, "decline"), {"reason": typed, "next": "/"}
    )
    assert response.status_code == 409  # the request's page, not a redirect that drops it
    html = response.content.decode()
    assert f"Already declined by {reviewer.username} at" in html
    assert "Not sent. What you typed is kept here to copy:" in html
    assert "Your reason" in html
    assert "Customer &lt;b&gt;called&lt;/b&gt; twice;\nrefund is not due</textarea>" in html
    assert fresh_row(row).reason == "first"
    assert len(decisions_of(fresh_row(row))) == 1


def test_stale_decline_with_htmx_answers_the_card_with_the_message(reviewer, halted):
    _, row = halted
    other = make_user(role="reviewer")
    session_client(reviewer).post(url(row, "decline"), {"reason": "first"}, headers=HX)
    response = session_client(other).post(url(row, "decline"), {"reason": "late"}, headers=HX)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="request-{row.pk}"' in html
    assert f"Already declined by {reviewer.username} at" in html
    assert "nothing was changed" in html
    assert 'class="notice warning"' in html
    assert ">late</textarea>" in html  # the typed reason stays to copy
    assert response["X-Toolnexus-Outcome"] == "unsent"  # the inbox keeps this card open
    assert len(decisions_of(fresh_row(row))) == 1
    assert fresh_row(row).reason == "first"


def test_approve_after_a_decline_is_stale_too(reviewer, halted):
    _, row = halted
    session_client(reviewer).post(url(row, "decline"), {"reason": "no"})
    response = session_client(make_user()).post(url(row, "approve"), headers=HX)
    assert response.status_code == 200
    assert "Already declined by" in response.content.decode()
    assert fresh_row(row).state == "declined"


# -- a late decision keeps what was typed, labelled as the form showed it ---------------------
# These tests post what the rendered form posts: they read the card's form (its field names
# and prefilled values), type into it, and send that, as a browser would.


class _FormReader(HTMLParser):
    """The fields of the first form posting to `action`, and what it posts as rendered."""

    def __init__(self, action: str):
        super().__init__(convert_charrefs=True)
        self.action, self.inside, self.found = action, False, False
        self.names: list[str] = []  # every field name, in the form's order
        self.posted: list[tuple[str, str]] = []  # (name, value) the form sends untouched
        self._textarea: str | None = None
        self._select: str | None = None
        self._text: list[str] = []
        self._options: list[tuple[str, bool]] = []

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        name = a.get("name", "")
        if tag == "form":
            self.inside = not self.found and a.get("action") == self.action
            self.found = self.found or self.inside
        elif not self.inside:
            return
        elif tag == "option" and self._select:
            self._options.append((a.get("value", ""), "selected" in a))
        elif not name:
            return
        elif tag == "input":
            self.names.append(name)
            kind = a.get("type", "text")
            if kind not in ("radio", "checkbox") or "checked" in a:
                self.posted.append((name, a.get("value", "on" if kind == "checkbox" else "")))
        elif tag == "textarea":
            self.names.append(name)
            self._textarea, self._text = name, []
        elif tag == "select":
            self.names.append(name)
            self._select, self._options = name, []

    def handle_data(self, data):
        if self._textarea:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "form":
            self.inside = False
        elif tag == "textarea" and self._textarea:
            text = "".join(self._text)
            self.posted.append((self._textarea, text[1:] if text.startswith("\n") else text))
            self._textarea = None
        elif tag == "select" and self._select:
            chosen = [v for v, selected in self._options if selected] or [
                v for v, _ in self._options[:1]
            ]
            self.posted.extend((self._select, v) for v in chosen[:1])
            self._select = None


def form_post(html: str, action: str, typed: dict[str, str]) -> dict[str, list[str]]:
    """What the form posting to `action` in `html` sends with `typed` typed into it; a name
    the rendered form does not have fails the test."""
    reader = _FormReader(action)
    reader.feed(html)
    assert reader.found, f"no form posts to {action}"
    unknown = set(typed) - set(reader.names)
    assert not unknown, f"the form has no field {sorted(unknown)}, only {reader.names}"
    data: dict[str, list[str]] = {}
    for name, value in reader.posted:
        data.setdefault(name, []).append(value)
    for name, value in typed.items():
        data[name] = [value]
    return data


def kept(html: str) -> list[tuple[str, str]]:
    """The (label, text) pairs a late decision's card keeps to copy."""
    block = re.search(r'<div class="unsent">(.*?)</div>', html, re.S)
    if block is None:
        return []
    pairs = re.findall(
        r"<label>(.*?) <textarea[^>]*>(.*?)</textarea></label>", block.group(1), re.S
    )
    return [(unescape(label), unescape(text)) for label, text in pairs]


_late_rows = iter(range(1, 1_000_000))


def make_row(kind: str, data: dict, calls=()) -> ApprovalRequest:
    """A pending request of the demo agent made directly (no model turn)."""
    n = next(_late_rows)
    run = Run.objects.create(agent="demo", prompt=f"late decision {n}", status="pending")
    row = ApprovalRequest.objects.create(
        run=run, agent="demo", request_id=f"late-{n}", kind=kind, prompt=f"late {n}", data=data
    )
    for position, (call_id, tool, input) in enumerate(calls):
        row.calls.create(position=position, call_id=call_id, tool_name=tool, input=input)
    return row


def decided_first(row: ApprovalRequest) -> None:
    response = session_client(make_user(role="reviewer")).post(
        url(row, "decline"), {"reason": "first"}
    )
    assert response.status_code == 302
    assert fresh_row(row).state == "declined"


def sent_too_late(client, row, action, typed, *, page=None, extra=None):
    """Fill in the form posting to `action` as `page` (default: the request in the inbox)
    shows it, let another reviewer decide first, then send it with htmx."""
    if page is None:
        page = client.get(f"/?r={row.request_id}").content.decode()
    data = form_post(page, url(row, action), typed) | (extra or {})
    decided_first(row)
    return client.post(url(row, action), data, headers=HX)


def test_a_late_edit_keeps_the_changed_arguments_under_their_names(reviewer, halted):
    _, row = halted
    late = session_client(reviewer)
    card = late.get(f"/?r={row.request_id}").content.decode()
    edit = form_post(card, url(row, "edit"), {"field.amount": "120"})
    decided_first(row)

    response = late.post(url(row, "edit"), edit, headers=HX)
    assert response["X-Toolnexus-Outcome"] == "unsent"
    # the argument as the editor labelled it; the order, left as it was, is not typing
    assert kept(response.content.decode()) == [("amount", "120")]
    page = late.post(url(row, "edit"), edit)  # without JavaScript: the request's page
    assert page.status_code == 409
    assert kept(page.content.decode()) == [("amount", "120")]
    assert "field.amount" not in page.content.decode().split('class="unsent"')[1][:400]
    assert fresh_row(row).reason != "120" and len(decisions_of(fresh_row(row))) == 1


def test_a_late_edit_that_changed_nothing_keeps_nothing(reviewer, halted):
    _, row = halted
    response = sent_too_late(session_client(reviewer), row, "edit", {})
    assert response["X-Toolnexus-Outcome"] == "warning"  # nothing to lose: the inbox moves on
    assert kept(response.content.decode()) == []


def test_a_late_approval_of_edited_arguments_keeps_them(reviewer, halted):
    _, row = halted
    late = session_client(reviewer)
    card = late.get(f"/?r={row.request_id}").content.decode()
    preview = late.post(
        url(row, "edit"), form_post(card, url(row, "edit"), {"field.amount": "120"}), headers=HX
    ).content.decode()
    response = sent_too_late(late, row, "approve", {}, page=preview)
    assert response["X-Toolnexus-Outcome"] == "unsent"
    [(label, text)] = kept(response.content.decode())
    assert label == "Your edited arguments"
    assert json.loads(text) == {"order": "A-1001", "amount": 120}


def test_a_late_approval_of_unchanged_arguments_keeps_nothing(reviewer, halted):
    _, row = halted
    late = session_client(reviewer)
    card = late.get(f"/?r={row.request_id}").content.decode()
    preview = late.post(
        url(row, "edit"), form_post(card, url(row, "edit"), {}), headers=HX
    ).content.decode()
    assert "No changes" in preview
    response = sent_too_late(late, row, "approve", {}, page=preview)
    assert response["X-Toolnexus-Outcome"] == "warning"
    assert kept(response.content.decode()) == []


def test_a_late_typed_result_is_kept(reviewer):
    email = {"to": "a@example.com", "subject": "Hi", "body": "Hello"}
    row = make_row(
        "tool_call",
        {"calls": [{"id": "c1", "name": "send_email", "input": email, "arguments": ""}]},
        [("c1", "send_email", email)],
    )
    typed = {"output": "Sent by hand at 9:05"}
    response = sent_too_late(session_client(reviewer), row, "output", typed)
    assert response["X-Toolnexus-Outcome"] == "unsent"
    assert kept(response.content.decode()) == [("Your result", "Sent by hand at 9:05")]


def test_late_per_call_decisions_keep_results_and_reasons_under_the_tool_names(reviewer, two_calls):
    _, row = two_calls
    late = session_client(reviewer)
    card = late.get(f"/?r={row.request_id}").content.decode()
    typed = {
        "decision.call_refund": "decline",
        "reason.call_refund": "over the limit",
        "decision.call_email": "output",
        "output.call_email": "mailed it myself",
    }
    response = sent_too_late(late, row, "calls", typed, page=card)
    assert response["X-Toolnexus-Outcome"] == "unsent"
    assert kept(response.content.decode()) == [
        ("Your reason for refund", "over the limit"),
        ("Your result for send_email", "mailed it myself"),
    ]


def test_a_late_answer_keeps_what_was_typed_for_questions_without_options(reviewer):
    questions = [
        {"question": "Which plan?", "header": "Plan", "options": [{"label": "basic"}, "pro"]},
        {"question": "When should we call the customer?", "header": "Call"},
    ]
    row = make_row("question", {"questions": questions})
    typed = {"q.0": "pro", "q.1": "Monday, after 10"}
    response = sent_too_late(session_client(reviewer), row, "respond", typed)
    assert response["X-Toolnexus-Outcome"] == "unsent"
    # the typed answer under its question; a choice between given options is not typing
    assert kept(response.content.decode()) == [
        ("When should we call the customer?", "Monday, after 10")
    ]


BOOKING_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name on the booking"},
        "party_size": {"type": "integer", "title": "Party size", "default": 2},
        "seating": {"type": "string", "enum": ["inside", "terrace"]},
        "vegan": {"type": "boolean", "title": "Vegan menu"},
        "note": {"type": "string"},
    },
    "required": ["name"],
}


@pytest.mark.parametrize("kind", ["input", "elicitation"])
def test_a_late_form_answer_keeps_each_typed_field_under_its_label(reviewer, kind):
    data = {"schema": BOOKING_SCHEMA}
    if kind == "elicitation":
        data |= {"server": "tables", "tool": "book_table", "input": {"time": "19:30"}}
    row = make_row(kind, data)
    late = session_client(reviewer)
    card = late.get(f"/?r={row.request_id}").content.decode()
    typed = {
        "field.name": "Ada Lovelace",
        "field.party_size": "4",
        "field.seating": "terrace",
        "field.vegan": "on",
        "field.note": "",
    }
    response = sent_too_late(late, row, "respond", typed, page=card)
    assert response["X-Toolnexus-Outcome"] == "unsent"
    assert kept(response.content.decode()) == [
        ("Name on the booking", "Ada Lovelace"),
        ("Party size", "4"),
    ]


def test_a_late_decision_taking_over_a_claim_keeps_no_hidden_field(reviewer, halted):
    _, row = halted
    takeover = {"takeover": ["1"]}  # what inbox-keys.js adds
    response = sent_too_late(session_client(reviewer), row, "decline", {}, extra=takeover)
    assert response["X-Toolnexus-Outcome"] == "warning"
    assert kept(response.content.decode()) == []


def test_unknown_request_is_404(reviewer):
    client = session_client(reviewer)
    assert client.post("/requests/nope/decline/", {"reason": "x"}).status_code == 404
    assert client.get("/requests/nope/").status_code == 404


@pytest.mark.parametrize(
    "target",
    ["https://evil.example/phish", "//evil.example/", "http://testserver.evil.example/"],
)
def test_an_external_next_is_ignored(reviewer, halted, target):
    _, row = halted
    response = session_client(reviewer).post(url(row, "decline"), {"reason": "x", "next": target})
    assert response.status_code == 302
    assert response["Location"] == "/"


# -- escaping ------------------------------------------------------------------------------


def test_hostile_html_in_prompt_arguments_and_reason_is_escaped(reviewer, mock_agent):
    mock_agent.tool_input = {"order": HOSTILE_SCRIPT, "amount": 5}
    run = services.run_start(
        agent="mocked", prompt=f"Refund {HOSTILE_IMG} {HOSTILE_SCRIPT}", started_by=reviewer
    )
    drain()
    row = pending(fresh(run))
    client = session_client(reviewer)

    inbox = client.get(f"/?r={row.request_id}").content.decode()
    assert HOSTILE_SCRIPT not in inbox
    assert HOSTILE_IMG not in inbox
    assert ESCAPED_IMG in inbox  # the prompt
    assert inbox.count(ESCAPED_SCRIPT) >= 2  # the prompt and the arguments

    response = client.post(url(row, "decline"), {"reason": f"no {HOSTILE_IMG}"}, headers=HX)
    card = response.content.decode()
    assert HOSTILE_IMG not in card
    assert ESCAPED_IMG in card

    drain()
    assert fresh(run).status == "done"
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert HOSTILE_SCRIPT not in page
    assert HOSTILE_IMG not in page
    assert ESCAPED_SCRIPT in page
    assert ESCAPED_IMG in page
    # the model's reply quotes the reason; it is shown as text too
    assert re.search(r"Final answer</h2>\s*<div class=\"text md\"><p>[^<]*&lt;img src=x", page)


# -- approve with edits --------------------------------------------------------------------


def test_edit_preview_shows_a_diff_then_approve_runs_the_edited_arguments(reviewer, halted):
    run, row = halted
    client = session_client(reviewer)
    inbox = client.get(f"/?r={row.request_id}").content.decode()
    assert url(row, "edit") in inbox
    assert 'name="field.amount"' in inbox

    preview = client.post(
        url(row, "edit"), {"field.order": "A-1001", "field.amount": "99"}, headers=HX
    )
    assert preview.status_code == 200
    html = preview.content.decode()
    assert '<table class="diff">' in html
    diff_row = re.search(r'<tr class="changed">.*?</tr>', html, re.S).group(0)
    assert "<code>amount</code>" in diff_row
    assert "<code>250</code>" in diff_row
    assert "<code>99</code>" in diff_row
    assert "order" not in diff_row
    assert "Approve with these arguments" in html
    assert fresh_row(row).state == "pending"  # a preview decides nothing

    hidden = re.search(r'name="input" value="([^"]*)"', html).group(1)
    edited = json.loads(hidden.replace("&quot;", '"'))
    assert edited == {"order": "A-1001", "amount": 99}

    response = client.post(url(row, "approve"), {"input": json.dumps(edited)}, headers=HX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Approved.</p>" not in html and "<strong>Approved with edits</strong> by" in html
    call = RequestCall.objects.get(request=row)
    assert call.decision == "edit"
    assert call.edited_input == {"order": "A-1001", "amount": 99}
    assert fresh_row(row).state == "approved"

    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "refund issued: $99 to order A-1001"


def test_edit_preview_without_changes_says_so(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).post(
        url(row, "edit"), {"field.order": "A-1001", "field.amount": "250"}, headers=HX
    )
    html = response.content.decode()
    assert '<table class="diff">' not in html
    assert "No changes" in html


@pytest.mark.parametrize(
    ("amount", "expected"),
    [("-5", "amount"), ("lots", "amount: not a valid number"), ("20000", "amount")],
)
def test_invalid_edits_name_the_field_and_change_nothing(reviewer, halted, amount, expected):
    _, row = halted
    client = session_client(reviewer)
    events_before = Event.objects.count()

    response = client.post(
        url(row, "edit"), {"field.order": "A-1001", "field.amount": amount}, headers=HX
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert '<table class="diff">' not in html
    notice = re.search(r'<p class="notice error" role="alert">(.*?)</p>', html, re.S)
    assert notice, html
    assert notice.group(1).startswith("Not approved:")
    assert expected in notice.group(1)

    # without htmx: the request's page with the same message, the editor open as typed
    response = client.post(url(row, "edit"), {"field.order": "A-1001", "field.amount": amount})
    assert response.status_code == 400
    page = response.content.decode()
    assert expected in page and "<!doctype html>" in page
    assert f'value="{amount}"' in page

    row = fresh_row(row)
    assert row.state == "pending"
    call = RequestCall.objects.get(request=row)
    assert call.decision == ""
    assert call.edited_input is None
    assert Event.objects.count() == events_before


def test_approve_with_invalid_edited_json_changes_nothing(reviewer, halted):
    _, row = halted
    client = session_client(reviewer)
    response = client.post(url(row, "approve"), {"input": "{not json"}, headers=HX)
    assert "not valid JSON" in response.content.decode()
    response = client.post(
        url(row, "approve"), {"input": json.dumps({"order": "A-1001", "amount": -1})}, headers=HX
    )
    assert "amount" in response.content.decode()
    assert fresh_row(row).state == "pending"


def test_approval_edit_with_an_empty_account_is_refused(reviewer):
    run = start_and_halt(user=reviewer, prompt="Please delete the account of this customer")
    row = pending(run)
    assert row.kind == "approval"
    response = session_client(reviewer).post(url(row, "edit"), {"field.account": ""}, headers=HX)
    html = response.content.decode()
    assert "Not approved:" in html
    assert "account" in html
    assert fresh_row(row).state == "pending"


# -- per-call decisions (two calls in one turn) --------------------------------------------


@pytest.fixture
def two_calls(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund order A-1001 $40 and email the customer")
    row = pending(run)
    assert [c.call_id for c in row.calls.order_by("position")] == ["call_refund", "call_email"]
    return run, row


def test_two_call_card_offers_a_decision_per_call(reviewer, two_calls):
    _, row = two_calls
    html = session_client(reviewer).get(f"/?r={row.request_id}").content.decode()
    assert url(row, "calls") in html
    for name in [
        "decision.call_refund",
        "decision.call_email",
        "output.call_email",
        "reason.call_refund",
    ]:
        assert f'name="{name}"' in html
    assert "Submit decisions" in html
    assert "Decline all" in html


def test_per_call_decline_and_typed_output_reach_the_model(reviewer, two_calls):
    run, row = two_calls
    client = session_client(reviewer)
    response = client.post(
        url(row, "calls"),
        {
            "decision.call_refund": "decline",
            "reason.call_refund": "needs a manager",
            "decision.call_email": "output",
            "output.call_email": "email sent by hand",
            "next": "/",
        },
    )
    assert response.status_code == 302
    assert "Decisions sent." in toasts(client.get("/").content.decode())
    row = fresh_row(row)
    assert row.state == "answered"
    calls = {c.call_id: c for c in row.calls.all()}
    assert calls["call_refund"].decision == "decline"
    assert calls["call_refund"].reason == "needs a manager"
    assert calls["call_email"].decision == "output"

    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: needs a manager"
    assert tool_output(run, "call_email") == "email sent by hand"
    assert "needs a manager" in run.text


def test_per_call_approve_one_decline_the_other(reviewer, two_calls):
    run, row = two_calls
    response = session_client(reviewer).post(
        url(row, "calls"),
        {
            "decision.call_refund": "approve",
            "decision.call_email": "decline",
            "reason.call_email": "we phone instead",
        },
        headers=HX,
    )
    assert response.status_code == 200
    assert "You sent your decisions on refund and send_email" in response.content.decode()
    assert fresh_row(row).state == "approved"
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "refund issued: $40 to order A-1001"
    assert tool_output(run, "call_email") == "relay declined for send_email: we phone instead"


def test_per_call_approve_without_an_executor_is_refused(reviewer, two_calls):
    _, row = two_calls
    response = session_client(reviewer).post(
        url(row, "calls"),
        {"decision.call_refund": "approve", "decision.call_email": "approve"},
        headers=HX,
    )
    html = response.content.decode()
    assert 'class="notice error"' in html
    assert "send_email has no executor here" in html
    row = fresh_row(row)
    assert row.state == "pending"
    assert {c.decision for c in row.calls.all()} == {""}


def test_decline_all_declines_every_call(reviewer, two_calls):
    run, row = two_calls
    session_client(reviewer).post(url(row, "decline"), {"reason": "not today"})
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "relay declined for refund: not today"
    assert tool_output(run, "call_email") == "relay declined for send_email: not today"


# -- questions -----------------------------------------------------------------------------


def test_question_answer_flow(reviewer):
    run = start_and_halt(user=reviewer, prompt="Please ask the customer a question first")
    row = pending(run)
    assert row.kind == "question"
    client = session_client(reviewer)
    html = client.get(f"/?r={row.request_id}").content.decode()
    assert url(row, "respond") in html
    assert "Which plan should the customer move to?" in html
    assert 'name="q.0" value="pro"' in html

    missing = client.post(url(row, "respond"), {}, headers=HX).content.decode()
    assert "Answer every question (missing: Which plan should the customer move to?)" in missing
    assert fresh_row(row).state == "pending"

    response = client.post(url(row, "respond"), {"q.0": "pro", "next": "/"})
    assert response.status_code == 302
    assert "Answer sent." in toasts(client.get("/").content.decode())
    row = fresh_row(row)
    assert row.state == "answered"
    assert row.answer["data"] == {"answers": {"Which plan should the customer move to?": "pro"}}

    drain()
    run = fresh(run)
    assert run.status == "done"
    assert "pro" in run.text


# -- the run page --------------------------------------------------------------------------


def test_run_page_shows_the_timeline_with_the_decision_and_reviewer(reviewer, halted):
    run, row = halted
    client = session_client(reviewer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Waiting for a decision" in page
    assert url(row, "decline") in page
    assert 'ws-connect="/ws/runs/' in page

    client.post(url(row, "decline"), {"reason": "amount exceeds policy"})
    drain()
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Waiting for a decision" not in page
    assert "status-done" in page
    assert '<li class="step step-user">' in page
    assert "Refund order A-1001, $250" in page
    assert "<code>refund</code>" in page
    note = re.search(r'<div class="decision-note">(.*?)</div>', page, re.S)
    assert note, page
    assert f"<strong>Declined</strong> by {reviewer.username} <time" in note.group(1)
    assert "amount exceeds policy" in note.group(1)
    assert "relay declined for refund: amount exceeds policy" in page
    final = re.search(r"Final answer</h2>\s*<div class=\"text md\"><p>([^<]*)</p>", page)
    assert final and "amount exceeds policy" in final.group(1)


def test_watcher_sees_the_run_page_without_controls(reviewer, halted):
    run, _ = halted
    page = session_client(make_user(role="watcher")).get(f"/runs/{run.pk}/").content.decode()
    assert "Waiting for a decision" in page
    assert "/decline/" not in page
    assert "Cancel this run" not in page


def test_missing_run_is_404(reviewer):
    assert session_client(reviewer).get("/runs/999999/").status_code == 404


def test_retry_button_on_a_failed_run(reviewer, mock_agent):
    mock_agent.fail = True
    run = services.run_start(agent="mocked", prompt="Refund B-7 $9", started_by=reviewer)
    drain()
    run = fresh(run)
    assert run.status == "failed"

    watcher_page = session_client(make_user(role="watcher")).get(f"/runs/{run.pk}/")
    assert "The run failed." in watcher_page.content.decode()
    assert f"/runs/{run.pk}/retry/" not in watcher_page.content.decode()

    client = session_client(reviewer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "The run failed." in page
    assert f'action="/runs/{run.pk}/retry/"' in page
    assert ">Retry</button>" in page

    mock_agent.fail = False
    response = client.post(f"/runs/{run.pk}/retry/")
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/"
    page = client.get(response["Location"]).content.decode()
    assert "Queued again" in toasts(page)
    assert fresh(run).status == "queued"

    drain()
    assert fresh(run).status == "pending"  # the model answered this time and halted


def test_retry_of_a_run_that_did_not_fail_warns(reviewer, halted):
    run, _ = halted
    client = session_client(reviewer)
    response = client.post(f"/runs/{run.pk}/retry/")
    assert response.status_code == 302
    assert 'class="toast warning"' in toasts(client.get(response["Location"]).content.decode())
    assert fresh(run).status == "pending"


def test_watcher_cannot_retry_or_cancel(reviewer, halted):
    run, _ = halted
    client = session_client(make_user(role="watcher"))
    assert client.post(f"/runs/{run.pk}/retry/").status_code == 403
    assert client.post(f"/runs/{run.pk}/cancel/").status_code == 403
    assert fresh(run).status == "pending"


def test_cancel_stops_the_run_and_its_request(reviewer, halted):
    run, row = halted
    client = session_client(reviewer)
    response = client.post(f"/runs/{run.pk}/cancel/", {"confirmed": "1"})
    assert response.status_code == 302
    assert fresh(run).status == "cancelled"
    assert fresh_row(row).state == "cancelled"
    assert "Run cancelled." in toasts(client.get(response["Location"]).content.decode())


def test_run_list(reviewer, halted):
    run, _ = halted
    page = session_client(reviewer).get("/runs/").content.decode()
    assert f'href="/runs/{run.pk}/"' in page
    assert "status-pending" in page


# -- the start page ------------------------------------------------------------------------


def test_start_page_renders_the_form(reviewer):
    page = session_client(reviewer).get("/runs/new/").content.decode()
    assert '<option value="demo" selected>' in page
    assert 'name="prompt"' in page


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"agent": "demo", "prompt": ""}, "prompt: must be a non-empty string"),
        ({"agent": "demo", "prompt": "   "}, "prompt: must be a non-empty string"),
        ({"agent": "no-such-agent", "prompt": "hi"}, "no agent named"),
        ({"agent": "demo", "prompt": "x" * 20_001}, "prompt: must be at most 20000 characters"),
    ],
)
def test_start_page_validation(reviewer, data, message):
    response = session_client(reviewer).post("/runs/new/", data)
    assert response.status_code == 400
    html = response.content.decode()
    assert '<p class="notice error" role="alert">' in html
    assert message in html
    assert Run.objects.count() == 0


def test_start_page_keeps_the_typed_prompt_on_error(reviewer):
    response = session_client(reviewer).post(
        "/runs/new/", {"agent": "no-such-agent", "prompt": "keep <b>me</b>"}
    )
    assert response.status_code == 400
    assert "keep &lt;b&gt;me&lt;/b&gt;</textarea>" in response.content.decode()


def test_start_page_starts_a_run_and_redirects_to_it(reviewer):
    response = session_client(reviewer).post(
        "/runs/new/", {"agent": "demo", "prompt": "Refund order A-1001, $250"}
    )
    assert response.status_code == 302
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/"
    assert run.started_by == reviewer
    drain()
    assert fresh(run).status == "pending"


# -- inbox: filters, pagination, htmx partial, query count ---------------------------------


def _halt_many(user, n: int, prompt: str = "Refund order A-{i:04d}, $5") -> list[Run]:
    runs = [
        services.run_start(agent="demo", prompt=prompt.format(i=1000 + i), started_by=user)
        for i in range(n)
    ]
    drain()
    return runs


def _card_ids(html: str) -> list[str]:
    """The inbox's rows (one per request; the selected one's card is in the detail pane)."""
    return re.findall(r'<li id="row-(\d+)"', html)


def test_inbox_filters_by_kind_agent_and_state(reviewer, halted):
    _, refund = halted
    question = pending(start_and_halt(user=reviewer, prompt="ask a question please"))
    session_client(reviewer).post(url(refund, "decline"), {"reason": "no"})
    refund2 = pending(start_and_halt(user=reviewer, prompt="Refund order A-2002, $5"))
    client = session_client(reviewer)

    def ids(query: str) -> set[int]:
        return {int(i) for i in _card_ids(client.get(f"/?{query}").content.decode())}

    assert ids("") == {question.pk, refund2.pk}
    assert ids("kind=question") == {question.pk}
    assert ids("kind=tool_call") == {refund2.pk}
    assert ids("agent=demo") == {question.pk, refund2.pk}
    assert ids("agent=other") == set()
    assert ids("state=declined") == {refund.pk}
    assert ids("state=all") == {question.pk, refund.pk, refund2.pk}
    assert ids("state=bogus") == {question.pk, refund2.pk}  # falls back to pending

    empty = client.get("/?agent=other").content.decode()
    assert "No requests match these filters" in empty
    # the live socket gets the same filters
    assert 'ws-connect="/ws/inbox/?agent=other&amp;page=1"' in empty


def test_inbox_paginates_after_twenty(reviewer):
    _halt_many(reviewer, 23)
    client = session_client(reviewer)
    first = client.get("/").content.decode()
    assert len(_card_ids(first)) == 20
    assert "page 1 of 2" in first
    assert 'rel="next"' in first
    second = client.get("/?state=pending&page=2").content.decode()
    assert len(_card_ids(second)) == 3
    assert "page 2 of 2" in second
    assert 'rel="prev"' in second
    assert not set(_card_ids(first)) & set(_card_ids(second))
    assert ApprovalRequest.objects.filter(state="pending").count() == 23
    # newest first
    newest = ApprovalRequest.objects.order_by("-created_at", "-id").first()
    assert _card_ids(first)[0] == str(newest.pk)


def test_inbox_with_htmx_answers_only_the_request_list(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).get("/?kind=tool_call", headers=HX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<section id="request-list"')
    assert f'id="row-{row.pk}"' in html
    assert "HX-Request" in response.get("Vary", "")


def test_empty_inbox_invites_a_demo_run(reviewer):
    html = session_client(reviewer).get("/").content.decode()
    assert "Nothing waiting for you" in html
    assert 'href="/runs/new/"' in html


def test_request_card_view(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).get(f"/requests/{row.request_id}/", headers=HX)
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith(f'<article id="request-{row.pk}"')


def _inbox_queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/?state=all")
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_inbox_query_count_does_not_grow_with_rows(reviewer):
    client = session_client(reviewer)
    runs = _halt_many(reviewer, 3, prompt="Refund order A-{i:04d} $5 and email them")
    # decided rows too: the decided_by join and the per-call decisions must be prefetched
    row = pending(fresh(runs[0]))
    services.request_decline(request_id=row.request_id, user=reviewer, reason="no")
    client.get("/")  # warm up caches (content types, permissions)
    few = _inbox_queries(client)

    more = _halt_many(reviewer, 22, prompt="Refund order A-{i:04d} $5 and email them")
    for run in more[:5]:
        services.request_decline(request_id=pending(fresh(run)).request_id, user=reviewer)
    many = _inbox_queries(client)
    assert ApprovalRequest.objects.count() == 25
    assert many == few, f"{few} queries for 3 rows, {many} for 25"


# -- a record reviewers can trust: own decisions, signed out, forbidden --------------------


def test_an_htmx_decline_is_confirmed_as_the_reviewers_own(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).post(
        url(row, "decline"), {"reason": "no refunds on Sundays"}, headers=HX
    )
    assert response.status_code == 200
    assert response["X-Toolnexus-Outcome"] == "success"
    html = response.content.decode()
    toast = re.search(r'<div hx-swap-oob="beforeend:#toasts">(.*?)</div>', html, re.S).group(1)
    assert f'data-request="request-{row.pk}"' in toast
    assert "You declined: no refunds on Sundays" in toast
    assert "Already" not in html


def test_an_htmx_approve_says_you_approved_the_tool(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).post(url(row, "approve"), {"confirmed": "1"}, headers=HX)
    assert response.status_code == 200
    assert response["X-Toolnexus-Outcome"] == "success"
    assert "You approved refund" in response.content.decode()


def test_a_stale_htmx_decline_is_a_warning_for_the_page(reviewer, halted):
    _, row = halted
    session_client(reviewer).post(url(row, "decline"), {"reason": "first"}, headers=HX)
    response = session_client(make_user()).post(url(row, "decline"), {"reason": " "}, headers=HX)
    assert response["X-Toolnexus-Outcome"] == "warning"  # nothing typed: the inbox moves on
    html = response.content.decode()
    assert f"Already declined by {reviewer.username}" in html
    assert "Not sent" not in html


def test_an_htmx_post_from_a_signed_out_page_is_401_not_the_sign_in_page(client, halted):
    _, row = halted
    response = client.post(url(row, "decline"), {"reason": "x"}, headers=HX)
    assert response.status_code == 401
    assert "signed out" in response.content.decode()
    assert "<form" not in response.content.decode()
    assert "Location" not in response
    # a GET from a signed-out page (filters, reloading a card) too; without htmx: the redirect
    assert client.get("/?state=all", headers=HX).status_code == 401
    assert client.post(url(row, "decline"), {"reason": "x"}).status_code == 302
    assert fresh_row(row).state == "pending"


def test_a_forbidden_decision_names_the_missing_permission(reviewer, halted):
    _, row = halted
    watcher = session_client(make_user(role="watcher"))
    response = watcher.post(url(row, "decline"), {"reason": "watcher"})
    assert response.status_code == 403
    html = response.content.decode()
    assert '<header class="top">' in html  # a page of the app
    assert (
        "You need the permission &#x27;Can approve, answer or decline requests&#x27; "
        "(approvals.decide_request) to do this. Ask an administrator" in html
    )
    # htmx: the message alone, for the page's banner
    response = watcher.post(url(row, "decline"), {"reason": "watcher"}, headers=HX)
    assert response.status_code == 403
    assert response.content.decode().startswith(
        '<p class="notice error" role="alert" data-denied>You need'
    )
    assert fresh_row(row).state == "pending"


@pytest.mark.parametrize(
    ("role", "path", "permission"),
    [
        ("watcher", "/runs/new/", "approvals.add_run"),
        ("nobody", "/", "approvals.view_approvalrequest"),
        ("nobody", "/runs/", "approvals.view_run"),
    ],
)
def test_a_forbidden_page_names_the_missing_permission(role, path, permission):
    response = session_client(make_user(role=role)).get(path)
    assert response.status_code == 403
    html = response.content.decode()
    assert f"({permission}) to do this" in html
    assert "Ask an administrator" in html


def test_api_403_stays_json(halted):
    _, row = halted
    response = session_client(make_user(role="nobody")).get(f"/api/requests/{row.request_id}")
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/json")
    assert "detail" in response.json()

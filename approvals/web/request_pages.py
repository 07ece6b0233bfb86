"""A request's pages and decisions: its card and own page, and the decisions posted from the
card (approve, decline, results, answers, edits). Every action is a plain form POST that works
without JavaScript; with htmx the same POST answers with the card's new HTML."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from .. import permissions, selectors, services
from ..domain.arguments import diff
from ..domain.exceptions import AlreadyDecided, NotAllowed, ServiceError
from ..domain.jsonvalues import strict_json_loads
from ..models import ApprovalRequest
from ..permissions import (
    can_decide,
    can_decide_request,
    hidden_agents,
    permission_needed,
)
from ..presenters import cards, fields, pages
from .render import confirm_page, next_url, render_page

VIEW_REQUESTS = permissions.VIEW_REQUESTS
VIEW_RUNS = permissions.VIEW_RUNS
START = permissions.START_PERMISSION
DECIDE = permissions.DECIDE_PERMISSION


@require_GET
@login_required
@permission_required(VIEW_REQUESTS, raise_exception=True)
def request_card(request: HttpRequest, request_id: str) -> HttpResponse:
    """The card alone (htmx swaps it back in, e.g. the edit preview's Back)."""
    row = get_request_or_404(request_id, request.user)
    return render_card(request, row)


@require_GET
@login_required
@permission_required(VIEW_REQUESTS, raise_exception=True)
@vary_on_headers("HX-Request")
def request_detail(request: HttpRequest, request_id: str) -> HttpResponse:
    """A request's own page: the link a notification or a chat message points to."""
    row = get_request_or_404(request_id, request.user)
    if request.htmx and not request.htmx.history_restore_request:
        return render_card(request, row)
    return request_page(request, row)


def request_page(
    request: HttpRequest, row: ApprovalRequest, card=None, *, status: int = 200
) -> HttpResponse:
    """The detail pane as a page of its own (the same parts as in the inbox)."""
    context = {
        **pages.detail_context(request.user, row, card=card, list_url=pages.list_url({})),
        "nav": "inbox",
        "request_page": True,
        "next_url": reverse("approvals:request-detail", args=[row.request_id]),
    }
    return render_page(request, "approvals/request_detail.html", context, status=status)


def get_request_or_404(request_id: str, user) -> ApprovalRequest:
    """The request, or 404 (also when its agent is hidden from `user`)."""
    try:
        return selectors.request_get(request_id=request_id, hidden_agents=hidden_agents(user))
    except ApprovalRequest.DoesNotExist:
        raise Http404("no such request") from None


def render_card(
    request: HttpRequest, row: ApprovalRequest, *, message: str = "", level: str = "info", card=None
) -> HttpResponse:
    card = card or cards.request_card(
        row, can_decide=can_decide_request(request.user, row), message=message, level=level
    )
    return render_page(
        request, "approvals/inbox.html#request-card", {"card": card, "next_url": next_url(request)}
    )


def _decide(
    request: HttpRequest, request_id: str, action: Callable[[], object], done: str
) -> HttpResponse:
    """Run a decision service and answer: the card in place (htmx) or a redirect (forms)."""
    try:
        row = action()
    except ApprovalRequest.DoesNotExist:
        raise Http404("no such request") from None
    except NotAllowed as exc:
        # Per-agent access or the starter rule say why; without the permission, name it.
        if request.user.has_perm(DECIDE):
            raise PermissionDenied(str(exc)) from None
        raise PermissionDenied(permission_needed(DECIDE)) from None
    except AlreadyDecided as exc:
        message = cards.nothing_changed(exc.state, exc.decided_by, exc.decided_at)
        return _too_late(request, request_id, message)
    except ServiceError as exc:
        return decision_outcome(request, request_id, str(exc), "error")
    partial = getattr(row, "partial_approval", None)
    if partial is not None:  # counted toward the approvers a rule requires: the card stays
        return decision_outcome(
            request, request_id, f"Your approval counts: {partial.message}.", "info"
        )
    return decision_outcome(request, request_id, done, "success")


def _too_late(request: HttpRequest, request_id: str, message: str) -> HttpResponse:
    """Somebody decided first. When this reviewer had typed something (a reason, a result,
    an edit, an answer: cards.typed_texts reads the form as the card showed it), the decided
    card says who and holds what was typed to copy (outcome "unsent": the inbox keeps this
    card open instead of moving on; without htmx, the request's page, 409). Nothing typed:
    a warning, and the inbox moves on."""
    row = get_request_or_404(request_id, request.user)
    card = cards.request_card(
        row, can_decide=can_decide_request(request.user, row), message=message, level="warning"
    )
    card.late = True
    card.unsent = cards.typed_texts(card, request.POST)
    if not card.unsent:
        return decision_outcome(request, request_id, message, "warning", card=card)
    if not request.htmx:
        return request_page(request, row, card, status=409)
    return decision_outcome(request, request_id, message, "unsent", card=card)


OUTCOME_HEADER = "X-Toolnexus-Outcome"


STATE_HEADER = "X-Toolnexus-State"


def decision_outcome(
    request: HttpRequest, request_id: str, message: str, level: str, *, card=None
) -> HttpResponse:
    if not request.htmx and level == "success" and _shows_decided_card(request, request_id):
        # Said once: the page it goes back to shows the decided card, whose footer says it
        # ("Approved by reviewer"), so no "Approved." message besides.
        return redirect(next_url(request))
    if request.htmx:
        # htmx swaps only 2xx answers: the status lives in the card's message instead, and in
        # a header the page reads (approvals/app.js): "success" or "warning" means the request
        # is decided now (by this reviewer, or already by someone else), so the inbox drops
        # the card and moves focus to the next one; "error" keeps what was typed; "unsent"
        # (decided by someone else, after this reviewer typed) keeps the card open. A toast
        # says it too: a decision as the reviewer's own ("You declined: ..."; the deciding
        # tab shows this one, not the live push's), a warning or error in case a live update
        # already removed the card (the loser of a race sees who won either way).
        row = card.row if card is not None else get_request_or_404(request_id, request.user)
        # Said once: a decision of one's own reads in the card's footer ("Approved by ...")
        # and the toast, not a third time as the card's notice.
        own = level == "success" and row.state != ApprovalRequest.State.PENDING
        shown = "" if own else message
        response = render_card(request, row, message=shown, level=level, card=card)
        response[OUTCOME_HEADER] = level
        response[STATE_HEADER] = row.state  # the inbox keeps the card if it lists that state
        if level == "unsent":  # the card stays open and says it (the inbox moves on otherwise)
            return response
        toast = cards.own_toast(row, row.relay_tool_names()) if own else message
        toast_context = {
            "text": toast,
            "level": "warning" if level == "unsent" else level,
            "role": "status" if level == "success" else "alert",
            "about": f"request-{row.pk}",
        }
        response.write(render_to_string("approvals/_live.html#toast", {"toast": toast_context}))
        return response
    getattr(messages, level)(request, message)
    return redirect(next_url(request))


def _shows_decided_card(request: HttpRequest, request_id: str) -> bool:
    """Whether the page a form decision returns to shows this request's card, decided: its
    own page, or the inbox with it selected (`r`); the card's footer says who decided."""
    target = urlsplit(next_url(request))
    own_page = target.path == reverse("approvals:request-detail", args=[request_id])
    selected = target.path == reverse("approvals:inbox") and parse_qs(target.query).get("r") == [
        request_id
    ]
    if not (own_page or selected):
        return False
    return get_request_or_404(request_id, request.user).state != ApprovalRequest.State.PENDING


def _decision_view(fn):
    # Permission first: nothing a watcher posts is parsed (a deep JSON value included).
    return require_POST(login_required(permission_required(DECIDE, raise_exception=True)(fn)))


@_decision_view
def request_approve(request: HttpRequest, request_id: str) -> HttpResponse:
    raw = request.POST.get("input")
    # "Always allow" ticked: its scope (the service refuses it without "manage rules").
    always_allow = (
        request.POST.get("always_allow_scope", "args") if request.POST.get("always_allow") else None
    )
    try:
        edited = strict_json_loads(raw) if raw else None
    except ValueError as exc:
        return decision_outcome(
            request, request_id, f"The edited arguments are not valid JSON: {exc}", "error"
        )
    if not request.POST.get("confirmed") and can_decide(request.user):
        row = get_request_or_404(request_id, request.user)
        if (
            row.state == ApprovalRequest.State.PENDING
            and can_decide_request(request.user, row)
            and cards.request_card(row, can_decide=True).needs_confirmation
        ):
            return confirm_page(
                request,
                title=f"Approve: {row.prompt}",
                detail="The agent's tool runs as soon as you confirm. It cannot be undone.",
                action=reverse("approvals:request-approve", args=[request_id]),
                button="Yes, approve",
            )
    return _decide(
        request,
        request_id,
        lambda: services.request_approve(
            request_id=request_id, user=request.user, input=edited, always_allow=always_allow
        ),
        "Approved." if always_allow is None else "Approved, and allowed from now on (a rule).",
    )


@_decision_view
def request_output(request: HttpRequest, request_id: str) -> HttpResponse:
    output = request.POST.get("output", "")
    return _decide(
        request,
        request_id,
        lambda: services.request_approve(request_id=request_id, user=request.user, output=output),
        "Result sent.",
    )


@_decision_view
def request_decline(request: HttpRequest, request_id: str) -> HttpResponse:
    reason = request.POST.get("reason", "")
    return _decide(
        request,
        request_id,
        lambda: services.request_decline(request_id=request_id, user=request.user, reason=reason),
        "Declined.",
    )


@_decision_view
def request_calls(request: HttpRequest, request_id: str) -> HttpResponse:
    """Per-call decisions for a request carrying several relay calls."""
    row = get_request_or_404(request_id, request.user)
    calls = {}
    for call in row.calls.all():
        decision = request.POST.get(f"decision.{call.call_id}", "")
        spec = {"decision": decision}
        if decision == "output":
            spec["output"] = request.POST.get(f"output.{call.call_id}", "")
        elif decision == "decline":
            spec["reason"] = request.POST.get(f"reason.{call.call_id}", "")
        calls[call.call_id] = spec
    return _decide(
        request,
        request_id,
        lambda: services.request_approve(request_id=request_id, user=request.user, calls=calls),
        "Decisions sent.",
    )


@_decision_view
def request_respond(request: HttpRequest, request_id: str) -> HttpResponse:
    """Answer a question (one choice per question) or an input form built from data.schema."""
    row = get_request_or_404(request_id, request.user)
    if row.kind == "question":
        questions = cards.request_card(row, can_decide=True).questions
        answers, problem = cards.question_answers(questions, request.POST)
        if problem and row.state == ApprovalRequest.State.PENDING:
            return decision_outcome(request, request_id, problem, "error")
        data = {"answers": answers}
    else:
        schema = cards.form_schema(row)
        data, problems = fields.values_from(schema, request.POST)
        if not problems:  # against the schema (the service checks it all again)
            problems = services.input_problems(data, schema)
        # Decided meanwhile: the service says by whom, and the answer typed stays to copy.
        pending = row.state == ApprovalRequest.State.PENDING
        if problems and pending and can_decide_request(request.user, row):
            return _form_not_sent(request, row, schema, "; ".join(problems))
    return _decide(
        request,
        request_id,
        lambda: services.request_approve(request_id=request_id, user=request.user, input=data),
        "Answer sent.",
    )


def _form_not_sent(
    request: HttpRequest, row: ApprovalRequest, schema, problems: str
) -> HttpResponse:
    """An answer form that does not fit its schema: the card again, saying what is wrong
    and holding what the reviewer typed (the request's page, status 400, without htmx)."""
    card = cards.request_card(row, can_decide=True, message=f"Not sent: {problems}", level="error")
    card.input_fields = fields.fields_from_post(schema, {}, request.POST)
    if not request.htmx:
        return request_page(request, row, card, status=400)
    return decision_outcome(request, row.request_id, card.message, "error", card=card)


@require_http_methods(["POST"])
@login_required
def request_edit(request: HttpRequest, request_id: str) -> HttpResponse:
    """Step one of approving with edits: validate and show the diff; step two is approve."""
    row = get_request_or_404(request_id, request.user)
    if not can_decide(request.user):
        raise PermissionDenied("you do not have permission to decide requests")
    if not can_decide_request(request.user, row):
        try:  # per-agent access or the starter rule: the service's words say which
            permissions.require_decide_request(request.user, row)
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
    call = row.calls.first()
    if call is None:
        return decision_outcome(
            request, request_id, "This request has no arguments to edit.", "error"
        )
    schema = services.tool_schema(row.agent, call.tool_name)
    edited, problems = fields.values_from(schema, request.POST)
    problems += services.input_problems(edited, schema)
    if problems and row.state == ApprovalRequest.State.PENDING:
        # The editor stays open with what the reviewer typed, and says what is wrong.
        card = cards.request_card(
            row, can_decide=True, message="Not approved: " + "; ".join(problems), level="error"
        )
        card.edit_open = True
        card.calls[0].fields = fields.fields_from_post(schema, call.input, request.POST)
        if not request.htmx:  # the request's page, the editor open as the reviewer left it
            return request_page(request, row, card, status=400)
        return render_page(
            request,
            "approvals/inbox.html#request-card",
            {"card": card, "next_url": next_url(request)},
        )
    if row.state != ApprovalRequest.State.PENDING:
        message = cards.nothing_changed(row.state, row.decided_by, row.decided_at)
        return _too_late(request, request_id, message)
    card = cards.request_card(row, can_decide=True)
    context = {
        "card": card,
        "tool_name": call.tool_name,
        "edited": edited,
        "changes": diff(call.input, edited),
        "next_url": next_url(request),
    }
    return render_page(request, "approvals/inbox.html#edit-preview", context)

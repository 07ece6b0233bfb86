"""Reviewer pages. Each view parses, calls one service or selector, and renders.

Every action is a plain form POST that works without JavaScript (post/redirect/get with a
flash message); with htmx the same POST answers with the card's new HTML, swapped in place.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseServerError,
    JsonResponse,
)
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import defaults
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from .. import agents, permissions, selectors, services
from ..conf import app_settings
from ..domain.arguments import diff
from ..domain.exceptions import AlreadyDecided, InvalidInput, NotAllowed, ServiceError
from ..domain.jsonvalues import strict_json_loads
from ..models import ApprovalRequest, Run
from ..permissions import (
    can_decide,
    can_decide_request,
    can_decide_run,
    can_view_agent,
    hidden_agents,
    permission_needed,
)
from ..presenters import cards, fields, pages
from ..presenters.pages import run_context_for
from .middleware import signed_out_for_htmx
from .mounts import is_api_request

VIEW_REQUESTS = permissions.VIEW_REQUESTS
VIEW_RUNS = permissions.VIEW_RUNS
START = permissions.START_PERMISSION
DECIDE = permissions.DECIDE_PERMISSION


def _render(
    request: HttpRequest, template: str, context: dict | None = None, status: int = 200
) -> HttpResponse:
    """`render`, with the template the app's pages sit in (TOOLNEXUS_BASE_TEMPLATE, which
    approvals/base.html extends)."""
    context = {"approvals_base_template": app_settings.BASE_TEMPLATE, **(context or {})}
    return render(request, template, context, status=status)


def app_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Every page of the app (approvals/web/urls.py): a refusal is the app's own 403 page,
    whatever the project's handler403, and an htmx request from a signed-out page gets 401
    instead of the sign-in page swapped into the inbox (whether or not the project has
    RequestGuardMiddleware)."""

    @wraps(view)
    def page(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            response = view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return permission_denied(request, exc)
        return signed_out_for_htmx(request, response)

    return page


def websocket_only(request: HttpRequest, **kwargs) -> HttpResponse:
    """The live pages' socket URLs (approvals:live-inbox, approvals:live-run) as named URLs,
    so templates reverse them wherever the app is mounted; plain HTTP gets 426."""
    response = HttpResponse(
        "This URL is a websocket.", status=426, content_type="text/plain; charset=utf-8"
    )
    response["Upgrade"] = "websocket"
    return response


def api_not_found(request: HttpRequest) -> HttpResponse:
    """Any URL under the API's mount that no endpoint matches (e.g. an id with a "/" in it):
    JSON, whatever the project's handler404."""
    return JsonResponse({"detail": "Not Found: no endpoint at this URL"}, status=404)


# -- inbox ---------------------------------------------------------------------------------


@require_GET
@login_required
@permission_required(VIEW_REQUESTS, raise_exception=True)
@vary_on_headers("HX-Request", "HX-Target")
def inbox(request: HttpRequest) -> HttpResponse:
    """The triage inbox: a compact list (filters, search, sort and chips in the URL) and the
    selected request (`r=`) in a detail pane. htmx asks for a part: the list (filters,
    chips, pages) or the detail pane (a row clicked); a history restore gets the page."""
    partial = request.htmx and not request.htmx.history_restore_request
    if partial and request.htmx.target == "detail":
        asked = pages.selected_id(request.GET)
        row = pages.selected_row(request.user, asked)
        query = pages.inbox_query(request.GET).as_params()
        context = pages.detail_context(
            request.user, row, list_url=pages.list_url(query), asked_id=asked
        )
        context["next_url"] = pages.list_url({**query, **({"r": row.request_id} if row else {})})
        return _render(request, "approvals/inbox.html#detail", context)
    if partial:
        context = pages.list_context(request.user, request.GET, request.GET.get("page"))
        return _render(request, "approvals/inbox.html#list-update", context)
    context = pages.inbox_context(request.user, request.GET, request.GET.get("page"))
    return _render(request, "approvals/inbox.html", context)


@require_GET
@login_required
@permission_required(VIEW_REQUESTS, raise_exception=True)
def request_card(request: HttpRequest, request_id: str) -> HttpResponse:
    """The card alone (htmx swaps it back in, e.g. the edit preview's Back)."""
    row = _get_request(request_id, request.user)
    return _render_card(request, row)


@require_GET
@login_required
@permission_required(VIEW_REQUESTS, raise_exception=True)
@vary_on_headers("HX-Request")
def request_detail(request: HttpRequest, request_id: str) -> HttpResponse:
    """A request's own page: the link a notification or a chat message points to."""
    row = _get_request(request_id, request.user)
    if request.htmx and not request.htmx.history_restore_request:
        return _render_card(request, row)
    return _request_page(request, row)


def _request_page(
    request: HttpRequest, row: ApprovalRequest, card=None, *, status: int = 200
) -> HttpResponse:
    """The detail pane as a page of its own (the same parts as in the inbox)."""
    context = {
        **pages.detail_context(request.user, row, card=card, list_url=pages.list_url({})),
        "nav": "inbox",
        "request_page": True,
        "next_url": reverse("approvals:request-detail", args=[row.request_id]),
    }
    return _render(request, "approvals/request_detail.html", context, status=status)


# -- decisions -----------------------------------------------------------------------------


def _get_request(request_id: str, user) -> ApprovalRequest:
    """The request, or 404 (also when its agent is hidden from `user`)."""
    try:
        return selectors.request_get(request_id=request_id, hidden_agents=hidden_agents(user))
    except ApprovalRequest.DoesNotExist:
        raise Http404("no such request") from None


def _next_url(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return reverse("approvals:inbox")


def _render_card(
    request: HttpRequest, row: ApprovalRequest, *, message: str = "", level: str = "info", card=None
) -> HttpResponse:
    card = card or cards.request_card(
        row, can_decide=can_decide_request(request.user, row), message=message, level=level
    )
    return _render(
        request, "approvals/inbox.html#request-card", {"card": card, "next_url": _next_url(request)}
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
        return _outcome(request, request_id, str(exc), "error")
    partial = getattr(row, "partial_approval", None)
    if partial is not None:  # counted toward the approvers a rule requires: the card stays
        return _outcome(request, request_id, f"Your approval counts: {partial.message}.", "info")
    return _outcome(request, request_id, done, "success")


def _too_late(request: HttpRequest, request_id: str, message: str) -> HttpResponse:
    """Somebody decided first. When this reviewer had typed something (a reason, a result,
    an edit, an answer: cards.typed_texts reads the form as the card showed it), the decided
    card says who and holds what was typed to copy (outcome "unsent": the inbox keeps this
    card open instead of moving on; without htmx, the request's page, 409). Nothing typed:
    a warning, and the inbox moves on."""
    row = _get_request(request_id, request.user)
    card = cards.request_card(
        row, can_decide=can_decide_request(request.user, row), message=message, level="warning"
    )
    card.late = True
    card.unsent = cards.typed_texts(card, request.POST)
    if not card.unsent:
        return _outcome(request, request_id, message, "warning", card=card)
    if not request.htmx:
        return _request_page(request, row, card, status=409)
    return _outcome(request, request_id, message, "unsent", card=card)


OUTCOME_HEADER = "X-Toolnexus-Outcome"
STATE_HEADER = "X-Toolnexus-State"


def _outcome(
    request: HttpRequest, request_id: str, message: str, level: str, *, card=None
) -> HttpResponse:
    if not request.htmx and level == "success" and _shows_decided_card(request, request_id):
        # Said once: the page it goes back to shows the decided card, whose footer says it
        # ("Approved by reviewer"), so no "Approved." message besides.
        return redirect(_next_url(request))
    if request.htmx:
        # htmx swaps only 2xx answers: the status lives in the card's message instead, and in
        # a header the page reads (approvals/app.js): "success" or "warning" means the request
        # is decided now (by this reviewer, or already by someone else), so the inbox drops
        # the card and moves focus to the next one; "error" keeps what was typed; "unsent"
        # (decided by someone else, after this reviewer typed) keeps the card open. A toast
        # says it too: a decision as the reviewer's own ("You declined: ..."; the deciding
        # tab shows this one, not the live push's), a warning or error in case a live update
        # already removed the card (the loser of a race sees who won either way).
        row = card.row if card is not None else _get_request(request_id, request.user)
        # Said once: a decision of one's own reads in the card's footer ("Approved by ...")
        # and the toast, not a third time as the card's notice.
        own = level == "success" and row.state != ApprovalRequest.State.PENDING
        shown = "" if own else message
        response = _render_card(request, row, message=shown, level=level, card=card)
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
    return redirect(_next_url(request))


def _shows_decided_card(request: HttpRequest, request_id: str) -> bool:
    """Whether the page a form decision returns to shows this request's card, decided: its
    own page, or the inbox with it selected (`r`); the card's footer says who decided."""
    target = urlsplit(_next_url(request))
    own_page = target.path == reverse("approvals:request-detail", args=[request_id])
    selected = target.path == reverse("approvals:inbox") and parse_qs(target.query).get("r") == [
        request_id
    ]
    if not (own_page or selected):
        return False
    return _get_request(request_id, request.user).state != ApprovalRequest.State.PENDING


def _decision_view(fn):
    # Permission first: nothing a watcher posts is parsed (a deep JSON value included).
    return require_POST(login_required(permission_required(DECIDE, raise_exception=True)(fn)))


def _confirm(
    request: HttpRequest, *, title: str, detail: str, action: str, button: str, back: str = ""
) -> HttpResponse:
    """The confirmation step of an irreversible action, for forms posted without it (no
    JavaScript; with htmx the button's hx-confirm asked already and posts `confirmed`)."""
    context = {
        "title": title,
        "detail": detail,
        "action": action,
        "button": button,
        "fields": [
            (k, v)
            for k in request.POST
            if k not in ("csrfmiddlewaretoken", "confirmed")
            for v in request.POST.getlist(k)
        ],
        "back": back or _next_url(request),
    }
    return _render(request, "approvals/confirm.html", context)


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
        return _outcome(
            request, request_id, f"The edited arguments are not valid JSON: {exc}", "error"
        )
    if not request.POST.get("confirmed") and can_decide(request.user):
        row = _get_request(request_id, request.user)
        if (
            row.state == ApprovalRequest.State.PENDING
            and can_decide_request(request.user, row)
            and cards.request_card(row, can_decide=True).needs_confirmation
        ):
            return _confirm(
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
    row = _get_request(request_id, request.user)
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
    row = _get_request(request_id, request.user)
    if row.kind == "question":
        questions = cards.request_card(row, can_decide=True).questions
        answers, problem = cards.question_answers(questions, request.POST)
        if problem and row.state == ApprovalRequest.State.PENDING:
            return _outcome(request, request_id, problem, "error")
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
        return _request_page(request, row, card, status=400)
    return _outcome(request, row.request_id, card.message, "error", card=card)


@require_http_methods(["POST"])
@login_required
def request_edit(request: HttpRequest, request_id: str) -> HttpResponse:
    """Step one of approving with edits: validate and show the diff; step two is approve."""
    row = _get_request(request_id, request.user)
    if not can_decide(request.user):
        raise PermissionDenied("you do not have permission to decide requests")
    if not can_decide_request(request.user, row):
        try:  # per-agent access or the starter rule: the service's words say which
            permissions.require_decide_request(request.user, row)
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
    call = row.calls.first()
    if call is None:
        return _outcome(request, request_id, "This request has no arguments to edit.", "error")
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
            return _request_page(request, row, card, status=400)
        return _render(
            request,
            "approvals/inbox.html#request-card",
            {"card": card, "next_url": _next_url(request)},
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
        "next_url": _next_url(request),
    }
    return _render(request, "approvals/inbox.html#edit-preview", context)


# -- runs ----------------------------------------------------------------------------------


@require_GET
@login_required
@permission_required(VIEW_RUNS, raise_exception=True)
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = selectors.run_page(run_id=run_id, hidden_agents=hidden_agents(request.user))
    except Run.DoesNotExist:
        raise Http404("no such run") from None
    context = run_context_for(
        run, can_decide=can_decide_run(request.user, run), viewer=request.user
    )
    draft = request.session.pop("follow_up_draft", None)
    context["can_follow_up"] = request.user.has_perm(START)
    context["follow_up_text"] = draft["text"] if draft and draft.get("run") == run.pk else ""
    return _render(request, "approvals/run_detail.html", context)


@require_GET
@login_required
@permission_required(VIEW_RUNS, raise_exception=True)
def run_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(
        selectors.run_page_list(hidden_agents=hidden_agents(request.user)), 50
    ).get_page(request.GET.get("page"))
    return _render(
        request, "approvals/run_list.html", {"nav": "runs", "runs": page.object_list, "page": page}
    )


@require_http_methods(["GET", "POST"])
@login_required
@permission_required(START, raise_exception=True)
def run_start(request: HttpRequest) -> HttpResponse:
    context = {
        "nav": "start",
        "agents": [a for a in agents.all() if can_view_agent(request.user, a.name)],
        "form_agent": "demo",
        "form_prompt": "",
        "error": "",
    }
    if request.method == "POST":
        context.update(
            form_agent=request.POST.get("agent", ""), form_prompt=request.POST.get("prompt", "")
        )
        try:
            run = services.run_start(
                agent=context["form_agent"],
                prompt=context["form_prompt"],
                started_by=request.user,
                rate_limited=True,
            )
        except InvalidInput as exc:
            context["error"] = str(exc)
            return _render(request, "approvals/run_start.html", context, status=400)
        except services.TooManyRuns as exc:
            context["error"] = f"Not started: {exc}."
            response = _render(request, "approvals/run_start.html", context, status=429)
            response["Retry-After"] = str(exc.retry_after)
            return response
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        return redirect("approvals:run-detail", run.pk)
    return _render(request, "approvals/run_start.html", context)


def _run_action(
    request: HttpRequest, run_id: int, action: Callable[[], object], done: str
) -> HttpResponse:
    try:
        action()
        messages.success(request, done)
    except Run.DoesNotExist:
        raise Http404("no such run") from None
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except ServiceError as exc:
        messages.warning(request, str(exc))
    return redirect("approvals:run-detail", run_id)


@require_POST
@login_required
def run_retry(request: HttpRequest, run_id: int) -> HttpResponse:
    return _run_action(
        request,
        run_id,
        lambda: services.run_retry(run_id=run_id, user=request.user),
        "Queued again: the run resumes from where it stopped.",
    )


@require_POST
@login_required
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    if (
        not request.POST.get("confirmed")
        and can_decide(request.user)
        and selectors.run_page_list(hidden_agents=hidden_agents(request.user))
        .filter(pk=run_id)
        .exists()
    ):
        return _confirm(
            request,
            title=f"Cancel run #{run_id}?",
            detail="The run stops for good and its open request is cancelled. This cannot be undone.",
            action=reverse("approvals:run-cancel", args=[run_id]),
            button="Yes, cancel the run",
            back=reverse("approvals:run-detail", args=[run_id]),
        )
    return _run_action(
        request,
        run_id,
        lambda: services.run_cancel(
            run_id=run_id, user=request.user, reason="cancelled by a reviewer"
        ),
        "Run cancelled.",
    )


# -- error pages -------------------------------------------------------------------------------


def _is_api(request: HttpRequest) -> bool:
    return is_api_request(request)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: JSON under the API, else the app's own page (its header and stylesheet,
    readable on a phone) with a way back to the inbox."""
    if _is_api(request):
        return JsonResponse({"detail": "Not Found: no endpoint at this URL"}, status=404)
    return _render(request, "approvals/404.html", status=404)


def locked_out(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """django-axes' answer to a locked-out sign-in (AXES_LOCKOUT_CALLABLE): a page saying
    for how long, with status 429 and Retry-After."""
    cooloff = settings.AXES_COOLOFF_TIME
    seconds = int(cooloff.total_seconds()) if cooloff else 0
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": max(1, round(seconds / 60)) if seconds else None,
    }
    response = _render(request, "approvals/locked_out.html", context, status=429)
    if seconds:
        response["Retry-After"] = str(seconds)
    return response


def _stylesheet_url() -> str | None:
    """app.css's URL, or None: with DEBUG off the manifest storage raises for a file that
    `collectstatic` did not collect (with no manifest every other page fails: this one must not)."""
    try:
        return staticfiles_storage.url("approvals/app.css")
    except Exception:
        return None


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: JSON under the API, else a page readable on a phone that cannot fail in
    turn. Something is broken when it shows, so it reads nothing that may be: the template
    is rendered without the request (no context processor, user, session or query) and the
    stylesheet's URL is looked up here, guarded; Django's own plain page if even that
    template fails."""
    if _is_api(request):
        return JsonResponse({"detail": "Internal server error"}, status=500)
    try:
        html = render_to_string("approvals/500.html", {"stylesheet": _stylesheet_url()})
    except Exception:
        return defaults.server_error(request)
    return HttpResponseServerError(html)


# What each page or action needs: `permission_required(..., raise_exception=True)` raises a
# PermissionDenied that names nothing, so the 403 page looks the permission up here.
PERMISSION_OF_URL = {
    "inbox": VIEW_REQUESTS,
    "request-card": VIEW_REQUESTS,
    "request-detail": VIEW_REQUESTS,
    "request-approve": DECIDE,
    "request-output": DECIDE,
    "request-edit": DECIDE,
    "request-respond": DECIDE,
    "request-calls": DECIDE,
    "request-decline": DECIDE,
    "run-list": VIEW_RUNS,
    "run-detail": VIEW_RUNS,
    "run-start": START,
    "run-retry": START,
    "run-cancel": DECIDE,
}


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403 that says which permission is missing: a page of the app (htmx requests get just
    the message, which the page shows as a banner; the API keeps JSON)."""
    message = str(exception or "")
    if not message.startswith("You need"):
        match = request.resolver_match
        ours = match is not None and match.app_names[-1:] == ["approvals"]
        perm = PERMISSION_OF_URL.get(match.url_name) if ours else None
        if perm and not request.user.has_perm(perm):
            message = permission_needed(perm)
        elif message:
            message = f"{message[:1].upper()}{message[1:]}. Ask an administrator."
        else:
            message = "Your account may not do this. Ask an administrator."
    if _is_api(request):
        return JsonResponse({"detail": message}, status=403)
    if request.headers.get("HX-Request") == "true":
        return _render(request, "approvals/403.html#denied", {"message": message}, status=403)
    return _render(request, "approvals/403.html", {"message": message}, status=403)

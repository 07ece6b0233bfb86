"""Reviewer pages. Each view parses, calls one service or selector, and renders.

Every action is a plain form POST that works without JavaScript (post/redirect/get with a
flash message); with htmx the same POST answers with the card's new HTML, swapped in place.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
)
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from .. import agents, permissions, selectors, services
from ..domain.exceptions import InvalidInput, NotAllowed, ServiceError
from ..models import Run
from ..permissions import (
    can_decide,
    can_decide_run,
    can_view_agent,
    hidden_agents,
)
from ..presenters import pages
from ..presenters.pages import run_context_for
from .errors import (  # noqa: F401  (the project's settings name the handlers here)
    locked_out,
    not_found,
    permission_denied,
    server_error,
)
from .middleware import signed_out_for_htmx
from .render import confirm_page, render_page

VIEW_REQUESTS = permissions.VIEW_REQUESTS
VIEW_RUNS = permissions.VIEW_RUNS
START = permissions.START_PERMISSION
DECIDE = permissions.DECIDE_PERMISSION


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
        return render_page(request, "approvals/inbox.html#detail", context)
    if partial:
        context = pages.list_context(request.user, request.GET, request.GET.get("page"))
        return render_page(request, "approvals/inbox.html#list-update", context)
    context = pages.inbox_context(request.user, request.GET, request.GET.get("page"))
    return render_page(request, "approvals/inbox.html", context)


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
    return render_page(request, "approvals/run_detail.html", context)


@require_GET
@login_required
@permission_required(VIEW_RUNS, raise_exception=True)
def run_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(
        selectors.run_page_list(hidden_agents=hidden_agents(request.user)), 50
    ).get_page(request.GET.get("page"))
    return render_page(
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
            return render_page(request, "approvals/run_start.html", context, status=400)
        except services.TooManyRuns as exc:
            context["error"] = f"Not started: {exc}."
            response = render_page(request, "approvals/run_start.html", context, status=429)
            response["Retry-After"] = str(exc.retry_after)
            return response
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        return redirect("approvals:run-detail", run.pk)
    return render_page(request, "approvals/run_start.html", context)


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
        return confirm_page(
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

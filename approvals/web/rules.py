"""The Rules page: list, create, edit, switch on or off, delete (the "manage rules"
permission; everyone else gets the 403 page). Writes go through `services.rules`."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from .. import permissions, selectors
from ..domain.exceptions import InvalidInput, NotAllowed
from ..models import Rule
from ..permissions import DECIDE_PERMISSION, permission_needed
from ..presenters.rules import RuleForm, apply_results_view, rule_history_view, rules_page
from ..services import rule_apply as rule_apply_services
from ..services import rules as rule_services
from .render import confirm_page, render_page


def _require_manage(request: HttpRequest) -> None:
    if not request.user.has_perm(rule_services.MANAGE_RULES):
        raise PermissionDenied(permission_needed(rule_services.MANAGE_RULES))


def _rule_or_404(rule_id: int) -> Rule:
    try:
        return selectors.rule_get(rule_id=rule_id)
    except Rule.DoesNotExist:
        raise Http404("no such rule") from None


def _rule_page(request: HttpRequest, rule: Rule) -> dict:
    """What a rule's page shows beside its form: its history and its last matches."""
    hidden = permissions.hidden_agents(request.user)
    recent = selectors.rule_recent_decisions([rule.pk], per_rule=20, hidden_agents=hidden)
    return {
        "rule": rule,
        "history": rule_history_view(selectors.rule_history(rule_id=rule.pk)),
        "recent": recent.get(rule.pk, []),
    }


@require_http_methods(["GET", "POST"])
@login_required
def rule_list(request: HttpRequest) -> HttpResponse:
    """The rules in the order they are tried, and a form for a new one."""
    _require_manage(request)
    form = RuleForm(request.POST or None, prefix="new")
    if request.method == "POST" and form.is_valid():
        try:
            rule = rule_services.rule_create(user=request.user, **form.rule_fields())
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        messages.success(request, f"Rule {rule.pk}, {rule.name}, created.")
        return redirect("approvals:rule-list")
    status = 400 if request.method == "POST" else 200
    hidden = permissions.hidden_agents(request.user)
    context = {
        "nav": "rules",
        "form": form,
        **rules_page(selectors.rule_list(), hidden_agents=hidden),
    }
    return render_page(request, "approvals/rules.html", context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
def rule_edit(request: HttpRequest, rule_id: int) -> HttpResponse:
    _require_manage(request)
    rule = _rule_or_404(rule_id)
    form = RuleForm(request.POST or None, instance=rule)
    if request.method == "POST" and form.is_valid():
        try:
            saved = rule_services.rule_update(
                user=request.user, rule_id=rule.pk, **form.rule_fields()
            )
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        messages.success(request, f"Rule {saved.pk}, {saved.name}, is at version {saved.version}.")
        return redirect("approvals:rule-list")
    status = 400 if request.method == "POST" else 200
    context = {
        "nav": "rules",
        "form": form,
        **_rule_page(request, rule),
        "dry_run_limit": selectors.DRY_RUN_DEFAULT,
    }
    return render_page(request, "approvals/rule_edit.html", context, status=status)


def _dry_run_limit(raw: str | None) -> int:
    """The dry run's number of requests from the form (default 200, at most 2000)."""
    try:
        limit = int(raw) if raw else selectors.DRY_RUN_DEFAULT
    except ValueError:
        return selectors.DRY_RUN_DEFAULT
    return max(1, min(limit, selectors.DRY_RUN_MAX))


@require_POST
@login_required
def rule_dry_run(request: HttpRequest, rule_id: int) -> HttpResponse:
    """The edit form's rule as typed (not saved) tried on the newest decided requests: the
    edit page again, with what it would have decided; nothing is written."""
    _require_manage(request)
    rule = _rule_or_404(rule_id)
    form = RuleForm(request.POST, instance=selectors.rule_get(rule_id=rule_id))
    limit = _dry_run_limit(request.POST.get("limit"))
    result = None
    if form.is_valid():
        trial = rule_services.rule_unsaved(**form.rule_fields())
        trial.pk, trial.run_id = rule.pk, rule.run_id  # its place and its run, as saved
        hidden = permissions.hidden_agents(request.user)
        result = selectors.rule_dry_run(trial, limit=limit, hidden_agents=hidden)
    context = {
        "nav": "rules",
        "form": form,
        **_rule_page(request, rule),
        "dry_run": result,
        "dry_run_limit": limit,
    }
    return render_page(
        request, "approvals/rule_edit.html", context, status=200 if form.is_valid() else 400
    )


@require_POST
@login_required
def rule_apply(request: HttpRequest, rule_id: int) -> HttpResponse:
    """Apply to pending: the rule decides the pending requests it matches now, each on its
    own; asked to confirm first (the app's confirmation page), then the rule's page lists
    what became of each request."""
    _require_manage(request)
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied(permission_needed(DECIDE_PERMISSION))
    rule = _rule_or_404(rule_id)
    here = reverse("approvals:rule-edit", args=[rule.pk])
    if not request.POST.get("confirmed"):
        return confirm_page(
            request,
            title=f"Apply rule {rule.pk}, {rule.name}, to pending requests?",
            detail=f"Every pending request it matches now is decided by it ({rule.effect}),"
            " as if it had been on when their runs halted. It cannot be undone.",
            action=reverse("approvals:rule-apply", args=[rule.pk]),
            button="Yes, apply it",
            back=here,
        )
    try:
        outcomes = rule_apply_services.rule_apply_pending(user=request.user, rule_id=rule.pk)
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except InvalidInput as exc:
        messages.error(request, str(exc))
        return redirect(here)
    context = {
        "nav": "rules",
        "form": RuleForm(instance=selectors.rule_get(rule_id=rule.pk)),
        **_rule_page(request, selectors.rule_get(rule_id=rule.pk)),
        "dry_run_limit": selectors.DRY_RUN_DEFAULT,
        "applied": apply_results_view(outcomes),
    }
    return render_page(request, "approvals/rule_edit.html", context)


@require_POST
@login_required
def rule_switch(request: HttpRequest, rule_id: int) -> HttpResponse:
    """Switch a rule on or off (`enabled` in the form: "on" or "off")."""
    _require_manage(request)
    rule = _rule_or_404(rule_id)
    enabled = request.POST.get("enabled") == "on"
    saved = rule_services.rule_update(user=request.user, rule_id=rule.pk, enabled=enabled)
    messages.success(request, f"Rule {saved.pk}, {saved.name}, is {'on' if enabled else 'off'}.")
    return redirect("approvals:rule-list")


@require_POST
@login_required
def rule_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    _require_manage(request)
    rule = _rule_or_404(rule_id)
    rule_services.rule_delete(user=request.user, rule_id=rule.pk)
    messages.success(request, f"Rule {rule.pk}, {rule.name}, deleted.")
    return redirect("approvals:rule-list")

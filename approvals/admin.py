"""Admin: everything visible, JSON shown pretty and read-only, changes only through services.

Runs, requests, events and executions of agents a staff user's groups may not see
(per-agent access, `permissions.hidden_agents`) are left out of every list and page; the
agent access rules themselves are edited here ("Agent access")."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.shortcuts import render
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from . import agents, permissions, services
from .domain.arguments import diff
from .domain.exceptions import ServiceError
from .models import (
    AgentAccess,
    AgentPolicy,
    ApiToken,
    ApprovalRequest,
    Event,
    RequestCall,
    RequestHide,
    Run,
    ToolExecution,
)
from .presenters.cards import request_title
from .templatetags.approvals_tags import pretty_json


def _json_text(value) -> str:
    return "(not set)" if value is None else json.dumps(value, ensure_ascii=False, default=str)


def json_block(value) -> str:
    """A JSON value as an indented, escaped block for the admin's read-only fields (styled
    by admin.css: the CSP refuses inline style attributes)."""
    return format_html('<pre class="tn-json">{}</pre>', pretty_json(value))


class ReadOnlyAdmin(admin.ModelAdmin):
    """State changes go through services (with their locks and audit), never a form save.

    `agent_field` names the lookup to the row's agent: rows of agents hidden from the staff
    user are not in the queryset (so neither in lists nor reachable by URL)."""

    agent_field = ""

    class Media:
        css = {"all": ["approvals/admin.css"]}

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        hidden = permissions.hidden_agents(request.user) if self.agent_field else ()
        if hidden:
            qs = qs.exclude(**{f"{self.agent_field}__in": sorted(hidden)})
        return qs

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


class RequestCallInline(admin.TabularInline):
    model = RequestCall
    extra = 0
    can_delete = False
    fields = [
        "position",
        "call_id",
        "tool_name",
        "input_pretty",
        "decision",
        "edits",
        "output",
        "is_error",
        "reason",
    ]
    readonly_fields = fields

    @admin.display(description="input")
    def input_pretty(self, obj):
        return json_block(obj.input)

    @admin.display(description="edits (the model asked → approved)")
    def edits(self, obj):
        if obj.edited_input is None:
            return "—"
        changes = diff(obj.input or {}, obj.edited_input)
        return (
            format_html_join(
                mark_safe("<br>"),
                "{}: {} → {}",
                ((c["key"], _json_text(c["before"]), _json_text(c["after"])) for c in changes),
            )
            or "no change"
        )

    def has_add_permission(self, request, obj=None):
        return False


class DeclineForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=services.MAX_REASON_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Shown to the model. Empty means "declined".',
    )


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    agent_field = "agent"
    list_display = [
        "request_id",
        "kind",
        "agent",
        "state",
        "run_link",
        "short_prompt",
        "created_at",
        "expires_at",
        "decided_by",
        "decided_at",
    ]
    list_filter = ["state", "kind", "agent", "created_at"]
    search_fields = ["request_id", "prompt", "run__prompt", "calls__tool_name", "reason"]
    list_select_related = ["run", "decided_by"]
    date_hierarchy = "created_at"
    inlines = [RequestCallInline]
    actions = ["decline_selected", "expire_selected"]
    fields = [
        "request_id",
        "kind",
        "agent",
        "run",
        "state",
        "prompt",
        "url",
        "data_pretty",
        "expires_at",
        "answer_pretty",
        "reason",
        "decided_by",
        "decided_at",
        "applied_at",
        "created_at",
    ]
    readonly_fields = fields

    @admin.display(description="prompt")
    def short_prompt(self, obj):
        # A relay request's own prompt is machine text for the engine ("relay tool call …
        # to the caller"): show what a reviewer reads on the card instead.
        title = request_title(obj, obj.relay_tool_names())[:80]
        if obj.state == ApprovalRequest.State.PENDING:
            return f"{title} (waiting for a decision)"
        return title

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html('<a href="../run/{}/change/">{}</a>', obj.run_id, obj.run_id)

    @admin.display(description="data")
    def data_pretty(self, obj):
        return json_block(obj.data)

    @admin.display(description="answer")
    def answer_pretty(self, obj):
        return json_block(obj.answer)

    @admin.action(description="Decline selected requests (with a reason)", permissions=["decide"])
    def decline_selected(self, request, queryset):
        if "apply" in request.POST:
            form = DeclineForm(request.POST)
            if form.is_valid():
                self._each(
                    request,
                    queryset,
                    lambda row: services.request_decline(
                        request_id=row.request_id,
                        user=request.user,
                        reason=form.cleaned_data["reason"],
                    ),
                    "declined",
                )
                return None
        else:
            form = DeclineForm()
        return render(
            request,
            "admin/approvals/decline_reason.html",
            {
                "form": form,
                "queryset": queryset,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "opts": self.model._meta,
                "title": "Decline requests",
            },
        )

    @admin.action(description="Expire selected requests now", permissions=["decide"])
    def expire_selected(self, request, queryset):
        self._each(
            request,
            queryset,
            lambda row: services.request_expire(request_id=row.request_id, user=request.user),
            "expired",
        )

    def _each(self, request, queryset, fn, verb: str) -> None:
        done, problems = 0, []
        for row in queryset:
            try:
                fn(row)
                done += 1
            except ServiceError as exc:
                problems.append(str(exc))
        if done:
            self.message_user(request, f"{done} request(s) {verb}.", messages.SUCCESS)
        for problem in problems[:10]:
            self.message_user(request, problem, messages.WARNING)

    def has_decide_permission(self, request):
        return request.user.has_perm(permissions.DECIDE_PERMISSION)


class RequestInline(admin.TabularInline):
    model = ApprovalRequest
    extra = 0
    can_delete = False
    fields = ["request_id", "kind", "state", "prompt", "decided_by", "decided_at", "reason"]
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    agent_field = "agent"
    list_display = [
        "id",
        "agent",
        "status",
        "short_prompt",
        "started_by",
        "created_at",
        "updated_at",
        "attempts",
    ]
    list_filter = ["status", "agent", "created_at"]
    search_fields = ["=id", "prompt", "text", "error"]
    list_select_related = ["started_by"]
    date_hierarchy = "created_at"
    inlines = [RequestInline]
    actions = ["retry_selected"]
    fields = [
        "agent",
        "status",
        "prompt",
        "text",
        "error",
        "usage_pretty",
        "turns",
        "attempts",
        "started_by",
        "created_at",
        "updated_at",
        "finished_at",
        "worker_id",
        "lease_expires_at",
        "messages_pretty",
    ]
    readonly_fields = fields

    @admin.display(description="prompt")
    def short_prompt(self, obj):
        return obj.prompt[:80]

    @admin.display(description="usage")
    def usage_pretty(self, obj):
        return json_block(obj.usage)

    @admin.display(description="transcript")
    def messages_pretty(self, obj):
        return json_block(obj.messages)

    @admin.action(description="Retry selected failed runs", permissions=["retry"])
    def retry_selected(self, request, queryset):
        done = 0
        for run in queryset:
            try:
                services.run_retry(run_id=run.pk, user=request.user)
                done += 1
            except ServiceError as exc:
                self.message_user(request, f"run {run.pk}: {exc}", messages.WARNING)
        if done:
            self.message_user(request, f"{done} run(s) queued again.", messages.SUCCESS)

    def has_add_permission(self, request):
        return False  # runs start through the API or the start page, not a bare form

    def has_retry_permission(self, request):
        return request.user.has_perm(permissions.START_PERMISSION)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    agent_field = "run__agent"
    list_display = ["created_at", "action", "run", "request", "actor", "from_state", "to_state"]
    list_filter = ["action", "created_at"]
    search_fields = ["=run__id", "request__request_id", "actor__username", "action"]
    list_select_related = ["run", "request", "actor"]
    fields = [
        "created_at",
        "action",
        "run",
        "request",
        "actor",
        "from_state",
        "to_state",
        "detail_pretty",
    ]
    readonly_fields = fields

    @admin.display(description="detail")
    def detail_pretty(self, obj):
        return json_block(obj.detail)

    def has_delete_permission(self, request, obj=None):
        return False  # the audit trail is append-only


@admin.register(ToolExecution)
class ToolExecutionAdmin(ReadOnlyAdmin):
    agent_field = "run__agent"
    list_display = ["run", "tool_name", "call_id", "started_at", "finished_at", "is_error"]
    list_filter = ["tool_name", "is_error"]
    search_fields = ["=run__id", "call_id", "tool_name"]


@admin.register(RequestHide)
class RequestHideAdmin(ReadOnlyAdmin):
    """Each reviewer's snoozed (until a time) and ignored (no end) requests: theirs alone."""

    agent_field = "request__agent"
    list_display = ["request", "user", "until", "created_at"]
    list_select_related = ["request", "user"]
    search_fields = ["request__request_id", "user__username"]
    readonly_fields = ["request", "user", "until", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = [
        "prefix",
        "user",
        "name",
        "state",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["revoked_at", "expires_at"]
    list_select_related = ["user"]
    search_fields = ["prefix", "user__username", "name"]
    readonly_fields = [
        "prefix",
        "user",
        "name",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "revoked_reason",
    ]
    exclude = ["key_hash"]
    actions = ["revoke_selected"]

    @admin.display(description="state")
    def state(self, obj):
        return obj.state_at(timezone.now())

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_selected(self, request, queryset):
        count = services.api_tokens_revoke(
            tokens=queryset, reason=f"revoked in the admin by {request.user.get_username()}"
        )
        self.message_user(request, f"{count} token(s) revoked.", messages.SUCCESS)

    def has_revoke_permission(self, request):
        return request.user.has_perm(permissions.perm("change_apitoken"))


class AgentPolicyForm(forms.ModelForm):
    """The agent is picked from the registered ones (a rule for an agent no longer
    registered keeps its name)."""

    class Meta:
        model = AgentPolicy
        fields = ["agent", "starter_cannot_approve"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = [a.name for a in agents.all()]
        current = self.instance.agent if self.instance.pk else ""
        if current and current not in names:
            names.append(current)
        self.fields["agent"] = forms.ChoiceField(
            choices=[(n, n) for n in sorted(names)],
            help_text=AgentPolicy._meta.get_field("agent").help_text,
        )


class AgentAccessInline(admin.TabularInline):
    model = AgentAccess
    extra = 1
    fields = ["group", "can_decide"]
    autocomplete_fields = ["group"]


@admin.register(AgentPolicy)
class AgentPolicyAdmin(admin.ModelAdmin):
    """Per-agent access: with no group listed, the agent follows the global permissions; with
    groups listed, only their members (and superusers) see it, and only groups marked "can
    decide" decide its requests. The global view and decide permissions are still needed."""

    form = AgentPolicyForm
    inlines = [AgentAccessInline]
    list_display = ["agent", "groups_that_view", "groups_that_decide", "starter_cannot_approve"]
    list_filter = ["starter_cannot_approve"]
    search_fields = ["agent", "grants__group__name"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("grants__group")

    @admin.display(description="groups that see it")
    def groups_that_view(self, obj):
        names = [g.group.name for g in obj.grants.all()]
        return ", ".join(names) or "everyone with the view permission"

    @admin.display(description="groups that decide")
    def groups_that_decide(self, obj):
        grants = list(obj.grants.all())
        if not grants:
            return "everyone with the decide permission"
        return ", ".join(g.group.name for g in grants if g.can_decide) or "nobody"

"""Runs, requests (with the decline action), audit events, tool executions, workers' heartbeats
and hidden requests."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.shortcuts import render
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import permissions, services
from ..conf import app_settings
from ..domain.arguments import diff
from ..domain.exceptions import ServiceError
from ..models import (
    ApprovalRequest,
    Event,
    RequestCall,
    RequestHide,
    Run,
    ToolExecution,
    WorkerHeartbeat,
)
from ..presenters.cards import request_title
from .base import ReadOnlyAdmin, json_block, json_text


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
                ((c["key"], json_text(c["before"]), json_text(c["after"])) for c in changes),
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


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    """The workers' signs of life (what /readyz reads): written by the workers alone."""

    list_display = ["worker_id", "host", "pid", "started_at", "beat_at", "beat_age", "state"]
    list_filter = ["host"]
    search_fields = ["worker_id", "host"]
    readonly_fields = ["worker_id", "host", "pid", "started_at", "beat_at", "stopped_at"]

    @admin.display(description="beat", ordering="-beat_at")
    def beat_age(self, obj):
        seconds = (timezone.now() - obj.beat_at).total_seconds()
        return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"

    @admin.display(description="state")
    def state(self, obj):
        if obj.stopped_at is not None:
            return f"stopped {obj.stopped_at:%Y-%m-%d %H:%M:%S}"
        window = app_settings.READY_WORKER_SECONDS or 60
        fresh = (timezone.now() - obj.beat_at).total_seconds() <= window
        return "running" if fresh else "silent (gone?)"


@admin.register(RequestHide)
class RequestHideAdmin(ReadOnlyAdmin):
    """Each reviewer's snoozed (until a time) and ignored (no end) requests: theirs alone."""

    agent_field = "request__agent"
    list_display = ["request", "user", "until", "created_at"]
    list_select_related = ["request", "user"]
    search_fields = ["request__request_id", "user__username"]
    readonly_fields = ["request", "user", "until", "created_at"]

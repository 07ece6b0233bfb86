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

from . import agents, models, permissions, services
from .conf import app_settings
from .domain import hostevents
from .domain.arguments import diff
from .domain.exceptions import ServiceError
from .models import (
    AgentAccess,
    AgentPolicy,
    ApiToken,
    ApprovalGiven,
    ApprovalRequest,
    Event,
    RequestCall,
    RequestHide,
    RequestRequirement,
    Rule,
    Run,
    ToolExecution,
    WebhookDelivery,
    WebhookSubscription,
    WorkerHeartbeat,
)
from .presenters.cards import request_title
from .presenters.notifications import NotificationPreferenceForm
from .presenters.rules import RuleForm
from .services import rules as services_rules
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


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    """Rules, edited as on the Rules page (the same checks; each edit a new version), by
    people with the "manage rules" permission."""

    form = RuleForm
    list_display = ["name", "position", "enabled", "effect", "agent", "tool", "kind", "version"]
    list_filter = ["enabled", "effect", "kind"]
    search_fields = ["name", "agent", "tool", "condition"]
    readonly_fields = ["version", "match_count", "last_matched_at", "created_by", "run"]

    def _may_manage(self, request) -> bool:
        return request.user.has_perm(services_rules.MANAGE_RULES)

    def has_view_permission(self, request, obj=None):
        return self._may_manage(request)

    def has_add_permission(self, request):
        return self._may_manage(request)

    def has_change_permission(self, request, obj=None):
        return self._may_manage(request)

    def has_delete_permission(self, request, obj=None):
        return self._may_manage(request)

    def has_module_permission(self, request):
        return self._may_manage(request) or super().has_module_permission(request)

    def save_model(self, request, obj, form, change):
        fields = form.rule_fields()
        if change:
            saved = services_rules.rule_update(user=request.user, rule_id=obj.pk, **fields)
        else:
            saved = services_rules.rule_create(user=request.user, **fields)
        obj.pk, obj.version = saved.pk, saved.version

    def delete_model(self, request, obj):
        services_rules.rule_delete(user=request.user, rule_id=obj.pk)


# -- webhooks ------------------------------------------------------------------------------


class WebhookSubscriptionForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in hostevents.TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every event type.",
    )

    class Meta:
        model = WebhookSubscription
        fields = ["url", "description", "event_types", "active", "secret"]

    def clean_url(self):
        url = self.cleaned_data["url"]
        if not url.lower().startswith(("http://", "https://")):
            raise forms.ValidationError("Use an http:// or https:// address.")
        return url


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    """A host's endpoint. A new one hears events from its creation on (never the past); its
    secret is made for it and shown here for the host to verify signatures with."""

    form = WebhookSubscriptionForm
    list_display = ["__str__", "url", "types_shown", "active", "last_delivery", "created_at"]
    list_filter = ["active"]
    readonly_fields = ["last_event_id", "created_by", "created_at"]

    class Media:
        css = {"all": ["approvals/admin.css"]}

    def get_changeform_initial_data(self, request):
        return {**super().get_changeform_initial_data(request), "secret": services.webhook_secret()}

    @admin.display(description="events")
    def types_shown(self, obj):
        return ", ".join(obj.event_types) if obj.event_types else "all"

    @admin.display(description="last delivery")
    def last_delivery(self, obj):
        last = obj.deliveries.order_by("-id").first()
        if last is None:
            return "—"
        shown = f"{last.state}"
        return f"{shown}: {last.last_error[:80]}" if last.last_error else shown

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
        else:
            services.webhook_subscribe(obj, created_by=request.user)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """The delivery log: every event sent to every subscription, its attempts and last error.
    "Redeliver" sends the chosen ones again (same webhook id: hosts drop repeats by it)."""

    agent_field = "event__run__agent"
    list_display = [
        "webhook_id",
        "event_type",
        "subscription",
        "state",
        "attempts",
        "last_status",
        "error_shown",
        "next_attempt_at",
        "delivered_at",
    ]
    list_filter = ["state", "event_type", "subscription"]
    list_select_related = ["subscription"]
    readonly_fields = [
        "webhook_id",
        "subscription",
        "event_type",
        "state",
        "attempts",
        "last_status",
        "last_error",
        "last_attempt_at",
        "next_attempt_at",
        "delivered_at",
        "created_at",
        "body",
    ]
    exclude = ["event"]
    actions = ["redeliver"]

    @admin.display(description="webhook id")
    def webhook_id(self, obj):
        return f"evt_{obj.event_id}"

    @admin.display(description="last error")
    def error_shown(self, obj):
        return obj.last_error[:120] or "—"

    @admin.display(description="body sent")
    def body(self, obj):
        return json_block(hostevents.payload(obj.event))

    def has_change_permission(self, request, obj=None):
        # The change page is the read-only detail; the action needs change permission.
        return request.user.has_perm("approvals.change_webhookdelivery")

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields

    @admin.action(description="Redeliver the selected deliveries", permissions=["change"])
    def redeliver(self, request, queryset):
        count = services.webhook_redeliver(list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} delivery(ies) queued again.", messages.SUCCESS)


@admin.register(RequestRequirement)
class RequestRequirementAdmin(ReadOnlyAdmin):
    """What a rule required of a request's deciders, and its escalation (read-only: rules set
    them at the halt, the worker escalates)."""

    agent_field = "request__agent"
    list_display = [
        "request",
        "approvals_needed",
        "approver_group",
        "starter_may_not_approve",
        "escalate_action",
        "escalate_at",
        "escalated_at",
        "routed_user",
        "routed_group",
    ]
    list_select_related = ["request", "approver_group", "routed_user", "routed_group"]
    search_fields = ["request__request_id"]
    readonly_fields = [f.name for f in RequestRequirement._meta.fields if f.name != "id"]


@admin.register(ApprovalGiven)
class ApprovalGivenAdmin(ReadOnlyAdmin):
    """Each approval counted toward the distinct approvers a rule requires."""

    agent_field = "request__agent"
    list_display = ["request", "user", "created_at"]
    list_select_related = ["request", "user"]
    search_fields = ["request__request_id", "user__username"]
    readonly_fields = ["request", "user", "created_at"]


# -- reviewers' notifications -----------------------------------------------------------------


class NotificationPreferenceAdminForm(NotificationPreferenceForm):
    class Meta(NotificationPreferenceForm.Meta):
        fields = ["user", *NotificationPreferenceForm.Meta.fields]

    hide_push_without_keys = False


@admin.register(models.NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    """Each person's notification settings (they edit their own on the Notifications page);
    chat URLs are checked against the allowlist and apprise at save, as there."""

    form = NotificationPreferenceAdminForm
    list_display = [
        "user",
        "email_enabled",
        "chat_enabled",
        "push_enabled",
        "digest_minutes",
        "only_overdue",
    ]
    list_select_related = ["user"]
    raw_id_fields = ["user"]
    readonly_fields = ["last_sent_at", "updated_at"]

    def save_model(self, request, obj, form, change):
        services.notification_save(obj)


@admin.register(models.WebPushSubscription)
class WebPushSubscriptionAdmin(ReadOnlyAdmin):
    """The browsers where people turned push on (they add and remove their own on the
    Notifications page; a push service's 404 or 410 removes one). Keys are not shown."""

    list_display = ["user", "user_agent", "created_at", "last_success_at", "error_shown"]
    list_select_related = ["user"]
    fields = ["user", "endpoint", "user_agent", "created_at", "last_success_at", "last_error"]
    readonly_fields = fields

    @admin.display(description="last error")
    def error_shown(self, obj):
        return obj.last_error[:120] or "—"


@admin.register(models.NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    """Every message sent to a person's channel: its state, attempts and last error (a
    failing channel shows here, and in the log)."""

    list_display = [
        "user",
        "channel",
        "subject",
        "is_test",
        "state",
        "attempts",
        "error_shown",
        "next_attempt_at",
        "delivered_at",
    ]
    list_filter = ["state", "channel", "is_test"]
    list_select_related = ["user"]
    readonly_fields = [
        "user",
        "channel",
        "target",
        "subject",
        "body",
        "url",
        "is_test",
        "state",
        "attempts",
        "last_error",
        "last_attempt_at",
        "next_attempt_at",
        "delivered_at",
        "created_at",
    ]

    @admin.display(description="last error")
    def error_shown(self, obj):
        return obj.last_error[:120] or "—"


@admin.register(models.SlackLink)
class SlackLinkAdmin(ReadOnlyAdmin):
    """Which Slack user decides as which person. Made by that person from a signed link;
    a superuser may remove one (as the person's own "Unlink" does)."""

    list_display = ["user", "slack_name", "slack_user_id", "team_id", "created_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "slack_name", "slack_user_id"]
    readonly_fields = ["user", "slack_name", "slack_user_id", "team_id", "created_at"]


@admin.register(models.SlackMessage)
class SlackMessageAdmin(ReadOnlyAdmin):
    """Each request's message in the team's Slack channel: its state, attempts and last
    error (a failing Slack shows here, and in the log)."""

    agent_field = "request__agent"
    list_display = [
        "request",
        "channel",
        "state",
        "attempts",
        "error_shown",
        "next_attempt_at",
        "posted_at",
    ]
    list_filter = ["state"]
    list_select_related = ["request"]
    readonly_fields = [
        "request",
        "channel",
        "ts",
        "state",
        "attempts",
        "last_error",
        "last_attempt_at",
        "next_attempt_at",
        "posted_at",
        "shown",
        "update_attempts",
        "created_at",
    ]

    @admin.display(description="last error")
    def error_shown(self, obj):
        return obj.last_error[:120] or "—"

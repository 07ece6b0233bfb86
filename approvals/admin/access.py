"""API tokens, agent access for groups, rules, and what rules require of requests (requirements,
approvals given)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from .. import agents, permissions, services
from ..models import (
    AgentAccess,
    AgentPolicy,
    ApiToken,
    ApprovalGiven,
    RequestRequirement,
    Rule,
)
from ..presenters.rules import RuleForm
from ..services import rules as services_rules
from .base import ReadOnlyAdmin


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

    def delete_queryset(self, request, queryset):
        """The changelist's "delete selected": each rule through the service (its audit
        entry), all or none (Django's own would delete the rows with no entry)."""
        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        services_rules.rules_delete(user=request.user, rule_ids=ids)


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

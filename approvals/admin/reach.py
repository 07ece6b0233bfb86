"""Webhook subscriptions and deliveries (redeliver), reviewers' notification preferences and
deliveries, Web Push subscriptions and Slack."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from .. import models, services
from ..domain import hostevents
from ..models import (
    WebhookDelivery,
    WebhookSubscription,
)
from ..presenters.notifications import NotificationPreferenceForm
from .base import ReadOnlyAdmin, json_block

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

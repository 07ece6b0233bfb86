"""Reaching hosts and people: webhook subscriptions and deliveries, reviewers' notification
preferences and messages (email, chat, Web Push), signed links used, and Slack."""

from __future__ import annotations

import base64
import secrets

from django.conf import settings
from django.db import models

from .runs import ApprovalRequest, Event


class WebhookSubscription(models.Model):
    """A host's endpoint that hears the events it subscribed to (`approvals.hostevents`),
    signed per the Standard Webhooks specification with its secret (managed in the admin)."""

    url = models.URLField(max_length=500, help_text="Where events are POSTed (http or https).")
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = models.JSONField(
        default=list,
        blank=True,
        help_text='The event types sent, e.g. ["request.created", "run.finished"]; empty: all.',
    )
    secret = models.CharField(
        max_length=100,
        help_text="The signing secret (whsec_ and base64); the host verifies with it.",
    )
    active = models.BooleanField(default=True)
    # Events up to this one (the audit Event's id) have their deliveries made.
    last_event_id = models.BigIntegerField(default=0, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "webhook subscription"

    def __str__(self) -> str:
        return self.description or self.url

    @staticmethod
    def generate_secret() -> str:
        return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()

    def wants(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types


class WebhookDelivery(models.Model):
    """One event to one subscription: sent until the endpoint answers 2xx or attempts run out.
    The webhook id the host sees (`evt_<event id>`) stays the same over every attempt."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (gave up)"

    subscription = models.ForeignKey(
        WebhookSubscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="+")
    event_type = models.CharField(max_length=50)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.PositiveIntegerField(null=True, blank=True, help_text="HTTP status.")
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "event"], name="webhook_delivery_once_per_event"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} (evt_{self.event_id}) to {self.subscription}"


class NotificationPreference(models.Model):
    """How one reviewer hears of new requests: by email and/or chat (apprise URLs), which
    requests, when (quiet hours) and how often (one message per request, or a digest).
    Nothing is sent unless TOOLNEXUS_NOTIFICATIONS is on."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email_enabled = models.BooleanField("email", default=False)
    email = models.EmailField(
        "email address",
        blank=True,
        default="",
        help_text="Where emails go; empty: the account's address.",
    )
    chat_enabled = models.BooleanField("chat", default=False)
    push_enabled = models.BooleanField(
        "push",
        default=False,
        help_text="Web Push to the browsers where you turned it on (below).",
    )
    chat_urls = models.TextField(
        "chat URLs",
        blank=True,
        default="",
        help_text="Apprise URLs, one a line (e.g. json://chat.example.com/hook); only the"
        " schemes in TOOLNEXUS_NOTIFICATION_CHAT_SCHEMES.",
    )
    agents = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="Agent names, comma-separated; empty: all.",
    )
    kinds = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Request kinds (tool_call, approval, question, ...), comma-separated; empty: all.",
    )
    only_routed = models.BooleanField(
        "only requests routed to me",
        default=False,
        help_text="Only agents whose access lists a group of mine that can decide.",
    )
    only_overdue = models.BooleanField(
        "only overdue requests",
        default=False,
        help_text="Only requests still waiting past their deadline or"
        " TOOLNEXUS_NOTIFICATION_OVERDUE_MINUTES after they arrived.",
    )
    quiet_start = models.TimeField(null=True, blank=True, help_text="Quiet hours from (HH:MM).")
    quiet_end = models.TimeField(null=True, blank=True, help_text="... until (HH:MM).")
    time_zone = models.CharField(
        max_length=64,
        default="UTC",
        help_text="The time zone of the quiet hours, e.g. Europe/Paris.",
    )
    digest_minutes = models.PositiveIntegerField(
        "digest every (minutes)",
        default=0,
        help_text="0: one message per request; else one message every this many minutes"
        " listing what arrived.",
    )
    # When the last message went out (the digest's clock).
    last_sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "notification preference"

    def __str__(self) -> str:
        return f"notifications of {self.user}"

    def chat_url_list(self) -> list[str]:
        return [line.strip() for line in self.chat_urls.splitlines() if line.strip()]

    def agent_list(self) -> list[str]:
        return [a.strip() for a in self.agents.split(",") if a.strip()]

    def kind_list(self) -> list[str]:
        return [k.strip() for k in self.kinds.split(",") if k.strip()]


class NotificationItem(models.Model):
    """A request that reached one person's notifications, waiting for its message (now, after
    the quiet hours, or in the next digest). Kept once sent: a request reaches a person once
    per reason."""

    class Reason(models.TextChoices):
        NEW = "new", "new"
        OVERDUE = "overdue", "overdue"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=20, choices=Reason.choices, default=Reason.NEW)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "request", "reason"], name="notification_item_once"
            )
        ]
        indexes = [models.Index(fields=["user", "sent_at"], name="notification_item_unsent")]


class NotificationDelivery(models.Model):
    """One message to one channel of one person, sent by a task with retries; a failure is
    logged here (last_error) and never holds another channel back."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (gave up)"

    class Channel(models.TextChoices):
        EMAIL = "email", "email"
        CHAT = "chat", "chat"
        PUSH = "push", "push"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_deliveries"
    )
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.TextField(
        help_text="The email address, the apprise URL or the push subscription's endpoint."
    )
    subject = models.CharField(max_length=300)
    body = models.TextField()
    # The page a push opens when clicked (a push carries no text to read a link from).
    url = models.CharField(max_length=500, blank=True, default="")
    # A push's buttons: [{"action": "approve", "title": "Approve", "url": <a signed link>}].
    actions = models.JSONField(default=list, blank=True)
    is_test = models.BooleanField(default=False)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "notification deliveries"

    def __str__(self) -> str:
        return f"{self.channel} to {self.user}: {self.subject}"


class WebPushSubscription(models.Model):
    """One browser (a device, a profile) where a person turned push on: the push service's
    endpoint and the keys that encrypt what is sent to it. An endpoint belongs to one
    browser, so it is unique: the same browser subscribing again updates its row. Removed
    when the push service says it is gone (404, 410)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions"
    )
    endpoint = models.CharField(max_length=1000, unique=True)
    p256dh = models.CharField(max_length=200)
    auth = models.CharField(max_length=100)
    user_agent = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    last_error = models.TextField(blank=True, default="")
    last_success_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "web push subscription"

    def __str__(self) -> str:
        return f"push to {self.user}: {self.user_agent or 'a browser'}"


class NotificationLinkUse(models.Model):
    """A signed email link (approve or decline) that was used: each works once."""

    nonce = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=10)
    used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]


class NotificationCursor(models.Model):
    """One row: the audit rows up to `last_event_id` were turned into notification items."""

    last_event_id = models.BigIntegerField(default=0)


class SlackLink(models.Model):
    """A Slack user (of one workspace) whom a person linked to their account, once, from a
    signed link: that Slack user's Approve / Decline clicks decide as this person."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_links"
    )
    team_id = models.CharField("Slack workspace id", max_length=32)
    slack_user_id = models.CharField("Slack user id", max_length=32)
    slack_name = models.CharField("Slack user name", max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["team_id", "slack_user_id"], name="slack_link_once")
        ]

    def __str__(self) -> str:
        return f"Slack {self.slack_name or self.slack_user_id} ({self.team_id}) = {self.user}"


class SlackMessage(models.Model):
    """A request's message in the team's Slack channel: posted by a task with retries, then
    updated in place (by its channel and ts) with the outcome and who decided."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        POSTED = "posted", "posted"
        FAILED = "failed", "failed (gave up)"

    request = models.OneToOneField(
        ApprovalRequest, on_delete=models.CASCADE, related_name="slack_message"
    )
    channel = models.CharField(max_length=64, help_text="Slack's channel id.")
    ts = models.CharField(max_length=32, blank=True, default="", help_text="Slack's message id.")
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    posted_at = models.DateTimeField(null=True, blank=True)
    # What the message shows now (the request's state and approvals), so that an update is
    # sent only when there is something new to show.
    shown = models.CharField(max_length=100, blank=True, default="")
    update_attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Slack message of request {self.request_id}"


class SlackCursor(models.Model):
    """One row: the audit rows up to `last_event_id` were turned into Slack messages (and
    their updates)."""

    last_event_id = models.BigIntegerField(default=0)

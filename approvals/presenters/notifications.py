"""The Notifications page's form (also the admin's) and what the page shows."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms

from ..conf import app_settings
from ..domain.notifications import allowed_schemes, chat_url_problems
from ..domain.push import push_available
from ..execution import slack
from ..models import NotificationDelivery, NotificationPreference, SlackLink, WebPushSubscription

FIELDS = [
    "email_enabled",
    "email",
    "chat_enabled",
    "chat_urls",
    "push_enabled",
    "agents",
    "kinds",
    "only_routed",
    "only_overdue",
    "quiet_start",
    "quiet_end",
    "time_zone",
    "digest_minutes",
]


class NotificationPreferenceForm(forms.ModelForm):
    """A person's notification settings. Chat URLs outside the allowlist, or that apprise
    cannot use, are refused at the field with the reason; nothing is saved."""

    class Meta:
        model = NotificationPreference
        fields = FIELDS
        widgets = {
            "chat_urls": forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
            "quiet_start": forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
            "quiet_end": forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
        }

    # The page offers push only when the server can send it (the admin shows every field).
    hide_push_without_keys = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.hide_push_without_keys and not push_available():
            del self.fields["push_enabled"]

    def clean_chat_urls(self) -> str:
        text = self.cleaned_data.get("chat_urls", "")
        problems = chat_url_problems(text)
        if problems:
            raise forms.ValidationError(problems)
        return "\n".join(line.strip() for line in text.splitlines() if line.strip())

    def clean_time_zone(self) -> str:
        name = (self.cleaned_data.get("time_zone") or "UTC").strip()
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise forms.ValidationError(f"no time zone {name!r} (e.g. Europe/Paris, UTC)") from None
        return name

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        user = cleaned.get("user") or getattr(self.instance, "user", None)
        address = cleaned.get("email") or getattr(user, "email", "")
        if cleaned.get("email_enabled") and not address:
            self.add_error("email", "your account has no email address: type one here")
        if cleaned.get("chat_enabled") and not cleaned.get("chat_urls") and "chat_urls" in cleaned:
            self.add_error("chat_urls", "add at least one chat URL, or turn chat off")
        if bool(cleaned.get("quiet_start")) != bool(cleaned.get("quiet_end")):
            self.add_error("quiet_end", "give both ends of the quiet hours, or neither")
        return cleaned


def notifications_page(
    form: NotificationPreferenceForm,
    recent: list[NotificationDelivery],
    devices: list[WebPushSubscription],
    slack_links: list[SlackLink] | None = None,
) -> dict[str, Any]:
    return {
        "slack_enabled": slack.enabled(),
        "slack_links": slack_links or [],
        "form": form,
        "recent": recent,
        # The browser's applicationServerKey; None: push is not offered on this server.
        "push_key": app_settings.VAPID_PUBLIC_KEY if push_available() else None,
        "devices": devices,
        "enabled": bool(app_settings.NOTIFICATIONS),
        "schemes": ", ".join(allowed_schemes()),
        "saved": form.instance.pk is not None,
    }

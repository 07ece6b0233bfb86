"""What every admin page of the app shares: JSON shown pretty, read-only pages."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from .. import permissions
from ..templatetags.approvals_tags import pretty_json


def json_text(value) -> str:
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

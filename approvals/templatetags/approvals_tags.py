from __future__ import annotations

import json
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON as text; the template's autoescape keeps hostile strings inert."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@register.filter
def iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else ""


@register.filter
def is_past(value: Any) -> bool:
    return bool(value) and value <= timezone.now()

"""HTML form fields from a tool's JSON schema, and the submitted values back as JSON.

Flat properties get native inputs (text, number, checkbox, select); anything nested is
edited as JSON in a textarea. The service validates the result against the schema again,
so this module only has to be faithful, not strict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..domain.jsonvalues import strict_json_loads


@dataclass
class SchemaField:
    name: str
    widget: str  # "text" | "textarea" | "number" | "integer" | "checkbox" | "select" | "json"
    label: str
    value: Any
    required: bool
    choices: list[Any] | None = None
    help: str = ""
    typed: bool = False  # value is the reviewer's raw text, shown as typed

    @property
    def html_name(self) -> str:
        return f"field.{self.name}"

    @property
    def value_text(self) -> str:
        if self.typed:
            return "" if self.value is None else str(self.value)
        if self.widget == "json":
            return (
                json.dumps(self.value, indent=2, ensure_ascii=False)
                if self.value is not None
                else ""
            )
        return "" if self.value is None else str(self.value)


def _widget(prop: dict[str, Any], value: Any) -> str:
    if isinstance(prop.get("enum"), list):
        return "select"
    kind = prop.get("type")
    if kind == "boolean":
        return "checkbox"
    if kind in ("number", "integer"):
        return kind
    if kind == "string":
        return (
            "textarea"
            if (isinstance(value, str) and (len(value) > 80 or "\n" in value))
            or prop.get("maxLength", 0) > 200
            else "text"
        )
    return "json"


def fields_for(schema: dict[str, Any] | None, values: dict[str, Any]) -> list[SchemaField]:
    """One field per schema property (in schema order), then any extra keys of `values`."""
    props = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or [])
    fields = []
    for name, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        value = values.get(name, prop.get("default"))
        fields.append(
            SchemaField(
                name,
                _widget(prop, value),
                prop.get("title") or name,
                value,
                name in required,
                choices=prop.get("enum"),
                help=prop.get("description", ""),
            )
        )
    for name, value in values.items():
        if name not in props:
            fields.append(SchemaField(name, "json", name, value, False))
    return fields


def values_from(schema: dict[str, Any] | None, post: Any) -> tuple[dict[str, Any], list[str]]:
    """The edited arguments from a POSTed form, and problems that stop parsing."""
    props = (schema or {}).get("properties") or {}
    out: dict[str, Any] = {}
    problems: list[str] = []
    names = list(props) + [k[6:] for k in post if k.startswith("field.") and k[6:] not in props]
    for name in names:
        prop = props.get(name) if isinstance(props.get(name), dict) else {}
        key = f"field.{name}"
        widget = _widget(prop, None) if name in props else "json"
        if widget == "checkbox":
            out[name] = key in post
            continue
        if key not in post:
            continue
        raw = post.get(key, "")
        if raw == "" and widget != "text" and widget != "textarea":
            continue  # left empty: absent (the schema says whether that is allowed)
        try:
            if widget == "integer":
                out[name] = int(raw)
            elif widget == "number":
                number = float(raw)
                if not math.isfinite(number):
                    raise ValueError(raw)
                out[name] = int(number) if number.is_integer() and "." not in raw else number
            elif widget == "json":
                out[name] = strict_json_loads(raw)
            elif widget == "select":
                choices = prop.get("enum") or []
                out[name] = next((c for c in choices if str(c) == raw), raw)
            else:
                out[name] = raw
        except ValueError:
            problems.append(
                f"{name}: not a valid {'number' if widget in ('integer', 'number') else 'JSON value'}"
            )
    return out, problems


def fields_from_post(
    schema: dict[str, Any] | None, original: dict[str, Any], post: Any
) -> list[SchemaField]:
    """The editor's fields holding what the reviewer typed (after an error), not the
    original arguments: nothing typed is thrown away."""
    fields = fields_for(schema, original)
    for f in fields:
        if f.widget == "checkbox":
            f.value = f.html_name in post
        elif f.html_name in post:
            f.value = post.get(f.html_name)
            f.typed = True
    return fields

"""The rules' form (the Rules page and the admin) and how a rule's decision is named."""

from __future__ import annotations

import copy
from typing import Any

from django import forms

from .. import selectors
from ..models import Rule
from ..services.rules import EDITABLE, RuleInvalid, check_requirements, clean_rule_fields


class RuleForm(forms.ModelForm):
    """A rule's fields, checked as the service checks them (a condition that does not compile
    is an error at the field, saying where); saving goes through `services.rules`."""

    class Meta:
        model = Rule
        fields = list(EDITABLE)
        widgets = {
            "condition": forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
            "reason": forms.Textarea(attrs={"rows": 2}),
            "expires_at": forms.DateTimeInput(attrs={"type": "datetime-local"}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Left empty: one approver (the effects that need more say so).
        self.fields["approvals_needed"].required = False

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        if cleaned.get("approvals_needed") is None:
            cleaned["approvals_needed"] = 1
        try:
            fields = clean_rule_fields(
                {k: cleaned.get(k) for k in EDITABLE if k in cleaned}, creating=True
            )
            probe = copy.copy(self.instance)  # the rule as it would be saved
            for name, value in fields.items():
                setattr(probe, name, value)
            check_requirements(probe)
        except RuleInvalid as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
            return cleaned
        cleaned.update(fields)
        return cleaned

    def rule_fields(self) -> dict[str, Any]:
        return {k: self.cleaned_data[k] for k in EDITABLE if k in self.cleaned_data}


def decided_by_rule_text(rule: Any, version: int | None) -> str:
    """How a rule's decision is named on pages ("rule 7, small refunds, version 3")."""
    if rule is None:
        return f"a rule since deleted (version {version})" if version else "a deleted rule"
    return f"rule {rule.pk}, {rule.name}, version {version or rule.version}"


def rules_page(rules: list[Any], *, hidden_agents: Any = ()) -> dict[str, Any]:
    """The Rules page's list: each rule with its newest decisions (of agents the viewer may
    see)."""
    recent = selectors.rule_recent_decisions([r.pk for r in rules], hidden_agents=hidden_agents)
    return {"rules": [{"rule": r, "recent": recent.get(r.pk, [])} for r in rules]}


_HISTORY_VERBS = {
    "rule_created": "created it",
    "rule_edited": "edited it",
    "rule_switched_on": "switched it on",
    "rule_switched_off": "switched it off",
    "rule_deleted": "deleted it",
}


def rule_history_view(events: list[Any]) -> list[dict[str, Any]]:
    """The rule's audit trail as its page lists it: when, who, what they did, and each
    field's value before and after (or, for its creation, as it was set)."""
    out = []
    for event in events:
        detail = event.detail or {}
        if "changes" in detail:
            changes = [(k, before, after) for k, (before, after) in detail["changes"].items()]
        else:
            changes = [(k, None, v) for k, v in (detail.get("fields") or {}).items()]
        out.append(
            {
                "at": event.created_at,
                "who": event.actor.get_username() if event.actor else "the system",
                "verb": _HISTORY_VERBS.get(event.action, event.action),
                "version": (detail.get("rule") or {}).get("version"),
                "created": event.action == "rule_created",
                "changes": changes,
                "source_request": detail.get("source_request"),
            }
        )
    return out


# "Apply to pending": each outcome as the rule's page lists it.
_APPLY_LABELS = {"done": "decided", "already": "skipped: already decided"}


def apply_results_view(outcomes: list[Any]) -> dict[str, Any]:
    """The outcomes of applying a rule to pending requests: a summary line and one line per
    request (decided, skipped: already decided, or failed and why)."""
    lines = [
        {
            "request_id": o.request_id,
            "status": o.status,
            "label": _APPLY_LABELS.get(o.status, "failed"),
            "text": o.message,
        }
        for o in outcomes
    ]
    decided = sum(1 for o in outcomes if o.status == "done")
    skipped = sum(1 for o in outcomes if o.status == "already")
    failed = len(outcomes) - decided - skipped
    if not outcomes:
        summary = "No pending request matches the rule: nothing was decided."
    else:
        summary = f"{decided} decided, {skipped} skipped (already decided), {failed} failed."
    return {"summary": summary, "lines": lines}

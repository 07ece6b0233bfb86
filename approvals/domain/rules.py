"""Which rule decides a gated call: scope, then condition, in order (no database).

A call is described by `CallFacts`; `first_match` walks the rules by position (a decline
before an approve at the same position, then the older rule) and returns the first
enabled, unexpired rule whose scope covers the call and whose condition holds, with the
rules whose condition could not be evaluated (they do not match; the caller logs them).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from .conditions import ConditionFailed, evaluate


@dataclasses.dataclass(frozen=True)
class CallFacts:
    """What a rule looks at: the call and the run it belongs to."""

    agent: str
    tool: str
    kind: str
    args: Any
    run: dict[str, Any]  # id, agent, prompt, started_by (a username or null)
    run_id: int | None = None


@dataclasses.dataclass
class Match:
    rule: Any | None
    failed: list[tuple[Any, str]] = dataclasses.field(default_factory=list)


def order_key(rule: Any) -> tuple[int, int, int]:
    return (rule.position, 0 if rule.effect == "decline" else 1, rule.pk or 0)


def in_scope(rule: Any, facts: CallFacts, now: datetime) -> bool:
    if not rule.enabled or (rule.expires_at is not None and rule.expires_at <= now):
        return False
    if rule.agent and rule.agent != facts.agent:
        return False
    if rule.kind and rule.kind != facts.kind:
        return False
    if rule.run_id is not None and rule.run_id != facts.run_id:
        return False
    return not rule.tool or fnmatch.fnmatchcase(facts.tool, rule.tool)


def first_match(rules: Iterable[Any], facts: CallFacts, now: datetime) -> Match:
    match = Match(rule=None)
    for rule in sorted(rules, key=order_key):
        if not in_scope(rule, facts, now):
            continue
        if rule.condition.strip():
            try:
                holds = evaluate(rule.condition, args=facts.args, run=facts.run)
            except ConditionFailed as exc:
                match.failed.append((rule, str(exc)))
                continue
            if not holds:
                continue
        match.rule = rule
        return match
    return match

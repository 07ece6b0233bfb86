"""Reads of rules and the decisions they made."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Iterable
from typing import Any

from django.utils import timezone

from ..domain.rules import CallFacts, first_match
from ..models import ApprovalRequest, Event, Rule

# -- rules -----------------------------------------------------------------------------------


def rule_decision_view(row: ApprovalRequest) -> dict[str, Any] | None:
    """The rule that decided a request ({id, name, version}; a deleted rule's id and name are
    null), or None when a person (or the system) decided it."""
    if row.rule_version is None:
        return None
    rule = row.decided_by_rule if row.decided_by_rule_id else None
    return {
        "id": row.decided_by_rule_id,
        "name": rule.name if rule is not None else None,
        "version": row.rule_version,
    }


# A rule's groups and person, named in the API and on the Rules page.
REQUIREMENT_NAMES = (
    "approver_group",
    "escalate_group",
    "escalate_user",
    "route_user",
    "route_group",
)


def rule_list() -> list[Any]:
    """Every rule in the order the worker tries them (with who made each)."""
    return list(
        Rule.objects.select_related("created_by", "run", "source_request", *REQUIREMENT_NAMES)
    )


def rule_get(*, rule_id: int) -> Any:
    """One rule, or Rule.DoesNotExist (a 404)."""
    return Rule.objects.select_related("created_by", "source_request", *REQUIREMENT_NAMES).get(
        pk=rule_id
    )


def rule_recent_decisions(
    rule_ids: Iterable[int], *, per_rule: int = 5, hidden_agents: Collection[str] = ()
) -> dict[int, list]:
    """Each rule's newest decisions (requests it decided), newest first; none of an agent
    hidden from the viewer (`hidden_agents`)."""
    out: dict[int, list] = {}
    rows = ApprovalRequest.objects.filter(decided_by_rule__in=list(rule_ids)).order_by(
        "-decided_at", "-id"
    )
    if hidden_agents:
        rows = rows.exclude(agent__in=list(hidden_agents))
    for row in rows.only(
        "pk",
        "request_id",
        "run_id",
        "agent",
        "kind",
        "state",
        "decided_at",
        "decided_by_rule",
        "rule_version",
    )[: 50 * per_rule]:
        listed = out.setdefault(row.decided_by_rule_id, [])
        if len(listed) < per_rule:
            listed.append(row)
    return out


def rule_history(*, rule_id: int, limit: int = 200) -> list[Event]:
    """The rule's audit trail (created, edited, switched, always allowed), newest first."""
    rows = Event.objects.filter(rule_id=rule_id, run__isnull=True).select_related("actor")
    return list(rows.order_by("-created_at", "-id")[:limit])


# -- a stored request as a rule sees it -----------------------------------------------------

RULE_KINDS = ("tool_call", "approval")


def call_facts_of(row: ApprovalRequest) -> CallFacts | None:
    """What a rule looks at for a stored request (its calls and its run read with it), as
    the worker saw it when the run halted; None when no rule decides it (another kind, or a
    turn of several calls)."""
    calls = row.call_list()
    if row.kind not in RULE_KINDS or len(calls) != 1:
        return None
    call, run = calls[0], row.run
    starter = run.started_by.get_username() if run.started_by_id else None
    return CallFacts(
        agent=row.agent,
        tool=call.tool_name,
        kind=row.kind,
        args=call.input,
        run={"id": run.pk, "agent": run.agent, "prompt": run.prompt, "started_by": starter},
        run_id=run.pk,
    )


def rule_pending_candidates(
    *, hidden_agents: Collection[str] = (), limit: int = 5000
) -> list[ApprovalRequest]:
    """Pending requests a rule may decide (oldest first), with their calls, run and claim."""
    rows = (
        ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING, kind__in=RULE_KINDS)
        .exclude(agent__in=list(hidden_agents))
        .select_related("run__started_by", "claimed_by")
        .prefetch_related("calls")
        .order_by("created_at", "id")
    )
    return list(rows[:limit])


# -- dry run ---------------------------------------------------------------------------------

DRY_RUN_DEFAULT = 200
DRY_RUN_MAX = 2000
# What people decided, as a rule's effect would name it.
_PEOPLE = {"approved": "approve", "answered": "approve", "declined": "decline"}


@dataclasses.dataclass
class DryRunItem:
    row: ApprovalRequest
    tool: str
    people: str  # "approve" or "decline": what a person decided
    would: str | None  # the rule's effect when it matches, else None
    error: str = ""  # the condition could not be evaluated for this call

    @property
    def differs(self) -> bool:
        return self.would in ("approve", "decline") and self.would != self.people


@dataclasses.dataclass
class DryRun:
    considered: int = 0
    matched: int = 0
    would_approve: int = 0
    would_decline: int = 0
    differs: int = 0
    failed: int = 0
    items: list[DryRunItem] = dataclasses.field(default_factory=list)  # matched or failed


def rule_dry_run(
    rule: Rule, *, limit: int = DRY_RUN_DEFAULT, hidden_agents: Collection[str] = ()
) -> DryRun:
    """What `rule` (saved, or an unsaved Rule as typed) would have decided over the last
    `limit` requests people decided (a single gated call each: what a rule may decide), and
    where that differs from them. Its scope and condition are tried as if it were on and
    unexpired; only requests of agents the viewer may see are read."""
    limit = max(1, min(int(limit), DRY_RUN_MAX))
    trial = copy.copy(rule)
    trial.enabled, trial.expires_at = True, None
    rows = (
        ApprovalRequest.objects.filter(
            kind__in=RULE_KINDS,
            state__in=list(_PEOPLE),
            decided_by__isnull=False,
        )
        .exclude(agent__in=list(hidden_agents))
        .select_related("run__started_by", "decided_by")
        .prefetch_related("calls")
        .order_by("-decided_at", "-id")[:limit]
    )
    now = timezone.now()
    out = DryRun()
    for row in rows:
        out.considered += 1
        facts = call_facts_of(row)
        if facts is None:
            continue  # a turn of several calls always waits for a person
        match = first_match([trial], facts, now)
        item = DryRunItem(row=row, tool=facts.tool, people=_PEOPLE[row.state], would=None)
        if match.failed:
            out.failed += 1
            item.error = match.failed[0][1]
        elif match.rule is not None:
            item.would = rule.effect
            out.matched += 1
            out.would_approve += rule.effect == "approve"
            out.would_decline += rule.effect == "decline"
            out.differs += item.differs
        else:
            continue
        out.items.append(item)
    return out

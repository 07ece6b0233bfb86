"""Rules decide gated calls inline, where the run would otherwise halt (the engine's
`wait_for`, answering `HALT` for every call no rule decides).

A call a rule decides is recorded as a request decided by that rule (`decided_by_rule`, the
rule's version, an audit event naming both), created already decided and already applied:
nothing waits in the inbox, the run never leaves the worker. An approved relay call's
executor runs then and there (journaled like any other); a decline is the error result the
model reads. A condition that cannot be evaluated for a call does not match: it is logged,
never a decision and never a failed run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from toolnexus import Answer, Request
from toolnexus.relay import RelayResult, answer_declined, relay_answer, relay_calls_of

from .. import events
from ..domain import statements
from ..domain.records import (
    append_event,
    count_decision_on_commit,
    create_request,
    model_reads,
)
from ..domain.rules import CallFacts, first_match
from ..models import ApprovalRequest, Event, RequestCall, Rule, Run
from . import store

log = logging.getLogger(__name__)

State = ApprovalRequest.State
# Kinds a rule may decide: a relay call (its executor runs) and an approval-gated tool.
DECIDABLE_KINDS = ("tool_call", "approval")

# Runs an approved relay call's executor, journaled: (output, is_error).
ExecuteCall = Callable[[RequestCall], tuple[str, bool]]
# Effects that decide nothing: the run halts, its request waits with the rule's
# requirements (require_*) or routed to the rule's person or group (route).
WAITING = (Rule.Effect.REQUIRE_APPROVERS, Rule.Effect.REQUIRE_GROUP, Rule.Effect.ROUTE)


def enabled_rules() -> list[Rule]:
    """The rules a step tries (one query; expiry and scope are checked per call)."""
    return list(Rule.objects.filter(enabled=True))


def facts_of(run: Run, request: Request) -> CallFacts | None:
    """What the rules look at for one suspension, or None when no rule may decide it (another
    kind, or a relay request carrying more than one call)."""
    if request.kind not in DECIDABLE_KINDS:
        return None
    data = request.data if isinstance(request.data, dict) else {}
    if request.kind == "tool_call":
        calls = relay_calls_of(request)
        if len(calls) != 1:
            return None
        tool, args = calls[0].name, calls[0].input
    else:
        tool, args = str(data.get("tool") or ""), data.get("input")
        args = args if isinstance(args, dict) else {}
    started_by = run.started_by.get_username() if run.started_by_id else None
    return CallFacts(
        agent=run.agent,
        tool=tool,
        kind=request.kind,
        args=args,
        run={"id": run.pk, "agent": run.agent, "prompt": run.prompt, "started_by": started_by},
        run_id=run.pk,
    )


class RuleDecider:
    """One step's rules, asked once per suspended call (sync: call it through sync_to_async).
    The rules are read at the step's first decidable suspension: a step that never halts
    pays no query for them."""

    def __init__(self, run: Run, worker_id: str, execute: ExecuteCall):
        self.run, self.worker_id, self.execute = run, worker_id, execute
        self.rules: list[Rule] | None = None
        # Requests a require_* or route rule matched, by request id: they halt, with its
        # requirements or its routing.
        self.required: dict[str, Rule] = {}

    def requirement_for(self, request: Request | None) -> Rule | None:
        """The require_* or route rule the halt on `request` carries (None: an ordinary
        halt)."""
        return self.required.get(request.id) if request is not None else None

    def decide(self, request: Request) -> Answer | None:
        """The rule's answer for this suspension, recorded; None when no rule decides it."""
        if request.kind not in DECIDABLE_KINDS:
            return None
        if self.rules is None:
            self.rules = enabled_rules()
        if not self.rules:
            return None  # no rule: the call's facts (its run's starter, a read) are not needed
        facts = facts_of(self.run, request)
        if facts is None:
            return None
        match = first_match(self.rules, facts, timezone.now())
        for rule, error in match.failed:
            log.warning(
                "run %s: rule %s (%s) could not be evaluated for %s: %s",
                self.run.pk,
                rule.pk,
                rule.name,
                facts.tool,
                error,
            )
        if match.rule is None:
            return None
        if match.rule.effect in WAITING:
            self.required[request.id] = match.rule
            return None  # the run halts; the request records the rule's requirements
        return self._record(match.rule, request)

    def _record(self, rule: Rule, request: Request) -> Answer:
        approve = rule.effect == Rule.Effect.APPROVE
        relay = request.kind == "tool_call"
        answer = None if approve and relay else _answer(rule, request)
        with transaction.atomic():
            store.locked_own_run(self.run.pk, self.worker_id)
            row = create_request(self.run, request)
            row.state = State.APPROVED if approve else State.DECLINED
            row.answer = answer.to_dict() if answer is not None else None
            row.reason = "" if approve else (answer.reason if answer is not None else "")
            row.decided_at = row.applied_at = timezone.now()
            row.decided_by_rule, row.rule_version = rule, rule.version
            row.save(
                update_fields=[
                    "state",
                    "answer",
                    "reason",
                    "decided_at",
                    "applied_at",
                    "decided_by_rule",
                    "rule_version",
                ]
            )
            calls = statements.select(RequestCall, {"request_id": row.pk}, order_by=("position",))
            decision = RequestCall.Decision.APPROVE if approve else RequestCall.Decision.DECLINE
            for call in calls:
                statements.update(
                    RequestCall, {"pk": call.pk}, {"decision": decision, "reason": row.reason}
                )
                call.decision, call.request = decision, row
            Rule.objects.filter(pk=rule.pk).update(
                match_count=F("match_count") + 1, last_matched_at=row.decided_at
            )
            trail: list[Event] = []
            append_event(
                self.run,
                "request_created",
                request=row,
                to_state=State.PENDING,
                prompt=row.prompt,
                into=trail,
            )
            append_event(
                self.run,
                f"request_{row.state}",
                request=row,
                from_state=State.PENDING,
                to_state=row.state,
                into=trail,
                reason=row.reason,
                answer=row.answer,
                rule={"id": rule.pk, "name": rule.name, "version": rule.version},
                model_reads=model_reads(row, answer, row.reason),
            )
            statements.insert(trail)
            count_decision_on_commit(row, "rule")
            events.announce(run_id=self.run.pk, request_pk=row.pk, row=row)
        if answer is None:  # an approved relay call: its executor runs now, journaled
            row.run = self.run
            results = [RelayResult(c.call_id, *self.execute(c)) for c in calls]
            answer = relay_answer(request.id, results)
            store.request_store_answer(request_pk=row.pk, answer=answer)
        return answer


def _answer(rule: Rule, request: Request) -> Answer:
    if rule.effect == Rule.Effect.APPROVE:
        return Answer(id=request.id, ok=True)
    return answer_declined(request.id, rule.reason)

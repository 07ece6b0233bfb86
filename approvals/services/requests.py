"""Decisions on requests, as reviewers and hosts make them: approve (as shown, edited, with
typed results, per call), answer with an `Answer`, decline. Each runs in one transaction with
the request row locked, records every call's decision, appends the audit trail and queues the
run's resume in the SAME transaction (the task queue lives in the same database), so a
decision and the resume it causes commit together or not at all.

An MCP server's question (kind "elicitation") is answered with the content of its form,
checked against the server's requestedSchema first (a 400 naming the field; nothing is
stored), and the server hears `accept` with it; url mode: approving is consent. A decline
is `decline` for the server (the reviewer's reason stays in the record); expiry and a
cancelled run are `cancel`. A refusal given as an `Answer` (`request_answer`) is stored as
given and the engine's rule says what the server hears (`elicit_action`: reason "declined"
is `decline`, any other is `cancel`); the request's state says the same (declined or
cancelled), so the record, the API and the server agree.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import F

from toolnexus import Answer
from toolnexus.mcp import DECLINE_REASON, ELICITATION_KIND, elicit_action, elicitation_errors
from toolnexus.relay import RelayResult, answer_declined, decline_text, relay_answer

from .. import agents
from ..domain import statements
from ..domain.arguments import (
    clean_output,
    clean_reason,
    non_finite,
    validated_input,
)
from ..domain.exceptions import AlreadyDecided, InvalidInput
from ..domain.records import lock_request, record_decision
from ..execution import recovery
from ..execution.runner import enqueue
from ..models import ApprovalRequest, RequestCall, Rule
from ..permissions import DECIDE_PERMISSION, require, require_decide_request
from . import rules
from .approvers import check_requirement

log = logging.getLogger(__name__)

State = ApprovalRequest.State
Decision = RequestCall.Decision


def _decide(row: ApprovalRequest, user: Any, new_state: str, answer: Any, reason: str) -> None:
    """Record the decision and queue the run's resume in the same transaction."""
    if record_decision(row, user, new_state, answer, reason):
        enqueue(row.run_id, request_id=row.request_id)
        # Said once it is true (a decision rolled back was never made), under this request's
        # own ids (a bulk decision's requests each under theirs).
        ids = {"run_id": row.run_id, "request_id": row.request_id}
        transaction.on_commit(
            lambda: log.info(
                "request %s %s; run %s queued to resume",
                row.request_id,
                new_state,
                row.run_id,
                extra=ids,
            )
        )


def _locked_calls(row: ApprovalRequest) -> list[RequestCall]:
    """The request's calls by position, locked for the decision."""
    return statements.select(
        RequestCall, {"request_id": row.pk}, order_by=("position",), for_update=True
    )


# What a decision writes on a call's row.
_DECIDED_CALL_FIELDS = ("decision", "reason", "edited_input", "output", "is_error")


def _save_decided_call(call: RequestCall) -> None:
    statements.update(
        RequestCall, {"pk": call.pk}, {f: getattr(call, f) for f in _DECIDED_CALL_FIELDS}
    )


def lock_for_decision(user: Any, request_id: str, *, approving: bool) -> ApprovalRequest:
    """The pending request under a row lock, if `user` may decide it: per-agent access and
    the starter rule (`permissions.require_decide_request`: 404 for an agent hidden from the
    user, 403 otherwise). Who decided first is told only to those who may decide it."""
    try:
        row = lock_request(request_id)
    except AlreadyDecided:
        stored = ApprovalRequest.objects.only("agent", "run_id").get(request_id=request_id)
        require_decide_request(user, stored, approving=False)
        raise
    require_decide_request(user, row, approving=approving)
    return row


def request_expire(*, request_id: str, user: Any) -> ApprovalRequest:
    """Expire a request by hand (the admin action): declined with reason "expired"."""
    require(user, DECIDE_PERMISSION, "expire requests")
    stored = ApprovalRequest.objects.only("agent", "run_id").get(request_id=request_id)
    require_decide_request(user, stored, approving=False)
    return recovery.request_expire(request_id=request_id, user=user)


def tool_schema(agent_name: str, tool_name: str) -> dict[str, Any] | None:
    agent = agents.get(agent_name)
    return agent.tool_schema(tool_name) if agent is not None else None


def request_approve(
    *,
    request_id: str,
    user: Any,
    input: Any = None,
    output: Any = None,
    calls: Mapping[str, Mapping[str, Any]] | None = None,
    always_allow: str | None = None,
) -> ApprovalRequest:
    """Approve a request: as shown, with edited input, or with a typed output.

    A relay request carrying several calls is decided per call with `calls`:
    `{call_id: {"decision": "approve"|"output"|"decline", "input": ..., "output": ..., "reason": ...}}`;
    calls left out are approved as they are.

    `always_allow` (a scope of `rules.ALWAYS_ALLOW_SCOPES`, the "manage rules" permission)
    also makes an approve rule for this tool and agent, in the decision's transaction.
    """
    require(user, DECIDE_PERMISSION, "decide requests")
    if always_allow is not None:
        rules.require_always_allow(user, always_allow)
    with transaction.atomic():
        row = lock_for_decision(user, request_id, approving=True)
        as_shown = input is None and output is None and not calls
        partial = check_requirement(row, user, approving=True, as_shown=as_shown)
        if partial is not None:  # short of the N approvals a rule requires: still pending
            row.partial_approval = partial
            return row
        if row.is_relay:
            new_state, answer = _decide_relay_calls(row, input=input, output=output, calls=calls)
            reason = ""
        elif row.kind == ELICITATION_KIND:
            if calls:
                raise InvalidInput(
                    "calls: only a relay request (kind tool_call) is decided per call"
                )
            new_state, answer = _decide_elicitation(row, content=input, output=output)
            reason = ""
        else:
            if calls:
                raise InvalidInput(
                    "calls: only a relay request (kind tool_call) is decided per call"
                )
            new_state, answer = _decide_single(row, input=input, output=output)
            reason = ""
        _decide(row, user, new_state, answer, reason)
        if always_allow is not None:
            rules.rule_always_allow(user=user, row=row, scope=always_allow)
    return row


def _decide_single(row: ApprovalRequest, *, input: Any, output: Any) -> tuple[str, Answer]:
    if input is not None and output is not None:
        raise InvalidInput("give either input or output, not both")
    data: dict[str, Any] | None = None
    if row.kind == "approval":
        if output is not None:
            raise InvalidInput("output: an approval runs the tool; edit its input instead")
        original = (row.data or {}).get("input")
        if input is not None and input != original:
            tool = (row.data or {}).get("tool", "")
            data = {"input": validated_input(input, tool_schema(row.agent, tool), "input")}
            RequestCall.objects.filter(request=row).update(
                decision=Decision.EDIT, edited_input=data["input"]
            )
        else:  # as shown (arguments "edited" to what they were are a plain approval)
            RequestCall.objects.filter(request=row).update(decision=Decision.APPROVE)
        return State.APPROVED, Answer(id=row.request_id, ok=True, data=data)
    if input is not None:
        data = validated_input(input, (row.data or {}).get("schema"), "input")
    elif output is not None:
        text = clean_output(output)
        if not text.strip():
            raise InvalidInput("output: type the answer; an empty answer is not sent")
        data = {"output": text}
    return (State.ANSWERED if data else State.APPROVED), Answer(
        id=row.request_id, ok=True, data=data
    )


def _elicitation_problems(row: ApprovalRequest, content: Any, field: str = "input") -> list[str]:
    """What is wrong with `content` as the answer to an MCP server's question (its form's
    schema, and values MCP can carry), each naming the field (`input.party_size: ...`)."""
    if content is None:
        content = {}
    if not isinstance(content, Mapping):
        return [f"{field}: must be an object (the form's fields)"]
    if bad := non_finite(content, field):
        return [f"{bad}: must be a finite number (no NaN or Infinity)"]
    problems = [p.replace("$", field, 1) for p in elicitation_errors(row.to_engine(), content)]
    props = ((row.data or {}).get("schema") or {}).get("properties")
    if isinstance(props, Mapping):
        problems += [f"{field}.{k}: is not a field of the form" for k in content if k not in props]
    return problems


def _decide_elicitation(
    row: ApprovalRequest, *, content: Any, output: Any, field: str = "input"
) -> tuple[str, Answer]:
    """Accept an MCP server's question: the form's content (validated), or consent to open
    its link (url mode)."""
    server = (row.data or {}).get("server") or "the MCP server"
    if output is not None:
        raise InvalidInput(
            f"output: {server} asked a question; answer it with {field}, the form's content"
        )
    if (row.data or {}).get("mode") == "url":
        if content:
            raise InvalidInput(
                f"{field}: {server} asks for consent to open its link; approve it without {field}"
            )
        return State.APPROVED, Answer(id=row.request_id, ok=True)
    problems = _elicitation_problems(row, content, field)
    if problems:
        raise InvalidInput("; ".join(problems))
    data = dict(content or {})
    return (State.ANSWERED if data else State.APPROVED), Answer(
        id=row.request_id, ok=True, data=data
    )


def _decide_relay_calls(
    row: ApprovalRequest,
    *,
    input: Any,
    output: Any,
    calls: Mapping[str, Mapping[str, Any]] | None,
    fields: Mapping[str, str] | None = None,
) -> tuple[str, Answer | None]:
    """Record a decision on every call of a relay request and work out the answer.

    `fields` names each call's place in the caller's input for error messages (the API's
    `calls.<id>`, an Answer's `data.results[i]`); without it, `calls.<id>`.
    """
    call_rows = _locked_calls(row)
    if not call_rows:
        raise InvalidInput("this relay request carries no calls")
    if calls is not None and not isinstance(calls, Mapping):
        raise InvalidInput("calls: must be an object keyed by call id")
    if input is not None and output is not None:
        raise InvalidInput("give either input or output, not both")
    if (input is not None or output is not None) and len(call_rows) > 1:
        raise InvalidInput(
            f"this request carries {len(call_rows)} calls: decide each one with calls"
        )
    if calls:
        unknown = sorted(set(calls) - {c.call_id for c in call_rows})
        if unknown:
            raise InvalidInput(f"calls: unknown call id(s) {', '.join(unknown)}")
    agent = agents.get(row.agent)
    shorthand = len(call_rows) == 1 and not calls
    for call in call_rows:
        spec = dict((calls or {}).get(call.call_id) or {})
        if shorthand:  # top-level input/output decide the only call
            spec = {"input": input, "output": output}
        decision = spec.get("decision") or (
            "output" if spec.get("output") is not None else "approve"
        )
        field = "" if shorthand else (fields or {}).get(call.call_id, f"calls.{call.call_id}")
        prefix = f"{field}." if field else ""
        has_executor = agent is not None and agent.executor_for(call.tool_name) is not None
        if decision == Decision.DECLINE:
            call.decision, call.reason = Decision.DECLINE, clean_reason(spec.get("reason"))
            call.output, call.is_error = decline_text(call.tool_name, call.reason), True
        elif decision == Decision.OUTPUT or spec.get("output") is not None:
            raw = spec.get("output")
            text = clean_output("" if raw is None else raw, f"{prefix}output")
            if has_executor and not agent.allow_typed_output:
                raise InvalidInput(
                    f"{prefix}output: {call.tool_name} runs on the host once approved; approve"
                    " or decline it (agent "
                    f"{row.agent!r} does not take a typed result instead of running it)"
                )
            if not text.strip():
                raise InvalidInput(
                    f"{prefix}output: type the result for {call.tool_name}; an empty result"
                    " is not sent"
                )
            call.decision, call.output = Decision.OUTPUT, text
            call.is_error = spec.get("is_error") is True
        elif decision == Decision.APPROVE:
            if not has_executor:
                raise InvalidInput(
                    f"{prefix}output: {call.tool_name} has no executor here; type its result"
                    " or decline it"
                )
            if spec.get("input") is not None:
                schema = agent.tool_schema(call.tool_name)
                call.edited_input = validated_input(spec["input"], schema, f"{prefix}input")
                call.decision = (
                    Decision.EDIT if call.edited_input != call.input else Decision.APPROVE
                )
                if call.decision == Decision.APPROVE:
                    call.edited_input = None  # "edited" to the same arguments: a plain approval
            else:
                call.decision = Decision.APPROVE
        else:
            raise InvalidInput(f"{prefix}decision: must be approve, output or decline")
        _save_decided_call(call)
    row.listed_calls = call_rows  # as saved: the reply shows them without reading them again
    if all(c.decision == Decision.DECLINE for c in call_rows):
        reasons = sorted({c.reason for c in call_rows})
        return State.DECLINED, answer_declined(
            row.request_id, reasons[0] if len(reasons) == 1 else "; ".join(reasons)
        )
    if any(c.decision in (Decision.APPROVE, Decision.EDIT) for c in call_rows):
        return State.APPROVED, None  # the worker runs the executors, then builds the answer
    return State.ANSWERED, relay_answer(
        row.request_id, [RelayResult(c.call_id, c.output or "", c.is_error) for c in call_rows]
    )


def _relay_calls_from_answer(
    row: ApprovalRequest, data: Mapping[str, Any]
) -> tuple[dict[str, dict[str, Any]] | None, dict[str, str], Any]:
    """An ok Answer for a relay request as per-call decisions: `data.results` by call id, or
    the one-call shorthand `data.output` / `data.isError`. Returns (calls, field names,
    shorthand output)."""
    extra = sorted(set(data) - {"results", "output", "isError"})
    if extra:
        raise InvalidInput(
            f"data: unexpected key(s) {', '.join(extra)}; a relay answer carries results"
            " (or output and isError for one call)"
        )
    if "results" in data:
        if "output" in data:
            raise InvalidInput("data: give results or output, not both")
        results = data["results"]
        if not isinstance(results, list):
            raise InvalidInput("data.results: must be a list of {id, output, isError}")
        calls: dict[str, dict[str, Any]] = {}
        fields: dict[str, str] = {}
        for i, entry in enumerate(results):
            where = f"data.results[{i}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
                raise InvalidInput(f"{where}.id: must be the call id, a string")
            if entry["id"] in calls:
                raise InvalidInput(f"{where}.id: call {entry['id']} has two results")
            if not isinstance(entry.get("output"), str):
                raise InvalidInput(f"{where}.output: must be a string")
            if "isError" in entry and not isinstance(entry["isError"], bool):
                raise InvalidInput(f"{where}.isError: must be true or false")
            calls[entry["id"]] = {
                "decision": Decision.OUTPUT,
                "output": entry["output"],
                "is_error": entry.get("isError") is True,
            }
            fields[entry["id"]] = where
        known = {c.call_id for c in row.calls.all()}
        unknown = sorted(set(calls) - known)
        if unknown:
            raise InvalidInput(f"data.results: unknown call id(s) {', '.join(unknown)}")
        for call_id in known - set(calls):
            fields[call_id] = f"data.results (call {call_id})"
        return calls, fields, None
    if "isError" in data and not isinstance(data["isError"], bool):
        raise InvalidInput("data.isError: must be true or false")
    if "output" in data and not isinstance(data["output"], str):
        raise InvalidInput("data.output: must be a string")
    return None, {}, data.get("output")


def request_answer(*, request_id: str, user: Any, answer: Any) -> ApprovalRequest:
    """Decide with an `Answer` in wire shape, as a host would give the engine.

    The answer is recorded per call exactly like the same decision made with approve or
    decline: typed results, edited input, a decline. It is never stored as an override the
    record does not show.
    """
    require(user, DECIDE_PERMISSION, "decide requests")
    try:
        parsed = answer if isinstance(answer, Answer) else Answer.from_dict(answer)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if bad := non_finite(parsed.data, "data"):
        raise InvalidInput(f"{bad}: must be a finite number (no NaN or Infinity)")
    if parsed.id != request_id:
        raise InvalidInput(
            f"id: the answer's id {parsed.id!r} does not echo the request id {request_id!r}"
        )
    if not parsed.ok:
        return _refuse(request_id, user, parsed.reason, as_given=True)
    data = parsed.data or {}
    with transaction.atomic():
        row = lock_for_decision(user, request_id, approving=True)
        # An Answer decides in one go: a request needing several approvers takes approve.
        check_requirement(row, user, approving=True, as_shown=False)
        if row.is_relay:
            calls, fields, output = _relay_calls_from_answer(row, data)
            if output is not None:  # the one-call shorthand
                call_ids = [c.call_id for c in row.calls.all()]
                if len(call_ids) != 1:
                    raise InvalidInput(
                        f"data.output: this request carries {len(call_ids)} calls; give"
                        " data.results with one result per call id"
                    )
                calls = {
                    call_ids[0]: {
                        "decision": Decision.OUTPUT,
                        "output": output,
                        "is_error": data.get("isError") is True,
                    }
                }
                fields = {call_ids[0]: "data"}
            new_state, decided = _decide_relay_calls(
                row, input=None, output=None, calls=calls, fields=fields
            )
        elif row.kind == "approval":
            extra = sorted(set(data) - {"input"})
            if extra:
                raise InvalidInput(
                    f"data: unexpected key(s) {', '.join(extra)}; an approval answer carries"
                    " only input (the edited arguments)"
                )
            new_state, decided = _decide_single(row, input=data.get("input"), output=None)
        elif row.kind == ELICITATION_KIND:  # the data is the form's content
            new_state, decided = _decide_elicitation(
                row, content=parsed.data, output=None, field="data"
            )
        else:
            new_state, decided = _decide_single(row, input=data or None, output=None)
        _decide(row, user, new_state, decided, "")
    return row


def request_decline(*, request_id: str, user: Any, reason: Any = "") -> ApprovalRequest:
    """Refuse a request; the reason (default "declined") reaches the model. An MCP server's
    question is declined as such (the server hears `decline`, the model reads "declined"):
    the reason is kept in the record."""
    return _refuse(request_id, user, reason, as_given=False)


def _refuse(request_id: str, user: Any, reason: Any, *, as_given: bool) -> ApprovalRequest:
    """Refuse a request with `reason`; `as_given`: the reason of an `Answer` the caller built
    (`request_answer`), which an MCP server's question passes on as it is."""
    require(user, DECIDE_PERMISSION, "decide requests")
    reason = clean_reason(reason)
    with transaction.atomic():
        row = lock_for_decision(user, request_id, approving=False)
        check_requirement(row, user, approving=False)
        calls = _locked_calls(row)
        for call in calls:
            call.decision, call.reason = Decision.DECLINE, reason
            call.output, call.is_error = decline_text(call.tool_name, reason), True
            _save_decided_call(call)
        row.listed_calls = calls  # as saved: the reply shows them without reading them again
        new_state, answer = _refusal(row, reason, as_given=as_given)
        _decide(row, user, new_state, answer, reason)
    return row


def _refusal(row: ApprovalRequest, reason: str, *, as_given: bool) -> tuple[str, Answer]:
    """The state and the stored answer of a refusal. The stored answer is what the engine
    gives the run, so for an MCP server's question the state names what the server will
    hear: the reviewer's Decline is `decline` (their reason stays in the record only); an
    Answer's own reason goes to the engine as it is, and `decline` or `cancel` follows from
    it by the engine's rule (state declined or cancelled)."""
    if row.kind != ELICITATION_KIND:
        return State.DECLINED, answer_declined(row.request_id, reason)
    answer = answer_declined(row.request_id, reason if as_given else DECLINE_REASON)
    heard = elicit_action(answer)
    return (State.DECLINED if heard == "decline" else State.CANCELLED), answer


def request_decide_by_rule(*, request_id: str, user: Any, rule: Any) -> ApprovalRequest:
    """Decide one pending request as `rule` would have where its run halted, on `user`'s
    say-so ("apply to pending"): approved as the model asked it, or declined with the rule's
    reason. Recorded as the rule's decision (`decided_by_rule`, its version; the audit event
    names the rule and who applied it), one transaction, the rule's counter included."""
    require(user, DECIDE_PERMISSION, "decide requests")
    approve = rule.effect == "approve"
    if rule.effect not in ("approve", "decline"):
        raise InvalidInput(f"a rule that does {rule.effect!r} is not applied to pending requests")
    with transaction.atomic():
        row = lock_for_decision(user, request_id, approving=approve)
        if row.kind not in ("tool_call", "approval"):
            raise InvalidInput("only a relay call or an approval is decided by a rule")
        if approve and row.is_relay:
            new_state, answer = _decide_relay_calls(row, input=None, output=None, calls=None)
            reason = ""
        elif approve:
            new_state, answer = _decide_single(row, input=None, output=None)
            reason = ""
        else:
            reason = clean_reason(rule.reason or None)
            calls = _locked_calls(row)
            for call in calls:
                call.decision, call.reason = Decision.DECLINE, reason
                call.output, call.is_error = decline_text(call.tool_name, reason), True
                _save_decided_call(call)
            new_state, answer = _refusal(row, reason, as_given=False)
        row.decided_by_rule, row.rule_version = rule, rule.version
        named = {"id": rule.pk, "name": rule.name, "version": rule.version}
        applied_by = user.get_username()
        # No person decided it (decided_by null): the record names the rule, and who applied it.
        if record_decision(
            row, None, new_state, answer, reason, decider="rule", rule=named, applied_by=applied_by
        ):
            enqueue(row.run_id)
        ApprovalRequest.objects.filter(pk=row.pk).update(
            decided_by_rule=rule, rule_version=rule.version
        )
        Rule.objects.filter(pk=rule.pk).update(
            match_count=F("match_count") + 1, last_matched_at=row.decided_at
        )
    return row

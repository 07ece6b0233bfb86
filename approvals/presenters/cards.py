"""What a request card shows, worked out once per render from the row and its agent."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import agents, selectors
from ..domain.arguments import diff
from ..domain.jsonvalues import strict_json_loads
from ..models import ApprovalRequest, RequestCall
from ..services.rules import ALWAYS_ALLOW_SCOPES
from .fields import SchemaField, fields_for
from .rules import decided_by_rule_text

State = ApprovalRequest.State
Decision = RequestCall.Decision
# One label per kind, for the card's badge and the inbox's filter alike.
KIND_LABELS = {
    "tool_call": "relay call",
    "approval": "approval",
    "question": "question",
    "input": "input",
    "authorization": "sign-in",
    "elicitation": "MCP question",
}
# An approval whose prompt says this gets a confirmation step before it is approved.
IRREVERSIBLE = re.compile(
    r"\b(cannot|can't|can not|won't be able to) be (undone|reversed|recovered)\b|\birreversibl",
    re.IGNORECASE,
)
WAITING_TEXT = "Waiting for a decision"


@dataclass
class Outcome:
    """How one decision reads in the record: a verb, who, when, and what it carried."""

    verb: str  # "Approved", "Approved with edits", "Result typed", "Declined", ...
    css: str  # approve | edit | output | decline | answered | expired | cancelled
    actor: str
    at: datetime | None
    reason: str = ""
    changes: list[dict[str, Any]] = field(default_factory=list)
    output: str | None = None
    answers: list[tuple[str, str]] = field(default_factory=list)
    is_error: bool = False

    @property
    def line(self) -> str:
        """The outcome as one plain sentence (toasts, accessible names, the admin)."""
        text = f"{self.verb} by {self.actor}"
        if self.reason:
            text += f": {self.reason}"
        return text


def _actor(row: ApprovalRequest) -> str:
    if row.rule_version is not None:  # decided by a rule, inline, not by a person
        rule = row.decided_by_rule if row.decided_by_rule_id else None
        return decided_by_rule_text(rule, row.rule_version)
    return row.decided_by.get_username() if row.decided_by_id and row.decided_by else "the system"


def answers_of(data: Any, questions: Sequence[QuestionCard] = ()) -> list[tuple[str, str]]:
    """The answers an Answer's data carries, as (question or field, answer) pairs."""
    if not isinstance(data, dict):
        return []
    if isinstance(data.get("answers"), dict):
        headers = {q.text: q.header for q in questions}
        return [(headers.get(str(k)) or str(k), _as_text(v)) for k, v in data["answers"].items()]
    if set(data) == {"output"}:
        return [("", _as_text(data["output"]))]
    return [(str(k), _as_text(v)) for k, v in data.items()]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def call_outcome(row: ApprovalRequest, call: RequestCall | None) -> Outcome | None:
    """What was decided for one call of a decided request (None while it is pending)."""
    if row.state == State.PENDING:
        return None
    actor, at = _actor(row), row.decided_at
    if row.state == State.EXPIRED:
        return Outcome("Expired", "expired", "the system", at, is_error=True)
    if row.state == State.CANCELLED:
        return Outcome("Cancelled", "cancelled", actor, at, reason=row.reason, is_error=True)
    decision = call.decision if call is not None else ""
    if decision == Decision.DECLINE:
        return Outcome("Declined", "decline", actor, at, reason=call.reason, is_error=True)
    if decision == Decision.EDIT:
        changes = diff(call.input or {}, call.edited_input or {})
        return Outcome("Approved with edits", "edit", actor, at, changes=changes)
    if decision == Decision.OUTPUT:
        return Outcome(
            "Result typed", "output", actor, at, output=call.output, is_error=call.is_error
        )
    if decision == Decision.APPROVE:
        return Outcome("Approved", "approve", actor, at, output=call.output)
    # Requests decided as a whole (questions, inputs, sign-ins) and older rows.
    if row.state == State.DECLINED:
        return Outcome("Declined", "decline", actor, at, reason=row.reason, is_error=True)
    answer_data = (row.answer or {}).get("data") if isinstance(row.answer, dict) else None
    if row.state == State.ANSWERED:
        answers = answers_of(answer_data, _questions(row.data))
        if row.kind == "elicitation":  # the form's labels and order, not its keys
            form = fields_for(form_schema(row), {})
            rank = {f.name: i for i, f in enumerate(form)}
            titles = {f.name: f.label for f in form}
            answers = sorted(answers, key=lambda pair: rank.get(pair[0], len(rank)))
            answers = [(titles.get(k, k), v) for k, v in answers]
        return Outcome("Answered", "answered", actor, at, answers=answers)
    if row.kind == "approval" and isinstance(answer_data, dict) and "input" in answer_data:
        original = (row.data or {}).get("input") or {}
        return Outcome(
            "Approved with edits", "edit", actor, at, changes=diff(original, answer_data["input"])
        )
    return Outcome("Approved", "approve", actor, at)


def request_outcome(row: ApprovalRequest, calls: Sequence[RequestCall]) -> Outcome | None:
    """The decision of a whole request: one call's outcome when all calls agree, else
    "Decided per call" (each call then shows its own)."""
    if row.state == State.PENDING:
        return None
    outcomes = [call_outcome(row, c) for c in calls] or [call_outcome(row, None)]
    first = outcomes[0]
    if len(outcomes) > 1 and len({(o.verb, o.reason) for o in outcomes}) > 1:
        return Outcome("Decided per call", "mixed", first.actor, first.at)
    if len(outcomes) > 1 and first.css == "decline":
        return Outcome("Declined", "decline", first.actor, first.at, reason=first.reason)
    return first


def source_label(server: str, tool: str) -> str:
    """Where a tool runs, as the record names it: "time · get_current_time" for an MCP
    server's tool, the bare name for the agent's own."""
    return agents.mcp_tool_label(server, tool)


def mcp_call_servers(
    requests: Sequence[ApprovalRequest], journaled: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """Which MCP server each call of a run went to, by call id: from the questions servers
    asked (elicitation requests) and from the journal of executions, given as (call id,
    journaled name) pairs."""
    servers = {call_id: agents.mcp_server_of_label(name) for call_id, name in journaled}
    for row in requests:
        call_id = (row.data or {}).get("callId")
        if mcp_server_of(row) and isinstance(call_id, str):
            servers[call_id] = mcp_server_of(row)
    return {call_id: server for call_id, server in servers.items() if server}


def mcp_server_of(row: ApprovalRequest) -> str:
    """The MCP server a request's call went to (an elicitation's `data.server`), or ""."""
    server = (row.data or {}).get("server") if row.kind == "elicitation" else None
    return server if isinstance(server, str) else ""


def form_schema(row: ApprovalRequest) -> dict[str, Any] | None:
    """The form a request asks to fill (`data.schema`), its fields in the order they were
    asked (`data.fieldOrder`, which the worker keeps: a stored JSON object may lose it)."""
    data = row.data or {}
    schema = data.get("schema")
    if not isinstance(schema, dict):
        return None
    props, order = schema.get("properties"), data.get("fieldOrder")
    if not isinstance(props, dict) or not isinstance(order, list):
        return schema
    ordered = {name: props[name] for name in order if isinstance(name, str) and name in props}
    ordered.update((name, prop) for name, prop in props.items() if name not in ordered)
    return {**schema, "properties": ordered}


@dataclass
class CallCard:
    call: RequestCall
    has_executor: bool
    fields: list[SchemaField]
    # The agent lets a reviewer type this call's result instead of running its executor.
    may_type_output: bool = True
    # The MCP server the tool belongs to ("" for the agent's own tools).
    server: str = ""

    @property
    def outcome(self) -> Outcome | None:
        return call_outcome(self.call.request, self.call)

    @property
    def label(self) -> str:
        return source_label(self.server, self.call.tool_name)


@dataclass
class QuestionCard:
    index: int
    text: str
    header: str
    options: list[str]
    # A typed answer besides the options ("Other"): unless the question says `custom: false`
    # (the question builtin's field, as OpenCode's); a question without options is typed.
    allows_other: bool = True

    @property
    def html_name(self) -> str:
        return f"q.{self.index}"

    @property
    def other_name(self) -> str:
        """The typed answer's field beside the options (its radio posts an empty choice)."""
        return f"q.{self.index}.other"


@dataclass
class RequestCard:
    row: ApprovalRequest
    can_decide: bool
    calls: list[CallCard] = field(default_factory=list)
    questions: list[QuestionCard] = field(default_factory=list)
    input_fields: list[SchemaField] = field(default_factory=list)
    message: str = ""
    level: str = "info"
    # The argument editor is open (it showed an error and keeps what was typed).
    edit_open: bool = False
    # What a reviewer typed into a decision that arrived too late (someone decided first):
    # (label, text) pairs the card shows to copy, so nothing typed is lost.
    unsent: list[tuple[str, str]] = field(default_factory=list)
    # What a rule requires of its deciders and how far its approvals got (None: no rule).
    requirement: selectors.RequirementView | None = None
    # The answer to a decision that came too late (someone decided first): its notice says
    # who decided, when, and why, so the card's footer does not say it again.
    late: bool = False
    # The viewer may make "always allow" rules from it (a live card has no request: its
    # renderer says so, per variant).
    can_allow_always: bool = False

    @property
    def title(self) -> str:
        return request_title(self.row, [c.call.tool_name for c in self.calls])

    @property
    def kind_label(self) -> str:
        return KIND_LABELS.get(self.row.kind, self.row.kind)

    @property
    def server(self) -> str:
        """The MCP server asking (kind "elicitation"), or ""."""
        return mcp_server_of(self.row)

    @property
    def source(self) -> str:
        """The asking server and its tool: "tables · book_table"."""
        data = self.row.data or {}
        return source_label(self.server, str(data.get("tool") or ""))

    @property
    def is_elicitation(self) -> bool:
        return self.row.kind == "elicitation"

    @property
    def asks_consent(self) -> bool:
        """An MCP server's url-mode question: approving is consent to open its link."""
        return self.is_elicitation and (self.row.data or {}).get("mode") == "url"

    @property
    def elicitation_input(self) -> dict[str, Any]:
        """The arguments of the call the server asked in."""
        value = (self.row.data or {}).get("input")
        return value if isinstance(value, dict) else {}

    @property
    def is_pending(self) -> bool:
        return self.row.state == State.PENDING

    @property
    def dom_id(self) -> str:
        return f"request-{self.row.pk}"

    @property
    def multi(self) -> bool:
        return len(self.calls) > 1

    @property
    def approval_input(self) -> dict[str, Any]:
        data = self.row.data or {}
        return data.get("input") if isinstance(data.get("input"), dict) else {}

    @property
    def outcome(self) -> Outcome | None:
        return request_outcome(self.row, [c.call for c in self.calls])

    @property
    def single_outcome(self) -> bool:
        """One outcome for the whole card: the footer says it, the call shows only details."""
        return len(self.calls) <= 1

    @property
    def claim_holder(self) -> Any:
        """Who holds an active claim on this request (a user), or None (K: the claim bar
        and the take-over question read it; no query when `claimed_by` was joined)."""
        return selectors.active_claim(self.row)

    @property
    def always_allow_scopes(self) -> list[tuple[str, str]]:
        """The scopes of "always allow" (its menu beside Approve)."""
        return list(ALWAYS_ALLOW_SCOPES.items())

    @property
    def needs_confirmation(self) -> bool:
        """Approving runs something the prompt says cannot be undone: confirm it first."""
        return self.row.kind == "approval" and bool(IRREVERSIBLE.search(self.row.prompt or ""))

    @property
    def summary(self) -> str:
        """Agent, tool and key arguments in one line: the card's accessible name."""
        if self.calls:
            parts = [f"{c.label} {key_arguments(c.call.input)}".strip() for c in self.calls]
            what = "; ".join(parts)
        else:
            what = self.title
        return f"{self.kind_label} from {self.row.agent}: {what}"[:300]

    @property
    def action_target(self) -> str:
        """What the card's buttons act on, for their accessible names ("Approve refund A-2002")."""
        if self.calls:
            first = self.calls[0]
            target = f"{first.label} {key_arguments(first.call.input, limit=1)}".strip()
            return target + (f" and {len(self.calls) - 1} more" if len(self.calls) > 1 else "")
        return f"{self.kind_label} {self.row.request_id}"[:120]


def joined_names(names: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def request_title(row: ApprovalRequest, tool_names: Sequence[str]) -> str:
    """A human headline: relay prompts are machine text ("relay tool call x to ..."), and a
    question's prompt repeats the questions the card lists anyway."""
    if row.kind == "tool_call" and tool_names:
        joined = joined_names(tool_names)
        return f"The agent wants to run {joined}"
    if row.kind == "question":
        count = len(_questions(row.data))
        return (
            "The agent asks you a question" if count <= 1 else f"The agent asks {count} questions"
        )
    return row.prompt


def key_arguments(values: Any, limit: int = 3, *, named: bool = False) -> str:
    """The first few argument values in one short line ("A-2002, 40"; `named`: "order
    A-2002 · amount 40", for a list row that has no field labels around it)."""
    if not isinstance(values, dict):
        return ""
    shown = []
    for name, value in list(values.items())[:limit]:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = text if len(text) <= 40 else text[:39] + "…"
        shown.append(f"{name} {text}" if named else text)
    return (" · " if named else ", ").join(shown)


def _questions(data: dict[str, Any] | None) -> list[QuestionCard]:
    out = []
    for i, q in enumerate((data or {}).get("questions") or []):
        if not isinstance(q, dict):
            continue
        options = [
            o.get("label", "") if isinstance(o, dict) else str(o) for o in q.get("options") or []
        ]
        options = [o for o in options if o]  # an empty label is the typed answer's choice
        text, header = str(q.get("question", "")), str(q.get("header", ""))
        out.append(QuestionCard(i, text, header, options, q.get("custom") is not False))
    return out


def question_answers(questions: Sequence[QuestionCard], post: Any) -> tuple[dict[str, str], str]:
    """A question form's answers by question text (the service's `{"answers": ...}`), and
    what is wrong with them ("" when nothing is): a choice among the options, or the typed
    answer where the question allows one (its radio posts an empty choice; without options,
    the field itself is typed)."""
    answers, problem = {}, ""
    for q in questions:
        value, typed = post.get(q.html_name), post.get(q.other_name, "").strip()
        said = ""
        if q.options and q.allows_other and (value == "" or (value is None and typed)):
            value = typed  # "Other" chosen, or typed into without choosing it (no JavaScript)
            said = "" if typed else f"Type your answer to “{q.text}”, or choose an option."
        elif q.options and (value or typed) and value not in q.options:
            value, said = "", f"Choose one of the options for “{q.text}”."
        elif not (value or "").strip():
            said = f"Answer every question (missing: {q.text})."
        problem = problem or said
        answers[q.text] = value or ""
    return answers, problem


def request_card(
    row: ApprovalRequest,
    *,
    can_decide: bool,
    message: str = "",
    level: str = "info",
    can_allow_always: bool = False,
) -> RequestCard:
    agent = agents.get(row.agent)
    card = RequestCard(row=row, can_decide=can_decide, message=message, level=level)
    card.can_allow_always = can_allow_always and can_decide
    card.requirement = selectors.requirement_view(row)
    server = mcp_server_of(row)
    for call in row.call_list():
        schema = agent.tool_schema(call.tool_name) if agent else None
        has_executor = bool(agent and agent.executor_for(call.tool_name))
        card.calls.append(
            CallCard(
                call,
                has_executor,
                fields_for(schema, call.input),
                may_type_output=not has_executor or bool(agent and agent.allow_typed_output),
                server=server,
            )
        )
    if row.kind == "question":
        card.questions = _questions(row.data)
    schema = form_schema(row)
    if row.kind not in ("tool_call", "approval", "question") and schema is not None:
        card.input_fields = fields_for(schema, {})
    return card


# What a reviewer typed into a decision that came too late, kept on the card to copy.
# Fields of the decision forms that carry no typing of the reviewer's own: the form's
# plumbing, and the hidden fields the inbox adds (`takeover`, inbox-keys.js).
_NOT_TYPED = frozenset(
    {
        "csrfmiddlewaretoken",
        "confirmed",
        "next",
        "claim",
        "takeover",
        "always_allow",
        "always_allow_scope",
    }
)
_TYPED_LABELS = {
    "reason": "Your reason",
    "output": "Your result",
    "input": "Your edited arguments",  # the edit preview's approve form: the arguments as JSON
}
# Schema widgets that choose between given values (a checkbox, a select): not typing.
_CHOICE_WIDGETS = frozenset({"checkbox", "select"})


def _same_text(a: str, b: str) -> bool:
    """Equal as a reviewer reads them (browsers post a textarea's line ends as CRLF)."""
    return a.replace("\r\n", "\n").strip() == b.replace("\r\n", "\n").strip()


def _same_json(text: str, value: Any) -> bool:
    """`text` is `value` as JSON (the edit preview approving the arguments as they were)."""
    try:
        return strict_json_loads(text) == value
    except ValueError:
        return False


def _call_names(calls: Sequence[CallCard]) -> dict[str, str]:
    """Each call's name as its fieldset's legend shows it (the tool's), with its place when
    the turn calls that tool twice."""
    names = [c.call.tool_name for c in calls]
    return {
        c.call.call_id: name if names.count(name) == 1 else f"{name} (call {i})"
        for i, (c, name) in enumerate(zip(calls, names, strict=True), start=1)
    }


def typed_texts(card: RequestCard, post: Any) -> list[tuple[str, str]]:
    """What a reviewer typed into one of `card`'s decision forms (`post`, a QueryDict), as
    (label, text) pairs labelled as the form showed them: a reason or result (per call, under
    the tool's name), an argument edited or a form field filled in (under its label), a
    question's typed answer (under the question). Not typing, so not kept: a choice between
    given options (a question's option, a select, a checkbox, a call's decision), a field
    left as it was prefilled, the form's hidden fields. A field none of the card's forms has
    is kept under its own name: nothing typed is lost."""
    # The schema fields of the card's form: an input / MCP question's, or the edit form's.
    schema_fields = card.input_fields or (card.calls[0].fields if card.calls else [])
    by_name = {f.html_name: f for f in schema_fields}
    questions = {f"q.{q.index}": q for q in card.questions}
    call_names = _call_names(card.calls)
    typed = []
    for name in post:
        if name in _NOT_TYPED or name.startswith("decision."):
            continue
        values = [v for v in post.getlist(name) if v.strip()]
        if name in questions or name.removesuffix(".other") in questions:
            question = questions[name.removesuffix(".other")]
            if question.options and name in questions:  # a choice between given options
                continue
            label = question.text or question.header or name
        elif name in by_name:
            schema_field = by_name[name]
            if schema_field.widget in _CHOICE_WIDGETS:
                continue
            values = [v for v in values if not _same_text(v, schema_field.value_text)]
            label = schema_field.label
        else:
            if name == "input" and card.calls:  # the edit preview's arguments, if changed
                values = [v for v in values if not _same_json(v, card.calls[0].call.input)]
            base, _, rest = name.partition(".")
            label = _TYPED_LABELS.get(name, name)
            if base in ("reason", "output") and rest in call_names:  # a call's fieldset
                label = f"{_TYPED_LABELS[base]} for {call_names[rest]}"
            elif base == "field" and rest:  # an argument the editor did not show
                label = rest
        typed.extend((label, value) for value in values)
    return typed


def decision_toast(row: ApprovalRequest, tool_names: Sequence[str]) -> str:
    """A change as everybody else reads it: "New request from ...", "Already declined by ...".
    Plain text: pages escape it."""
    title = request_title(row, tool_names)[:120]
    if row.state == "pending":
        return f"New request from {row.agent}: {title}"
    who = row.decided_by.get_username() if row.decided_by else "the system"
    when = f"{row.decided_at:%H:%M:%S} UTC" if row.decided_at else "just now"
    return f"Already {row.state} by {who} at {when}: {title}"


def nothing_changed(state: str, decided_by: Any, decided_at: Any = None) -> str:
    """What a reviewer reads when somebody else decided first (plain text)."""
    when = f" at {decided_at:%H:%M:%S} UTC" if decided_at else ""
    return f"Already {state} by {decided_by or 'the system'}{when}: nothing was changed."


def own_toast(row: ApprovalRequest, tool_names: Sequence[str]) -> str:
    """A decision as its own decider reads it: "You declined: <reason> (...)"."""
    title = request_title(row, tool_names)[:120]
    if row.state == "declined":
        return f"You declined: {row.reason or 'declined'} — {title}"
    if row.state in ("approved", "answered") and tool_names:
        joined = joined_names(tool_names)
        if len(tool_names) > 1:
            return f"You sent your decisions on {joined}"
        if row.state == "answered":  # a relay call's result, typed by the reviewer
            return f"You sent the result for {joined}"
        return f"You approved {joined}"
    verb = {"approved": "approved", "answered": "answered", "cancelled": "cancelled"}
    return f"You {verb.get(row.state, row.state)}: {title}"


# -- the inbox's compact rows (issue 14) -------------------------------------------------------

ROW_SUMMARY_CHARS = 90
ROW_GIST_CHARS = 60


@dataclass
class RequestRow:
    """One line of the inbox list: agent, what (tools or "question"), key arguments in one
    line, age, deadline, claim. Reads only what `inbox_requests` joined and prefetched."""

    row: ApprovalRequest
    what: str
    summary: str
    claim_holder: Any = None
    overdue: bool = False
    # Seconds until its claim lapses (None: no active claim): the page redraws the list then.
    lapse_in: float | None = None

    @property
    def dom_id(self) -> str:
        return f"row-{self.row.pk}"

    @property
    def approval_progress(self) -> str:
        """ "1 of 2 approved" for a pending request that needs several approvers ("" else);
        from the row's annotations (selectors.with_approval_progress), no query."""
        needed = getattr(self.row, "approvers_needed", 1) or 1
        if needed < 2 or self.row.state != State.PENDING:
            return ""
        return f"{getattr(self.row, 'approvers_so_far', 0) or 0} of {needed} approved"

    @property
    def gist(self) -> str:
        """What the run was asked (its first user message), short: two rows of the same
        tool or question read apart by it."""
        return _one_line(self.row.run.prompt, ROW_GIST_CHARS)


def _one_line(text: str, limit: int = ROW_SUMMARY_CHARS) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def row_summary(row: ApprovalRequest) -> tuple[str, str]:
    """(what, summary) of a request for its inbox row: the tool name(s) or "question", and
    its key arguments (or the question, or the prompt) in one short line."""
    data = row.data if isinstance(row.data, dict) else {}
    if row.kind == "tool_call":
        calls = row.call_list()
        names = [c.tool_name for c in calls] or row.relay_tool_names()
        what = joined_names(names) if names else KIND_LABELS.get(row.kind, row.kind)
        parts = [key_arguments(c.input, named=True) for c in calls]
        summary = "; ".join(p for p in parts if p) or row.prompt
        return _one_line(what, 60), _one_line(summary)
    if row.kind == "question":
        questions = _questions(data)
        text = questions[0].text if questions else row.prompt
        if len(questions) > 1:
            text = f"{text} (+{len(questions) - 1} more)"
        return "question", _one_line(text)
    if row.kind == "approval":
        tool = str(data.get("tool") or "") or KIND_LABELS.get(row.kind, row.kind)
        values = data.get("input") if isinstance(data.get("input"), dict) else {}
        return _one_line(tool, 60), _one_line(key_arguments(values, named=True) or row.prompt)
    if row.kind == "elicitation":
        server = mcp_server_of(row)
        what = source_label(server, str(data.get("tool") or "")) or KIND_LABELS.get(row.kind, "")
        return _one_line(what, 60), _one_line(row.prompt)
    return KIND_LABELS.get(row.kind, row.kind), _one_line(row.prompt or row.url or "")


def request_row(row: ApprovalRequest, *, now: datetime | None = None) -> RequestRow:
    now = now or timezone.now()
    what, summary = row_summary(row)
    overdue = row.state == State.PENDING and row.expires_at is not None and row.expires_at < now
    holder = selectors.active_claim(row, now=now)
    lapses = selectors.claim_lapses_at(row) if holder is not None else None
    lapse_in = seconds_until(lapses, now)
    return RequestRow(row, what, summary, holder, overdue, lapse_in)


def seconds_until(at: datetime | None, now: datetime) -> float | None:
    """How long from `now` until `at` (None for none): what a page waits for, relative so
    that the browser's clock never matters."""
    return None if at is None else round(max(0.0, (at - now).total_seconds()), 1)

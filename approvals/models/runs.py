"""Runs, the requests they halt on, the calls inside each request, tool executions, and the
audit trail (`Event`)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        PENDING = "pending"
        DONE = "done"
        INCOMPLETE = "incomplete"
        FAILED = "failed"
        CANCELLED = "cancelled"

    agent = models.CharField(max_length=100, db_index=True)
    prompt = models.TextField()
    # Anthropic keeps the system prompt outside the transcript: the run keeps its own copy,
    # so a resume uses the prompt the run started with even if the agent's code changed.
    system_prompt = models.TextField(blank=True, default="")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    messages = models.JSONField(
        default=list, blank=True, help_text="The engine's transcript, exactly as returned."
    )
    text = models.TextField(blank=True, default="")
    usage = models.JSONField(default=dict, blank=True)
    turns = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(
        default=0, help_text="How many times a worker started this run."
    )
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A worker holds a run while it executes; a lease that lapses means the worker died.
    worker_id = models.CharField(max_length=64, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    version = models.PositiveIntegerField(default=0)
    # A team run (an agent registered with a team): the agent runtime's state as the last
    # step left it (`toolnexus.agents.Runtime.to_dict()`: every handle, its checkpoint and
    # transcript); null for a single agent's run.
    team_state = models.JSONField(
        null=True, blank=True, help_text="The agent runtime's state of a team run."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="run_status_created"),
            models.Index(fields=["status", "lease_expires_at"], name="run_status_lease"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.agent}, {self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in {
            self.Status.DONE,
            self.Status.INCOMPLETE,
            self.Status.FAILED,
            self.Status.CANCELLED,
        }


SEARCH_TEXT_CHARS = 8000


class ApprovalRequest(models.Model):
    """One engine suspension (`toolnexus.Request`) waiting for, or given, a human decision."""

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        ANSWERED = "answered"
        DECLINED = "declined"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    class Kind(models.TextChoices):
        """The engine's suspension kinds (a host's own kinds are stored as they come)."""

        TOOL_CALL = "tool_call", "relay call"
        APPROVAL = "approval", "approval"
        QUESTION = "question", "question"
        INPUT = "input", "input"
        AUTHORIZATION = "authorization", "sign-in"
        ELICITATION = "elicitation", "MCP question"  # an MCP server asks during a tool call

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="requests")
    agent = models.CharField(max_length=100, help_text="Copied from the run for the inbox filter.")
    # The engine's wire fields.
    request_id = models.CharField("request id", max_length=200, unique=True)
    kind = models.CharField(max_length=50, choices=Kind.choices)
    prompt = models.TextField(blank=True, default="")
    url = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # The decision.
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    answer = models.JSONField(
        null=True, blank=True, help_text="The Answer given to the engine, in wire shape."
    )
    reason = models.TextField(blank=True, default="")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    # Set once the worker has carried the decision into the run's transcript.
    applied_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Triage: a reviewer says "I am on it". Active while pending and claimed_at is newer
    # than TOOLNEXUS_CLAIM_MINUTES (selectors.active_claim); kept as history once decided.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    # What the inbox search looks in, lowercased (build_search_text): filled when the row is
    # made, so a search is one indexed column (pg_trgm on PostgreSQL), not a join per call.
    search_text = models.TextField(blank=True, default="", editable=False)
    # Decided by a rule, not a person (the worker, inline): which rule, at which version.
    decided_by_rule = models.ForeignKey(
        "Rule", null=True, blank=True, on_delete=models.SET_NULL, related_name="decisions"
    )
    rule_version = models.PositiveIntegerField(null=True, blank=True)
    # A rule set who may decide it (its RequestRequirement): decisions and cards read that
    # row only when this is set, so other requests cost no extra read.
    has_requirement = models.BooleanField(default=False, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "request"
        permissions = [("decide_request", "Can approve, answer or decline requests")]
        indexes = [
            models.Index(fields=["state", "-created_at", "-id"], name="req_inbox"),
            models.Index(fields=["state", "agent", "-created_at"], name="req_inbox_agent"),
            models.Index(fields=["state", "kind", "-created_at"], name="req_inbox_kind"),
            models.Index(fields=["state", "expires_at"], name="req_expiry"),
            # sort=deadline: soonest first, none last (ASC is NULLS LAST), then newest.
            models.Index(
                fields=["state", "expires_at", "-created_at", "-id"], name="req_inbox_deadline"
            ),
            # The next claim to lapse (selectors.next_lapse, for an "unclaimed" list): open
            # claims only, in claim order; without it every claimed row was read and sorted.
            models.Index(
                fields=["claimed_at"],
                condition=Q(state="pending", claimed_by__isnull=False),
                name="req_open_claims",
            ),
        ]
        constraints = [
            # A run waits on at most one open request at a time.
            models.UniqueConstraint(
                fields=["run"], condition=Q(state="pending"), name="req_one_open_per_run"
            ),
            # A decision is all there or not at all.
            models.CheckConstraint(
                condition=(Q(state="pending") & Q(decided_at__isnull=True) & Q(answer__isnull=True))
                | (~Q(state="pending") & Q(decided_at__isnull=False)),
                name="req_decision_complete",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} request {self.request_id} ({self.state})"

    def save(self, *args, **kwargs):
        if self._state.adding and not self.search_text:
            self.search_text = self.build_search_text()
        super().save(*args, **kwargs)

    def build_search_text(self) -> str:
        """The lowercased text the inbox search matches (`search_text_of`); the run's prompt
        is included when the run is at hand (no query)."""
        run = self.run if ApprovalRequest.run.is_cached(self) else None
        return search_text_of(
            agent=self.agent,
            kind=self.kind,
            prompt=self.prompt,
            data=self.data,
            run_prompt=run.prompt if run is not None else "",
        )

    @property
    def is_relay(self) -> bool:
        return self.kind == "tool_call"

    def to_engine(self):
        from toolnexus import Request

        return Request.from_dict(self.wire)

    def call_list(self) -> list:
        """The request's calls by position: as a list read prefetched them (`listed_calls`,
        no queryset per row), else from the calls' manager."""
        listed = getattr(self, "listed_calls", None)
        return listed if listed is not None else list(self.calls.all())

    def relay_tool_names(self) -> list[str]:
        """The tools a relay request asks the host to run, from its own data (no query)."""
        from toolnexus.relay import relay_calls_of

        return [c.name for c in relay_calls_of(self.to_engine())] if self.is_relay else []

    @property
    def wire(self) -> dict:
        out = {"id": self.request_id, "kind": self.kind, "prompt": self.prompt}
        if self.url:
            out["url"] = self.url
        if self.data:
            out["data"] = self.data
        if self.expires_at:
            out["expiresAt"] = self.expires_at.isoformat().replace("+00:00", "Z")
        return out


def search_text_of(*, agent: str, kind: str, prompt: str, data: Any, run_prompt: str = "") -> str:
    """What the inbox search looks in, lowercased, capped at SEARCH_TEXT_CHARS: the agent,
    the request's prompt, the run's prompt, and each call's tool name and arguments
    (a relay request's `data.calls`; an approval's `data.tool` and its raw `arguments`, or
    its `input` as JSON). Read from the request's own data, so no call rows are needed."""
    data = data if isinstance(data, dict) else {}
    parts = [agent, prompt]
    if run_prompt and run_prompt != prompt:
        parts.append(run_prompt)
    calls = data.get("calls") if kind == "tool_call" else None
    if not isinstance(calls, list):
        calls = [data] if data.get("tool") or data.get("callId") else []
    for call in calls:
        if not isinstance(call, dict):
            continue
        parts.append(str(call.get("name") or call.get("tool") or ""))
        arguments = call.get("arguments")
        if isinstance(arguments, str) and arguments.strip() not in ("", "{}"):
            parts.append(arguments)  # the provider's raw text, as the model wrote it
        elif call.get("input"):
            parts.append(json.dumps(call["input"], ensure_ascii=False))
    return "\n".join(p for p in parts if p).lower()[:SEARCH_TEXT_CHARS]


class RequestCall(models.Model):
    """One tool call a request carries: every relay call of the turn, or the gated call."""

    class Decision(models.TextChoices):
        APPROVE = "approve"
        EDIT = "edit"
        OUTPUT = "output"
        DECLINE = "decline"

    # Not indexed on its own: call_unique_per_request starts with it.
    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="calls", db_index=False
    )
    position = models.PositiveSmallIntegerField()
    call_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    input = models.JSONField(default=dict, blank=True)
    arguments = models.TextField(
        blank=True, default="", help_text="The provider's raw argument string."
    )
    decision = models.CharField(max_length=10, choices=Decision.choices, blank=True, default="")
    edited_input = models.JSONField(null=True, blank=True)
    output = models.TextField(
        null=True, blank=True, help_text="Typed by the reviewer, or the executor's result."
    )
    is_error = models.BooleanField(default=False)
    reason = models.TextField(blank=True, default="")

    class Meta:
        # By the key, not "request" (which follows the request's own ordering: a join to the
        # request table in every read of calls); newer requests first, as that order put them.
        ordering = ["-request_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["request", "call_id"], name="call_unique_per_request")
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.call_id})"


class RequestHide(models.Model):
    """One reviewer's snooze (`until`) or ignore (`until` null) of one request: hidden from
    that reviewer's inbox until then (or until they un-hide it), never from anyone else's."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="hides")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    until = models.DateTimeField(null=True, blank=True, help_text="Empty: ignored until un-hidden.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "hidden request"
        constraints = [
            models.UniqueConstraint(fields=["request", "user"], name="hide_once_per_user")
        ]

    def __str__(self) -> str:
        what = f"snoozed until {self.until:%Y-%m-%d %H:%M}" if self.until else "ignored"
        return f"request {self.request_id} {what} by user {self.user_id}"


class ToolExecution(models.Model):
    """A tool the worker executed for real, by call id: a crashed worker never runs it twice.

    `started_at` is committed before the tool runs and `finished_at` right after, so a crash
    in between is visible as an execution with an unknown outcome, not a silent re-run.
    """

    # Not indexed on its own: the unique key below starts with it.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="executions", db_index=False
    )
    # Position of the calling assistant message in the transcript: in-process models may
    # reuse call ids across turns, so the call id alone is not a key.
    message_index = models.IntegerField()
    call_id = models.CharField(max_length=200)
    # The agent of a team run that called it (its handle id, "root/coordinator.1/refunds.1"):
    # transcript positions and call ids repeat from one agent's transcript to another's.
    # "" for a single agent's run.
    handle = models.CharField(max_length=400, blank=True, default="")
    tool_name = models.CharField(max_length=200)
    input = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    output = models.TextField(blank=True, default="")
    is_error = models.BooleanField(default=False)

    class Meta:
        # By the key, not "run" (a join to the run table in every read); newer runs first.
        ordering = ["-run_id", "started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "handle", "message_index", "call_id"],
                name="execution_once_per_call",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.call_id}) for run {self.run_id}"


class Event(models.Model):
    """Append-only audit trail: who changed what, when, and what the model was told."""

    # Not indexed on its own: event_run_created starts with it (an insert per audit event
    # maintains one index fewer).
    # Null for an event about no run: a rule's audit trail (`rule`).
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    request = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    # The rule a rule_* event is about; the detail keeps its id and name once it is deleted.
    rule = models.ForeignKey(
        "Rule", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=50)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["run", "created_at"], name="event_run_created")]

    def __str__(self) -> str:
        return f"{self.action} on run {self.run_id} at {self.created_at:%Y-%m-%d %H:%M:%S}"

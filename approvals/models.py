"""Runs, the requests they halt on, the calls inside each request, tool executions, audit.

Nothing outside `approvals.services` (and the worker's runner, through services) writes these
rows; read them through `approvals.selectors`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
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


class ApiToken(models.Model):
    """A bearer token for the JSON API. Only a hash is stored; the token is shown once.

    A token works until it expires (`expires_at`, null: never) or is revoked (by its owner
    through the API, by the `revoke_api_token` command or the admin action, or by a change
    of its owner's password)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(
        max_length=12, help_text="The token's first characters, to tell tokens apart."
    )
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="The token stops working then; empty: never."
    )
    last_used_at = models.DateTimeField(
        null=True, blank=True, help_text="Updated at most once a minute."
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    def state_at(self, now) -> str:
        """ "active", "expired" or "revoked"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    @staticmethod
    def hash(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @staticmethod
    def generate() -> str:
        return "tnx_" + secrets.token_urlsafe(32)


class AgentPolicy(models.Model):
    """Who may see and decide one agent's runs and requests (managed in the admin).

    With no group listed for an agent, the global permissions apply to it as they are. Once a
    group is listed, only members of a listed group (and superusers) see the agent's runs,
    requests and transcripts, and only members of a group listed with "can decide" decide
    them; the global view and decide permissions are still needed as well."""

    agent = models.CharField(max_length=100, unique=True, help_text="The agent's registered name.")
    starter_cannot_approve = models.BooleanField(
        "whoever started a run cannot approve its requests",
        default=False,
        help_text="Four eyes: the person who started a run may decline its requests or cancel"
        " it, but another reviewer must approve or answer them. TOOLNEXUS_STARTER_CANNOT_APPROVE"
        " turns this on for every agent.",
    )

    class Meta:
        ordering = ["agent"]
        verbose_name = "agent access"
        verbose_name_plural = "agent access"

    def __str__(self) -> str:
        return self.agent


class AgentAccess(models.Model):
    """One group's rights on one agent (see AgentPolicy)."""

    policy = models.ForeignKey(AgentPolicy, on_delete=models.CASCADE, related_name="grants")
    group = models.ForeignKey("auth.Group", on_delete=models.CASCADE, related_name="+")
    can_decide = models.BooleanField(
        default=False, help_text="Members may approve, answer and decline, not only watch."
    )

    class Meta:
        ordering = ["policy", "group"]
        verbose_name = "group with access"
        verbose_name_plural = "groups with access"
        constraints = [
            models.UniqueConstraint(fields=["policy", "group"], name="agent_access_once_per_group")
        ]

    def __str__(self) -> str:
        return f"{self.group} on {self.policy} ({'decide' if self.can_decide else 'view'})"


class WorkerHeartbeat(models.Model):
    """A worker's sign of life, written when it starts and then every third of the run lease
    by its heartbeat thread (db_worker processes and `serve`'s in-process worker alike).
    /readyz wants one beat within TOOLNEXUS_READY_WORKER_SECONDS; the admin lists them."""

    worker_id = models.CharField("worker id", max_length=64, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField("process id")
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField("last beat", db_index=True)
    # Set when the worker stopped cleanly; a killed worker's row just stops beating.
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-beat_at", "-id"]

    def __str__(self) -> str:
        return f"worker {self.worker_id} on {self.host} (pid {self.pid})"


class Rule(models.Model):
    """A standing decision for the team: calls in its scope whose condition holds are approved
    or declined by the worker where the run would halt, with no request left waiting.

    Rules are tried by `position`, then declines before approves, then age; the first
    enabled, unexpired match decides (`domain.rules.first_match`). `version` goes up with
    every edit, and each decision records the version it was made under."""

    class Effect(models.TextChoices):
        APPROVE = "approve"
        DECLINE = "decline"
        # These decide nothing: the request waits with the rule's requirements on it.
        REQUIRE_APPROVERS = "require_approvers", "require N distinct approvers"
        REQUIRE_GROUP = "require_group", "require a group"

    class Escalation(models.TextChoices):
        NONE = "", "none"
        NOTIFY = "notify", "notify a group"
        REASSIGN = "reassign", "route to a person or group"
        DECLINE = "decline", "decline with a reason"

    class Kind(models.TextChoices):
        ANY = "", "any gated call"
        TOOL_CALL = "tool_call", "relay call"
        APPROVAL = "approval", "approval"

    name = models.CharField(max_length=100)
    position = models.PositiveIntegerField(
        default=100, help_text="Lower positions are tried first."
    )
    enabled = models.BooleanField(default=True)
    agent = models.CharField(max_length=100, blank=True, default="", help_text="Empty: any agent.")
    tool = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="A tool name or a glob such as refund_* (empty: any tool).",
    )
    kind = models.CharField(max_length=20, choices=Kind.choices, blank=True, default="")
    condition = models.TextField(
        blank=True,
        default="",
        help_text='A CEL expression over args and run, e.g. args.amount <= 50 && args.currency == "USD".',
    )
    effect = models.CharField(max_length=20, choices=Effect.choices)
    reason = models.TextField(
        blank=True, default="", help_text='What the model reads for a decline (empty: "declined").'
    )
    # An "always allow ... for this run only" rule: only this run's calls match.
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="rules"
    )
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never.")
    # Requirements (effects require_approvers / require_group), copied onto each request.
    approvals_needed = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct people who must approve (require_approvers: 2 or more)."
    )
    approver_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Only its members may decide (require_group; optional otherwise).",
    )
    starter_may_not_approve = models.BooleanField(
        default=False, help_text="Whoever started the run may not approve its call."
    )
    escalate_after_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Escalate a request still undecided after this long."
    )
    escalate_action = models.CharField(
        max_length=10, choices=Escalation.choices, blank=True, default=""
    )
    escalate_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_reason = models.TextField(blank=True, default="")
    version = models.PositiveIntegerField(default=1)
    match_count = models.PositiveIntegerField(default=0)
    last_matched_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # An "always allow" ticked when approving this request made the rule.
    source_request = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["position", "id"]
        permissions = [("manage_rules", "Can create, edit and delete rules")]

    def __str__(self) -> str:
        return f"rule {self.pk}, {self.name}, version {self.version}"


class WebhookSubscription(models.Model):
    """A host's endpoint that hears the events it subscribed to (`approvals.hostevents`),
    signed per the Standard Webhooks specification with its secret (managed in the admin)."""

    url = models.URLField(max_length=500, help_text="Where events are POSTed (http or https).")
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = models.JSONField(
        default=list,
        blank=True,
        help_text='The event types sent, e.g. ["request.created", "run.finished"]; empty: all.',
    )
    secret = models.CharField(
        max_length=100,
        help_text="The signing secret (whsec_ and base64); the host verifies with it.",
    )
    active = models.BooleanField(default=True)
    # Events up to this one (the audit Event's id) have their deliveries made.
    last_event_id = models.BigIntegerField(default=0, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "webhook subscription"

    def __str__(self) -> str:
        return self.description or self.url

    @staticmethod
    def generate_secret() -> str:
        return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()

    def wants(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types


class WebhookDelivery(models.Model):
    """One event to one subscription: sent until the endpoint answers 2xx or attempts run out.
    The webhook id the host sees (`evt_<event id>`) stays the same over every attempt."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (gave up)"

    subscription = models.ForeignKey(
        WebhookSubscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="+")
    event_type = models.CharField(max_length=50)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.PositiveIntegerField(null=True, blank=True, help_text="HTTP status.")
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "event"], name="webhook_delivery_once_per_event"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} (evt_{self.event_id}) to {self.subscription}"


class RequestRequirement(models.Model):
    """What a pending request needs before it is decided, copied from the rule that required
    it when the run halted (later edits of the rule change new halts only), and its
    escalation: when it is due, what it does, and once done, when and to whom it routed."""

    request = models.OneToOneField(
        ApprovalRequest, on_delete=models.CASCADE, related_name="requirement"
    )
    rule = models.ForeignKey(
        Rule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rule_version = models.PositiveIntegerField(null=True, blank=True)
    approvals_needed = models.PositiveSmallIntegerField(default=1)
    approver_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    starter_may_not_approve = models.BooleanField(default=False)
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalate_action = models.CharField(max_length=10, blank=True, default="")
    escalate_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_reason = models.TextField(blank=True, default="")
    escalated_at = models.DateTimeField(null=True, blank=True)
    # Set by a "reassign" escalation: the inbox's "routed to me" chip.
    routed_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    routed_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        indexes = [
            # The worker's escalation sweep: due and not yet escalated.
            models.Index(
                fields=["escalate_at"],
                condition=Q(escalated_at__isnull=True, escalate_at__isnull=False),
                name="req_escalation_due",
            )
        ]

    def __str__(self) -> str:
        return f"requirement of request {self.request_id}"


class ApprovalGiven(models.Model):
    """One person's approval of a request that needs several: the Nth distinct one decides it."""

    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="approvals_given"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name = "approval given"
        verbose_name_plural = "approvals given"
        constraints = [
            models.UniqueConstraint(fields=["request", "user"], name="approval_given_once_per_user")
        ]

    def __str__(self) -> str:
        return f"approval of request {self.request_id} by user {self.user_id}"


class NotificationPreference(models.Model):
    """How one reviewer hears of new requests: by email and/or chat (apprise URLs), which
    requests, when (quiet hours) and how often (one message per request, or a digest).
    Nothing is sent unless TOOLNEXUS_NOTIFICATIONS is on."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email_enabled = models.BooleanField("email", default=False)
    email = models.EmailField(
        "email address",
        blank=True,
        default="",
        help_text="Where emails go; empty: the account's address.",
    )
    chat_enabled = models.BooleanField("chat", default=False)
    push_enabled = models.BooleanField(
        "push",
        default=False,
        help_text="Web Push to the browsers where you turned it on (below).",
    )
    chat_urls = models.TextField(
        "chat URLs",
        blank=True,
        default="",
        help_text="Apprise URLs, one a line (e.g. json://chat.example.com/hook); only the"
        " schemes in TOOLNEXUS_NOTIFICATION_CHAT_SCHEMES.",
    )
    agents = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="Agent names, comma-separated; empty: all.",
    )
    kinds = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Request kinds (tool_call, approval, question, ...), comma-separated; empty: all.",
    )
    only_routed = models.BooleanField(
        "only requests routed to me",
        default=False,
        help_text="Only agents whose access lists a group of mine that can decide.",
    )
    only_overdue = models.BooleanField(
        "only overdue requests",
        default=False,
        help_text="Only requests still waiting past their deadline or"
        " TOOLNEXUS_NOTIFICATION_OVERDUE_MINUTES after they arrived.",
    )
    quiet_start = models.TimeField(null=True, blank=True, help_text="Quiet hours from (HH:MM).")
    quiet_end = models.TimeField(null=True, blank=True, help_text="... until (HH:MM).")
    time_zone = models.CharField(
        max_length=64,
        default="UTC",
        help_text="The time zone of the quiet hours, e.g. Europe/Paris.",
    )
    digest_minutes = models.PositiveIntegerField(
        "digest every (minutes)",
        default=0,
        help_text="0: one message per request; else one message every this many minutes"
        " listing what arrived.",
    )
    # When the last message went out (the digest's clock).
    last_sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "notification preference"

    def __str__(self) -> str:
        return f"notifications of {self.user}"

    def chat_url_list(self) -> list[str]:
        return [line.strip() for line in self.chat_urls.splitlines() if line.strip()]

    def agent_list(self) -> list[str]:
        return [a.strip() for a in self.agents.split(",") if a.strip()]

    def kind_list(self) -> list[str]:
        return [k.strip() for k in self.kinds.split(",") if k.strip()]


class NotificationItem(models.Model):
    """A request that reached one person's notifications, waiting for its message (now, after
    the quiet hours, or in the next digest). Kept once sent: a request reaches a person once
    per reason."""

    class Reason(models.TextChoices):
        NEW = "new", "new"
        OVERDUE = "overdue", "overdue"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=20, choices=Reason.choices, default=Reason.NEW)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "request", "reason"], name="notification_item_once"
            )
        ]
        indexes = [models.Index(fields=["user", "sent_at"], name="notification_item_unsent")]


class NotificationDelivery(models.Model):
    """One message to one channel of one person, sent by a task with retries; a failure is
    logged here (last_error) and never holds another channel back."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (gave up)"

    class Channel(models.TextChoices):
        EMAIL = "email", "email"
        CHAT = "chat", "chat"
        PUSH = "push", "push"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_deliveries"
    )
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.TextField(
        help_text="The email address, the apprise URL or the push subscription's endpoint."
    )
    subject = models.CharField(max_length=300)
    body = models.TextField()
    # The page a push opens when clicked (a push carries no text to read a link from).
    url = models.CharField(max_length=500, blank=True, default="")
    is_test = models.BooleanField(default=False)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "notification deliveries"

    def __str__(self) -> str:
        return f"{self.channel} to {self.user}: {self.subject}"


class WebPushSubscription(models.Model):
    """One browser (a device, a profile) where a person turned push on: the push service's
    endpoint and the keys that encrypt what is sent to it. An endpoint belongs to one
    browser, so it is unique: the same browser subscribing again updates its row. Removed
    when the push service says it is gone (404, 410)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions"
    )
    endpoint = models.CharField(max_length=1000, unique=True)
    p256dh = models.CharField(max_length=200)
    auth = models.CharField(max_length=100)
    user_agent = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    last_error = models.TextField(blank=True, default="")
    last_success_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "web push subscription"

    def __str__(self) -> str:
        return f"push to {self.user}: {self.user_agent or 'a browser'}"


class NotificationLinkUse(models.Model):
    """A signed email link (approve or decline) that was used: each works once."""

    nonce = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=10)
    used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]


class NotificationCursor(models.Model):
    """One row: the audit rows up to `last_event_id` were turned into notification items."""

    last_event_id = models.BigIntegerField(default=0)


class TeamReport(models.Model):
    """No table: the holder of the "view reports" permission (the team dashboard, /reports/).
    A permission needs a model to hang on; an unmanaged one adds none to the database."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_reports", "Can view the team reports")]


class SlackLink(models.Model):
    """A Slack user (of one workspace) whom a person linked to their account, once, from a
    signed link: that Slack user's Approve / Decline clicks decide as this person."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_links"
    )
    team_id = models.CharField("Slack workspace id", max_length=32)
    slack_user_id = models.CharField("Slack user id", max_length=32)
    slack_name = models.CharField("Slack user name", max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["team_id", "slack_user_id"], name="slack_link_once")
        ]

    def __str__(self) -> str:
        return f"Slack {self.slack_name or self.slack_user_id} ({self.team_id}) = {self.user}"


class SlackMessage(models.Model):
    """A request's message in the team's Slack channel: posted by a task with retries, then
    updated in place (by its channel and ts) with the outcome and who decided."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        POSTED = "posted", "posted"
        FAILED = "failed", "failed (gave up)"

    request = models.OneToOneField(
        ApprovalRequest, on_delete=models.CASCADE, related_name="slack_message"
    )
    channel = models.CharField(max_length=64, help_text="Slack's channel id.")
    ts = models.CharField(max_length=32, blank=True, default="", help_text="Slack's message id.")
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    posted_at = models.DateTimeField(null=True, blank=True)
    # What the message shows now (the request's state and approvals), so that an update is
    # sent only when there is something new to show.
    shown = models.CharField(max_length=100, blank=True, default="")
    update_attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Slack message of request {self.request_id}"


class SlackCursor(models.Model):
    """One row: the audit rows up to `last_event_id` were turned into Slack messages (and
    their updates)."""

    last_event_id = models.BigIntegerField(default=0)

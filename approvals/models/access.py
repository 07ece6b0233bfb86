"""Who may do what: API tokens, per-agent access for groups, the reports permission; and
the workers' heartbeats."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


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


class TeamReport(models.Model):
    """No table: the holder of the "view reports" permission (the team dashboard, /reports/).
    A permission needs a model to hang on; an unmanaged one adds none to the database."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_reports", "Can view the team reports")]

"""A run page's socket: the run's body as of its latest change, and the model's reply while
it is generated."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.db import database_sync_to_async

from ...models import Run
from .. import rendering
from ..groups import run_group
from .base import _Base

log = logging.getLogger(__name__)


class RunConsumer(_Base):
    permission = "approvals.view_run"
    live_page = "run"
    next_change: str | None = None  # the newest change not yet rendered
    body_stale = False  # whether a change since the last rendering touched more than the status

    @property
    def run_id(self) -> int:
        return self.scope["url_route"]["kwargs"]["run_id"]

    def live_groups(self) -> list[str]:
        return [run_group(self.run_id)]

    def _permissions(self, user) -> tuple[bool, bool]:
        """The page's permission. A run that does not exist, or one of an agent hidden from
        this viewer, is `missing`: its page is told the run does not exist and nothing
        follows (run ids are sequential: a socket waiting for the next one would get a run
        of any agent; and a hidden run reads as a missing one, as its page's 404 does)."""
        can_decide, allowed = super()._permissions(user)
        run = Run.objects.filter(pk=self.run_id).values("agent", "started_by_id").first()
        self.missing = run is None or not self.rights.can_view(run["agent"])
        self.run_agent = run["agent"] if run else ""
        self.run_starter = run["started_by_id"] if run else None
        return can_decide, allowed

    def missing_html(self) -> str:
        return rendering.run_gone()

    def _variants(self) -> dict[str, bool]:
        return {
            # the run's own actions (cancel, retry); its open request may differ (the starter rule)
            "can_decide": self.rights.can_decide(self.run_agent, approving=False),
            "open_can_decide": self.rights.can_decide(
                self.run_agent, started_by_id=self.run_starter
            ),
        }

    def snapshot(self, user) -> str:
        return rendering.run_body(self.run_id, **self._variants())

    async def catch_up(self) -> None:
        await self.push(
            await database_sync_to_async(self.snapshot, thread_sensitive=False)(self.scope["user"])
        )

    async def approvals_run(self, event: dict) -> None:
        """Render and send the run's body as of the latest change (only its status line when
        no change since the last rendering touched more). The rendering runs beside the
        message loop: changes that arrive meanwhile (a resume makes several within
        milliseconds) are coalesced into one rendering of the newest."""
        if not await self.still_allowed():
            return
        self.next_change = event["change"]
        if not event.get("status_only"):
            self.body_stale = True
        if getattr(self, "sending", None) is None or self.sending.done():
            self.sending = asyncio.get_running_loop().create_task(self._send_latest())

    async def _send_latest(self) -> None:
        while self.next_change is not None:
            change, self.next_change = self.next_change, None
            whole, self.body_stale = self.body_stale, False
            variants = self._variants()
            try:
                if whole:
                    html = await rendering.run_body_for_change(
                        self.run_id, change=change, **variants
                    )
                else:
                    html = await rendering.run_head_for_change(
                        self.run_id, change=change, can_decide=variants["can_decide"]
                    )
            except Exception:  # the page heals at the next change or reconnect
                log.exception("rendering run %s for a live page failed", self.run_id)
                self.body_stale = self.body_stale or whole  # the next change renders it all
                continue
            await self.push(html)

    async def approvals_reply(self, event: dict) -> None:
        """The model's reply so far, while the run works: the page's "replying…" entry
        (replaced by the stored transcript when the turn's outcome is rendered)."""
        if not await self.still_allowed():
            return
        await self.push(
            rendering.live_reply(
                event["text"], done=bool(event.get("done")), agent=event.get("agent") or ""
            )
        )

    async def disconnect(self, code: int) -> None:
        sending = getattr(self, "sending", None)
        if sending is not None and not sending.done():
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sending
        await super().disconnect(code)

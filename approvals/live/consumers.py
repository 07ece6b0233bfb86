"""Websocket consumers: authenticated, thin, read-only.

On connect each sends the page's live region re-rendered from the database, so a reconnect
heals any missed message; afterwards, on each change the publisher announces, it sends the
fragments its page shows (`rendering`: rendered once per change and variant, only when some
page needs them). Nothing here writes: decisions are HTTP POSTs.

A page stays live only while its viewer may see it: a sign-out closes the sockets of that
session at once (`approvals.session` messages to the user's group, see apps.py), and before
forwarding a push a consumer re-checks session, active state and permissions when its last
check is older than RECHECK_SECONDS. A TTL rather than a check per push: a push goes to every
open page, and three queries per page per push would make every decision cost O(pages)
queries; a change of access that must act at once (a sign-out, a user's groups, permissions
or active flag edited) is sent as a message instead, and anything else (a group's permissions
edited, a session expiring) is caught within RECHECK_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from importlib import import_module
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.cache import cache

from ..conf import app_settings
from ..models import Run
from ..permissions import agent_rights
from ..presenters.pages import inbox_filters
from . import rendering
from .groups import INBOX_GROUP, run_group, user_group

try:  # what Daphne's websocket layer raises on a send after the client went away
    from autobahn.exception import Disconnected as ClientGone
except ImportError:  # another ASGI server
    ClientGone = ()  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

MAX_FRAME = 4096  # clients have nothing to say; a large frame is a misbehaving client
RECHECK_SECONDS = 30.0  # how stale a viewer's checked access may be when a push arrives
# Close codes: the page says "signed out" / "not allowed" / "too many live pages".
SIGNED_OUT, FORBIDDEN, TOO_MANY = 4401, 4403, 4429
# A user's open-socket count lives in the cache (shared by every server process when
# TOOLNEXUS_CACHE_URL names one); refreshed on every connect, so a count left by a killed
# process lapses instead of locking the user out for good.
SOCKET_COUNT_SECONDS = 3600


def session_tag(session_key: str | None) -> str:
    """Names a session in channel messages without sending its key around."""
    return hashlib.sha256((session_key or "").encode()).hexdigest()[:32] if session_key else ""


class _Base(AsyncWebsocketConsumer):
    permission = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.can_decide, allowed = await database_sync_to_async(self._permissions)(user)
        if not allowed:
            await self.close(code=4403)
            return
        self.user_id = user.pk
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.session_tag = session_tag(self.session_key)
        self.checked_at = time.monotonic()
        self.ended = False
        if not await self._count_socket():
            await self.close(code=TOO_MANY)
            return
        for group in self._groups():
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        # Off the thread-sensitive thread (see rendering.FragmentCache): a page's snapshot
        # must not hold up the messages of every other page of the process.
        await self.push(await database_sync_to_async(self.snapshot, thread_sensitive=False)(user))

    def _groups(self) -> list[str]:
        return [*self.live_groups(), user_group(self.user_id)]

    async def push(self, html: str) -> None:
        if not html:
            return
        try:
            await self.send(text_data=html)
        except ClientGone:
            # The page closed while a push was on its way; its next connect re-renders.
            return

    def _permissions(self, user) -> tuple[bool, bool]:
        """(may decide at all, may see this page), and the viewer's per-agent rights
        (`self.rights`: one query, which also fills the permission cache)."""
        self.rights = agent_rights(user, fresh=True)
        return user.has_perm("approvals.decide_request"), user.has_perm(self.permission)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            with contextlib.suppress(ValueError):  # the count lapsed meanwhile
                await cache.adecr(self._count_key())
        if getattr(self, "user_id", None) is None:
            return  # refused before joining any group
        for group in self._groups():
            await self.channel_layer.group_discard(group, self.channel_name)

    def _count_key(self) -> str:
        return f"toolnexus:live:sockets:{self.user_id}"

    async def _count_socket(self) -> bool:
        """Count this socket against its user's cap (TOOLNEXUS_MAX_SOCKETS_PER_USER): one
        account cannot hold the server's connections open by the hundred."""
        limit = app_settings.MAX_SOCKETS_PER_USER
        if not limit:
            return True
        key = self._count_key()
        await cache.aadd(key, 0, SOCKET_COUNT_SECONDS)
        try:
            count = await cache.aincr(key)
        except ValueError:  # expired between add and incr
            await cache.aset(key, 1, SOCKET_COUNT_SECONDS)
            count = 1
        await cache.atouch(key, SOCKET_COUNT_SECONDS)
        self.counted = True
        return count <= limit

    # -- the viewer's access, re-checked -------------------------------------------------

    async def approvals_session(self, event: dict) -> None:
        """A session of this user ended (sign-out: close this page if it is that session's),
        or the user's access changed (check it now)."""
        if event.get("action") == "logout":
            if not event.get("session") or event["session"] == self.session_tag:
                await self._end(SIGNED_OUT)
            return
        await self._recheck()

    async def still_allowed(self) -> bool:
        """Before forwarding a push: may this viewer still see it? Checked against the
        database at most every RECHECK_SECONDS (and at once on an `approvals.session`)."""
        if self.ended:
            return False
        if time.monotonic() - self.checked_at < RECHECK_SECONDS:
            return True
        return await self._recheck()

    async def _recheck(self) -> bool:
        if self.ended:
            return False
        code, can_decide = await database_sync_to_async(self._current_access)()
        if code:
            await self._end(code)
            return False
        self.can_decide = can_decide
        self.checked_at = time.monotonic()
        return True

    def _current_access(self) -> tuple[int | None, bool]:
        """(close code or None, may decide) for this page's session as the database has it
        now: the session still exists, still names this user, the user is active and their
        password unchanged (Django's session hash), and still has the page's permission."""
        from django.contrib.auth import (
            BACKEND_SESSION_KEY,
            HASH_SESSION_KEY,
            SESSION_KEY,
            load_backend,
        )
        from django.utils.crypto import constant_time_compare

        if not self.session_key:
            return SIGNED_OUT, False
        # Read-only on purpose: auth.get_user() may flush or cycle the session, which a
        # socket could not tell the browser about.
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=self.session_key)
        data = store.load()
        backend_path = data.get(BACKEND_SESSION_KEY)
        if str(data.get(SESSION_KEY)) != str(self.user_id) or (
            backend_path not in settings.AUTHENTICATION_BACKENDS
        ):
            return SIGNED_OUT, False
        user = load_backend(backend_path).get_user(self.user_id)  # None when inactive
        session_hash = data.get(HASH_SESSION_KEY) or ""
        if user is None or not any(
            constant_time_compare(session_hash, h)
            for h in [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
        ):
            return SIGNED_OUT, False
        can_decide, allowed = self._permissions(user)
        return (None if allowed else FORBIDDEN), can_decide

    async def _end(self, code: int) -> None:
        if self.ended:
            return
        self.ended = True
        await self.close(code=code)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if (text_data and len(text_data) > MAX_FRAME) or bytes_data:
            await self.close(code=4400)
        # Anything else is ignored: the socket only carries server-to-page updates.

    def live_groups(self) -> list[str]:
        raise NotImplementedError

    def snapshot(self, user) -> str:
        raise NotImplementedError


class InboxConsumer(_Base):
    permission = "approvals.view_approvalrequest"

    def live_groups(self) -> list[str]:
        return [INBOX_GROUP]

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        params = {k: v[0] for k, v in query.items() if v}
        self.filters = inbox_filters(params)
        self.page = params.get("page") or 1
        await super().connect()

    def snapshot(self, user) -> str:
        return rendering.request_list(user, self.filters, self.page)

    def _matches(self, event: dict) -> bool:
        return (not self.filters["agent"] or self.filters["agent"] == event["agent"]) and (
            not self.filters["kind"] or self.filters["kind"] == event["kind"]
        )

    def _counts_pending(self) -> bool:
        """An unfiltered list of pending requests: its header counts them all."""
        return self.filters == {"agent": "", "kind": "", "state": "pending"}

    async def approvals_request(self, event: dict) -> None:
        """A request was created or changed. A page that shows it gets its card (a new one on
        top of page one, a changed one in place); a page that no longer shows it drops it at
        once, before anything is rendered. The pending count follows in a frame of its own,
        so counting a large inbox never delays the rest."""
        if not self._matches(event) or not await self.still_allowed():
            return
        if not self.rights.can_view(event["agent"]):
            return  # an agent hidden from this viewer: not even a toast
        dom_id = f"request-{event['request_pk']}"
        shows_card = self.filters["state"] in ("all", event["state"])
        created = event["created"]
        card, drop = "", ""
        if shows_card and not (created and str(self.page) != "1"):
            card = await rendering.card_for_change(
                event["request_pk"],
                change=event["change"],
                can_decide=self.rights.can_decide(
                    event["agent"], started_by_id=event.get("started_by_id")
                ),
                oob=not created,
            )
        elif not shows_card and not created:
            drop = dom_id
        await self.push(
            rendering.inbox_update(card=card, prepend=created, drop=drop, toast=self._toast(event))
        )
        if self._counts_pending():
            count = await rendering.count_for_change(
                change=event["change"],
                hidden=frozenset() if self.rights.superuser else self.rights.hidden,
            )
            await self.push(rendering.pending_count_html(count))

    def _toast(self, event: dict) -> dict:
        if event["state"] == "pending":
            return {"text": event["toast"]}
        # A decision: its decider's own pages confirm it as theirs ("You declined: ..."),
        # everybody else's say who decided. `about` lets a page tell which card the news is
        # about (the deciding tab keeps its own answer's toast, not this one).
        own = event.get("decided_by") is not None and event["decided_by"] == self.user_id
        text = event["own_toast"] if own and event.get("own_toast") else event["toast"]
        return {
            "text": text,
            "level": "success" if own else "",
            "about": f"request-{event['request_pk']}",
        }


class RunConsumer(_Base):
    permission = "approvals.view_run"

    @property
    def run_id(self) -> int:
        return self.scope["url_route"]["kwargs"]["run_id"]

    def live_groups(self) -> list[str]:
        return [run_group(self.run_id)]

    def _permissions(self, user) -> tuple[bool, bool]:
        """The page's permission, and the run's agent visible to this viewer (a missing run
        is allowed: its page says it no longer exists)."""
        can_decide, allowed = super()._permissions(user)
        run = Run.objects.filter(pk=self.run_id).values("agent", "started_by_id").first()
        self.run_agent = run["agent"] if run else ""
        self.run_starter = run["started_by_id"] if run else None
        return can_decide, allowed and (run is None or self.rights.can_view(self.run_agent))

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

    async def approvals_run(self, event: dict) -> None:
        """Render and send the run's body as of the latest change. The rendering runs beside
        the message loop: changes that arrive meanwhile (a resume makes several within
        milliseconds) are coalesced into one rendering of the newest."""
        if not await self.still_allowed():
            return
        self.next_change = event["change"]
        if getattr(self, "sending", None) is None or self.sending.done():
            self.sending = asyncio.get_running_loop().create_task(self._send_latest())

    async def _send_latest(self) -> None:
        while self.next_change is not None:
            change, self.next_change = self.next_change, None
            try:
                html = await rendering.run_body_for_change(
                    self.run_id, change=change, **self._variants()
                )
            except Exception:  # the page heals at the next change or reconnect
                log.exception("rendering run %s for a live page failed", self.run_id)
                continue
            await self.push(html)

    async def disconnect(self, code: int) -> None:
        sending = getattr(self, "sending", None)
        if sending is not None and not sending.done():
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sending
        await super().disconnect(code)

"""The consumers' common part: who may watch, the access checks with their TTL, the
per-user socket cap, the snapshot on connect and the guarded push."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from importlib import import_module

from channels.consumer import get_handler_name
from channels.db import aclose_old_connections, database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.cache import cache

from ... import metrics
from ...conf import app_settings
from ...permissions import agent_rights
from .. import rendering
from ..groups import LIVE_GROUP, user_group

try:  # what Daphne's websocket layer raises on a send after the client went away
    from autobahn.exception import Disconnected as ClientGone
except ImportError:  # another ASGI server
    ClientGone = ()  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

MAX_FRAME = 4096  # clients have nothing to say; a large frame is a misbehaving client
RECHECK_SECONDS = 30.0  # how stale a viewer's checked access may be when a push arrives
# Close codes: the page says "signed out" / "not allowed" / "gone" / "too many live pages".
SIGNED_OUT, FORBIDDEN, GONE, TOO_MANY = 4401, 4403, 4404, 4429
# A user's open-socket count lives in the cache (shared by every server process when
# TOOLNEXUS_CACHE_URL names one); refreshed on every connect, so a count left by a killed
# process lapses instead of locking the user out for good.
SOCKET_COUNT_SECONDS = 3600


def session_tag(session_key: str | None) -> str:
    """Names a session in channel messages without sending its key around."""
    return hashlib.sha256((session_key or "").encode()).hexdigest()[:32] if session_key else ""


class _Base(AsyncWebsocketConsumer):
    permission = ""
    can_allow_always = False  # set with the viewer's permissions (_permissions)
    live_page = ""  # its name in the live sockets gauge (metrics.LIVE_PAGES)
    metered = False  # counted in the gauge: this socket was accepted to follow its page
    # What the page follows does not exist (yet): its page is told so and the socket closes
    # without joining any group, since access could not be checked against it.
    missing = False

    async def dispatch(self, message: dict) -> None:
        """As channels' own, but its hop to close stale database connections comes only
        before the socket's own messages (connect, a frame, disconnect: these may use the
        cache, which a project may keep in the database), not before every push. The hop
        goes through the process's one thread-sensitive thread, which every consumer of the
        process shares: a push to a hundred open pages queued a hundred hops one after the
        other. Pushes reach the database only through database_sync_to_async, which closes
        stale connections around each call itself."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        if message["type"].startswith("websocket."):
            await aclose_old_connections()
        await handler(message)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.can_decide, allowed = await database_sync_to_async(self._permissions)(user)
        if not allowed:
            await self.close(code=FORBIDDEN)
            return
        if self.missing:
            await self.accept()
            await self.push(await database_sync_to_async(self.missing_html)())
            await self.close(code=GONE)
            return
        self.user_id = user.pk
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.session_tag = session_tag(self.session_key)
        self.checked_at = time.monotonic()
        self.fresh_at = time.monotonic()  # when the page last got the database's state
        self.ended = False
        if not await self._count_socket():
            await self.close(code=TOO_MANY)
            return
        for group in self._groups():
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.metered = True
        metrics.socket_opened(page=self.live_page)
        # Off the thread-sensitive thread (see rendering.FragmentCache): a page's snapshot
        # must not hold up the messages of every other page of the process.
        await self.push(await database_sync_to_async(self.snapshot, thread_sensitive=False)(user))

    def _groups(self) -> list[str]:
        return [*self.live_groups(), user_group(self.user_id), LIVE_GROUP]

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
        # Cards pushed to this page offer "always allow" to people who may make rules.
        self.can_allow_always = user.has_perm("approvals.manage_rules")
        return user.has_perm("approvals.decide_request"), user.has_perm(self.permission)

    async def disconnect(self, code: int) -> None:
        if self.metered:
            self.metered = False
            metrics.socket_closed(page=self.live_page)
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

    async def approvals_toast(self, event: dict) -> None:
        """A note for this user (an escalation naming them): a toast, on every live page."""
        if self.ended:
            return
        await self.push(rendering.toast_html(event.get("text") or "", event.get("about") or ""))

    async def approvals_resync(self, event: dict) -> None:
        """The live layer dropped messages (it was down) and works again since `age` seconds:
        unless this page connected or caught up since, it gets its live region re-rendered
        from the database, as after a reconnect (`catch_up`)."""
        healthy_at = time.monotonic() - float(event.get("age") or 0)
        if self.ended or self.fresh_at >= healthy_at or not await self.still_allowed():
            return
        self.fresh_at = time.monotonic()
        try:
            await self.catch_up()
        except Exception:  # the page stays as it was; the next change or reconnect heals it
            log.exception("a live page could not catch up after the layer came back")

    async def catch_up(self) -> None:
        raise NotImplementedError

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
        return (FORBIDDEN if not allowed else GONE if self.missing else None), can_decide

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

    def missing_html(self) -> str:
        return ""

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
import json
import logging
import re
import time
from importlib import import_module
from urllib.parse import parse_qs, urlencode

from channels.consumer import get_handler_name
from channels.db import aclose_old_connections, database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.cache import cache

from .. import metrics
from ..conf import app_settings
from ..models import ApprovalRequest, Run
from ..permissions import agent_rights
from ..selectors import InboxQuery
from . import rendering
from .groups import INBOX_GROUP, LIVE_GROUP, run_group, user_group

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


PRESENCE_SECONDS = 60  # a page says what it shows every 25 s (app.js); gone after this
REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def presence_key(request_id: str) -> str:
    return f"toolnexus:live:presence:{request_id}"


class InboxConsumer(_Base):
    """The inbox: its rows follow every change (a new request on top of page one when it
    matches the page's filters, a changed one replaced or dropped), the selected request's
    card follows (app.js never replaces a card in use), the counts follow, and the page
    says which request it shows (`{"viewing": "<request id>"}` frames, or `r=` at connect)
    so others who show the same request read "(reviewer2 is viewing)".

    A request's own page connects with `view=request&r=<id>`: only that request's card and
    toasts follow, and presence works both ways; no list, no counts."""

    permission = "approvals.view_approvalrequest"
    live_page = "inbox"

    def live_groups(self) -> list[str]:
        return [INBOX_GROUP]

    async def connect(self) -> None:
        params = self._use_filters(self.scope.get("query_string", b"").decode(errors="replace"))
        self.viewing = ""  # request id shown in the detail pane
        self.viewing_pk = None
        wanted = params.get("r", "")
        self.wanted = wanted if REQUEST_ID.match(wanted) else ""
        # A request's own page (`view=request`): its card and who else views it, no list.
        self.single = params.get("view") == "request" and bool(self.wanted)
        await super().connect()
        if getattr(self, "user_id", None) is not None and not self.ended and self.wanted:
            await self._view(self.wanted)

    def _use_filters(self, query_string: str) -> dict[str, str]:
        """The list's filters and page, from the page's URL query (at connect, and again when
        the page changes them without reloading, see `receive`)."""
        query = parse_qs(query_string.lstrip("?"))
        params = {k: v[0] for k, v in query.items() if v}
        self.query = InboxQuery.from_params(params)
        self.params = self.query.as_params()
        self.filter_query = urlencode(self.params)
        self.page = params.get("page") or 1
        return params

    def _list_snapshot(self) -> str:
        self._check_hides()
        return rendering.request_list(self.scope["user"], self.params, self.page)

    async def catch_up(self) -> None:
        """What a reconnect brings: the list as the page now filters it (on which the page
        says again which card it shows, with `resync`, and gets that card if the request
        was decided meanwhile); a request's own page gets that card directly. The page
        keeps a card the reviewer is working in and says who decided."""
        if not self.single:
            await self.push(
                await database_sync_to_async(self._list_snapshot, thread_sensitive=False)()
            )
        elif self.viewing:
            await self.push(
                await database_sync_to_async(self._decided_card, thread_sensitive=False)(
                    self.viewing
                )
            )

    def snapshot(self, user) -> str:
        """The list, and the selected request's card (the page keeps a card in use)."""
        self.username = user.get_username()
        html = "" if self.single else self._list_snapshot()
        row = rendering.visible_row(self.wanted, self.rights) if self.wanted else None
        if row is not None:
            decide = self.rights.can_decide(row.agent, started_by_id=row.run.started_by_id)
            html += rendering.card_html(
                row,
                can_decide=decide and row.state == "pending",
                oob=True,
                can_allow_always=self.can_allow_always,
            )
        return html

    # -- which rows this page shows ----------------------------------------------------------

    def _matches(self, event: dict) -> bool:
        """The page's agent and kind filters (events of other agents or kinds: nothing)."""
        q = self.query
        return (not q.agent or q.agent == event["agent"]) and (
            not q.kind or q.kind == event["kind"]
        )

    def _lists(self, event: dict) -> bool:
        """Whether the list shows the request as it is now, from the event's facts; the
        search and the snoozed/ignored list are asked of the database (`_lists_now`)."""
        q = self.query
        if q.state != "all" and q.state != event["state"]:
            return False
        holder = event.get("claimed_by_id")
        if q.claim == "mine" and holder != self.user_id:
            return False
        if q.claim == "unclaimed" and holder is not None:
            return False
        return not (q.overdue and not event.get("overdue"))

    async def _lists_now(self, event: dict) -> bool:
        if not self._lists(event):
            return False
        # Routed to this viewer: the request's escalation and their groups, in the database.
        if self.query.q or self.query.hidden or self.query.claim == "routed":
            hidden = frozenset() if self.rights.superuser else self.rights.hidden
            return await database_sync_to_async(rendering.matches_query, thread_sensitive=False)(
                event["request_pk"], self.user_id, self.params, hidden
            )
        return True

    async def approvals_request(self, event: dict) -> None:
        """A request was created or changed. A page that lists it gets its row (a new one on
        top of page one, a changed one in place); a page that no longer lists it drops it,
        before anything is rendered; the page showing it in the detail pane gets its card.
        The counts follow in a frame of their own, so counting never delays the rest."""
        if not self._matches(event) or not await self.still_allowed():
            return
        if not self.rights.can_view(event["agent"]):
            return  # an agent hidden from this viewer: not even a toast
        if self.single:
            await self._push_viewed_card(event)
            return
        created = event["created"]
        listed = await self._lists_now(event)
        row, drop = "", ""
        if listed and not (created and str(self.page) != "1"):
            row = await rendering.row_for_change(
                event["request_pk"],
                change=event["change"],
                filter_query=self.filter_query,
                oob=not created,
            )
        elif not listed and not created:
            drop = f"row-{event['request_pk']}"
        card = await self._viewed_card(event)
        await self.push(
            rendering.inbox_update(
                row=row, card=card, prepend=created, drop=drop, toast=self._toast(event)
            )
        )
        await self._push_count(event)

    async def approvals_bulk(self, event: dict) -> None:
        """A bulk decision, said once: "reviewer declined 3 requests" ("You ..." on the
        decider's pages; the deciding tab shows its own result instead, inbox-keys.js),
        counting the requests whose agent this viewer may see."""
        if self.single or not await self.still_allowed():
            return
        pks = [pk for pk, agent in event["requests"] if self.rights.can_view(agent)]
        if not pks:
            return
        own = event["decided_by"] == self.user_id
        who = "You" if own else event["decider"]
        text = f"{who} {event['verb']} {len(pks)} request{'' if len(pks) == 1 else 's'}"
        about = " ".join(f"request-{pk}" for pk in pks)
        toast = {"text": text, "level": "success" if own else "", "bulk": about}
        await self.push(rendering.inbox_update(toast=toast))

    async def _viewed_card(self, event: dict) -> str:
        """The card of the changed request when this page shows it ("" otherwise)."""
        if event["created"] or event["request_pk"] != self.viewing_pk:
            return ""
        return await rendering.card_for_change(
            event["request_pk"],
            change=event["change"],
            can_decide=self.rights.can_decide(
                event["agent"], started_by_id=event.get("started_by_id")
            ),
            oob=True,
            can_allow_always=self.can_allow_always,
        )

    async def _push_viewed_card(self, event: dict) -> None:
        """A request's own page: a change of that request brings its card and the toast."""
        card = await self._viewed_card(event)
        if card:
            await self.push(rendering.inbox_update(card=card, toast=self._toast(event)))

    async def _push_count(self, event: dict) -> None:
        """The list's count, the title's and the chips'. An unfiltered list shares one
        pending count per change (rendered once for every such page: a per-viewer count on
        each change for every open page slowed a 50-reviewer race past its deadline), and
        its chips, the viewer's own, follow coalesced (`_chips_follow`); a filtered one is
        counted for its viewer (selectors.inbox_counts, capped), its chips in the same
        frame."""
        if self._plain():
            hidden = frozenset() if self.rights.superuser else self.rights.hidden
            pending = await rendering.count_for_change(change=event["change"], hidden=hidden)
            await self.push(rendering.pending_count_html(pending, pending, self.query.state))
            self._chips_follow()
            return
        counts = await database_sync_to_async(rendering.list_counts, thread_sensitive=False)(
            self.scope["user"], self.params
        )
        await self.push(rendering.counts_html(counts))

    def _chips_follow(self) -> None:
        """An unfiltered list's chips follow a change: counted for this viewer at most once
        per TOOLNEXUS_LIVE_CHIP_SECONDS, that long after the first change not yet counted
        (the changes meanwhile ride along, the last one always counted), beside the message
        loop and never twice at once (the pattern of RunConsumer.approvals_run)."""
        self.chips_stale = True
        counting = getattr(self, "chip_counting", None)
        if counting is None or counting.done():
            self.chip_counting = asyncio.get_running_loop().create_task(self._count_chips())

    async def _count_chips(self) -> None:
        try:
            while self.chips_stale and not self.ended:
                await asyncio.sleep(max(0.0, float(app_settings.LIVE_CHIP_SECONDS or 0)))
                if not self._plain() or not await self.still_allowed():
                    return  # a filtered list's counts come with its count; a page gone: none
                # Every change that arrived until now is committed: this count reflects it.
                # One arriving from now on may not be: it marks the chips stale again.
                self.chips_stale = False
                params = self.params
                counts = await database_sync_to_async(
                    rendering.list_counts, thread_sensitive=False
                )(self.scope["user"], params)
                if self.ended or self.params != params:
                    continue  # the page changed its filters meanwhile: its new list has chips
                await self.push(rendering.chip_counts_html(counts["chips"], counts["menus"]))
        except Exception:  # nothing escapes the task: the chips heal at the next change
            log.exception("counting the inbox chips for a live page failed")

    def _plain(self) -> bool:
        """A list of every pending request (any sort) of a viewer who hides none: its count
        is the pending count. One who snoozed or ignored some is counted for themselves, so
        that the count, the title and "all N matching" leave those out, as the list does."""
        return self.query.as_params().keys() <= {"sort"} and not self.viewer_hides

    viewer_hides = False  # whether the viewer snoozed or ignored a request (`_check_hides`)

    def _check_hides(self) -> None:
        """Read it again: at each list snapshot, and when the page says it hid or showed a
        request (a `{"hides": true}` frame) or a snooze of theirs ended (it redraws its list)."""
        self.viewer_hides = rendering.viewer_hides(self.user_id)

    def _toast(self, event: dict) -> dict:
        if event["state"] == "pending":
            # a new request; a claim or a release says nothing (the row and claim bar do)
            return {"text": event["toast"]} if event["toast"] else {}
        if event.get("bulk") and not self.single:
            return {}  # a list hears a bulk decision once, as a whole (approvals_bulk)
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

    # -- presence ------------------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """A page says which request its detail pane shows: `{"viewing": "<id>"}` (or "")."""
        if (text_data and len(text_data) > MAX_FRAME) or bytes_data:
            await self.close(code=4400)
            return
        try:
            frame = json.loads(text_data or "")
        except ValueError:
            return
        if not isinstance(frame, dict):
            return
        if frame.get("hides") is True and not self.ended and not self.single:
            await database_sync_to_async(self._check_hides, thread_sensitive=False)()
        filters = frame.get("filters")
        if isinstance(filters, str) and not self.ended and not self.single:
            # The page changed its filters, search, sort or page without reloading (or got
            # a reconnect's snapshot for the URL it was opened with): follow them, and send
            # the list as they give it.
            before = (self.filter_query, str(self.page))
            self._use_filters(filters)
            if (self.filter_query, str(self.page)) != before and await self.still_allowed():
                await self.push(
                    await database_sync_to_async(self._list_snapshot, thread_sensitive=False)()
                )
        if isinstance(frame.get("viewing"), str):
            await self._view(frame["viewing"], resync=frame.get("resync") is True)

    def _decided_card(self, request_id: str) -> str:
        row = rendering.visible_row(request_id, self.rights)
        if row is None or row.state == ApprovalRequest.State.PENDING:
            return ""
        return rendering.card_html(row, can_decide=False, oob=True)

    def _visible_pk(self, request_id: str) -> int | None:
        found = (
            ApprovalRequest.objects.filter(request_id=request_id).values_list("pk", "agent").first()
        )
        if found is None or not self.rights.can_view(found[1]):
            return None
        return found[0]

    async def _view(self, request_id: str, *, resync: bool = False) -> None:
        """The page shows `request_id` now ("": none). With `resync` (the page got a snapshot
        after a reconnect) a request decided meanwhile gets its card, which the page shows
        unless the reviewer is working in it (then it says who decided)."""
        if self.ended or not await self.still_allowed():
            return
        request_id = request_id if REQUEST_ID.match(request_id or "") else ""
        if resync and request_id:
            await self.push(
                await database_sync_to_async(self._decided_card, thread_sensitive=False)(request_id)
            )
        if request_id == self.viewing:
            if request_id:
                await self._presence_set(request_id, self.viewing_pk, add=True, announce=False)
            return
        old, old_pk = self.viewing, self.viewing_pk
        pk = None
        if request_id:
            pk = await database_sync_to_async(self._visible_pk, thread_sensitive=False)(request_id)
            if pk is None:
                request_id = ""
        self.viewing, self.viewing_pk = request_id, pk
        if old:
            await self._presence_set(old, old_pk, add=False)
        if request_id:
            await self._presence_set(request_id, pk, add=True)

    async def _presence_set(self, request_id: str, pk, *, add: bool, announce: bool = True):
        """Add or remove this page in the request's viewers (in the cache, shared by every
        server process; entries lapse after PRESENCE_SECONDS) and tell every inbox."""
        key = presence_key(request_id)
        now = time.time()
        viewers = await cache.aget(key) or {}
        viewers = {c: v for c, v in viewers.items() if v[1] > now}
        before = sorted({v[0] for v in viewers.values()})
        if add:
            viewers[self.channel_name] = (getattr(self, "username", ""), now + PRESENCE_SECONDS)
        else:
            viewers.pop(self.channel_name, None)
        await cache.aset(key, viewers, PRESENCE_SECONDS)
        names = sorted({v[0] for v in viewers.values() if v[0]})
        if announce or names != before:
            await self.channel_layer.group_send(
                INBOX_GROUP,
                {
                    "type": "approvals.presence",
                    "request_id": request_id,
                    "request_pk": pk,
                    "names": names,
                },
            )

    async def approvals_presence(self, event: dict) -> None:
        """Who views a request: shown on the pages that show it (never the viewer's own name)."""
        if event.get("request_id") != self.viewing or self.viewing_pk is None:
            return
        mine = getattr(self, "username", "")
        names = [n for n in event.get("names", []) if n != mine]
        await self.push(rendering.presence_html(self.viewing_pk, names))

    async def disconnect(self, code: int) -> None:
        counting = getattr(self, "chip_counting", None)
        if counting is not None and not counting.done():
            counting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await counting
        if getattr(self, "viewing", ""):
            with contextlib.suppress(Exception):
                await self._presence_set(self.viewing, self.viewing_pk, add=False)
            self.viewing = ""
        await super().disconnect(code)


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
        await self.push(rendering.live_reply(event["text"], done=bool(event.get("done"))))

    async def disconnect(self, code: int) -> None:
        sending = getattr(self, "sending", None)
        if sending is not None and not sending.done():
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sending
        await super().disconnect(code)

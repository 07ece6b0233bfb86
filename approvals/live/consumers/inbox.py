"""The inbox's socket: its list, counts and the card in its detail pane, and who else
is looking at the same request (presence)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from urllib.parse import parse_qs, urlencode

from channels.db import database_sync_to_async
from django.core.cache import cache

from ...conf import app_settings
from ...models import ApprovalRequest
from ...selectors import InboxQuery
from .. import rendering
from ..groups import INBOX_GROUP
from .base import MAX_FRAME, _Base

log = logging.getLogger(__name__)

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

"""Websocket consumers: authenticated, thin, read-only.

On connect each sends the page's live region re-rendered from the database, so a reconnect
heals any missed message; afterwards it forwards the broadcaster's pre-rendered fragments
that fit its page. Nothing here writes: decisions are HTTP POSTs.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.middleware.csrf import CSRF_SECRET_LENGTH, _mask_cipher_secret
from django.utils.html import format_html

from . import broadcast

try:  # what Daphne's websocket layer raises on a send after the client went away
    from autobahn.exception import Disconnected as ClientGone
except ImportError:  # another ASGI server
    ClientGone = ()  # type: ignore[assignment,misc]

MAX_FRAME = 4096  # clients have nothing to say; a large frame is a misbehaving client


class _Base(AsyncWebsocketConsumer):
    permission = ""

    async def connect(self) -> None:
        broadcast.note_server_loop()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.can_decide, allowed = await database_sync_to_async(self._permissions)(user)
        if not allowed:
            await self.close(code=4403)
            return
        self.variant = "decide" if self.can_decide else "view"
        self.csrf_token = self._csrf_token()
        for group in self.live_groups():
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.push(await database_sync_to_async(self.snapshot)(user))

    def _csrf_token(self) -> str:
        """A fresh masked token for the page's CSRF cookie, as Django's own forms carry."""
        secret = self.scope.get("cookies", {}).get(settings.CSRF_COOKIE_NAME, "")
        if len(secret) == CSRF_SECRET_LENGTH and secret.isalnum():
            return _mask_cipher_secret(secret)
        return ""  # no cookie: htmx posts still send the page's token as a header

    async def push(self, html: str) -> None:
        try:
            await self.send(text_data=broadcast.personalize(html, self.csrf_token))
        except ClientGone:
            # The page closed while a push was on its way; its next connect re-renders.
            return

    def _permissions(self, user) -> tuple[bool, bool]:
        return user.has_perm("approvals.decide_request"), user.has_perm(self.permission)

    async def disconnect(self, code: int) -> None:
        for group in self.live_groups():
            await self.channel_layer.group_discard(group, self.channel_name)

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
        return [broadcast.INBOX_GROUP]

    async def connect(self) -> None:
        from .views import inbox_filters

        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        params = {k: v[0] for k, v in query.items() if v}
        self.filters = inbox_filters(params)
        self.page = params.get("page") or 1
        await super().connect()

    def snapshot(self, user) -> str:
        return broadcast.as_oob(
            broadcast.render_request_list(user, self.filters, self.page), "section"
        )

    def _matches(self, event: dict) -> bool:
        return (not self.filters["agent"] or self.filters["agent"] == event["agent"]) and (
            not self.filters["kind"] or self.filters["kind"] == event["kind"]
        )

    async def approvals_request(self, event: dict) -> None:
        """A decision comes twice: light (no cards, no count) at once, then full (rendered
        cards and the pending count). A page that drops the card acts on the light one and
        takes only the count from the full one; a page that shows the card waits for the
        full one. A new request comes once, full."""
        if not self._matches(event):
            return
        shows_card = self.filters["state"] in ("all", event["state"])
        light = event["cards"] is None
        if light and shows_card:
            return
        dom_id = f"request-{event['request_pk']}"
        html, toast = "", True
        if light:
            html = f'<div id="{dom_id}" hx-swap-oob="delete"></div>'
        elif not shows_card:
            toast = False  # the light message dropped the card and showed the toast
        elif event["created"] and str(self.page) == "1":
            card = event["cards"][self.variant]
            html = (
                f'<div hx-swap-oob="afterbegin:#request-cards">{card}</div>'
                '<div id="inbox-empty" hx-swap-oob="delete"></div>'
            )
        else:
            html = broadcast.as_oob(event["cards"][self.variant], "article")
        count = event["pending_count"]
        if (
            count is not None
            and self.filters["state"] == "pending"
            and not self.filters["agent"]
            and not self.filters["kind"]
        ):
            plural = "" if count == 1 else "s"
            html += f'<p class="count" id="request-count" hx-swap-oob="true">{count} request{plural} pending</p>'
        if toast:
            html += format_html(
                '<div hx-swap-oob="beforeend:#toasts"><p class="toast">{}</p></div>',
                event["toast"],
            )
        if html:
            await self.push(html)


class RunConsumer(_Base):
    permission = "approvals.view_run"

    def live_groups(self) -> list[str]:
        return [broadcast.run_group(self.scope["url_route"]["kwargs"]["run_id"])]

    def snapshot(self, user) -> str:
        from .models import Run

        run = (
            Run.objects.select_related("started_by")
            .filter(pk=self.scope["url_route"]["kwargs"]["run_id"])
            .first()
        )
        if run is None:
            return '<div id="run-body" hx-swap-oob="true"><p class="notice error">This run no longer exists.</p></div>'
        return broadcast.as_oob(broadcast.render_run_body(run, can_decide=self.can_decide), "div")

    async def approvals_run(self, event: dict) -> None:
        await self.push(broadcast.as_oob(event["bodies"][self.variant], "div"))

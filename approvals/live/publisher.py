"""Live push: the one module that knows the channel groups and what goes through them.

After a commit, `changed()` hands the change to two broadcaster threads: the light lane sends
at once what needs no rendering (which card to drop, a toast), the full lane renders the
affected fragments ONCE (a card and the run's body, each for deciders and for watchers) and
sends them to the groups; consumers only pick the variant and the swap that fit their page.
Rendering off the request thread keeps a reviewer's decision response fast, and a push
failure can never undo a committed decision: pages re-render from the database on
(re)connect, so a lost message costs a stale view until then, never a lost request.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from contextvars import ContextVar, Token
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections
from django.template.loader import render_to_string

from .. import events
from ..models import ApprovalRequest, Run
from ..presenters.cards import decision_toast, own_toast, request_card
from ..presenters.pages import inbox_context, run_context_for

log = logging.getLogger(__name__)

INBOX_GROUP = "approvals.inbox"
# Fragments pushed over websockets are rendered once for every viewer, without a request:
# their CSRF fields carry this placeholder, which each consumer replaces with a token for its
# own viewer (`personalize`), so plain form posts in pushed fragments work too.
CSRF_PLACEHOLDER = "toolnexus-csrf-placeholder"
NO_REQUEST = {"csrf_token": CSRF_PLACEHOLDER}


def personalize(html: str, csrf_token: str) -> str:
    return html.replace(CSRF_PLACEHOLDER, csrf_token)


VARIANTS = ("decide", "view")


def run_group(run_id: int) -> str:
    return f"approvals.run.{run_id}"


def user_group(user_id: int) -> str:
    """Every live page of one user: told when a session of theirs ends or their access
    changed (`notify_user`)."""
    return f"approvals.user.{user_id}"


class _Lane:
    """A thread with its own queue and its own event loop (channels-redis keeps connections
    per loop, so one loop for the thread's whole life means one Redis connection, not one
    per push). `build` turns a list of changes into the messages to send."""

    def __init__(self, name: str, build, *, yield_to_requests: float = 0.0) -> None:
        self.name, self.build = name, build
        self.yield_to_requests = yield_to_requests
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def put(self, item: dict[str, Any]) -> None:
        if self.thread is None or not self.thread.is_alive():
            with self.lock:
                if self.thread is None or not self.thread.is_alive():
                    self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                    self.thread.start()
        self.queue.put(item)

    def flush(self, timeout: float) -> None:
        if self.thread is None or not self.thread.is_alive():
            return  # nothing was ever queued on this lane in this process
        done = threading.Event()
        self.queue.put({"flush": done})
        done.wait(timeout)

    def _loop(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            batch = [self.queue.get()]
            if self.yield_to_requests:
                _wait_for_idle(self.yield_to_requests)
            while True:  # take everything queued meanwhile: a burst is built once per change
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            changes = _coalesce([item for item in batch if "flush" not in item])
            try:
                if changes:
                    close_old_connections()
                    send(self.build(changes), loop=loop)
            except Exception:
                log.exception("live push (%s) for %s change(s) failed", self.name, len(changes))
            try:
                close_old_connections()
            except Exception:
                log.exception("closing the %s database connection failed", self.name)
            for item in batch:
                if "flush" in item:
                    item["flush"].set()


def _light_batch(changes: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [m for change in changes for m in build_light_messages(**change)]


def _full_batch(changes: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    # One count for the whole batch: a coalesced burst must not count a large inbox per change.
    count = _pending_count() if any(c["request_pk"] is not None for c in changes) else None
    return [m for change in changes for m in build_messages(**change, pending_count=count)]


def _pending_count() -> int:
    return ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING).count()


# HTTP requests this process is serving (middleware.requests_in_flight_middleware counts).
_in_flight = 0
_idle = threading.Condition()
# Longest the full lane waits for the requests in flight to finish before it renders anyway.
RENDER_YIELD_SECONDS = 0.25


# Light messages of changes a request committed, held until its view has returned: sending
# them meanwhile would make the lane thread and the response compete for the GIL.
_held: ContextVar[list[dict[str, Any]] | None] = ContextVar("toolnexus_held_pushes", default=None)


def request_started() -> Token:
    global _in_flight
    with _idle:
        _in_flight += 1
    return _held.set([])


def request_finished(token: Token) -> None:
    global _in_flight
    held = _held.get() or []
    _held.reset(token)
    for item in held:
        _light_lane.put(item)
    with _idle:
        _in_flight -= 1
        if _in_flight <= 0:
            _idle.notify_all()


def _wait_for_idle(timeout: float) -> None:
    with _idle:
        _idle.wait_for(lambda: _in_flight <= 0, timeout)


# Two lanes, so that what costs no rendering (a decided card to drop, a toast) never waits
# behind the rendering of earlier changes: other reviewers' inboxes lose a decided card at
# once. The full lane renders when no HTTP request is being served (or after
# RENDER_YIELD_SECONDS): in one process the GIL is shared, and rendering in parallel with a
# reviewer's decision slows the response down; under load, waiting also coalesces more
# changes into one render.
_light_lane = _Lane("toolnexus-push-light", _light_batch)
_full_lane = _Lane("toolnexus-push-full", _full_batch, yield_to_requests=RENDER_YIELD_SECONDS)


def changed(
    *,
    run_id: int,
    request_pk: int | None = None,
    created: bool = False,
    decided: Any = None,
) -> None:
    """Queue a push for a committed change (call after commit). `decided`: the request row
    just decided, as the service left it in memory: its light message is built from it now,
    without a query."""
    item = {"run_id": run_id, "request_pk": request_pk, "created": created}
    if request_pk is not None and not created:
        event = None
        if decided is not None:
            try:
                event = light_event(decided)
            except Exception:  # the lane reads the row instead
                log.exception("building the light message of request %s failed", request_pk)
        held = _held.get()  # the same list in the view's thread: contexts are copied
        if held is not None:
            held.append({**item, "event": event})
        else:
            _light_lane.put({**item, "event": event})
    _full_lane.put(item)


def flush(timeout: float = 10) -> None:
    """Wait until every queued push was sent (tests, and an orderly shutdown)."""
    _light_lane.flush(timeout)
    _full_lane.flush(timeout)


def _coalesce(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One change per (run, request), in first-seen order: pages render the latest state,
    so two queued pushes for the same rows carry nothing the second one alone does not."""
    merged: dict[tuple[int, int | None], dict[str, Any]] = {}
    for item in items:
        key = (item["run_id"], item["request_pk"])
        if key in merged:
            merged[key]["created"] = merged[key]["created"] or item["created"]
        else:
            merged[key] = dict(item)
    return list(merged.values())


def _request_row(request_pk: int):
    return (
        ApprovalRequest.objects.filter(pk=request_pk)
        .select_related("run", "decided_by")
        .prefetch_related("calls")
        .first()
    )


def _request_event(
    row,
    created: bool,
    cards: dict[str, str] | None,
    tool_names: list[str] | None = None,
    pending_count: int | None = None,
) -> dict[str, Any]:
    if tool_names is None:
        tool_names = [c.tool_name for c in row.calls.all()]

    return {
        "type": "approvals.request",
        "request_pk": row.pk,
        "agent": row.agent,
        "kind": row.kind,
        "state": row.state,
        "created": created,
        # None in the light message: pages that show the card wait for the full one.
        "cards": cards,
        "toast": decision_toast(row, tool_names),
        # Who decided, so that a page of theirs says "You declined: ..." (`own_toast`) where
        # everybody else reads "Already declined by ...".
        "decided_by": row.decided_by_id if row.state != "pending" else None,
        "own_toast": own_toast(row, tool_names) if row.state != "pending" else "",
        # For unfiltered inboxes: their header count, without a query per page. Only in the
        # full message (None in the light one): counting a large inbox must not delay it.
        "pending_count": pending_count,
    }


def build_light_messages(
    *, run_id: int, request_pk: int | None, created: bool, event: dict[str, Any] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The unrendered part of a change: enough for pages that drop a decided card."""
    if event is not None:
        return [(INBOX_GROUP, event)]
    row = _request_row(request_pk) if request_pk is not None and not created else None
    if row is None:
        return []
    return [(INBOX_GROUP, _request_event(row, created, None))]


def light_event(row) -> dict[str, Any]:
    """The light message of a decided request, from the row in memory (no query)."""
    return _request_event(row, False, None, row.relay_tool_names())


def build_messages(
    *, run_id: int, request_pk: int | None, created: bool, pending_count: int | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The rendered fragments for one change, addressed to their groups (`pending_count`:
    the inbox's count if the caller has it already)."""
    out: list[tuple[str, dict[str, Any]]] = []
    row = _request_row(request_pk) if request_pk is not None else None
    if row is not None:
        if row.state == "pending":
            cards = {v: render_card(row, can_decide=v == "decide") for v in VARIANTS}
        else:  # a decided card has no decision forms: one rendering serves everybody
            card = render_card(row, can_decide=False)
            cards = dict.fromkeys(VARIANTS, card)
        if pending_count is None:
            pending_count = _pending_count()
        out.append((INBOX_GROUP, _request_event(row, created, cards, pending_count=pending_count)))
    run = Run.objects.filter(pk=run_id).select_related("started_by").first()
    if run is not None:
        out.append(
            (
                run_group(run_id),
                {"type": "approvals.run", "run_id": run_id, "bodies": render_run_bodies(run)},
            )
        )
    return out


_server_loop: asyncio.AbstractEventLoop | None = None


def note_server_loop() -> None:
    """Remember the ASGI server's event loop (consumers call this when they connect)."""
    global _server_loop
    _server_loop = asyncio.get_running_loop()


def send(messages: list[tuple[str, dict[str, Any]]], *, loop: asyncio.AbstractEventLoop) -> None:
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    server_loop = _server_loop
    if (
        isinstance(layer, InMemoryChannelLayer)
        and server_loop is not None
        and server_loop.is_running()
    ):
        # The in-memory layer's queues belong to the server's loop and are not thread-safe:
        # hand the send to that loop instead of running it on a loop of our own.
        future = asyncio.run_coroutine_threadsafe(_send_all(layer, messages), server_loop)
        future.result(timeout=10)
    else:
        loop.run_until_complete(_send_all(layer, messages))


async def _send_all(layer, messages) -> None:
    for group, message in messages:
        await layer.group_send(group, message)


def notify_user(user_id: int, message: dict[str, Any]) -> None:
    """Send `message` to every live page of one user, now (sign-out, a change of access).
    Rare, so a direct send; a failure is logged and never breaks the request sending it."""
    from asgiref.sync import async_to_sync

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(user_group(user_id), message)
    except Exception:
        log.exception("telling the pages of user %s about %s failed", user_id, message.get("type"))


def render_card(row, *, can_decide: bool) -> str:
    card = request_card(row, can_decide=can_decide)
    return render_to_string(
        "approvals/inbox.html#request-card", {"card": card, "next_url": "/", **NO_REQUEST}
    )


def render_run_body(run, *, can_decide: bool) -> str:
    return render_to_string(
        "approvals/run_detail.html#run-body",
        {**run_context_for(run, can_decide=can_decide), **NO_REQUEST},
    )


def render_run_bodies(run) -> dict[str, str]:
    """The run's body for deciders and for watchers, from one read of its rows."""
    context = {**run_context_for(run, can_decide=True), **NO_REQUEST}
    bodies = {"decide": render_to_string("approvals/run_detail.html#run-body", context)}
    if run.is_finished and run.status != "failed":
        # Nothing left to decide, cancel or retry: deciders and watchers see the same page.
        return dict.fromkeys(VARIANTS, bodies["decide"])
    open_card = context["open_card"]
    watcher = {
        **context,
        "can_decide": False,
        "open_card": request_card(open_card.row, can_decide=False) if open_card else None,
    }
    bodies["view"] = render_to_string("approvals/run_detail.html#run-body", watcher)
    return bodies


def render_request_list(user, filters: dict[str, str], page: int | str | None) -> str:
    return render_to_string(
        "approvals/inbox.html#request-list", {**inbox_context(user, filters, page), **NO_REQUEST}
    )


def as_oob(html: str, tag: str) -> str:
    """Mark a fragment's root element for an out-of-band swap by its id."""
    return html.replace(f"<{tag} ", f'<{tag} hx-swap-oob="true" ', 1)


def _on_change(
    sender, *, run_id: int, request_pk: int | None, created: bool, decided: Any, **signal: Any
) -> None:
    changed(run_id=run_id, request_pk=request_pk, created=created, decided=decided)


events.changed.connect(_on_change, dispatch_uid="approvals.live.publisher")

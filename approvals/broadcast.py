"""Live push: the one module that knows the channel groups and what goes through them.

After a commit, `changed()` hands the change to a broadcaster thread, which renders the
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
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections
from django.template.loader import render_to_string
from django.utils.html import format_html

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


_queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def changed(*, run_id: int, request_pk: int | None = None, created: bool = False) -> None:
    """Queue a push for a committed change (call after commit)."""
    _ensure_thread()
    _queue.put({"run_id": run_id, "request_pk": request_pk, "created": created})


def flush(timeout: float = 10) -> None:
    """Wait until every queued push was sent (tests, and an orderly shutdown)."""
    if _thread is None or not _thread.is_alive():
        return  # nothing was ever queued in this process
    done = threading.Event()
    _queue.put({"flush": done})
    done.wait(timeout)


def _ensure_thread() -> None:
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_loop, name="toolnexus-broadcast", daemon=True)
            _thread.start()


def _loop() -> None:
    # One event loop for the thread's whole life: channels-redis keeps its connections per
    # loop, so a fresh loop per push would open a Redis connection per push.
    loop = asyncio.new_event_loop()
    while True:
        batch = [_queue.get()]
        while True:  # take everything queued meanwhile: a burst is rendered once per change
            try:
                batch.append(_queue.get_nowait())
            except queue.Empty:
                break
        changes = _coalesce([item for item in batch if "flush" not in item])
        try:
            close_old_connections()
            # First what costs no rendering (cards to drop, counts, toasts), so the other
            # reviewers' inboxes lose a decided card at once; then the rendered fragments.
            send([m for change in changes for m in build_light_messages(**change)], loop=loop)
            send([m for change in changes for m in build_messages(**change)], loop=loop)
        except Exception:
            log.exception("live push for %s change(s) failed", len(changes))
        try:
            close_old_connections()
        except Exception:
            log.exception("closing the broadcaster's database connection failed")
        for item in batch:
            if "flush" in item:
                item["flush"].set()


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
    from .models import ApprovalRequest

    return (
        ApprovalRequest.objects.filter(pk=request_pk)
        .select_related("run", "decided_by")
        .prefetch_related("calls")
        .first()
    )


def _request_event(row, created: bool, cards: dict[str, str] | None) -> dict[str, Any]:
    from .models import ApprovalRequest

    return {
        "type": "approvals.request",
        "request_pk": row.pk,
        "agent": row.agent,
        "kind": row.kind,
        "state": row.state,
        "created": created,
        # None in the light message: pages that show the card wait for the full one.
        "cards": cards,
        "toast": _toast(row),
        # For unfiltered inboxes: their header count, without a query per page.
        "pending_count": ApprovalRequest.objects.filter(
            state=ApprovalRequest.State.PENDING
        ).count(),
    }


def build_light_messages(
    *, run_id: int, request_pk: int | None, created: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The unrendered part of a change: enough for pages that drop a decided card."""
    row = _request_row(request_pk) if request_pk is not None and not created else None
    if row is None:
        return []
    return [(INBOX_GROUP, _request_event(row, created, None))]


def build_messages(
    *, run_id: int, request_pk: int | None, created: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The rendered fragments for one change, addressed to their groups."""
    from .models import Run

    out: list[tuple[str, dict[str, Any]]] = []
    row = _request_row(request_pk) if request_pk is not None else None
    if row is not None:
        cards = {v: render_card(row, can_decide=v == "decide") for v in VARIANTS}
        out.append((INBOX_GROUP, _request_event(row, created, cards)))
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


def _toast(row) -> str:
    if row.state == "pending":
        from . import presenters

        title = presenters.request_card(row, can_decide=False).title
        return format_html("New request from {}: {}", row.agent, title[:120])
    from . import presenters

    who = row.decided_by.get_username() if row.decided_by else "the system"
    when = f"{row.decided_at:%H:%M:%S} UTC" if row.decided_at else "just now"
    title = presenters.request_card(row, can_decide=False).title
    return format_html("Already {} by {} at {}: {}", row.state, who, when, title[:120])


def render_card(row, *, can_decide: bool) -> str:
    from . import presenters

    card = presenters.request_card(row, can_decide=can_decide)
    return render_to_string(
        "approvals/inbox.html#request-card", {"card": card, "next_url": "/", **NO_REQUEST}
    )


def render_run_body(run, *, can_decide: bool) -> str:
    from .views import run_context_for

    return render_to_string(
        "approvals/run_detail.html#run-body",
        {**run_context_for(run, can_decide=can_decide), **NO_REQUEST},
    )


def render_run_bodies(run) -> dict[str, str]:
    """The run's body for deciders and for watchers, from one read of its rows."""
    from . import presenters
    from .views import run_context_for

    context = {**run_context_for(run, can_decide=True), **NO_REQUEST}
    bodies = {"decide": render_to_string("approvals/run_detail.html#run-body", context)}
    open_card = context["open_card"]
    watcher = {
        **context,
        "can_decide": False,
        "open_card": presenters.request_card(open_card.row, can_decide=False)
        if open_card
        else None,
    }
    bodies["view"] = render_to_string("approvals/run_detail.html#run-body", watcher)
    return bodies


def render_request_list(user, filters: dict[str, str], page: int | str | None) -> str:
    from .views import inbox_context

    return render_to_string(
        "approvals/inbox.html#request-list", {**inbox_context(user, filters, page), **NO_REQUEST}
    )


def as_oob(html: str, tag: str) -> str:
    """Mark a fragment's root element for an out-of-band swap by its id."""
    return html.replace(f"<{tag} ", f'<{tag} hx-swap-oob="true" ', 1)

"""Committed changes, turned into channel messages and sent at once.

`events.changed` fires after a commit (never for a rolled-back change); this module builds
one small message per affected page kind (the inbox, the run's page) and sends it from that
hook. Messages carry facts, never HTML: a consumer renders what its own page shows
(`rendering`), once per change and variant, and only when somebody watches.

Where the send happens: on the calling thread's serving loop (the one `async_to_sync` would
use from it), or the loop running in the thread itself. In a view under a server, or in a
worker, that is the process's long-lived loop, so channels-redis keeps one connection per
process and the in-memory layer is used from the loop that owns it. There the hook only
queues the messages (`_LoopSender`, one per loop, sending in order) and returns: the
decision's response no longer waits for the sends, which took as long as the rest of the
decision once the same server's pages took their share of that loop (about 10 ms of a 29 ms
response, one reviewer, `decision_latency.py --trace`). Anywhere else (a management
command, a WSGI view of a host project, a script, a sync test) the hook sends and waits, at
most SYNC_SEND_SECONDS, on one loop the process keeps for that (`_OwnLoop`).

A failed push never undoes a committed change: pages re-render from the database on
(re)connect, so a lost message costs a stale view until then, never a lost decision.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
import weakref
from collections import deque
from datetime import timedelta
from typing import Any

from asgiref.sync import SyncToAsync
from channels.layers import get_channel_layer
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils import timezone

from .. import events
from ..conf import app_settings
from ..models import ApprovalRequest, Run
from ..presenters.cards import decision_toast, own_toast
from .groups import INBOX_GROUP, LIVE_GROUP, run_group, user_group

log = logging.getLogger(__name__)


def claim_holder_id(row: ApprovalRequest, now: Any = None) -> Any:
    """The id of the user holding an active claim on the request, or None (no query; the
    same rule as selectors.active_claim)."""
    if row.state != ApprovalRequest.State.PENDING or not row.claimed_by_id or not row.claimed_at:
        return None
    minutes = int(app_settings.CLAIM_MINUTES or 0)
    now = now or timezone.now()
    if minutes > 0 and row.claimed_at <= now - timedelta(minutes=minutes):
        return None
    return row.claimed_by_id


def request_message(
    row: ApprovalRequest,
    *,
    created: bool,
    change: str,
    started_by_id: Any = None,
    bulk: str | None = None,
) -> dict[str, Any]:
    """What every inbox needs to know about a changed request (no query: the row's decider
    is loaded or already in memory; `started_by_id`: the run's starter, for a pending one)."""
    tool_names = row.relay_tool_names()
    decided = row.state != ApprovalRequest.State.PENDING
    return {
        "type": "approvals.request",
        "change": change,  # names this change: consumers cache what they render for it
        "request_pk": row.pk,
        "request_id": row.request_id,
        "run_id": row.run_id,
        "agent": row.agent,
        # A pending card's variant depends on it (whoever started the run may not approve it,
        # where that rule is on); a decided card has no decision forms.
        "started_by_id": started_by_id,
        "kind": row.kind,
        "state": row.state,
        "created": created,
        # The inbox's chips: who holds an active claim, and whether it is past its deadline.
        "claimed_by_id": claim_holder_id(row),
        "overdue": bool(
            not decided and row.expires_at is not None and row.expires_at < timezone.now()
        ),
        # Plain text (pages escape it): "New request from ...", "Already declined by ...".
        # (None for a change that leaves it pending: a claim, a release.)
        "toast": decision_toast(row, tool_names) if created or decided else "",
        # Who decided, so that a page of theirs says "You declined: ..." where everybody
        # else reads who decided.
        "decided_by": row.decided_by_id if decided else None,
        "own_toast": own_toast(row, tool_names) if decided else "",
        # Decided as part of a bulk decision (its id): inboxes say that once, as a whole
        # (`bulk_message`), not this request's toast.
        "bulk": bulk,
    }


def bulk_message(
    *, bulk: str, user_id: Any, username: str, verb: str, requests: list[tuple[int, str]]
) -> dict[str, Any]:
    """A bulk decision as a whole: who, what, and each request's pk and agent (a viewer
    hears of those whose agent they may see)."""
    return {
        "type": "approvals.bulk",
        "bulk": bulk,
        "decided_by": user_id,
        "decider": username,
        "verb": verb,
        "requests": [[pk, agent] for pk, agent in requests],
    }


def run_message(run_id: int, *, change: str, status_only: bool = False) -> dict[str, Any]:
    """`status_only`: only the run's status line changed (a worker took the run or gave it
    back), so its pages re-render only that."""
    return {"type": "approvals.run", "change": change, "run_id": run_id, "status_only": status_only}


def messages_for(
    *,
    run_id: int,
    request_pk: int | None,
    created: bool,
    row: ApprovalRequest | None,
    status_only: bool = False,
    bulk: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """`row`: the request as the write left it in memory (its decider and, for a pending
    one, its run at hand), or None to read it."""
    change = uuid.uuid4().hex
    out: list[tuple[str, dict[str, Any]]] = []
    if request_pk is not None:
        if row is None:
            row = ApprovalRequest.objects.select_related("decided_by").filter(pk=request_pk).first()
        if row is not None:
            starter = None
            if row.state == ApprovalRequest.State.PENDING:
                starter = _starter_of(row)
            message = request_message(
                row, created=created, change=change, started_by_id=starter, bulk=bulk
            )
            out.append((INBOX_GROUP, message))
    out.append((run_group(run_id), run_message(run_id, change=change, status_only=status_only)))
    return out


def _starter_of(row: ApprovalRequest) -> Any:
    """Who started the request's run: from the run in memory when the write loaded it."""
    if ApprovalRequest.run.is_cached(row) and "started_by_id" not in row.run.get_deferred_fields():
        return row.run.started_by_id
    return Run.objects.filter(pk=row.run_id).values_list("started_by_id", flat=True).first()


Messages = list[tuple[str, dict[str, Any]]]

# A send failed because the layer could not be reached (not because of one bad message).
try:
    from redis.exceptions import ConnectionError as _RedisDown
    from redis.exceptions import TimeoutError as _RedisTimeout

    LAYER_DOWN: tuple[type[BaseException], ...] = (OSError, TimeoutError, _RedisDown, _RedisTimeout)
except ImportError:  # no Redis client installed: the in-memory layer
    LAYER_DOWN = (OSError, TimeoutError)


def send(messages: Messages) -> None:
    """Send these messages in order: queued on the calling thread's serving loop (or the loop
    running in it), or at once where there is none, waiting at most SYNC_SEND_SECONDS (then
    the send is cancelled and TimeoutError raised)."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    loop = _serving_loop()
    if loop is not None:
        try:
            loop.call_soon_threadsafe(_LoopSender.queue, loop, layer, messages)
            return
        except RuntimeError:  # the loop closed since (a server shutting down): send here
            pass
    running = _running_loop()
    if running is not None:  # waiting here would stall that loop (or, on _OwnLoop's, hang)
        _LoopSender.queue(running, layer, messages)
        return
    sending = _OwnLoop.submit(_send_all(layer, messages))
    try:
        sending.result(timeout=SYNC_SEND_SECONDS)
    except TimeoutError:
        sending.cancel()
        raise TimeoutError(f"not sent within {SYNC_SEND_SECONDS} s") from None


# How long sync code waits for a send before giving up on it (and logging it): a layer that
# hangs must not hold a command or a request for good.
SYNC_SEND_SECONDS = 10.0


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _OwnLoop:
    """The process's loop for sends from code on no serving loop, in a daemon thread of its
    own. `async_to_sync` there ran each send on a new loop in a new thread, and a Redis
    layer (whose connections belong to a loop) connected anew for every change."""

    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None
    thread: threading.Thread | None = None

    @classmethod
    def submit(cls, coroutine: Any) -> Any:
        """Run `coroutine` on the loop (a concurrent future of its result). Under the lock,
        so a `close` meanwhile finds it scheduled, and finishes it before the loop closes."""
        with cls.lock:
            if cls.loop is None or cls.thread is None or not cls.thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=cls._run, args=(loop,), name="toolnexus-push-sends", daemon=True
                )
                thread.start()
                cls.loop, cls.thread = loop, thread
            return asyncio.run_coroutine_threadsafe(coroutine, cls.loop)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        finally:
            # Sends submitted before the stop still go out. Then the close, here and not in
            # `close`'s caller, which may run a loop of its own: channels-redis closes its
            # connections on this loop by running it once more as it closes.
            left = asyncio.all_tasks(loop)
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=SYNC_SEND_SECONDS))
            loop.close()

    @classmethod
    def close(cls) -> None:
        """Stop and close the loop (what a Redis layer opened on it closes with it); the next
        send starts another."""
        with cls.lock:
            loop, thread = cls.loop, cls.thread
            cls.loop = cls.thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    @classmethod
    def forget(cls) -> None:
        """In a forked child: the parent's thread did not come along (nor, if another thread
        held it at the fork, the lock's release)."""
        cls.lock = threading.Lock()
        cls.loop = cls.thread = None


os.register_at_fork(after_in_child=_OwnLoop.forget)


@receiver(setting_changed)
def _layers_changed(*, setting: str, **kwargs: Any) -> None:
    # A layer replaced by new settings (tests) lets go of its connections on the own loop
    # too, as it did when each send's loop closed with the send.
    if setting == "CHANNEL_LAYERS":
        _OwnLoop.close()


async def _send_all(layer: Any, messages: Messages) -> None:
    for group, message in messages:
        await layer.group_send(group, message)


def _serving_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop this thread's sync code was called from (asgiref's SyncToAsync
    records it per thread: the loop `async_to_sync` runs on from here), or None."""
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is None or getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return None
    return loop if loop.is_running() and not loop.is_closed() else None


class _LoopSender:
    """One loop's queue of messages to send, sent in the order queued by one task that ends
    when the queue is empty (nothing lingers on an idle loop). Used only on its loop."""

    # The registry: loop -> its sender (a loop that is gone takes its sender with it). Loops
    # of other threads (a test's, a second worker's) may look up theirs at the same moment.
    by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopSender] = (
        weakref.WeakKeyDictionary()
    )
    registry_lock = threading.Lock()
    MAX_QUEUED = 50_000  # messages: a layer that is down must not grow the queue without end
    # Sends that failed because the layer was down mean pages missed changes. A probe (a
    # resync message) is sent every PROBE_EVERY seconds until one goes through; then every
    # live page is asked to catch up, again RESYNC_AFTER seconds later for the processes
    # whose subscriptions take a moment to come back (a page that caught up or connected
    # since ignores it: `_Base.approvals_resync`).
    PROBE_EVERY = 5.0
    RESYNC_AFTER = (2.0, 10.0)

    def __init__(self) -> None:
        self.pending: deque[tuple[Any, str, dict[str, Any]]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.failing = False
        self.probing = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopSender | None:
        with cls.registry_lock:
            return cls.by_loop.get(loop)

    @classmethod
    def queue(cls, loop: asyncio.AbstractEventLoop, layer: Any, messages: Messages) -> None:
        with cls.registry_lock:
            sender = cls.by_loop.get(loop)
            if sender is None:
                sender = cls.by_loop[loop] = cls()
        if len(sender.pending) + len(messages) > cls.MAX_QUEUED:
            sender.dropped += 1
            if sender.dropped == 1 or sender.dropped % 1000 == 0:
                log.warning("live push queue full: %s change(s) not pushed", sender.dropped)
            return
        sender.pending.extend((layer, group, message) for group, message in messages)
        if sender.task is None:
            sender.task = loop.create_task(sender.run())

    async def run(self) -> None:
        try:
            await self._drain()
        except asyncio.CancelledError:
            # Its loop is closing (asyncio.run cancels what is left): send what is queued
            # first, so a change committed just before the end still reaches its pages.
            await self._drain()
            raise
        finally:
            self.task = None  # a finished task holds its loop: the registry lets go of both

    async def _drain(self) -> None:
        while self.pending:
            layer, group, message = self.pending[0]
            try:
                await layer.group_send(group, message)
            except asyncio.CancelledError:
                raise  # still queued: the drain after the cancellation sends it (again)
            except Exception as exc:
                log.exception("live push of %s to %s failed", message.get("type"), group)
                if isinstance(exc, LAYER_DOWN):
                    self.failing = True
                    self._probe_later(layer)
            else:
                if self.failing:
                    self.failing = False
                    self._resync_later(layer)
            self.pending.popleft()
        self.dropped = 0  # the next overflow is reported from its first drop

    def _probe_later(self, layer: Any) -> None:
        if self.probing:
            return
        self.probing = True
        loop = asyncio.get_running_loop()

        def probe() -> None:
            self.probing = False
            if self.failing:  # nothing went through since: try (this probe fails: again)
                _LoopSender.queue(loop, layer, [(LIVE_GROUP, resync_message(0.0))])

        loop.call_later(self.PROBE_EVERY, probe)

    def _resync_later(self, layer: Any) -> None:
        """Pages missed the changes whose sends failed: ask them all to catch up from the
        database once the layer works again."""
        log.warning("live push works again: every live page catches up from the database")
        loop = asyncio.get_running_loop()
        healthy = time.monotonic()

        def resync() -> None:
            message = resync_message(time.monotonic() - healthy)
            _LoopSender.queue(loop, layer, [(LIVE_GROUP, message)])

        for delay in self.RESYNC_AFTER:
            loop.call_later(delay, resync)


def resync_message(age: float) -> dict[str, Any]:
    """Every live page that neither connected nor caught up in the last `age` seconds (the
    layer works again since then) re-renders its live region from the database. An age,
    not a time: the processes' clocks need not agree."""
    return {"type": "approvals.resync", "age": age}


async def flush(timeout: float | None = None) -> None:
    """Wait until every message queued on the running loop has been sent, at most `timeout`
    seconds (a server's or a worker's last step, through `events.settle`; tests)."""
    sender = _LoopSender.of(asyncio.get_running_loop())
    task = sender.task if sender is not None else None
    if task is not None:
        await asyncio.wait({task}, timeout=timeout)


async def _on_settling(sender: Any, *, timeout: float, **signal: Any) -> None:
    await flush(timeout)


def notify_user(user_id: int, message: dict[str, Any]) -> None:
    """Send `message` to every live page of one user, now (sign-out, a change of access).
    A failure is logged and never breaks the request sending it."""
    try:
        send([(user_group(user_id), message)])
    except Exception:
        log.exception("telling the pages of user %s about %s failed", user_id, message.get("type"))


def _on_change(
    sender,
    *,
    run_id: int,
    request_pk: int | None,
    created: bool,
    row: Any,
    status_only: bool = False,
    bulk: str | None = None,
    **signal: Any,
) -> None:
    try:
        messages = messages_for(
            run_id=run_id,
            request_pk=request_pk,
            created=created,
            row=row,
            status_only=status_only,
            bulk=bulk,
        )
        send(messages)
    except Exception:
        log.exception("live push for run %s (request %s) failed", run_id, request_pk)


def reply_message(run_id: int, *, text: str, done: bool, agent: str = "") -> dict[str, Any]:
    """A run's model reply so far (execution.streaming), for its pages only."""
    return {"type": "approvals.reply", "run_id": run_id, "text": text, "done": done, "agent": agent}


def _on_reply(
    sender, *, run_id: int, text: str, done: bool, agent: str = "", **signal: Any
) -> None:
    # Only the run's own group: its sockets joined it after their viewer's access to this
    # run was checked (consumers.RunConsumer), and check it again before each push.
    try:
        send([(run_group(run_id), reply_message(run_id, text=text, done=done, agent=agent))])
    except Exception:
        log.exception("live push of run %s's reply failed", run_id)


def _on_notified(sender, *, user_ids: list[int], text: str, about: str = "", **signal: Any):
    """A toast on every live page of these people (an escalation's notice)."""
    message = {"type": "approvals.toast", "text": text, "about": about}
    try:
        send([(user_group(user_id), message) for user_id in user_ids])
    except Exception:
        log.exception("a toast for %s user(s) failed", len(user_ids))


def _on_bulk(sender, **decision: Any) -> None:
    try:
        fields = ("bulk", "user_id", "username", "verb", "requests")
        send([(INBOX_GROUP, bulk_message(**{k: decision[k] for k in fields}))])
    except Exception:
        log.exception("live push of bulk decision %s failed", decision.get("bulk"))


events.changed.connect(_on_change, dispatch_uid="approvals.live.publisher")
events.replied.connect(_on_reply, dispatch_uid="approvals.live.publisher.reply")
events.notified.connect(_on_notified, dispatch_uid="approvals.live.publisher.notified")
events.bulk_decided.connect(_on_bulk, dispatch_uid="approvals.live.publisher")
events.settling.connect(_on_settling, dispatch_uid="approvals.live.publisher")

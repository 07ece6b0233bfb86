"""approvals.live.publisher: a committed change becomes one small message per page kind,
built from the row in memory for a decision, sent from the commit hook, never for a
rolled-back change, and carrying no HTML."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import events, services
from approvals.live import publisher
from approvals.live.groups import INBOX_GROUP, run_group

from .factories import make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


def test_a_decisions_push_is_built_from_the_row_in_memory_and_carries_no_html():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    row = services.request_decline(request_id=request_id, user=user, reason="over the limit")
    with CaptureQueriesContext(connection) as ctx:
        from_memory = publisher.messages_for(
            run_id=run.pk, request_pk=row.pk, created=False, row=row
        )
    assert _statements(ctx) == []
    from_database = publisher.messages_for(
        run_id=run.pk, request_pk=row.pk, created=False, row=None
    )

    def without_change(messages):
        return [(group, {**m, "change": None}) for group, m in messages]

    assert without_change(from_memory) == without_change(from_database)
    (inbox_group, event), (run_grp, run_event) = from_memory
    assert (inbox_group, run_grp) == (INBOX_GROUP, run_group(run.pk))
    assert event["change"] == run_event["change"]  # one change, one name for its renderings
    assert f"Already declined by {user.username}" in event["toast"]
    assert "The agent wants to run refund" in event["toast"]
    assert not any("<" in str(value) for value in [*event.values(), *run_event.values()])


def test_a_decision_is_pushed_when_it_commits_before_its_service_returns(monkeypatch):
    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    assert [[group for group, _ in batch] for batch in sent] == [[INBOX_GROUP, run_group(run.pk)]]
    assert sent[0][0][1]["state"] == "declined"


def test_a_rolled_back_change_is_never_pushed(monkeypatch):
    from django.db import transaction

    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.request_decline(request_id=run.requests.get().request_id, user=user)
        raise RuntimeError("the caller fails after the decision")
    assert sent == []
    assert run.requests.get().state == "pending"


def test_only_a_worker_taking_a_run_is_a_status_only_change(monkeypatch):
    """A claim changes the run's status line alone (its pages re-render only that); the
    decision before it and the step's result after it change the transcript too."""
    from .factories import drain

    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    drain()
    run_messages = [
        m
        for batch in sent
        for group, m in batch
        if group == run_group(run.pk) and m["type"] == "approvals.run"  # not the reply's text
    ]
    assert [m["status_only"] for m in run_messages] == [False, True, False]


# -- sending: queued on a serving loop, in order; at once elsewhere ---------------------------


class _Layer:
    """A channel layer that records group_sends: optionally held until released, taking
    `delay` seconds each (so that a cancellation can land in the middle of one), or raising
    what `fail(group, message)` returns (None: the send works)."""

    def __init__(self, *, fail=None, delay: float = 0.0) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.loops: list[int] = []  # the loop each message was sent on
        self.cancelled = 0  # sends cancelled while held
        self.release: asyncio.Event | None = None
        self.fail = fail or (lambda group, message: None)
        self.delay = delay

    async def group_send(self, group: str, message: dict) -> None:
        if self.release is not None:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.delay:
            await asyncio.sleep(self.delay)
        if (error := self.fail(group, message)) is not None:
            raise error
        self.sent.append((group, message))
        self.loops.append(id(asyncio.get_running_loop()))  # not the loop: it may go


def _down_for(group: str):
    return lambda g, message: ConnectionError("the layer is down") if g == group else None


def _batch(n: int) -> list[tuple[str, dict]]:
    return [(f"g{n}", {"type": "t", "n": n}), (f"h{n}", {"type": "t", "n": n})]


async def _send_from_a_thread(messages) -> None:
    """As a view under a server or a worker's step calls it: sync code in a thread of this
    loop (a send that waited for the held layer would not return: the test fails in 2 s)."""
    call = sync_to_async(publisher.send, thread_sensitive=False)(messages)
    await asyncio.wait_for(call, timeout=2)


@pytest.mark.django_db(transaction=False)
async def test_on_a_serving_loop_a_send_is_queued_and_returns_before_the_layer_sends(
    monkeypatch,
):
    layer = _Layer()
    layer.release = asyncio.Event()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    await _send_from_a_thread(_batch(1))
    await _send_from_a_thread(_batch(2))
    await asyncio.sleep(0.05)
    assert layer.sent == []  # both returned while the layer was still held
    layer.release.set()
    await events.settle()  # what a worker or a server awaits before its loop ends
    assert layer.sent == _batch(1) + _batch(2)  # in the order sent


@pytest.mark.django_db(transaction=False)
async def test_a_failed_send_is_logged_and_the_next_messages_still_go(monkeypatch, caplog):
    layer = _Layer(fail=_down_for("h1"))
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    await _send_from_a_thread(_batch(1))
    await _send_from_a_thread(_batch(2))
    await publisher.flush(timeout=2)
    assert layer.sent == [_batch(1)[0], *_batch(2)]
    assert "live push of t to h1 failed" in caplog.text


@pytest.mark.django_db(transaction=False)
def test_without_a_serving_loop_a_send_is_done_when_it_returns(monkeypatch):
    layer = _Layer()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    publisher.send(_batch(1))
    assert layer.sent == _batch(1)


@pytest.mark.django_db(transaction=False)
def test_sends_from_sync_code_on_no_serving_loop_share_one_loop_of_the_process(monkeypatch):
    """A management command, a host project's WSGI view: every send there runs on one loop
    the process keeps (a Redis layer keeps its connection), not a new loop per send, and
    each is done when it returns, whichever thread sent it."""
    import threading

    layer = _Layer()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    publisher.send(_batch(1))
    other = threading.Thread(target=publisher.send, args=(_batch(2),))
    other.start()
    other.join()
    publisher.send(_batch(3))
    assert layer.sent == _batch(1) + _batch(2) + _batch(3)
    assert len(set(layer.loops)) == 1
    loop = publisher._OwnLoop.loop
    assert id(loop) == layer.loops[0]
    assert loop.is_running()  # it stays for the next send


@pytest.mark.django_db(transaction=False)
def test_a_forked_process_sends_on_a_loop_of_its_own(monkeypatch):
    """The parent's loop thread does not survive a fork: a child (a pre-forking server's
    worker) starts its own and its sends go through."""
    import os
    import time

    layer = _Layer()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    publisher.send(_batch(1))
    parent_loop = publisher._OwnLoop.loop
    pid = os.fork()
    if pid == 0:  # the child: report by exit code, never return into pytest
        code = 1
        try:
            forgotten = publisher._OwnLoop.loop is None  # the fork hook's doing
            publisher.send(_batch(2))
            fresh = publisher._OwnLoop.loop is not parent_loop
            sent = layer.sent == _batch(1) + _batch(2)
            code = 0 if forgotten and fresh and sent else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's send did not return")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert publisher._OwnLoop.loop is parent_loop  # the parent's is untouched


@pytest.mark.django_db(transaction=False)
async def test_sync_code_called_on_a_running_loop_queues_its_send_there(monkeypatch):
    """Sync code called straight from a coroutine (no thread in between) never waits for a
    send: that would stall the loop it runs on."""
    layer = _Layer()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    publisher.send(_batch(1))
    assert layer.sent == []  # queued on this loop, not sent yet
    await publisher.flush(timeout=2)
    assert layer.sent == _batch(1)


@pytest.mark.django_db(transaction=False)
def test_a_send_from_sync_code_gives_up_on_a_layer_that_hangs(monkeypatch):
    layer = _Layer()
    layer.release = asyncio.Event()  # never set: every send hangs
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(publisher, "SYNC_SEND_SECONDS", 0.2)
    with pytest.raises(TimeoutError, match=r"not sent within 0\.2 s"):
        publisher.send(_batch(1))
    healthy = _Layer()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: healthy)
    publisher.send(_batch(2))  # the loop is free for the next one
    assert healthy.sent == _batch(2)
    assert layer.cancelled == 1  # the hung send was called off, not left on the loop


@pytest.mark.django_db(transaction=False)
def test_new_channel_layer_settings_close_the_loop_sync_sends_used(monkeypatch, settings):
    """A replaced layer (tests change the setting) lets go of what it opened on that loop
    (channels-redis closes its connections when the loop closes)."""
    layer = _Layer()
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    publisher.send(_batch(1))
    old = publisher._OwnLoop.loop
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert old.is_closed()
    publisher.send(_batch(2))
    assert layer.sent == _batch(1) + _batch(2)
    assert publisher._OwnLoop.loop is not old


@pytest.mark.django_db(transaction=False)
async def test_the_send_loop_closes_in_its_own_thread(settings):
    """channels-redis closes its connections by running the loop once more as it closes: a
    caller that runs a loop of its own (an async test changing settings) could not."""
    import threading

    publisher._OwnLoop.submit(asyncio.sleep(0)).result(timeout=2)  # the loop is up
    loop = publisher._OwnLoop.loop
    closed_in = []
    original = loop.close

    def close_as_channels_redis_does() -> None:
        loop.run_until_complete(asyncio.sleep(0))  # its layers' flush
        closed_in.append(threading.current_thread().name)
        original()

    loop.close = close_as_channels_redis_does
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert closed_in == ["toolnexus-push-sends"]
    assert loop.is_closed()


@pytest.mark.django_db(transaction=False)
def test_messages_queued_on_a_loop_that_ends_are_all_sent_and_the_loop_let_go(monkeypatch):
    """async_to_sync from plain sync code runs on a loop of its own that ends with the call
    (asyncio.run, which cancels what is left, here in the middle of a send): what was queued
    on it still goes out, the one cut short included, and the registry keeps no loop."""
    layer = _Layer(delay=0.02)
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    loops = []

    async def request_like() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await _send_from_a_thread(_batch(1) + _batch(2))
        await asyncio.sleep(0.01)  # the first send has begun when the loop's end cancels it

    async_to_sync(request_like)()
    assert layer.sent == _batch(1) + _batch(2)
    gc.collect()
    assert loops[0]() is None


@pytest.mark.django_db(transaction=False)
async def test_once_sends_work_again_after_failing_every_live_page_is_asked_to_catch_up(
    monkeypatch,
):
    from approvals.live.groups import LIVE_GROUP

    layer = _Layer(fail=_down_for("h1"))
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(publisher._LoopSender, "RESYNC_AFTER", (0.05, 0.1))
    monkeypatch.setattr(publisher._LoopSender, "PROBE_EVERY", 10.0)
    await _send_from_a_thread(_batch(1))  # h1 fails (the layer is down): pages missed it
    await _send_from_a_thread(_batch(2))  # works again
    await publisher.flush(timeout=2)
    assert [group for group, _ in layer.sent] == ["g1", "g2", "h2"]
    await asyncio.sleep(0.3)
    await publisher.flush(timeout=2)
    resyncs = [message for group, message in layer.sent if group == LIVE_GROUP]
    assert [m["type"] for m in resyncs] == ["approvals.resync", "approvals.resync"]
    assert 0.04 < resyncs[0]["age"] < resyncs[1]["age"] < 1  # seconds since it works again
    layer.sent.clear()
    await _send_from_a_thread(_batch(3))  # no failure since: no more asking
    await asyncio.sleep(0.3)
    await publisher.flush(timeout=2)
    assert layer.sent == _batch(3)


@pytest.mark.django_db(transaction=False)
async def test_after_a_failure_the_layer_is_probed_until_it_works_then_pages_catch_up(
    monkeypatch,
):
    """Nothing else to send after the failure (a quiet server): probes find the layer back."""
    from approvals.live.groups import LIVE_GROUP

    down = {"on": True}  # every send fails, probes too, until the layer is back
    layer = _Layer(fail=lambda g, m: ConnectionError("the layer is down") if down["on"] else None)
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(publisher._LoopSender, "RESYNC_AFTER", (0.05,))
    monkeypatch.setattr(publisher._LoopSender, "PROBE_EVERY", 0.05)
    await _send_from_a_thread(_batch(1))
    await asyncio.sleep(0.3)  # probes went out meanwhile and failed
    assert layer.sent == []
    down["on"] = False
    await asyncio.sleep(0.4)
    await publisher.flush(timeout=2)
    groups = [group for group, _ in layer.sent]
    assert groups and set(groups) == {LIVE_GROUP}  # the probe that worked, then the resync
    assert len(groups) == 2


@pytest.mark.django_db(transaction=False)
async def test_a_message_that_fails_by_itself_does_not_make_pages_catch_up(monkeypatch):
    layer = _Layer(fail=lambda g, m: TypeError("cannot serialise this") if m["n"] == 1 else None)
    monkeypatch.setattr(publisher, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(publisher._LoopSender, "RESYNC_AFTER", (0.05,))
    monkeypatch.setattr(publisher._LoopSender, "PROBE_EVERY", 0.05)
    await _send_from_a_thread(_batch(1))
    await _send_from_a_thread(_batch(2))
    await asyncio.sleep(0.3)
    await publisher.flush(timeout=2)
    assert layer.sent == _batch(2)

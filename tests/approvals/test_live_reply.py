"""The model's reply, live on its run's page while it is generated (execution.streaming,
the run socket's `approvals.reply`): in batches, to the run's own sockets only, replaced by
the stored transcript when the turn ends; off with TOOLNEXUS_STREAM_REPLIES."""

from __future__ import annotations

import asyncio
import itertools
import re

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from approvals import events, services
from approvals.execution.streaming import ReplyStream
from approvals.live import publisher
from approvals.live.groups import run_group

from .factories import TIMEOUT, drain, halted_run, in_thread, open_socket, user_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]

LIVE_REPLY = '<li id="live-reply"'


@pytest.fixture
def streaming(settings):
    """The demo model generates word by word, batches go out often: several per reply."""
    settings.TOOLNEXUS_STREAM_REPLIES = True
    settings.TOOLNEXUS_DEMO_WORD_SECONDS = 0.01
    settings.TOOLNEXUS_STREAM_BATCH_SECONDS = 0.03


async def _frames_until_quiet(comm, quiet: float = 0.5) -> list[str]:
    frames = []
    while not await comm.receive_nothing(timeout=quiet):
        frames.append(await comm.receive_from(timeout=TIMEOUT))
    return frames


def _reply_text(frame: str) -> str:
    found = re.search(r'<div class="text">(.*?)</div></li>', frame, re.S)
    assert found, frame
    return found.group(1)


def _restrict_demo_to_a_new_group(*members):
    """`demo` becomes visible (and decidable) to the members of a group of its own only."""
    from django.contrib.auth.models import Group

    from approvals.models import AgentAccess, AgentPolicy

    group = Group.objects.create(name="Refunds")
    policy = AgentPolicy.objects.create(agent="demo")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    for user in members:
        user.groups.add(group)


async def test_a_declined_runs_reply_arrives_in_pieces_then_the_stored_transcript(streaming):
    reviewer = await user_of("reviewer")
    run, row = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        await in_thread(
            services.request_decline,
            request_id=row.request_id,
            user=reviewer,
            reason="amount exceeds refund policy",
        )
        queued = await comm.receive_from(timeout=TIMEOUT)
        # The re-rendered body while the run waits for its worker holds the (empty) slot.
        assert 'id="live-reply"' in queued and "status-queued" in queued
        await in_thread(drain)
        frames = await _frames_until_quiet(comm)
    finally:
        await comm.disconnect()
    replies = [f for f in frames if f.startswith(LIVE_REPLY)]
    texts = [_reply_text(f) for f in replies]
    assert len(texts) >= 3, texts  # in pieces, not once at the end
    for shorter, longer in itertools.pairwise(texts):
        assert longer.startswith(shorter) and len(longer) > len(shorter)
    final = texts[-1]
    assert "the reviewer declined it (amount exceeds refund policy)" in final
    assert "replying…" in replies[0] and "replying…" not in replies[-1]  # the turn ended
    # After the last piece comes the run's stored outcome, which drops the live entry.
    last = frames[-1].lstrip()
    assert last.startswith('<div id="run-body"') and "status-done" in last
    assert 'id="live-reply"' not in last
    assert "amount exceeds refund policy" in last
    assert frames.index(replies[-1]) < len(frames) - 1


async def test_switched_off_the_page_gets_the_outcome_only(streaming, settings):
    settings.TOOLNEXUS_STREAM_REPLIES = False
    reviewer = await user_of("reviewer")
    run, row = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        await in_thread(services.request_decline, request_id=row.request_id, user=reviewer)
        await comm.receive_from(timeout=TIMEOUT)
        await in_thread(drain)
        frames = await _frames_until_quiet(comm)
    finally:
        await comm.disconnect()
    assert frames and "status-done" in frames[-1]
    assert not [f for f in frames if f.startswith(LIVE_REPLY)]


async def test_a_reply_goes_to_its_own_runs_page_only(streaming):
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    other, _ = await halted_run(reviewer, prompt="Refund order B-7, $5")
    watching_other, _ = await open_socket(f"/ws/runs/{other.pk}/", reviewer)
    try:
        await in_thread(
            services.request_decline, request_id=row.request_id, user=reviewer, reason="SECRET-7"
        )
        await in_thread(drain)
        frames = await _frames_until_quiet(watching_other, quiet=0.3)
    finally:
        await watching_other.disconnect()
    assert not [f for f in frames if "SECRET-7" in f or f.startswith(LIVE_REPLY)]


async def test_a_user_who_may_not_see_the_run_gets_no_reply(streaming):
    """A foreign run's socket is refused (4404, as its page's 404) before it joins the run's
    group: the reply, sent to that group, never reaches it."""
    owner = await user_of("reviewer")
    outsider = await user_of("reviewer")
    await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
    run, row = await halted_run(owner)
    theirs, _ = await open_socket(f"/ws/runs/{run.pk}/", owner)
    foreign, _ = await open_socket(f"/ws/runs/{run.pk}/", outsider)
    try:
        assert await foreign.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4404,
        }
        await in_thread(
            services.request_decline, request_id=row.request_id, user=owner, reason="SECRET-9"
        )
        await in_thread(drain)
        owners = await _frames_until_quiet(theirs)
        assert [f for f in owners if f.startswith(LIVE_REPLY) and "SECRET-9" in f]
        assert await foreign.receive_nothing(timeout=0.2)
    finally:
        await theirs.disconnect()
        await foreign.disconnect()


async def test_a_page_whose_access_was_withdrawn_gets_no_more_of_the_reply(monkeypatch):
    """Before a piece is forwarded the viewer's access is checked (at most RECHECK_SECONDS
    old): a run hidden from them since closes the page, with nothing of the piece."""
    from approvals.live.consumers import base as consumers

    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0)
    owner = await user_of("reviewer")
    viewer = await user_of("reviewer")
    run, _ = await halted_run(owner)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", viewer)
    try:
        layer = get_channel_layer()
        message = publisher.reply_message(run.pk, text="first words", done=False)
        await layer.group_send(run_group(run.pk), message)
        assert _reply_text(await comm.receive_from(timeout=TIMEOUT)) == "first words"
        await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
        message = publisher.reply_message(run.pk, text="first words SECRET", done=False)
        await layer.group_send(run_group(run.pk), message)
        assert await comm.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4404,
        }
        assert await comm.receive_nothing(timeout=0.2)
    finally:
        await comm.disconnect()


async def test_the_reply_is_escaped():
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        message = publisher.reply_message(run.pk, text="<script>x</script> & co", done=True)
        await get_channel_layer().group_send(run_group(run.pk), message)
        frame = await comm.receive_from(timeout=TIMEOUT)
    finally:
        await comm.disconnect()
    assert "<script>" not in frame
    assert _reply_text(frame) == "&lt;script&gt;x&lt;/script&gt; &amp; co"


async def test_a_team_agents_reply_is_named_by_its_agent_on_the_page():
    """In a team run the entry says which agent is replying, escaped as any text is."""
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        message = publisher.reply_message(run.pk, text="on it", done=False, agent="<refunds>")
        await get_channel_layer().group_send(run_group(run.pk), message)
        frame = await comm.receive_from(timeout=TIMEOUT)
    finally:
        await comm.disconnect()
    assert '<span class="chain-agent">&lt;refunds&gt;</span>' in frame
    assert "Assistant" not in frame and _reply_text(frame) == "on it"


# -- the batches -------------------------------------------------------------------------------


@pytest.fixture
def announced(settings):
    settings.TOOLNEXUS_STREAM_BATCH_SECONDS = 0.05
    heard: list[dict] = []

    def listen(sender, **kwargs):
        heard.append({k: kwargs[k] for k in ("run_id", "text", "done")})

    events.replied.connect(listen, dispatch_uid="test_live_reply")
    yield heard
    events.replied.disconnect(dispatch_uid="test_live_reply")


async def test_pieces_are_batched_and_each_batch_carries_the_reply_so_far(announced):
    stream = ReplyStream(7)
    stream.add("One")  # the first piece goes out at once: the page shows the reply started
    for word in (" two", " three", " four"):
        stream.add(word)
    assert announced == [{"run_id": 7, "text": "One", "done": False}]
    await asyncio.sleep(0.1)
    assert announced[-1] == {"run_id": 7, "text": "One two three four", "done": False}
    assert len(announced) == 2
    stream.add(" five")
    stream.add(" six")  # within the batch interval: waits for the batch
    stream.end_turn()  # at once, marked done, and no batch after it
    assert announced[-1] == {"run_id": 7, "text": "One two three four five six", "done": True}
    count = len(announced)
    await asyncio.sleep(0.1)
    assert len(announced) == count
    stream.add("Next turn")  # starts afresh
    assert announced[-1] == {"run_id": 7, "text": "Next turn", "done": False}
    stream.add(" goes on")
    stream.close()  # the step ended: nothing more
    await asyncio.sleep(0.1)
    assert announced[-1]["text"] == "Next turn"


async def test_a_turn_without_text_announces_nothing(announced):
    stream = ReplyStream(7)
    stream.end_turn()
    stream.close()
    assert announced == []

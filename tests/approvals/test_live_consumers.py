"""approvals.live.consumers: the inbox and run-page sockets through the real ASGI stack
(session auth, routing, snapshots, pushes, access rechecks, misbehaving clients).

Every test talks to `toolnexus_web.asgi.application` with a `WebsocketCommunicator` and the
session cookie of a logged-in test client, on a fresh in-memory channel layer. Writes run in
a worker thread (`database_sync_to_async`), as views do under the ASGI server: their commit
hooks send the pushes on the event loop the consumers run on.
"""

from __future__ import annotations

import asyncio
import json
import re
from html.parser import HTMLParser

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from approvals import services
from approvals.live import publisher
from approvals.live.groups import INBOX_GROUP, run_group

from .factories import (
    TIMEOUT,
    communicator,
    drain,
    halted_run,
    in_thread,
    open_socket,
    pending_request,
    socket_for_session,
    start_and_halt,
    user_of,
)
from .factories import frame_with as _frame_with
from .factories import request_event as _event
from .factories import signed_in_client as _signed_in_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


# -- who may connect ---------------------------------------------------------------------------


async def test_anonymous_is_refused():
    comm = await communicator("/ws/inbox/")
    connected, code = await comm.connect(timeout=TIMEOUT)
    assert not connected
    assert code == 4401
    await comm.disconnect()


async def test_anonymous_is_refused_on_the_run_page_too():
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm = await communicator(f"/ws/runs/{run.pk}/")
    connected, code = await comm.connect(timeout=TIMEOUT)
    assert not connected
    assert code == 4401
    await comm.disconnect()


async def test_user_without_view_permission_is_refused():
    nobody = await user_of("nobody")
    comm = await communicator("/ws/inbox/", nobody)
    connected, code = await comm.connect(timeout=TIMEOUT)
    assert not connected
    assert code == 4403
    await comm.disconnect()


async def test_watcher_is_accepted_and_gets_the_request_list_snapshot():
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    watcher = await user_of("watcher")
    comm, snapshot = await open_socket(f"/ws/inbox/?r={row.request_id}", watcher)
    try:
        assert 'id="request-list"' in snapshot
        assert "hx-swap-oob" in snapshot
        assert snapshot.lstrip().startswith('<section id="request-list" hx-swap-oob="true"')
        assert f'id="row-{row.pk}"' in snapshot
        # the selected request's card follows the list
        assert f'<article id="request-{row.pk}" hx-swap-oob="true"' in snapshot
        # the watcher's variant: the card is there, its decision forms are not
        assert "/decline/" not in snapshot
        assert "You can watch but not decide." in snapshot
    finally:
        await comm.disconnect()


async def test_snapshot_for_a_reviewer_carries_the_decision_forms():
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    comm, snapshot = await open_socket(f"/ws/inbox/?r={row.request_id}", reviewer)
    try:
        assert f'id="row-{row.pk}"' in snapshot
        assert f'id="request-{row.pk}"' in snapshot
        assert f"/requests/{row.request_id}/decline/" in snapshot
        assert f"/requests/{row.request_id}/approve/" in snapshot
    finally:
        await comm.disconnect()


async def test_empty_inbox_snapshot_shows_the_empty_state():
    watcher = await user_of("watcher")
    comm, snapshot = await open_socket("/ws/inbox/", watcher)
    try:
        assert 'id="request-list"' in snapshot
        assert 'id="inbox-empty"' in snapshot
    finally:
        await comm.disconnect()


class _TextOf(HTMLParser):
    """The text inside the element with one id, nested elements included."""

    VOID = {"area", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}

    def __init__(self, element_id: str) -> None:
        super().__init__()
        self.element_id, self.depth, self.text = element_id, 0, []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        if self.depth or dict(attrs).get("id") == self.element_id:
            self.depth += 1

    def handle_endtag(self, tag):
        if self.depth and tag not in self.VOID:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


def _text_of(html: str, element_id: str) -> str:
    parser = _TextOf(element_id)
    parser.feed(html)
    return "".join(parser.text)


def _inbox_page(user, path: str) -> str:
    client = Client()
    client.force_login(user)
    return client.get(path).content.decode()


async def test_notices_about_unknown_filter_values_outlive_the_live_snapshot():
    """The page names what its URL asked that the inbox could not do; the socket opens with
    the filters as the page cleaned them, and its snapshot replaces the list: the notices
    must not be inside anything the snapshot replaces."""
    reviewer = await user_of("reviewer")
    await halted_run(reviewer)
    url = "/?sort=bogus&state=weird&claim=x&kind=poem"
    page = await in_thread(_inbox_page, reviewer, url)
    notices = re.findall(r'class="notice warning filter-notice" role="status">([^<]+)<', page)
    assert len(notices) == 4 and "Unknown sort “bogus”: showing newest first." in notices
    live = re.search(r'ws-connect="([^"]+)"', page).group(1).replace("&amp;", "&")
    comm, snapshot = await open_socket(live, reviewer)
    try:
        replaced = re.findall(r'<\w+ id="([^"]+)"[^>]*hx-swap-oob="true"', snapshot)
        assert "request-list" in replaced and "inbox-chips" in replaced
        for element_id in replaced:
            inside = _text_of(page, element_id)
            assert not [n for n in notices if n in inside], element_id
        assert "filter-notice" not in snapshot
        # the page then tells the socket its URL as typed: the same list, nothing re-sent
        await comm.send_to(text_data=json.dumps({"viewing": "", "filters": url[1:]}))
        assert await comm.receive_nothing(timeout=0.3)
    finally:
        await comm.disconnect()


# -- inbox pushes ------------------------------------------------------------------------------


async def test_a_new_pending_request_is_inserted_at_the_top():
    reviewer = await user_of("reviewer")
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    try:
        _, row = await halted_run(reviewer)
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert frame.startswith('<div hx-swap-oob="afterbegin:#request-rows">')
        assert f'id="row-{row.pk}"' in frame
        assert f'data-request-id="{row.request_id}"' in frame
        # the empty state goes away, and a toast announces the request
        assert '<div id="inbox-empty" hx-swap-oob="delete"></div>' in frame
        assert 'hx-swap-oob="beforeend:#toasts"' in frame
        assert "New request from demo: The agent wants to run refund" in frame
        # the unfiltered pending inbox also gets its live count, in a frame of its own
        count = await comm.receive_from(timeout=TIMEOUT)
        assert count == (
            '<p class="count" id="request-count" data-count="1" data-pending="1"'
            ' hx-swap-oob="true">1 request pending</p>'
            # "all N matching" with it, from the same count (issue 33)
            '<span id="bulk-all-label" hx-swap-oob="true">all 1 matching</span>'
        )
        # nothing else for the inbox: run-only changes go to the run group
        assert await comm.receive_nothing(timeout=0.2)
    finally:
        await comm.disconnect()


async def test_a_new_request_is_not_inserted_into_page_two():
    reviewer = await user_of("reviewer")
    comm, _ = await open_socket("/ws/inbox/?page=2", reviewer)
    try:
        _, row = await halted_run(reviewer)
        frame = await comm.receive_from(timeout=TIMEOUT)
        # page two holds older requests: the new one is announced, not inserted
        assert "afterbegin:#request-rows" not in frame
        assert f'id="row-{row.pk}"' not in frame
        assert "New request from demo" in frame
    finally:
        await comm.disconnect()


async def test_a_decision_deletes_the_card_for_pending_and_replaces_it_for_all():
    reviewer = await user_of("reviewer")
    colleague = await user_of("reviewer")  # watches; their own decision reads differently
    _, row = await halted_run(reviewer)
    pending, _ = await open_socket("/ws/inbox/?state=pending", colleague)
    everything, _ = await open_socket(f"/ws/inbox/?state=all&r={row.request_id}", colleague)
    try:
        await in_thread(
            services.request_decline,
            request_id=row.request_id,
            user=reviewer,
            reason="over the limit",
        )
        # two frames: the first drops the card and says who decided (nothing rendered), the
        # second carries the new count
        frame = await pending.receive_from(timeout=TIMEOUT)
        assert frame.startswith(f'<div id="row-{row.pk}" hx-swap-oob="delete"></div>')
        assert f"Already declined by {reviewer.username} at " in frame
        assert "The agent wants to run refund" in frame
        count = await pending.receive_from(timeout=TIMEOUT)
        assert count == (
            '<p class="count" id="request-count" data-count="0" data-pending="0"'
            ' hx-swap-oob="true">0 requests pending</p>'
            # "all N matching" with it, from the same count (issue 33)
            '<span id="bulk-all-label" hx-swap-oob="true">all 0 matching</span>'
        )
        assert await pending.receive_nothing(timeout=0.2)

        frame = await everything.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith(f'<article id="request-{row.pk}" hx-swap-oob="true"')
        assert "state-declined" in frame
        assert "over the limit" in frame
        assert reviewer.username in frame
        # a decided card has no decision forms left; the row follows the card
        assert "/decline/" not in frame.split('<div hx-swap-oob="beforeend:#toasts">')[0]
        assert f'<li id="row-{row.pk}" hx-swap-oob="true" class="row state-declined' in frame
    finally:
        await pending.disconnect()
        await everything.disconnect()


async def test_a_decision_is_inserted_nowhere_for_a_page_filtered_on_another_state():
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    approved, _ = await open_socket("/ws/inbox/?state=approved", reviewer)
    try:
        await in_thread(services.request_decline, request_id=row.request_id, user=reviewer)
        frame = await approved.receive_from(timeout=TIMEOUT)
        # not a match for this page: removed if present, never shown
        assert frame.startswith(f'<div id="row-{row.pk}" hx-swap-oob="delete"></div>')
    finally:
        await approved.disconnect()


@pytest.mark.parametrize(
    "query",
    ["agent=someone-else", "kind=question", "agent=someone-else&kind=tool_call"],
)
async def test_filters_drop_events_that_do_not_match(query):
    reviewer = await user_of("reviewer")
    filtered, _ = await open_socket(f"/ws/inbox/?{query}", reviewer)
    control, _ = await open_socket("/ws/inbox/?agent=demo&kind=tool_call", reviewer)
    try:
        _, row = await halted_run(reviewer)
        frame = await control.receive_from(timeout=TIMEOUT)
        assert f'id="row-{row.pk}"' in frame  # the event did go out
        assert await filtered.receive_nothing(timeout=0.3)
        # decisions on a non-matching request are dropped too
        await in_thread(services.request_decline, request_id=row.request_id, user=reviewer)
        assert 'hx-swap-oob="delete"' in await _frame_with(control, "delete")
        assert await filtered.receive_nothing(timeout=0.3)
    finally:
        await filtered.disconnect()
        await control.disconnect()


async def test_a_kind_filter_lets_matching_events_through():
    reviewer = await user_of("reviewer")
    questions, _ = await open_socket("/ws/inbox/?kind=question", reviewer)
    try:
        _, row = await halted_run(reviewer, prompt="Ask the customer a question about plans")
        frame = await questions.receive_from(timeout=TIMEOUT)
        assert f'id="row-{row.pk}"' in frame
        assert "afterbegin:#request-rows" in frame
    finally:
        await questions.disconnect()


async def test_watchers_get_the_view_variant_and_reviewers_the_decide_variant():
    reviewer = await user_of("reviewer")
    watcher = await user_of("watcher")
    _, row = await halted_run(reviewer)
    decide, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", reviewer)
    view, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", watcher)
    try:
        # a change of the request both pages show in their detail pane
        await get_channel_layer().group_send(INBOX_GROUP, _event(row, toast=""))
        decide_frame = await _frame_with(decide, "<article")
        view_frame = await _frame_with(view, "<article")
        for frame in (decide_frame, view_frame):
            assert f'id="request-{row.pk}"' in frame
        assert f'action="/requests/{row.request_id}/decline/"' in decide_frame
        assert f'action="/requests/{row.request_id}/approve/"' in decide_frame
        assert ">Decline<span" in decide_frame
        assert "<form" not in view_frame
        assert "Approve" not in view_frame
        assert "Decline" not in view_frame
        assert "You can watch but not decide." in view_frame
    finally:
        await decide.disconnect()
        await view.disconnect()


# -- group membership and misbehaving clients --------------------------------------------------


async def test_a_message_sent_to_the_inbox_group_reaches_the_consumer():
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    watcher = await user_of("watcher")
    comm, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", watcher)
    try:
        layer = get_channel_layer()
        await layer.group_send(INBOX_GROUP, _event(row, toast="hello"))
        frame = await _frame_with(comm, "<article")
        # the consumer rendered the card for its viewer: the watcher's variant, in place
        assert frame.lstrip().startswith(f'<article id="request-{row.pk}" hx-swap-oob="true"')
        assert "You can watch but not decide." in frame
        assert '<p class="toast">hello</p>' in frame
    finally:
        await comm.disconnect()
    # after disconnecting the consumer left the group
    assert not get_channel_layer().groups.get(INBOX_GROUP)


async def test_after_the_layer_dropped_messages_every_page_connected_before_catches_up():
    """`approvals.resync` (the publisher's sends failed, then worked again): a page that
    connected before the layer came back gets its live region re-rendered from the database
    (the list as it filters it, the run's body), as after a reconnect; a page connected
    since, or caught up since, gets nothing."""
    from approvals.live.groups import LIVE_GROUP

    reviewer = await user_of("reviewer")
    run, row = await halted_run(reviewer)
    inbox, _ = await open_socket("/ws/inbox/", reviewer)
    run_page, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    layer = get_channel_layer()
    try:
        # The layer works again since an hour: these pages connected since, up to date.
        await layer.group_send(LIVE_GROUP, {"type": "approvals.resync", "age": 3600.0})
        assert await inbox.receive_nothing(timeout=0.2)  # connected after: up to date
        assert await run_page.receive_nothing(timeout=0.2)
        # Decided while the layer was down: no push told the pages.
        await in_thread(
            services.request_decline, request_id=row.request_id, user=reviewer, reason="missed"
        )
        for comm in (inbox, run_page):  # the in-memory layer did tell them: read it all
            while not await comm.receive_nothing(timeout=0.5):
                await comm.receive_from(timeout=TIMEOUT)
        await layer.group_send(LIVE_GROUP, {"type": "approvals.resync", "age": 0.0})
        listed = await inbox.receive_from(timeout=TIMEOUT)
        assert 'id="request-list"' in listed and f'id="row-{row.pk}"' not in listed
        body = await run_page.receive_from(timeout=TIMEOUT)
        assert body.lstrip().startswith('<div id="run-body" hx-swap-oob="true">')
        assert "missed" in body
        # The same recovery told again (another process, or the later reminder, so older
        # by now): these pages caught up since.
        await asyncio.sleep(0.05)
        await layer.group_send(LIVE_GROUP, {"type": "approvals.resync", "age": 0.5})
        assert await inbox.receive_nothing(timeout=0.2)
        assert await run_page.receive_nothing(timeout=0.2)
    finally:
        await inbox.disconnect()
        await run_page.disconnect()


async def test_the_run_consumer_joins_only_its_own_run_group():
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        layer = get_channel_layer()
        other = run.pk + 1000
        await layer.group_send(run_group(other), publisher.run_message(other, change="x"))
        assert await comm.receive_nothing(timeout=0.2)
        await layer.group_send(run_group(run.pk), publisher.run_message(run.pk, change="y"))
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith('<div id="run-body" hx-swap-oob="true">')
        assert f"Run #{run.pk}" not in frame or "Waiting for a decision" in frame
    finally:
        await comm.disconnect()


async def test_an_oversized_frame_closes_the_socket():
    watcher = await user_of("watcher")
    comm, _ = await open_socket("/ws/inbox/", watcher)
    await comm.send_to(text_data="x" * 10_000)
    output = await comm.receive_output(timeout=TIMEOUT)
    assert output["type"] == "websocket.close"
    assert output["code"] == 4400
    await comm.disconnect()


async def test_a_binary_frame_closes_the_socket():
    watcher = await user_of("watcher")
    comm, _ = await open_socket("/ws/inbox/", watcher)
    await comm.send_to(bytes_data=b"\x00\x01")
    output = await comm.receive_output(timeout=TIMEOUT)
    assert output["type"] == "websocket.close"
    await comm.disconnect()


async def test_small_client_frames_are_ignored():
    watcher = await user_of("watcher")
    comm, _ = await open_socket("/ws/inbox/", watcher)
    try:
        await comm.send_to(text_data='{"hello": "server"}')
        assert await comm.receive_nothing(timeout=0.2)
    finally:
        await comm.disconnect()


# -- the run page ------------------------------------------------------------------------------


async def test_run_consumer_sends_the_body_on_connect_and_on_every_change():
    reviewer = await user_of("reviewer")
    run, row = await halted_run(reviewer)
    comm, snapshot = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        assert snapshot.lstrip().startswith('<div id="run-body" hx-swap-oob="true">')
        assert "Waiting for a decision" in snapshot
        assert f"/requests/{row.request_id}/decline/" in snapshot

        await in_thread(
            services.request_decline,
            request_id=row.request_id,
            user=reviewer,
            reason="policy says no",
        )
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith('<div id="run-body" hx-swap-oob="true">')
        assert "Waiting for a decision" not in frame
        assert "status-queued" in frame

        await in_thread(drain)
        frames = []
        while not await comm.receive_nothing(timeout=0.3):
            frames.append(await comm.receive_from(timeout=TIMEOUT))
        assert frames, "the resume pushed nothing"
        last = frames[-1]
        assert "status-done" in last
        assert re.search(r"Final answer</h2>\s*<div class=\"text md\"><p>[^<]*policy says no", last)
        assert f"<strong>Declined</strong> by {reviewer.username}" in last
    finally:
        await comm.disconnect()


async def test_run_consumer_for_a_watcher_sends_the_view_variant():
    reviewer = await user_of("reviewer")
    watcher = await user_of("watcher")
    run, row = await halted_run(reviewer)
    comm, snapshot = await open_socket(f"/ws/runs/{run.pk}/", watcher)
    try:
        assert "Waiting for a decision" in snapshot
        assert "/decline/" not in snapshot
        assert "Cancel this run" not in snapshot
        await in_thread(services.request_decline, request_id=row.request_id, user=reviewer)
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert 'id="run-body"' in frame
        assert "Cancel this run" not in frame
    finally:
        await comm.disconnect()


async def test_run_consumer_for_a_missing_run_says_so_and_closes():
    reviewer = await user_of("reviewer")
    comm, snapshot = await open_socket("/ws/runs/999999/", reviewer)
    try:
        assert 'id="run-body"' in snapshot
        assert "This run no longer exists." in snapshot
        assert await comm.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4404,
        }
    finally:
        await comm.disconnect()


async def test_a_socket_opened_before_its_run_exists_gets_nothing_of_a_hidden_agents_run():
    """Run ids are sequential: a socket for the next id, opened by someone who may not see
    `demo`, must not receive that run when its owner starts it (nor one of any agent)."""
    from approvals.models import Run

    owner = await user_of("reviewer")
    outsider = await user_of("reviewer")
    await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)

    def last_id() -> int:  # the ids a flushed table still counts from: make one, drop it
        run = Run.objects.create(agent="demo", prompt="probe")
        pk = run.pk
        run.delete()
        return pk

    last = await database_sync_to_async(last_id)()
    next_ids = [last + n for n in (1, 2, 3)]
    traps = []
    for run_id in next_ids:
        comm = await communicator(f"/ws/runs/{run_id}/", outsider)
        connected, _ = await comm.connect(timeout=TIMEOUT)
        traps.append((comm, connected))
    try:
        run, _ = await halted_run(owner, prompt="Refund order SECRET-77, $250")
        assert run.pk in next_ids
        for comm, connected in traps:
            if not connected:
                continue
            frames = []
            while True:
                output = await comm.receive_output(timeout=TIMEOUT)
                if output["type"] == "websocket.close":
                    assert output["code"] == 4404
                    break
                frames.append(output.get("text", ""))
            assert all("SECRET-77" not in frame for frame in frames)
            assert await comm.receive_nothing(timeout=0.3)
        # a run started after the traps were set reaches its owner's page as before
        page, body = await open_socket(f"/ws/runs/{run.pk}/", owner)
        assert "SECRET-77" in body
        await page.disconnect()
    finally:
        for comm, _ in traps:
            await comm.disconnect()


async def test_run_consumer_refuses_a_user_without_run_permission():
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    nobody = await user_of("nobody")
    comm = await communicator(f"/ws/runs/{run.pk}/", nobody)
    connected, code = await comm.connect(timeout=TIMEOUT)
    assert not connected
    assert code == 4403
    await comm.disconnect()


async def test_a_push_to_a_page_that_just_went_away_is_dropped_quietly():
    from autobahn.exception import Disconnected

    from approvals.live.consumers import InboxConsumer

    consumer = InboxConsumer()

    async def gone(**kwargs):
        raise Disconnected("Attempt to send on a closed protocol")

    consumer.send = gone
    await consumer.push("<p>late</p>")  # no exception: nothing to tell a closed page

    async def broken(**kwargs):
        raise RuntimeError("something else")

    consumer.send = broken
    with pytest.raises(RuntimeError):
        await consumer.push("<p>late</p>")


# -- a record reviewers can trust: own decisions, withdrawn access -----------------------------


async def test_your_own_decision_reads_as_yours_and_everybody_elses_says_who():
    reviewer = await user_of("reviewer")
    colleague = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    mine, _ = await open_socket("/ws/inbox/", reviewer)
    mine_all, _ = await open_socket("/ws/inbox/?state=all", reviewer)
    theirs, _ = await open_socket("/ws/inbox/", colleague)
    try:
        await in_thread(
            services.request_decline,
            request_id=row.request_id,
            user=reviewer,
            reason="over the limit",
        )
        dom_id = f"request-{row.pk}"
        own = [await mine.receive_from(timeout=TIMEOUT) for _ in range(2)]
        (frame,) = [f for f in own if "delete" in f]
        said = f'<p class="toast success" data-request="{dom_id}">You declined: over the limit'
        assert said in frame
        assert "Already" not in frame
        frame = await mine_all.receive_from(timeout=TIMEOUT)
        assert "state-declined" in frame
        assert "You declined: over the limit" in frame
        assert "Already" not in frame

        other = [await theirs.receive_from(timeout=TIMEOUT) for _ in range(2)]
        (frame,) = [f for f in other if "delete" in f]
        said = f'<p class="toast" data-request="{dom_id}">Already declined by {reviewer.username}'
        assert said in frame
        assert "You declined" not in frame
    finally:
        for comm in (mine, mine_all, theirs):
            await comm.disconnect()


@pytest.fixture
def recheck_every_push(monkeypatch):
    from approvals.live.consumers import base as consumers

    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0, raising=False)


async def test_a_push_is_not_forwarded_once_the_groups_permission_was_withdrawn(
    recheck_every_push,
):
    """A change no message announces (a group's permissions edited) is caught before the
    next push (at most RECHECK_SECONDS late), and nothing of the push leaks."""
    from django.contrib.auth.models import Group, Permission

    reviewer = await user_of("reviewer")
    watcher = await user_of("watcher")
    comm, _ = await open_socket("/ws/inbox/", watcher)
    try:

        def withdraw():
            Group.objects.get(name="Watchers").permissions.remove(
                Permission.objects.get(codename="view_approvalrequest")
            )

        await in_thread(withdraw)
        assert await comm.receive_nothing(timeout=0.2)  # no message for a group's edit
        await halted_run(reviewer, prompt="Refund order A-9999, $1 secret-prompt")
        output = await comm.receive_output(timeout=TIMEOUT)
        assert output == {"type": "websocket.close", "code": 4403}
        assert await comm.receive_nothing(timeout=0.2)
    finally:
        await comm.disconnect()


async def test_a_run_page_whose_agent_is_hidden_later_gets_nothing_more(recheck_every_push):
    """The agent's access is restricted after the run page connected: the next push finds it
    hidden and closes the page (4404, as for a missing run), with nothing of the push."""
    from approvals import services

    owner = await user_of("reviewer")
    viewer = await user_of("reviewer")
    run, row = await halted_run(owner)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", viewer)
    try:
        await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
        await in_thread(
            services.request_decline, request_id=row.request_id, user=owner, reason="SECRET-42"
        )
        output = await comm.receive_output(timeout=TIMEOUT)
        assert output == {"type": "websocket.close", "code": 4404}
        assert await comm.receive_nothing(timeout=0.2)
    finally:
        await comm.disconnect()


async def test_an_ended_session_gets_no_more_pushes(recheck_every_push):
    from django.contrib.sessions.models import Session

    reviewer = await user_of("reviewer")
    _, session = await database_sync_to_async(_signed_in_client)(reviewer)
    comm = await socket_for_session("/ws/inbox/", session)
    try:
        await in_thread(lambda: Session.objects.filter(session_key=session).delete())
        await halted_run(reviewer)
        output = await comm.receive_output(timeout=TIMEOUT)
        assert output == {"type": "websocket.close", "code": 4401}
    finally:
        await comm.disconnect()


async def test_access_is_rechecked_at_most_every_few_seconds_not_per_push():
    """Pushes within RECHECK_SECONDS cost no query per page."""
    reviewer = await user_of("reviewer")
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    calls = []
    try:
        from approvals.live.consumers import base as consumers

        original = consumers._Base._current_access

        def counting(self):
            calls.append(1)
            return original(self)

        consumers._Base._current_access = counting
        try:
            row = await database_sync_to_async(pending_request)((await halted_run(reviewer))[0])
            for _ in range(2):  # the new request's card and count
                await comm.receive_from(timeout=TIMEOUT)
            for i in range(3):
                await get_channel_layer().group_send(INBOX_GROUP, _event(row, change=f"c{i}"))
                await comm.receive_from(timeout=TIMEOUT)
        finally:
            consumers._Base._current_access = original
        assert calls == []
    finally:
        await comm.disconnect()


async def test_toasts_travel_as_plain_text_and_are_escaped_once_by_the_page():
    """Messages carry text, never HTML: the consumer's template escapes it exactly once."""
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    watcher = await user_of("watcher")
    comm, _ = await open_socket("/ws/inbox/", watcher)
    try:
        event = _event(row, state="declined", toast="Already declined by ann: Tom's <b>")
        await get_channel_layer().group_send(INBOX_GROUP, event)
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert ">Already declined by ann: Tom&#x27;s &lt;b&gt;</p>" in frame
    finally:
        await comm.disconnect()


async def test_a_viewer_whose_access_holds_keeps_getting_pushes_after_a_recheck(
    recheck_every_push,
):
    reviewer = await user_of("reviewer")
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    try:
        for n in range(2):
            _, row = await halted_run(reviewer)
            frame = await _frame_with(comm, f'id="row-{row.pk}"')
            assert "pending" in await comm.receive_from(timeout=TIMEOUT)  # the count
            # the page shows it: a change brings the card, still the decide variant
            await comm.send_to(text_data=json.dumps({"viewing": row.request_id}))
            await get_channel_layer().group_send(INBOX_GROUP, _event(row, change=f"re{n}"))
            frame = await _frame_with(comm, "<article")
            assert f'id="request-{row.pk}"' in frame
            assert f"/requests/{row.request_id}/decline/" in frame
            assert "pending" in await _frame_with(comm, 'id="request-count"')
    finally:
        await comm.disconnect()


# -- a cap on live pages per account -----------------------------------------------------------


async def test_one_account_cannot_hold_more_live_pages_than_the_cap(settings):
    from django.core.cache import cache

    settings.TOOLNEXUS_MAX_SOCKETS_PER_USER = 2
    await cache.aclear()
    watcher = await user_of("watcher")
    colleague = await user_of("watcher")
    first, _ = await open_socket("/ws/inbox/", watcher)
    second, _ = await open_socket("/ws/inbox/", watcher)
    third = await communicator("/ws/inbox/", watcher)
    try:
        connected, code = await third.connect(timeout=TIMEOUT)
        assert (connected, code) == (False, 4429)
        await third.disconnect()
        # another account is not affected, and a closed page frees its place
        other, _ = await open_socket("/ws/inbox/", colleague)
        await other.disconnect()
        await first.disconnect()
        again, _ = await open_socket("/ws/inbox/", watcher)
        await again.disconnect()
    finally:
        await second.disconnect()


# -- per-agent access and the starter rule over sockets ----------------------------------------


def _restrict_demo_to_a_new_group(*members):
    """`demo` becomes visible (and decidable) to the members of a group of its own only."""
    from django.contrib.auth.models import Group

    from approvals.models import AgentAccess, AgentPolicy

    group = Group.objects.create(name="Refunds")
    policy = AgentPolicy.objects.create(agent="demo")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    for user in members:
        user.groups.add(group)


async def test_a_hidden_agents_requests_never_reach_an_outsiders_inbox(second_demo_agent):
    owner = await user_of("reviewer")
    outsider = await user_of("reviewer")
    await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
    theirs, _ = await open_socket("/ws/inbox/", owner)
    mine, _ = await open_socket("/ws/inbox/", outsider)
    try:
        _, hidden = await halted_run(owner)  # agent demo
        frame = await theirs.receive_from(timeout=TIMEOUT)
        assert f'id="row-{hidden.pk}"' in frame
        assert "1 request pending" in await theirs.receive_from(timeout=TIMEOUT)
        assert await mine.receive_nothing(timeout=0.3)  # no card, no toast, no count

        run = await in_thread(start_and_halt, user=owner, agent="demo2", prompt="Refund A-1, $1")
        visible = await database_sync_to_async(pending_request)(run)
        frame = await mine.receive_from(timeout=TIMEOUT)
        assert f'id="row-{visible.pk}"' in frame
        # the outsider's count leaves out what they may not see
        assert "1 request pending" in await mine.receive_from(timeout=TIMEOUT)
        assert "2 requests pending" in (
            await theirs.receive_from(timeout=TIMEOUT) + await theirs.receive_from(timeout=TIMEOUT)
        )
    finally:
        await theirs.disconnect()
        await mine.disconnect()


async def test_a_hidden_agents_run_page_socket_reads_as_a_missing_run():
    """As the run's page answers 404 for it: told the run does not exist, closed (4404), the
    same as for an id no run has."""
    owner = await user_of("reviewer")
    outsider = await user_of("reviewer")
    await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
    run, _ = await halted_run(owner, prompt="Refund order SECRET-99, $250")
    answers = []
    for run_id in (run.pk, 999999):
        comm, snapshot = await open_socket(f"/ws/runs/{run_id}/", outsider)
        close = await comm.receive_output(timeout=TIMEOUT)
        answers.append((snapshot, close))
        await comm.disconnect()
    assert answers[0] == answers[1]
    assert "This run no longer exists." in answers[0][0] and "SECRET-99" not in answers[0][0]
    assert answers[0][1] == {"type": "websocket.close", "code": 4404}
    allowed, body = await open_socket(f"/ws/runs/{run.pk}/", owner)
    assert "Waiting for a decision" in body
    await allowed.disconnect()


async def test_no_live_group_carries_a_hidden_agents_request_to_an_outsider():
    """Every group an outsider's sockets join (the inbox's, a request page's, the live
    layer's resync, presence) keeps a hidden agent's request from them."""
    from approvals.live.groups import LIVE_GROUP

    owner = await user_of("reviewer")
    outsider = await user_of("reviewer")
    await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
    _, row = await halted_run(owner, prompt="Refund order SECRET-88, $250")
    inbox, snapshot = await open_socket(f"/ws/inbox/?r={row.request_id}", outsider)
    page = await communicator(f"/ws/inbox/?view=request&r={row.request_id}", outsider)
    connected, _ = await page.connect(timeout=TIMEOUT)
    try:
        assert "SECRET-88" not in snapshot
        layer = get_channel_layer()
        await layer.group_send(INBOX_GROUP, _event(row))
        await layer.group_send(LIVE_GROUP, {"type": "approvals.resync", "age": 3600.0})
        await layer.group_send(
            INBOX_GROUP,
            {
                "type": "approvals.presence",
                "request_id": row.request_id,
                "request_pk": row.pk,
                "names": ["owner"],
            },
        )
        frames = []
        for comm in (inbox, page) if connected else (inbox,):
            while not await comm.receive_nothing(timeout=0.5):
                frames.append(await comm.receive_from(timeout=TIMEOUT))
        assert all(
            "SECRET-88" not in frame and f"request-{row.pk}" not in frame for frame in frames
        )
    finally:
        await inbox.disconnect()
        await page.disconnect()


async def test_whoever_started_a_run_gets_no_approve_form_where_the_starter_rule_holds(settings):
    settings.TOOLNEXUS_STARTER_CANNOT_APPROVE = True
    starter = await user_of("reviewer")
    colleague = await user_of("reviewer")
    run, row = await halted_run(starter)
    own, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", starter)
    other, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", colleague)
    try:
        event = _event(row, started_by_id=starter.pk)  # as the publisher says of a pending one
        await get_channel_layer().group_send(INBOX_GROUP, event)
        own_card = await _frame_with(own, "<article")
        other_card = await _frame_with(other, "<article")
        assert f"/requests/{row.request_id}/approve/" in other_card
        assert f"/requests/{row.request_id}/approve/" not in own_card
        assert f'id="request-{row.pk}"' in own_card
        # the run page agrees: the starter may still cancel the run, not approve its request
        page, body = await open_socket(f"/ws/runs/{run.pk}/", starter)
        assert f"/requests/{row.request_id}/approve/" not in body
        assert "Cancel this run" in body
        await page.disconnect()
    finally:
        await own.disconnect()
        await other.disconnect()


async def test_a_burst_of_run_changes_is_rendered_once_for_the_newest(monkeypatch):
    """A resume makes several changes within milliseconds: a run page renders the one that is
    newest when its previous rendering is done, not every one in turn."""
    import time as clock

    from approvals.live import rendering

    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    rendered = []
    original = rendering.run_body

    def slow(run_id, **kwargs):
        rendered.append(run_id)
        clock.sleep(0.3)  # a transcript that takes a while to render
        return original(run_id, **kwargs)

    monkeypatch.setattr(rendering, "run_body", slow)
    try:
        layer = get_channel_layer()
        for i in range(5):
            await layer.group_send(run_group(run.pk), publisher.run_message(run.pk, change=f"b{i}"))
        frames = [await comm.receive_from(timeout=TIMEOUT) for _ in range(2)]
        extra = []
        while not await comm.receive_nothing(timeout=0.5):
            extra.append(await comm.receive_from(timeout=TIMEOUT))
        assert not extra, (len(extra), len(rendered))
        assert all('id="run-body"' in frame for frame in frames)
        assert len(rendered) == 2  # the first change, then the newest of the other four
    finally:
        await comm.disconnect()


async def test_a_status_only_change_pushes_the_status_line_alone():
    """A worker taking the run changes its status line only: that is what the page gets, not
    the whole body (whose transcript is the costly part to render)."""
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    layer = get_channel_layer()
    try:
        await layer.group_send(
            run_group(run.pk), publisher.run_message(run.pk, change="s1", status_only=True)
        )
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith(
            '<section class="run-head" id="run-head" aria-label="Status" hx-swap-oob="true">'
        )
        assert "status-pending" in frame
        assert "Cancel this run" in frame
        assert 'id="run-body"' not in frame and "Transcript" not in frame

        await layer.group_send(run_group(run.pk), publisher.run_message(run.pk, change="f1"))
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith('<div id="run-body" hx-swap-oob="true">')
    finally:
        await comm.disconnect()


async def test_changes_coalesced_render_the_whole_body_when_any_of_them_needs_it(monkeypatch):
    """A full change followed by status-only ones while a rendering runs: the newest is
    rendered whole (the status line alone would leave the transcript behind); and a whole
    rendering that fails is owed to the next change, even a status-only one."""
    import time as clock

    from approvals.live import rendering

    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    comm, _ = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    original = rendering.run_body
    calls = []

    def slow_then_failing(run_id, **kwargs):
        calls.append(run_id)
        clock.sleep(0.3)
        if len(calls) == 3:
            raise RuntimeError("the database went away")
        return original(run_id, **kwargs)

    monkeypatch.setattr(rendering, "run_body", slow_then_failing)
    layer = get_channel_layer()
    group = run_group(run.pk)
    try:
        await layer.group_send(group, publisher.run_message(run.pk, change="a"))
        await layer.group_send(group, publisher.run_message(run.pk, change="b"))
        await layer.group_send(group, publisher.run_message(run.pk, change="c", status_only=True))
        frames = [await comm.receive_from(timeout=TIMEOUT) for _ in range(2)]
        assert all(f.lstrip().startswith('<div id="run-body"') for f in frames)
        assert len(calls) == 2  # "a", then "b" and "c" as one whole rendering

        await layer.group_send(group, publisher.run_message(run.pk, change="d"))  # fails
        assert await comm.receive_nothing(timeout=0.6)
        await layer.group_send(group, publisher.run_message(run.pk, change="e", status_only=True))
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith('<div id="run-body"'), frame[:80]
        assert len(calls) == 4
    finally:
        await comm.disconnect()


async def test_a_push_does_not_wait_for_the_processs_thread_sensitive_thread(monkeypatch):
    """Channels' consumers hop through the process's one thread-sensitive thread before
    every message (to close stale database connections), so at a hundred open pages a
    decision's pushes queued a hundred hops one after the other. A push must not wait for
    that thread; the socket's own messages (connect, frames, disconnect) still get the hop
    (they may use the cache, which a project may keep in the database)."""
    import time as clock

    from asgiref.sync import sync_to_async

    from approvals.live.consumers import base as consumers

    hops = []
    real_hop = consumers.aclose_old_connections
    monkeypatch.setattr(consumers, "aclose_old_connections", lambda: hops.append(1) or real_hop())
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    assert len(hops) == 1  # the connect
    busy = asyncio.ensure_future(sync_to_async(clock.sleep, thread_sensitive=True)(1.5))
    try:
        await asyncio.sleep(0.05)  # the slow view holds the thread now
        started = clock.monotonic()
        await get_channel_layer().group_send(
            INBOX_GROUP, _event(row, state="declined", toast="Declined by someone")
        )
        frame = await _frame_with(comm, f'id="row-{row.pk}" hx-swap-oob="delete"')
        assert clock.monotonic() - started < 1.0, "the push waited for the busy thread"
        assert not busy.done()
        assert frame and len(hops) == 1
    finally:
        await busy
        await comm.disconnect()


# -- a request's own page ----------------------------------------------------------------------


async def test_a_request_page_gets_its_card_and_presence_but_no_list():
    reviewer, colleague = await user_of("reviewer"), await user_of("reviewer")
    _, row = await halted_run(reviewer)
    _, other = await halted_run(reviewer, prompt="Refund order B-2, $5")
    path = f"/ws/inbox/?view=request&r={row.request_id}"
    page, snapshot = await open_socket(path, reviewer)
    try:
        assert f'<article id="request-{row.pk}" hx-swap-oob="true"' in snapshot
        assert 'id="request-list"' not in snapshot
        # a colleague opens the same request in the inbox: the page says so, live
        inbox, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", colleague)
        try:
            said = await _frame_with(page, "is viewing)")
            assert f'id="presence-{row.pk}"' in said
            assert f"({colleague.username} is viewing)" in said
            # another request's change says nothing here; this one's brings its card
            await in_thread(services.request_decline, request_id=other.request_id, user=colleague)
            await in_thread(services.request_decline, request_id=row.request_id, user=colleague)
            frame = await page.receive_from(timeout=TIMEOUT)
            assert f'<article id="request-{row.pk}" hx-swap-oob="true"' in frame
            assert "state-declined" in frame and f"request-{other.pk}" not in frame
            assert f"Already declined by {colleague.username}" in frame
            assert await page.receive_nothing(timeout=0.3)  # no rows, no counts
        finally:
            await inbox.disconnect()
    finally:
        await page.disconnect()


async def test_a_request_page_ignores_list_filters_sent_to_it():
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    page, _ = await open_socket(f"/ws/inbox/?view=request&r={row.request_id}", reviewer)
    try:
        await _frame_with(page, f'id="presence-{row.pk}"')  # its own arrival: nobody else
        await page.send_to(text_data=json.dumps({"viewing": row.request_id, "filters": "?q=x"}))
        assert await page.receive_nothing(timeout=0.3)
    finally:
        await page.disconnect()


# -- the chips' counts follow changes ----------------------------------------------------------

CHIP_COUNT = re.compile(r"data-chip='([^']+)'\] \.chip-count\">([^<]*)</span>")
SNAPSHOT_CHIP = re.compile(r'data-chip="([^"]+)"[^>]*>[^<]*<span class="chip-count">([^<]*)</span>')


def _chips(frame: str) -> dict[str, str]:
    """The chip counts a live frame pushes, by chip ("claim=mine": "1")."""
    return dict(CHIP_COUNT.findall(frame))


async def _claim(row, user) -> None:
    await in_thread(services.request_claim, request_id=row.request_id, user=user)


async def test_a_filtered_pages_count_frame_carries_its_chip_counts(settings):
    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0.05  # would a filtered page get more frames: soon
    reviewer, colleague = await user_of("reviewer"), await user_of("reviewer")
    _, first = await halted_run(reviewer)
    _, second = await halted_run(reviewer, prompt="Refund order B-2, $5")
    comm, snapshot = await open_socket("/ws/inbox/?agent=demo", reviewer)
    try:
        assert dict(SNAPSHOT_CHIP.findall(snapshot))["claim=unclaimed"] == "2"
        await _claim(first, colleague)
        assert f'id="row-{first.pk}"' in await comm.receive_from(timeout=TIMEOUT)
        frame = await comm.receive_from(timeout=TIMEOUT)
        # one frame: the list's count (and the title's), then only the chips' counts
        assert frame.startswith('<p class="count" id="request-count" data-count="2"')
        assert _chips(frame) == {
            "claim=mine": "0",
            "claim=unclaimed": "1",
            "claim=routed": "0",
            "overdue=1": "0",
            "hidden=only": "0",
        }
        assert "<a " not in frame and 'class="chip' not in frame  # the links stay as they are
        await _claim(second, reviewer)
        frame = await _frame_with(comm, 'id="request-count"')
        assert _chips(frame)["claim=mine"] == "1" and _chips(frame)["claim=unclaimed"] == "0"
        # no refresh of the chips besides: the count frame had them
        assert await comm.receive_nothing(timeout=0.3)
    finally:
        await comm.disconnect()


async def test_a_plain_pages_chips_follow_a_claim_by_another_reviewer(settings):
    import time as clock

    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0.2
    reviewer, colleague = await user_of("reviewer"), await user_of("reviewer")
    _, row = await halted_run(reviewer)
    mine, snapshot = await open_socket("/ws/inbox/", reviewer)
    theirs, _ = await open_socket("/ws/inbox/", colleague)
    try:
        before = dict(SNAPSHOT_CHIP.findall(snapshot))
        assert (before["claim=unclaimed"], before["claim=mine"]) == ("1", "0")
        claimed_at = clock.monotonic()
        await _claim(row, colleague)
        assert f'id="row-{row.pk}"' in await mine.receive_from(timeout=TIMEOUT)
        # the shared pending count, as before: nothing of the viewer's own in it
        assert await mine.receive_from(timeout=TIMEOUT) == (
            '<p class="count" id="request-count" data-count="1" data-pending="1"'
            ' hx-swap-oob="true">1 request pending</p>'
            # "all N matching" with it, from the same count (issue 33)
            '<span id="bulk-all-label" hx-swap-oob="true">all 1 matching</span>'
        )
        # then the viewer's chips, counted once the coalescing window passed
        frame = await mine.receive_from(timeout=TIMEOUT)
        assert clock.monotonic() - claimed_at >= 0.2
        assert _chips(frame) == {
            "claim=mine": "0",
            "claim=unclaimed": "0",
            "claim=routed": "0",
            "overdue=1": "0",
            "hidden=only": "0",
        }
        # the claimer's page counts the claim as theirs
        frame = await _frame_with(theirs, "chip-count")
        assert _chips(frame)["claim=mine"] == "1" and _chips(frame)["claim=unclaimed"] == "0"
        for comm in (mine, theirs):
            assert await comm.receive_nothing(timeout=0.5)  # one count for one change
    finally:
        await mine.disconnect()
        await theirs.disconnect()


@pytest.fixture
def chip_countings(monkeypatch):
    """Each time a page counts its chips (`rendering.list_counts`): the number counting at
    once when it started; `chip_countings.seconds`: how long each count takes."""
    import threading
    import time as clock

    from approvals.live import rendering

    class Countings(list):
        seconds = 0.0

    calls = Countings()
    running = [0]
    lock = threading.Lock()
    original = rendering.list_counts

    def counting(user, params):
        with lock:
            running[0] += 1
            calls.append(running[0])
        try:
            clock.sleep(calls.seconds)
            return original(user, params)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(rendering, "list_counts", counting)
    return calls


async def _frames_until_quiet(comm, quiet: float = 0.8) -> list[str]:
    frames = []
    while not await comm.receive_nothing(timeout=quiet):
        frames.append(await comm.receive_from(timeout=TIMEOUT))
    return frames


async def test_a_burst_of_changes_on_a_plain_page_counts_its_chips_at_most_twice(
    settings, chip_countings
):
    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0.3
    reviewer, colleague = await user_of("reviewer"), await user_of("reviewer")
    _, row = await halted_run(reviewer)
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    try:
        layer = get_channel_layer()
        for i in range(12):
            await layer.group_send(INBOX_GROUP, _event(row, change=f"burst{i}", toast=""))
        await _claim(row, colleague)  # the burst's last change
        frames = await _frames_until_quiet(comm)
        chip_frames = [f for f in frames if "chip-count" in f]
        assert 1 <= len(chip_countings) <= 2, chip_countings
        assert len(chip_frames) == len(chip_countings)
        # every change's row and count went out as before; the chips: the last change too
        assert sum('id="request-count"' in f for f in frames) == 13
        assert _chips(chip_frames[-1])["claim=unclaimed"] == "0"
    finally:
        await comm.disconnect()


async def test_a_plain_page_never_counts_its_chips_twice_at_once(settings, chip_countings):
    """TOOLNEXUS_LIVE_CHIP_SECONDS = 0: counted after every change, but the changes that
    arrive while a count runs make one count after it, not one each beside it."""
    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0
    chip_countings.seconds = 0.3  # a count that takes a while
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    try:
        for i in range(5):
            await get_channel_layer().group_send(
                INBOX_GROUP, _event(row, change=f"slow{i}", toast="")
            )
        frames = await _frames_until_quiet(comm)
        assert chip_countings == [1, 1]  # the first change's, then one for the other four
        assert len([f for f in frames if "chip-count" in f]) == 2
    finally:
        await comm.disconnect()


async def test_closing_a_plain_page_cancels_its_pending_chip_count(settings, chip_countings):
    import asyncio

    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0.3
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    await get_channel_layer().group_send(INBOX_GROUP, _event(row, change="last", toast=""))
    assert 'id="request-count"' in await _frame_with(comm, 'id="request-count"')
    await comm.disconnect()  # within the window: its count is due in 0.3 s
    await asyncio.sleep(0.6)
    assert chip_countings == []


async def test_a_failing_chip_count_is_logged_and_the_next_change_counts_again(
    settings, monkeypatch, caplog
):
    import asyncio

    from approvals.live import rendering

    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0.1
    original = rendering.chip_counts_html
    failures = [RuntimeError("the template went away")]

    def render_or_fail(*args, **kwargs):
        if failures:
            raise failures.pop()
        return original(*args, **kwargs)

    monkeypatch.setattr(rendering, "chip_counts_html", render_or_fail)
    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    try:
        await get_channel_layer().group_send(INBOX_GROUP, _event(row, change="one", toast=""))
        await asyncio.sleep(0.5)
        assert "counting the inbox chips for a live page failed" in caplog.text
        frames = await _frames_until_quiet(comm, quiet=0.3)
        assert not [f for f in frames if "chip-count" in f]  # that count failed: no frame
        # the task ended cleanly (nothing unretrieved), and the next change counts again
        await get_channel_layer().group_send(INBOX_GROUP, _event(row, change="two", toast=""))
        assert "chip-count" in await _frame_with(comm, "chip-count")
    finally:
        await comm.disconnect()


async def test_a_lapsed_claim_in_a_live_change_counts_as_no_claim(settings):
    """A change to a request whose claim is older than TOOLNEXUS_CLAIM_MINUTES: the
    "unclaimed" list keeps (or gets) its row, its old holder's "mine" list drops it."""
    from .factories import claim

    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    holder = await user_of("reviewer")
    other = await user_of("reviewer")
    _, row = await halted_run(holder)
    await in_thread(claim, row, holder, minutes_ago=5)  # held: listed under "mine"
    mine, snapshot = await open_socket("/ws/inbox/?claim=mine", holder)
    unclaimed, other_snapshot = await open_socket("/ws/inbox/?claim=unclaimed", other)
    try:
        assert f'id="row-{row.pk}"' in snapshot
        assert f'id="row-{row.pk}"' not in other_snapshot
        await in_thread(claim, row, holder, minutes_ago=31)  # the claim lapses
        fresh_row = await database_sync_to_async(
            lambda: type(row).objects.select_related("claimed_by").get(pk=row.pk)
        )()
        event = _event(fresh_row)  # as the publisher says of the request now
        await get_channel_layer().group_send(INBOX_GROUP, event)
        dropped = await _frame_with(mine, f"row-{row.pk}")
        assert f'<div id="row-{row.pk}" hx-swap-oob="delete"></div>' in dropped
        kept = await _frame_with(unclaimed, f'id="row-{row.pk}"')
        assert 'hx-swap-oob="delete"' not in kept and "claimed by" not in kept
    finally:
        await mine.disconnect()
        await unclaimed.disconnect()

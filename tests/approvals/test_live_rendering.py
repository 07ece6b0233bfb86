"""approvals.live.rendering: the fragments live pages show, from the views' own partials,
rendered once per change and variant however many pages ask at once, afresh for a later
change and never for a change nobody watches; pushed fragments escape what they show and
carry no CSRF token."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from approvals import services
from approvals.live import rendering
from approvals.live.groups import INBOX_GROUP
from approvals.models import Run

from .factories import (
    TIMEOUT,
    drain,
    halted_run,
    in_thread,
    make_user,
    open_socket,
    start_and_halt,
    user_of,
)
from .factories import frame_with as _frame_with
from .factories import request_event as _event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


def test_a_decided_card_is_the_same_for_deciders_and_watchers():
    user = make_user()
    run = start_and_halt(user=user)
    row = services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    decide = rendering.changed_card(row.pk, can_decide=True, oob=True)
    view = rendering.changed_card(row.pk, can_decide=False, oob=True)
    assert decide == view
    assert "/decline/" not in decide
    assert 'hx-swap-oob="true"' in decide


def test_a_pending_card_differs_for_deciders_and_watchers():
    user = make_user()
    run = start_and_halt(user=user)
    row = run.requests.get()
    decide = rendering.changed_card(row.pk, can_decide=True, oob=False)
    view = rendering.changed_card(row.pk, can_decide=False, oob=False)
    assert "/decline/" in decide
    assert "/decline/" not in view
    assert "hx-swap-oob" not in decide  # inserted into the list, not swapped by id


async def test_a_change_is_rendered_once_however_many_pages_ask(monkeypatch):
    user = await database_sync_to_async(make_user)()
    run = await database_sync_to_async(start_and_halt)(user=user)
    row = await database_sync_to_async(run.requests.get)()
    rendered = []
    card_html = rendering.card_html
    monkeypatch.setattr(
        rendering, "card_html", lambda *a, **k: rendered.append(1) or card_html(*a, **k)
    )

    async def page() -> str:
        return await rendering.card_for_change(row.pk, change="c3", can_decide=True, oob=True)

    results = await asyncio.gather(*(page() for _ in range(20)))  # twenty pages at once
    assert len(set(results)) == 1 and len(rendered) == 1
    # a later change is rendered afresh: a page never gets a stale card
    await database_sync_to_async(services.request_decline)(request_id=row.request_id, user=user)
    after = await rendering.card_for_change(row.pk, change="c4", can_decide=True, oob=True)
    assert "state-declined" in after and len(rendered) == 2


def test_a_filtered_pages_pushed_count_leaves_out_what_the_viewer_snoozed():
    me = make_user()
    first = start_and_halt(user=me).requests.get()
    start_and_halt(user=me)
    services.request_hide(
        request_id=first.request_id, user=me, until=timezone.now() + timedelta(hours=1)
    )
    for params in ({"sort": "oldest", "agent": "demo"}, {"hidden": "only"}):
        counts = rendering.list_counts(me, params)
        assert (counts["count"], counts["pending"]) == (1, 1)


async def test_a_failed_rendering_is_tried_again_by_the_next_page():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database went away")
        return "<p>ok</p>"

    cache = rendering.FragmentCache()
    with pytest.raises(RuntimeError):
        await cache.get("k", flaky)
    assert await cache.get("k", flaky) == "<p>ok</p>"
    assert await cache.get("k", flaky) == "<p>ok</p>" and len(calls) == 2


async def test_only_the_latest_changes_are_kept():
    cache = rendering.FragmentCache(size=3)
    for i in range(5):
        await cache.get(f"k{i}", lambda i=i: i)
    assert await cache.get("k0", lambda: "again") == "again"  # evicted, computed anew
    assert await cache.get("k4", lambda: "again") == 4


# -- what live pages get, through their sockets ------------------------------------------------


async def test_a_change_is_rendered_once_per_variant_however_many_pages_watch(monkeypatch):
    from approvals.live import rendering

    reviewer = await user_of("reviewer")
    _, row = await halted_run(reviewer)
    watcher = await user_of("watcher")
    path = f"/ws/inbox/?state=all&r={row.request_id}"
    pages = [await open_socket(path, u) for u in [reviewer] * 3 + [watcher] * 3]
    rendered = []
    original = rendering.card_html

    def counting(row, **kwargs):
        rendered.append(kwargs["can_decide"])
        return original(row, **kwargs)

    monkeypatch.setattr(rendering, "card_html", counting)
    try:
        await get_channel_layer().group_send(INBOX_GROUP, _event(row, change="once"))
        for comm, _ in pages:
            assert f'id="request-{row.pk}"' in await _frame_with(comm, "<article")
        assert sorted(rendered) == [False, True]  # one rendering per variant, not per page
    finally:
        for comm, _ in pages:
            await comm.disconnect()


async def test_a_change_nobody_watches_renders_nothing(monkeypatch):
    from approvals.live import rendering

    def no_rendering(*args, **kwargs):
        raise AssertionError("rendered a fragment for no page")

    for name in ("card_html", "run_body", "changed_card"):
        monkeypatch.setattr(rendering, name, no_rendering)
    reviewer = await user_of("reviewer")
    run, row = await halted_run(reviewer)
    await in_thread(services.request_decline, request_id=row.request_id, user=reviewer)
    await in_thread(drain)
    assert await database_sync_to_async(lambda: Run.objects.get(pk=run.pk).status)() == "done"


async def test_pushed_fragments_escape_hostile_text():
    reviewer = await user_of("reviewer")
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    hostile = "Refund A-1001 $5 <img src=x onerror=window.__xss=1><script>window.__xss=1</script>"
    try:
        await halted_run(reviewer, prompt=hostile)
        frame = await comm.receive_from(timeout=TIMEOUT)  # the row: the prompt is its title
        assert "<script>window.__xss" not in frame
        assert "<img src=x" not in frame
        assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in frame
    finally:
        await comm.disconnect()


async def test_pushed_forms_carry_no_token_and_post_through_htmx():
    """Pushed HTML is the same for every viewer: no CSRF token in it. Its forms post through
    htmx (hx-post, or hx-boost for the run page's plain forms), which sends the token the
    page holds in <body hx-headers>."""
    reviewer = await user_of("reviewer")
    run, row = await halted_run(reviewer)
    run_page, body = await open_socket(f"/ws/runs/{run.pk}/", reviewer)
    inbox, listing = await open_socket(f"/ws/inbox/?r={row.request_id}", reviewer)
    try:
        for html in (body, listing):
            forms = re.findall(r"<form[^>]*>", html)
            assert forms
            for form in forms:
                if 'method="dialog"' in form:
                    continue  # closes a dialog (the keys' list): posts nothing
                assert "hx-post=" in form or 'hx-boost="true"' in form, form
            assert "csrfmiddlewaretoken" not in html
        assert re.search(rf'<form[^>]*action="/runs/{run.pk}/cancel/"[^>]*hx-boost="true"', body)
    finally:
        await run_page.disconnect()
        await inbox.disconnect()


async def test_text_that_looks_like_a_token_placeholder_stays_text():
    """Nothing is substituted into rendered HTML: a prompt naming the old placeholder (or
    anything else) reaches the page as typed, and no token goes with it."""
    reviewer = await user_of("reviewer")
    comm, _ = await open_socket("/ws/inbox/", reviewer)
    try:
        await halted_run(reviewer, prompt="Refund A-1001 $5 toolnexus-csrf-placeholder NOTPROVIDED")
        frame = await comm.receive_from(timeout=TIMEOUT)
        assert "toolnexus-csrf-placeholder NOTPROVIDED" in frame
        assert "csrfmiddlewaretoken" not in frame
    finally:
        await comm.disconnect()


def test_a_frame_that_depends_on_its_arguments_alone_is_rendered_once_per_variant(monkeypatch):
    """Every open inbox of a process builds the same frame for a decision (the row to drop,
    the toast): the template runs once per variant, not once per page."""
    from django.template import loader

    renders = []
    real = loader.render_to_string
    monkeypatch.setattr(
        rendering, "render_to_string", lambda *a, **k: renders.append(a[0]) or real(*a, **k)
    )
    toast = {"text": "Declined by ann: <b>no</b>", "about": "request-9901"}
    frames = [rendering.inbox_update(drop="row-9901", toast=dict(toast)) for _ in range(30)]
    mine = rendering.inbox_update(drop="row-9901", toast={**toast, "level": "success"})
    assert len(set(frames)) == 1 and mine != frames[0]
    assert renders.count("approvals/_live.html#inbox-update") == 2
    assert '<div id="row-9901" hx-swap-oob="delete"></div>' in frames[0]
    assert "Declined by ann: &lt;b&gt;no&lt;/b&gt;" in frames[0]
    assert 'class="toast success"' in mine
    counts = {rendering.pending_count_html(9902, 9902, "pending") for _ in range(30)}
    assert len(counts) == 1 and renders.count("approvals/inbox.html#request-count") == 1
    with_card = rendering.inbox_update(card="<article>card</article>", drop="row-9901")
    assert with_card.startswith("<article>card</article>") and 'id="row-9901"' in with_card


def test_a_shared_count_frame_follows_the_count_cap(settings):
    """The same count reads "9903" under a higher cap and "1000+" where counting stops at
    1000: the cap is part of what the shared frame depends on."""
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 100_000
    assert 'data-count="9903"' in rendering.pending_count_html(9903, 9903, "pending")
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 1000
    assert 'data-count="1000+"' in rendering.pending_count_html(9903, 9903, "pending")


def test_a_run_pages_renderings_read_only_what_they_show():
    """The whole body: the run, its requests, their calls, the people they name (its starter
    and the deciders, in one read) and the MCP journal, each read from its own table (calls
    and executions joined the request and run tables only to sort by them); the status line
    alone: one read of the run, without its transcript."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    user = make_user()
    run = start_and_halt(user=user)
    with CaptureQueriesContext(connection) as whole:
        body = rendering.run_body(run.pk, can_decide=True)
    reads = [q["sql"] for q in whole.captured_queries]
    assert len(reads) == 5, reads
    people = [s for s in reads if 'FROM "auth_user"' in s]
    assert len(people) == 1, reads
    calls = [s for s in reads if s.startswith('SELECT "approvals_requestcall"')]
    journal = [s for s in reads if 'FROM "approvals_toolexecution"' in s]
    assert calls and journal and not any("JOIN" in s for s in calls + journal), reads
    assert "Transcript" in body and 'id="run-head"' in body

    with CaptureQueriesContext(connection) as status:
        head = rendering.run_head(run.pk, can_decide=True)
    (read,) = [q["sql"] for q in status.captured_queries]
    assert '"messages"' not in read and '"prompt"' not in read
    assert head.lstrip().startswith('<section class="run-head" id="run-head"')
    assert "status-pending" in head and "Transcript" not in head

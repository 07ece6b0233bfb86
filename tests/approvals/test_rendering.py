"""approvals.live.rendering: the fragments live pages show, from the views' own partials,
rendered once per change and variant however many pages ask at once, and afresh for a later
change."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from approvals import services
from approvals.live import rendering

from .factories import make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


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
    assert rendering.list_count(me, {"sort": "oldest", "agent": "demo"}) == (1, 1)
    assert rendering.list_count(me, {"hidden": "only"}) == (1, 1)


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

""" "Always allow" on cards the live sockets push: a card redrawn live (the snapshot, and a
change of the open request) offers it to people who may manage rules, in their own variant,
and to nobody else; a watcher's card has no decision forms at all."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission

from approvals import services

from .factories import TIMEOUT, frame_with, halted_run, in_thread, open_socket, user_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]

ALWAYS = 'name="always_allow"'


def _grant_rules(user):
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


async def test_live_cards_offer_always_allow_to_rule_makers_only():
    maker = await database_sync_to_async(_grant_rules)(await user_of("reviewer"))
    reviewer, watcher = await user_of("reviewer"), await user_of("watcher")
    _, row = await halted_run(maker)
    path = f"/ws/inbox/?r={row.request_id}"
    sockets = {
        who: await open_socket(path, user)
        for who, user in (("maker", maker), ("reviewer", reviewer), ("watcher", watcher))
    }
    try:
        snapshots = {who: snapshot for who, (_, snapshot) in sockets.items()}
        assert ALWAYS in snapshots["maker"]
        assert ALWAYS not in snapshots["reviewer"] and "/approve/" in snapshots["reviewer"]
        assert ALWAYS not in snapshots["watcher"] and "/approve/" not in snapshots["watcher"]

        # a change of the open request (a claim) redraws its card on every page that shows it
        await in_thread(services.request_claim, request_id=row.request_id, user=reviewer)
        cards = {}
        for who, (comm, _) in sockets.items():
            await comm.send_to(text_data=f'{{"viewing": "{row.request_id}"}}')
            cards[who] = await frame_with(comm, f'id="request-{row.pk}"')
        assert ALWAYS in cards["maker"]
        assert ALWAYS not in cards["reviewer"] and ALWAYS not in cards["watcher"]
    finally:
        for comm, _ in sockets.values():
            await comm.disconnect(timeout=TIMEOUT)

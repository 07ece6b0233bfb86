"""The app's URLs plus `POST /bench/floor/decline/<pk>`: the least a decision can cost.

The floor view does one row update (the request's state, reason and time) and one
channel-layer group_send to the inbox group, carrying a message the app's own InboxConsumer
turns into the same `<div id="request-<pk>" hx-swap-oob="delete">` frame a real decline
produces. No authentication, no row lock, no audit row, no task enqueued, no rendering: what
is left is Django's middleware stack, one UPDATE, and one Redis publish. decision_latency.py
times it exactly like the real `POST /api/requests/{id}/decline`.

With BENCH_TRACE=1 in the environment (decision_latency.py --trace), the server also wraps
the app's broadcaster (approvals.live.publisher, untouched on disk) to print one line per pushed
decision to its log: when the change was queued after commit, when the light lane started
and finished building its message, and when the group_send returned, all on the machine-wide
monotonic clock (time.perf_counter), so the bench can split (b) into its parts.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from approvals.live.publisher import INBOX_GROUP
from approvals.models import ApprovalRequest
from toolnexus_web.urls import urlpatterns as app_urlpatterns


@csrf_exempt
@require_POST
def floor_decline(request: HttpRequest, pk: int) -> JsonResponse:
    reason = (json.loads(request.body or b"{}").get("reason") or "declined")[:2000]
    updated = ApprovalRequest.objects.filter(pk=pk, state="pending").update(
        state="declined", reason=reason, decided_at=timezone.now()
    )
    async_to_sync(get_channel_layer().group_send)(
        INBOX_GROUP,
        {
            "type": "approvals.request",
            "request_pk": pk,
            "agent": "demo",
            "kind": "tool_call",
            "state": "declined",
            "created": False,
            "cards": None,  # the app's light message: what a page needs to drop the card
            "toast": "",
            "pending_count": 0,
        },
    )
    return JsonResponse({"updated": updated})


def _install_trace() -> None:
    from approvals.live import publisher as broadcast

    changed, build, send = broadcast.changed, broadcast.build_light_messages, broadcast.send
    queued: dict[int, tuple[float, int]] = {}
    local = threading.local()

    def traced_changed(*, run_id: int, request_pk: int | None = None, created: bool = False, **kw):
        if request_pk is not None and not created:
            queued[request_pk] = (time.perf_counter(), broadcast._light_lane.queue.qsize())
        changed(run_id=run_id, request_pk=request_pk, created=created, **kw)

    def traced_build(*, run_id: int, request_pk: int | None, created: bool, **kw):
        t0 = time.perf_counter()
        out = build(run_id=run_id, request_pk=request_pk, created=created, **kw)
        if not hasattr(local, "items"):
            local.items = []
        local.items.append((request_pk, t0, time.perf_counter()))
        return out

    def traced_send(messages, **kwargs):
        send(messages, **kwargs)
        items, local.items = getattr(local, "items", []), []
        sent = time.perf_counter()
        for pk, b0, b1 in items:  # only the light lane builds light messages
            if pk in queued:
                q, depth = queued.pop(pk)
                print(
                    f"BENCH-TRACE {pk} {q:.6f} {b0:.6f} {b1:.6f} {sent:.6f} {depth}",
                    file=sys.stderr,
                    flush=True,
                )

    broadcast.changed = traced_changed
    broadcast.build_light_messages = traced_build
    broadcast.send = traced_send


if os.environ.get("BENCH_TRACE") == "1":
    _install_trace()


urlpatterns = [
    path("bench/floor/decline/<int:pk>", floor_decline),
    *app_urlpatterns,
]

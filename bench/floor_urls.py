"""The app's URLs plus `POST /bench/floor/decline/<pk>`: the least a decision can cost.

The floor view does one row update (the request's state, reason and time) and one
channel-layer group_send to the inbox group, carrying a message the app's own InboxConsumer
turns into the same `<div id="request-<pk>" hx-swap-oob="delete">` frame a real decline
produces. No authentication, no row lock, no audit row, no task enqueued, no rendering: what
is left is Django's middleware stack, one UPDATE, and one Redis publish. decision_latency.py
times it exactly like the real `POST /api/requests/{id}/decline`.

With BENCH_TRACE=1 in the environment (decision_latency.py --trace), the server also wraps
the app's publisher (approvals.live.publisher, untouched on disk) to print one line per pushed
decision to its log: when the commit hook started, when building its messages started and
finished, and when `publisher.send` returned, all on the machine-wide monotonic clock
(time.perf_counter), so the bench can split (b) into its parts. Under a server `send` only
queues the messages on the server's loop (the sends follow on that loop), so its part is
the queueing alone. (The last field, once a queue depth, is always 0.)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from approvals.live.groups import INBOX_GROUP
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
        {  # the app's message for a decision: a pending page drops the card at once
            "type": "approvals.request",
            "change": uuid.uuid4().hex,
            "request_pk": pk,
            "run_id": 0,
            "agent": "demo",
            "kind": "tool_call",
            "state": "declined",
            "created": False,
            "toast": "",
            "decided_by": None,
            "own_toast": "",
        },
    )
    return JsonResponse({"updated": updated})


def _install_trace() -> None:
    from approvals import events
    from approvals.live import publisher

    build, send = publisher.messages_for, publisher.send
    local = threading.local()

    def traced_build(*, request_pk: int | None, created: bool, **kw):
        t0 = time.perf_counter()
        out = build(request_pk=request_pk, created=created, **kw)
        if request_pk is not None and not created:
            local.items = [(request_pk, t0, time.perf_counter())]
        return out

    def traced_send(messages):
        send(messages)
        items, local.items = getattr(local, "items", []), []
        sent = time.perf_counter()
        for pk, b0, b1 in items:
            print(
                f"BENCH-TRACE {pk} {local.hooked:.6f} {b0:.6f} {b1:.6f} {sent:.6f} 0",
                file=sys.stderr,
                flush=True,
            )

    def traced_on_change(sender, **kw):
        local.hooked = time.perf_counter()
        publisher._on_change(sender, **kw)

    publisher.messages_for = traced_build
    publisher.send = traced_send
    events.changed.disconnect(dispatch_uid="approvals.live.publisher")
    events.changed.connect(traced_on_change, dispatch_uid="bench.trace", weak=False)


if os.environ.get("BENCH_TRACE") == "1":
    _install_trace()


urlpatterns = [
    path("bench/floor/decline/<int:pk>", floor_decline),
    *app_urlpatterns,
]

"""Host events through the real servers: `/api/events` streamed by daphne while the worker
(in the server, or a separate db_worker in the split topology) changes the run, and a
webhook delivered by the delivery worker that `serve` / `db_worker` start beside it."""

from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from standardwebhooks.webhooks import Webhook

from .conftest import WAIT


def _start_and_decline(api: httpx.Client, prompt: str) -> str:
    run_id = api.post("/api/runs", json={"agent": "demo", "prompt": prompt}).json()["id"]
    deadline = time.monotonic() + WAIT
    while (run := api.get(f"/api/runs/{run_id}").json())["status"] != "pending":
        assert time.monotonic() < deadline, run
        time.sleep(0.1)
    request_id = run["pending"]["request"]["id"]
    declined = api.post(f"/api/requests/{request_id}/decline", json={"reason": "no refunds today"})
    assert declined.status_code == 200, declined.text
    return request_id


def test_a_stream_hears_the_worker_halt_and_finish_a_run_as_it_happens(app, api):
    heard: queue.Queue = queue.Queue()

    def listen() -> None:
        with api.stream("GET", "/api/events", timeout=WAIT * 2) as response:
            assert response.headers["content-type"] == "text/event-stream"
            for line in response.iter_lines():
                if line.startswith("data: "):
                    heard.put(json.loads(line.removeprefix("data: ")))

    threading.Thread(target=listen, daemon=True).start()
    time.sleep(0.5)  # the stream starts with the next event: let it open first
    request_id = _start_and_decline(api, "Refund order A-5150, $950")
    mine = []
    deadline = time.monotonic() + WAIT
    while not any(e["type"] == "run.finished" for e in mine):
        assert time.monotonic() < deadline, mine
        event = heard.get(timeout=WAIT)
        if event["data"].get("request_id") == request_id or event["type"] == "run.finished":
            mine.append(event)
    assert [e["type"] for e in mine] == [
        "run.pending",
        "request.created",
        "request.decided",
        "run.finished",
    ]
    assert mine[2]["data"]["reason"] == "no refunds today"


def test_a_webhook_reaches_a_host_signed_from_the_delivery_worker(app, api):
    arrived: queue.Queue = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            arrived.put((body, dict(self.headers)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        secret = app.manage(
            "shell",
            "-c",
            "from approvals import services; from approvals.models import WebhookSubscription as W;"
            f" s = W(url={url!r}, event_types=['request.decided']);"
            " services.webhook_subscribe(s); print(s.secret)",
        ).splitlines()[-1]
        request_id = _start_and_decline(api, "Refund order A-5151, $960")
        body, headers = arrived.get(timeout=WAIT)
        event = Webhook(secret).verify(body, headers)
        assert event["type"] == "request.decided"
        assert event["data"]["request_id"] == request_id
        assert event["data"]["state"] == "declined"
    finally:
        server.shutdown()
        server.server_close()
        # The app outlives this test: its endpoint is gone, so the subscription goes too.
        app.manage(
            "shell",
            "-c",
            "from approvals.models import WebhookSubscription as W;"
            " W.objects.filter(url__contains='/hook').update(active=False)",
        )

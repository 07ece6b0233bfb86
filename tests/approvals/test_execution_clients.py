"""approvals.execution.clients: in a worker, one model client per agent for the worker's
life (on its one loop, over one connection, each run with its own system prompt), closed
when the worker stops; outside a worker, a client per run, closed after it."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from approvals import agents, services
from approvals.agents.demo import demo_generate, demo_tools
from approvals.models import Run
from toolnexus import create_client, create_in_process_client

from .factories import MockOpenAI, fresh, make_user, serving, start_and_halt, tool_output
from .factories import run_in_status as _status
from .factories import wait_until as _wait

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loop_agent():
    """`looper`: the demo's model and tools; records the loop of every model call, every
    client its factory builds, and every client closed."""
    seen: dict[str, list] = {"loops": [], "built": [], "closed": []}

    def generate(request):
        seen["loops"].append(asyncio.get_running_loop())
        return demo_generate(request)

    def model():
        client = create_in_process_client(generate=generate, model="looper")
        seen["built"].append(client)
        close = client.backend.aclose

        async def aclose():
            seen["closed"].append(client)
            await close()

        client.backend.aclose = aclose
        return client

    agents.register("looper", model=model, tools=demo_tools, replace=True)
    yield seen
    agents.unregister("looper")


def test_a_worker_drives_every_run_and_resume_on_its_one_loop_with_one_client(loop_agent):
    user = make_user()
    with serving() as (_, loop):
        runs = [
            services.run_start(agent="looper", prompt=f"Refund order A-{n}, ${n}", started_by=user)
            for n in (1, 2)
        ]
        for run in runs:
            _wait(lambda run=run: _status(run, "pending"), f"run {run.pk} to halt")
            request = run.requests.get()
            services.request_decline(request_id=request.request_id, user=user, reason="no")
            _wait(lambda run=run: _status(run, "done"), f"run {run.pk} to finish")
        assert loop_agent["closed"] == []  # kept while the worker runs
    # Four drives (two runs, two resumes), every model call on the worker's loop ...
    assert len(loop_agent["loops"]) == 4
    assert all(seen is loop for seen in loop_agent["loops"])
    # ... through the one client the agent's factory built for it, closed when it stopped.
    assert len(loop_agent["built"]) == 1
    assert loop_agent["closed"] == loop_agent["built"]
    for run in runs:
        assert tool_output(fresh(run), "call_refund") == "relay declined for refund: no"


def test_each_run_gets_its_own_system_prompt_on_the_kept_client(loop_agent):
    agents.register(
        "looper",
        model=agents.get("looper").model,
        tools=demo_tools,
        system_prompt="the agent's prompt",
        replace=True,
    )
    user = make_user()
    first = services.run_start(agent="looper", prompt="a question", started_by=user)
    second = services.run_start(agent="looper", prompt="a question", started_by=user)
    Run.objects.filter(pk=second.pk).update(system_prompt="this run's prompt")
    with serving():
        for run in (first, second):
            _wait(lambda run=run: _status(run, "pending", "done"), f"run {run.pk}")
    assert fresh(first).messages[0] == {"role": "system", "content": "the agent's prompt"}
    assert fresh(second).messages[0] == {"role": "system", "content": "this run's prompt"}
    (kept,) = loop_agent["built"]
    assert kept.system_prompt == "the agent's prompt" and kept.hooks is None


class _Socket(ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def socket_model():
    """`socketed`: MockOpenAI's replies over a real loopback socket; the client port of
    every request is recorded (one port: one connection, reused)."""
    model = MockOpenAI(tool="refund", tool_input={"order": "S-1", "amount": 3})
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            ports.append(self.client_address[1])
            reply = model.handler(httpx.Request("POST", "http://model/", content=body))
            self.send_response(reply.status_code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        def log_message(self, *args) -> None:
            pass

    server = _Socket(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    agents.register(
        "socketed",
        model=lambda: create_client(base_url=url, style="openai", model="x", retries=0),
        tools=demo_tools,
        replace=True,
    )
    yield ports
    agents.unregister("socketed")
    server.shutdown()
    server.server_close()


def test_the_model_connection_outlives_a_run_in_a_worker(socket_model):
    user = make_user()
    with serving():
        runs = [
            services.run_start(agent="socketed", prompt="refund", started_by=user) for _ in (1, 2)
        ]
        for run in runs:
            _wait(lambda run=run: _status(run, "pending"), f"run {run.pk} to halt")
            request = run.requests.get()
            services.request_decline(request_id=request.request_id, user=user, reason="no")
            _wait(lambda run=run: _status(run, "done"), f"run {run.pk} to finish")
    assert len(socket_model) == 4  # two runs, two resumes: four model calls ...
    assert len(set(socket_model)) == 1  # ... over one connection


def test_drain_outside_a_worker_builds_and_closes_a_client_per_run(loop_agent):
    start_and_halt(agent="looper")
    start_and_halt(agent="looper", prompt="refund A-2 $2")
    assert len(loop_agent["built"]) == 2
    assert loop_agent["closed"] == loop_agent["built"]

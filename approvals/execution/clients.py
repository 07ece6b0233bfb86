"""Model clients kept for a worker's event loop: one per agent, reused by every run it drives.

A worker process runs its whole life on one event loop (`worker.Worker.serve`), and inside
`keep_clients()` each agent's `model` factory is called once on that loop: the client it
returns (and the HTTP connection pool of its backend) is reused by every run and resume the
worker drives there, and closed when the worker stops. A run gets a shallow copy of the kept
client carrying its own system prompt and hooks, so nothing of one run leaks into the next
while the backend, and its connections, are shared.

Anywhere else (an inline `drain()` in a test, a one-off `async_to_sync` call) no loop keeps
clients: each run builds its own client and closes it afterwards, as before.

Everything here runs on the loop's own thread (runs are driven by coroutines on it), so the
registry needs no lock.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from toolnexus import Client

from .. import agents

log = logging.getLogger(__name__)


class KeptClients:
    """The clients kept on one event loop, by agent name (a re-registered agent, a new
    `Agent` object, gets a new client; the old one is closed with the rest)."""

    def __init__(self) -> None:
        self._by_agent: dict[str, tuple[agents.Agent, Client]] = {}
        self._retired: list[Client] = []
        self.built = 0  # how many clients the factories made (tests, logs)

    def client_for(self, agent: agents.Agent) -> Client:
        held = self._by_agent.get(agent.name)
        if held is not None and held[0] is agent:
            return held[1]
        if held is not None:
            self._retired.append(held[1])  # a run may still use it: closed at the end
        client = agent.build_client()
        self.built += 1
        self._by_agent[agent.name] = (agent, client)
        return client

    async def aclose(self) -> None:
        clients = [client for _, client in self._by_agent.values()] + self._retired
        self._by_agent.clear()
        self._retired.clear()
        for client in clients:
            try:
                await client.aclose()
            except Exception:
                log.exception("closing a model client failed")


_kept: dict[asyncio.AbstractEventLoop, KeptClients] = {}


@asynccontextmanager
async def keep_clients() -> AsyncIterator[KeptClients]:
    """Keep model clients for the running loop until the block ends (nested: the outer
    block's clients)."""
    loop = asyncio.get_running_loop()
    outer = _kept.get(loop)
    if outer is not None:
        yield outer
        return
    kept = _kept[loop] = KeptClients()
    try:
        yield kept
    finally:
        _kept.pop(loop, None)
        await kept.aclose()


def kept_on_running_loop() -> KeptClients | None:
    try:
        return _kept.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


@asynccontextmanager
async def client_for_run(agent: agents.Agent, system_prompt: str) -> AsyncIterator[Client]:
    """The client one run is driven with: a copy of the loop's kept client when a worker
    keeps clients on this loop, else a client of its own, closed when the block ends."""
    kept = kept_on_running_loop()
    if kept is None:
        client = agent.build_client(system_prompt)
        async with client:
            yield client
        return
    # A shallow copy: the run's own settings (system prompt, hooks), the kept backend.
    client = copy.copy(kept.client_for(agent))
    client.system_prompt = system_prompt
    yield client

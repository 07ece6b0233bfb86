"""A run's model reply as it is generated, announced in small batches for its live page.

The engine hands each piece of text to `ReplyStream.add` (its `on_text`, on the run's event
loop) as the model generates it. A message per piece would be a channel message per token
for every watching page: the pieces are gathered and announced at most once every
STREAM_BATCH_SECONDS, each announcement carrying the turn's whole reply so far (a page that
opened mid-reply, or missed a batch, is whole again with the next one). When the turn ends
(`end_turn`, the engine's after_llm) what is left goes out at once, marked done; the
stored transcript then replaces it on the page (`events.changed` with the step's outcome).

Nothing here is stored: a worker that dies mid-reply leaves the transcript of before the
model call, and the page shows what the run is driven to next.
"""

from __future__ import annotations

import asyncio
import logging

from toolnexus.agents import current_handle

from .. import events
from ..conf import app_settings
from ..domain.teams import agent_of_segment

log = logging.getLogger(__name__)


class ReplyStream:
    """One run's reply text between the engine and the live layer. Used on one loop."""

    def __init__(self, run_id: int, agent: str = "") -> None:
        self.run_id = run_id
        self.agent = agent  # in a team run: whose reply it is
        self.every = max(0.0, float(app_settings.STREAM_BATCH_SECONDS or 0))
        self.text = ""  # the turn's reply so far
        self.sent = 0  # how much of it was announced
        self.sent_at = float("-inf")  # the loop's time of the last announcement
        self.timer: asyncio.TimerHandle | None = None

    def add(self, piece: str) -> None:
        """A piece of the reply (the engine's `on_text`): announced with the next batch."""
        self.text += piece
        if self.timer is not None:
            return  # the batch due soon takes it along
        loop = asyncio.get_running_loop()
        wait = self.sent_at + self.every - loop.time()
        if wait <= 0:
            self._announce(done=False)
        else:
            self.timer = loop.call_later(wait, self._announce, False)

    def end_turn(self) -> None:
        """The model's turn is complete: announce the rest now, and start the next turn's
        reply afresh (a turn that said nothing announces nothing)."""
        self._cancel()
        if self.text:
            self._announce(done=True)
        self.text, self.sent, self.sent_at = "", 0, float("-inf")

    def close(self) -> None:
        """The step ended: no batch is announced after its outcome."""
        self._cancel()

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _announce(self, done: bool) -> None:
        self.timer = None
        if not done and len(self.text) == self.sent:
            return
        self.sent = len(self.text)
        self.sent_at = asyncio.get_running_loop().time()
        try:
            events.reply_streamed(run_id=self.run_id, text=self.text, done=done, agent=self.agent)
        except Exception:  # a page that misses a batch gets the whole reply with the next one
            log.exception("announcing run %s's reply failed", self.run_id)


class TeamReplies:
    """A team run's replies: one `ReplyStream` per agent (handle), each named by its agent.
    The engine's runtime calls `add` and the after_llm hook (`end_turn`) with
    `current_handle()` naming the agent that is replying."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.streams: dict[str, ReplyStream] = {}

    def _stream(self) -> ReplyStream:
        handle = current_handle() or ""
        stream = self.streams.get(handle)
        if stream is None:
            agent = agent_of_segment(handle.rsplit("/", 1)[-1]) if handle else ""
            stream = self.streams[handle] = ReplyStream(self.run_id, agent)
        return stream

    def add(self, piece: str) -> None:
        self._stream().add(piece)

    def end_turn(self) -> None:
        self._stream().end_turn()

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()


def reply_stream_for(run_id: int, team: bool) -> ReplyStream | TeamReplies | None:
    """The run's reply stream (a team run's: one per agent), or None when replies are not
    streamed (TOOLNEXUS_STREAM_REPLIES off)."""
    if not app_settings.STREAM_REPLIES:
        return None
    return TeamReplies(run_id) if team else ReplyStream(run_id)

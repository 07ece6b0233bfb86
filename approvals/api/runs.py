"""Runs: start, list, read, retry, continue with a follow-up, cancel."""

from __future__ import annotations

from typing import Any

from ninja import Field, Query, Status
from pydantic import StrictStr

from .. import permissions, selectors, services
from .core import api, require_view
from .schemas import ERRORS, DeclineIn, RunIn, RunListFilter, RunOut, RunPage, Strict

# -- runs ----------------------------------------------------------------------------------


@api.post("/runs", response={201: RunOut, **ERRORS}, tags=["runs"], summary="Start a run")
def start_run(request, payload: RunIn):
    run = services.run_start(
        agent=payload.agent, prompt=payload.prompt, started_by=request.user, rate_limited=True
    )
    return Status(201, selectors.run_view(selectors.run_get(run_id=run.pk)))


@api.get(
    "/runs", response={200: RunPage, **ERRORS}, tags=["runs"], summary="List runs, newest first"
)
def list_runs(request, filters: Query[RunListFilter]):
    hidden = require_view(request, permissions.VIEW_RUNS)
    qs = selectors.run_list(
        status=filters.status or None, agent=filters.agent or None, hidden_agents=hidden
    )
    page = qs[filters.offset : filters.offset + filters.limit]
    return {"items": [selectors.run_view(r) for r in page], "count": qs.count()}


@api.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, tags=["runs"], summary="Read a run")
def get_run(request, run_id: int):
    hidden = require_view(request, permissions.VIEW_RUNS)
    return selectors.run_view(selectors.run_get(run_id=run_id, hidden_agents=hidden))


@api.get(
    "/runs/{run_id}/messages",
    response={200: list[dict[str, Any]], **ERRORS},
    tags=["runs"],
    summary="The run's transcript, as stored",
)
def get_run_messages(request, run_id: int):
    hidden = require_view(request, permissions.VIEW_RUNS)
    return selectors.run_messages(run_id=run_id, hidden_agents=hidden)


@api.post(
    "/runs/{run_id}/retry",
    response={200: RunOut, **ERRORS},
    tags=["runs"],
    summary="Queue a failed run again",
)
def retry_run(request, run_id: int):
    services.run_retry(run_id=run_id, user=request.user)
    return selectors.run_view(selectors.run_get(run_id=run_id))


class FollowUpIn(Strict):
    message: StrictStr = Field(
        ..., max_length=services.MAX_PROMPT_CHARS, examples=["Now refund order A-1002 too"]
    )


@api.post(
    "/runs/{run_id}/messages",
    response={200: RunOut, **ERRORS},
    tags=["runs"],
    summary="Continue a finished run with a new user message",
    description="The same agent carries on with the transcript kept and this message added;"
    " the run is queued again and may halt on a new request. Only a run that is done (or"
    " stopped at its turn limit) takes one: otherwise 409. Needs the start-runs permission;"
    " the record shows who asked what.",
)
def follow_up_run(request, run_id: int, payload: FollowUpIn):
    services.run_follow_up(run_id=run_id, user=request.user, message=payload.message)
    return selectors.run_view(selectors.run_get(run_id=run_id))


@api.post(
    "/runs/{run_id}/cancel",
    response={200: RunOut, **ERRORS},
    tags=["runs"],
    summary="Stop a run and cancel its open request",
)
def cancel_run(request, run_id: int, payload: DeclineIn | None = None):
    services.run_cancel(
        run_id=run_id, user=request.user, reason=(payload.reason if payload else "") or ""
    )
    return selectors.run_view(selectors.run_get(run_id=run_id))

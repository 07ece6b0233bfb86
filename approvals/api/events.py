"""Host events as server-sent events (`/api/events`)."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from ninja import Field, Query
from pydantic import StrictStr

from .. import event_feed, permissions, services, streams
from ..domain import hostevents
from .core import api, require_view
from .schemas import ERRORS, Strict

# -- host events ---------------------------------------------------------------------------


class EventStreamFilter(Strict):
    types: StrictStr = Field(
        "",
        description="Comma-separated event types to hear (default: all): "
        + ", ".join(hostevents.TYPES),
    )
    after: StrictStr = Field(
        "",
        description="Start after this event id (`evt_123`; `evt_0`: from the first). The"
        " Last-Event-ID header, which a reconnecting EventSource sends, wins over it. With"
        " neither, the stream starts with the next event.",
    )


@api.get(
    "/events",
    response={200: None, **ERRORS},
    tags=["events"],
    summary="Hear host events as they happen (server-sent events)",
    description="A `text/event-stream` of `request.created`, `request.decided`, `run.pending`,"
    " `run.finished`, `run.failed` and `run.cancelled`, each with `id: evt_<n>`, `event:"
    " <type>` and `data:` the JSON a webhook carries (`id`, `type`, `timestamp`, `data`)."
    " Events of agents you may not see are left out; access is re-checked every poll. The"
    " stream ends after a while: reconnect with `Last-Event-ID` (EventSource does) and nothing"
    " is lost. Needs the view-runs permission.",
    openapi_extra={"responses": {200: {"content": {"text/event-stream": {}}}}},
)
def event_stream(request, filters: Query[EventStreamFilter]):
    require_view(request, permissions.VIEW_RUNS)
    types = [t.strip() for t in filters.types.split(",") if t.strip()] or None
    unknown = hostevents.unknown_types(types or [])
    if unknown:
        raise services.InvalidInput(
            f"types: unknown {', '.join(unknown)} (known: {', '.join(hostevents.TYPES)})"
        )
    given = request.headers.get("Last-Event-ID") or filters.after
    after = hostevents.parse_event_id(given)
    if given and after is None:
        raise services.InvalidInput(f"after: {given[:40]!r} is not an event id (evt_123)")
    if after is None:
        after = event_feed.latest_event_id()
    token = getattr(request, "api_token", None)
    response = StreamingHttpResponse(
        streams.host_event_stream(
            user=request.user,
            token_pk=token.pk if token is not None else None,
            after=after,
            types=types,
        ),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold events back
    return response

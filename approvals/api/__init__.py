"""The JSON API for hosts (see the project's api.md). Mounted by `approvals.urls` under
`api/` (the demo project: /api/), OpenAPI schema at `<mount>api/openapi.json`; its URL
namespace is `approvals:toolnexus_api`. Every answer is JSON, errors included (500s too
when DEBUG is off; unknown URLs under the mount are 404 JSON, see approvals/urls.py).

Endpoints parse with pydantic schemas, call one selector or service, and return plain
dicts; domain exceptions become `{"detail": ...}` with the status the service chose.

Throttles (django-ninja's, counted in the cache; docs/operations.md, "Security settings"):
requests per token and per user, and failed bearer authentications per client address,
each 429 with Retry-After once over its rate. Reads leave out runs and requests of agents
the caller may not see (`permissions.hidden_agents`).
"""

# The endpoints register on `api` as their modules load: in this order, the schema's.
# isort: off
from .core import api
from . import runs, approval_requests, tokens  # noqa: F401
from ..rules_api import router as rules_router

api.add_router("/rules", rules_router)
from . import events  # noqa: E402, F401
# isort: on

__all__ = ["api"]

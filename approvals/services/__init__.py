"""Every write people make: runs (start, retry, cancel), decisions on requests, API tokens.
Pages, the API, the admin and commands call these; each checks permission, validates, and
changes state in one transaction."""

from ..domain.arguments import MAX_OUTPUT_CHARS, MAX_REASON_CHARS, input_problems
from ..domain.exceptions import ClaimedByOther, InvalidInput, NotAllowed, ServiceError
from .bulk import MAX_BULK_IDS, BulkOutcome, requests_bulk
from .claims import request_claim, request_hide, request_release, request_unhide
from .notifications import notification_save, notification_test
from .requests import (
    request_answer,
    request_approve,
    request_decline,
    request_expire,
    tool_schema,
)
from .runs import (
    MAX_PROMPT_CHARS,
    TooManyRuns,
    run_cancel,
    run_follow_up,
    run_retry,
    run_start,
)
from .tokens import (
    TokenRejected,
    api_token_authenticate,
    api_token_create,
    api_token_revoke,
    api_token_verify,
    api_tokens_revoke,
)
from .webhooks import webhook_redeliver, webhook_secret, webhook_subscribe

__all__ = [
    "MAX_BULK_IDS",
    "MAX_OUTPUT_CHARS",
    "MAX_PROMPT_CHARS",
    "MAX_REASON_CHARS",
    "BulkOutcome",
    "ClaimedByOther",
    "InvalidInput",
    "NotAllowed",
    "ServiceError",
    "TokenRejected",
    "TooManyRuns",
    "api_token_authenticate",
    "api_token_create",
    "api_token_revoke",
    "api_token_verify",
    "api_tokens_revoke",
    "input_problems",
    "notification_save",
    "notification_test",
    "request_answer",
    "request_approve",
    "request_claim",
    "request_decline",
    "request_expire",
    "request_hide",
    "request_release",
    "request_unhide",
    "requests_bulk",
    "run_cancel",
    "run_follow_up",
    "run_retry",
    "run_start",
    "tool_schema",
    "webhook_redeliver",
    "webhook_secret",
    "webhook_subscribe",
]

"""The app's models: runs and their requests, calls, tool executions and audit; access;
rules; and the reach to hosts and people.

Nothing outside `approvals.services` (and the worker's runner, through services) writes these
rows; read them through `approvals.selectors`.

The models live in modules by concern (runs, access, rules, reach), all imported here,
where Django and the rest of the app find them.
"""

from .access import (
    AgentAccess,
    AgentPolicy,
    ApiToken,
    TeamReport,
    WorkerHeartbeat,
)
from .reach import (
    NotificationCursor,
    NotificationDelivery,
    NotificationItem,
    NotificationLinkUse,
    NotificationPreference,
    SlackCursor,
    SlackLink,
    SlackMessage,
    WebhookDelivery,
    WebhookSubscription,
    WebPushSubscription,
)
from .rules import (
    ApprovalGiven,
    RequestRequirement,
    Rule,
)
from .runs import (
    SEARCH_TEXT_CHARS,
    ApprovalRequest,
    Event,
    RequestCall,
    RequestHide,
    Run,
    ToolExecution,
    search_text_of,
)

__all__ = [
    "SEARCH_TEXT_CHARS",
    "AgentAccess",
    "AgentPolicy",
    "ApiToken",
    "ApprovalGiven",
    "ApprovalRequest",
    "Event",
    "NotificationCursor",
    "NotificationDelivery",
    "NotificationItem",
    "NotificationLinkUse",
    "NotificationPreference",
    "RequestCall",
    "RequestHide",
    "RequestRequirement",
    "Rule",
    "Run",
    "SlackCursor",
    "SlackLink",
    "SlackMessage",
    "TeamReport",
    "ToolExecution",
    "WebPushSubscription",
    "WebhookDelivery",
    "WebhookSubscription",
    "WorkerHeartbeat",
    "search_text_of",
]

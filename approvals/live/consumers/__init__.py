"""Websocket consumers: authenticated, thin, read-only.

On connect each sends the page's live region re-rendered from the database, so a reconnect
heals any missed message; afterwards, on each change the publisher announces, it sends the
fragments its page shows (`rendering`: rendered once per change and variant, only when some
page needs them). Nothing here writes: decisions are HTTP POSTs.

A page stays live only while its viewer may see it: a sign-out closes the sockets of that
session at once (`approvals.session` messages to the user's group, see apps.py), and before
forwarding a push a consumer re-checks session, active state and permissions when its last
check is older than RECHECK_SECONDS. A TTL rather than a check per push: a push goes to every
open page, and three queries per page per push would make every decision cost O(pages)
queries; a change of access that must act at once (a sign-out, a user's groups, permissions
or active flag edited) is sent as a message instead, and anything else (a group's permissions
edited, a session expiring) is caught within RECHECK_SECONDS.
"""

from .base import FORBIDDEN, GONE, RECHECK_SECONDS, SIGNED_OUT, TOO_MANY, session_tag
from .inbox import InboxConsumer, presence_key
from .run import RunConsumer

__all__ = [
    "FORBIDDEN",
    "GONE",
    "RECHECK_SECONDS",
    "SIGNED_OUT",
    "TOO_MANY",
    "InboxConsumer",
    "RunConsumer",
    "presence_key",
    "session_tag",
]

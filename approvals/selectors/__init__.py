"""Reads: querysets shaped for each page and endpoint (constant query counts), and the
plain-dict views of rows the API returns.

Every read of runs and requests takes `hidden_agents`: the agents the viewer may not see,
from `permissions.hidden_agents(user)` (the caller asks; selectors do not know users). A row
of a hidden agent is left out of lists and counts, and does not exist for a get (404).

The package's modules by subject; every read is named here."""

from .approvers import RequirementView, requirement_view, with_approval_progress  # noqa: F401
from .counts import (  # noqa: F401
    OPTION_MENUS,
    count_cap,
    count_label,
    inbox_counts,
    inbox_matching_count,
    pending_count,
)
from .inbox import (  # noqa: F401
    claim_lapses_at,
    count_matching_after,
    has_hides,
    inbox_matching,
    inbox_page,
    inbox_requests,
    next_lapse,
    request_ids_matching,
)
from .inbox_query import (  # noqa: F401
    INBOX_CLAIMS,
    INBOX_HIDDEN,
    INBOX_ROW_DEFERRED,
    INBOX_SORTS,
    MAX_BULK_IDS,
    MAX_SEARCH_CHARS,
    InboxQuery,
    param_text,
)
from .notifications import (  # noqa: F401
    notification_preference,
    notification_recent,
    push_subscriptions,
    slack_links,
)
from .records import (  # noqa: F401
    TOKEN_STATES,
    active_claim,
    call_view,
    claim_view,
    mcp_servers_told,
    request_get,
    request_history,
    request_list,
    request_view,
    request_view_light,
    run_events,
    run_get,
    run_list,
    run_messages,
    run_page,
    run_page_list,
    run_requests,
    run_row,
    run_view,
    token_list,
    token_view,
)
from .rules import (  # noqa: F401
    DRY_RUN_DEFAULT,
    DRY_RUN_MAX,
    DryRun,
    call_facts_of,
    rule_decision_view,
    rule_dry_run,
    rule_get,
    rule_history,
    rule_list,
    rule_pending_candidates,
    rule_recent_decisions,
)

""" "Apply to pending": a rule decides the pending requests it matches now, as it would have
where their runs halted. Each request is decided in its own transaction
(`requests.request_decide_by_rule`), so one that cannot be decided never undoes the others;
the outcome of each is listed as bulk decisions list theirs (`bulk.BulkOutcome`: done,
already, invalid, forbidden, missing).

Only the requests of agents the person may see are tried; a request another reviewer has
claimed is left for them ("invalid", as bulk decisions leave it), and a request the person
may not decide (the agent's groups, the starter rule for an approve) is "forbidden".
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .. import selectors
from ..domain.exceptions import AlreadyDecided, InvalidInput, NotAllowed, ServiceError
from ..domain.rules import first_match
from ..models import ApprovalRequest, Rule
from ..permissions import DECIDE_PERMISSION, hidden_agents, require
from .bulk import ALREADY, DONE, FORBIDDEN, INVALID, MAX_BULK_IDS, MISSING, BulkOutcome
from .requests import request_decide_by_rule
from .rules import MANAGE_RULES


def rule_apply_pending(*, user: Any, rule_id: int) -> list[BulkOutcome]:
    """Decide, by the rule, each pending request it matches (at most 500 a time, oldest
    first). The rule must be on and unexpired; Rule.DoesNotExist for no such rule."""
    require(user, MANAGE_RULES, "manage rules")
    require(user, DECIDE_PERMISSION, "decide requests")
    rule = Rule.objects.get(pk=rule_id)
    now = timezone.now()
    if not rule.enabled:
        raise InvalidInput("the rule is off: switch it on to apply it to pending requests")
    if rule.expires_at is not None and rule.expires_at <= now:
        raise InvalidInput("the rule has expired: change its expiry to apply it")
    outcomes: list[BulkOutcome] = []
    for row in selectors.rule_pending_candidates(hidden_agents=hidden_agents(user)):
        facts = selectors.call_facts_of(row)
        if facts is None or first_match([rule], facts, now).rule is None:
            continue
        if len(outcomes) == MAX_BULK_IDS:
            break
        holder = selectors.active_claim(row, now=now)
        if holder is not None and holder.pk != user.pk:
            message = f"claimed by {holder.get_username()}: open it to take it over"
            outcomes.append(BulkOutcome(row.request_id, INVALID, message))
            continue
        outcomes.append(_decide_one(row.request_id, user, rule))
    return outcomes


def _decide_one(request_id: str, user: Any, rule: Rule) -> BulkOutcome:
    try:
        row = request_decide_by_rule(request_id=request_id, user=user, rule=rule)
    except ApprovalRequest.DoesNotExist:
        return BulkOutcome(request_id, MISSING, "no such request")
    except AlreadyDecided as exc:
        return BulkOutcome(request_id, ALREADY, str(exc))
    except NotAllowed as exc:
        return BulkOutcome(request_id, FORBIDDEN, str(exc))
    except ServiceError as exc:  # InvalidInput included: e.g. a relay call with no executor
        return BulkOutcome(request_id, INVALID, str(exc))
    return BulkOutcome(request_id, DONE, row.state)

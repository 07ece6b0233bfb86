"""Who may do what: the permission names, the checks services make, per-agent access, the
default groups, the demo accounts `serve` prints, the one-query permission backend (which
also refuses sign-ins while django-axes, when installed, has locked them out), and how a
client's address is read for throttling and lockout.

Per-agent access (`AgentPolicy`, `AgentAccess`, managed in the admin) is enforced here and
only here: selectors take `hidden_agents(user)`, pages, the API and the admin ask
`can_view_agent` / `can_decide_request`, services call `require_decide_request`, and the
websocket consumers ask `agent_rights(user)` once per access check, then its `can_view` and
`can_decide` per push (no query).
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from typing import Any

from django.apps import apps as django_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db import connections, router
from django.db.models import BooleanField, CharField, Exists, IntegerField, OuterRef, Q, Value

from .conf import app_settings
from .domain.exceptions import NotAllowed
from .models import AgentPolicy

# Permission names carry the app's label as Django registered it (its AppConfig's `label`).
APP_LABEL = AgentPolicy._meta.app_label


def perm(codename: str) -> str:
    """A permission of this app by codename: "decide_request" -> "<label>.decide_request"."""
    return f"{APP_LABEL}.{codename}"


VIEW_REQUESTS = perm("view_approvalrequest")
VIEW_RUNS = perm("view_run")
DECIDE_PERMISSION = perm("decide_request")
START_PERMISSION = perm("add_run")


def require(user: Any, permission: str, action: str) -> None:
    if user is None or not user.is_authenticated or not user.has_perm(permission):
        raise NotAllowed(f"you do not have permission to {action}")


def can_decide(user: Any) -> bool:
    """The global decide permission only; per request, ask `can_decide_request`."""
    return user.has_perm(DECIDE_PERMISSION)


# -- per-agent access ------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentRights:
    """What one user may do per agent, read in one query (`agent_rights`).

    An agent nobody configured (no group listed in its AgentPolicy) follows the global
    permissions alone; a listed agent only for members of a listed group (deciding: of a group
    listed with can_decide). Superusers see and decide everything. The starter rule
    (AgentPolicy.starter_cannot_approve or TOOLNEXUS_STARTER_CANNOT_APPROVE) keeps whoever
    started a run from approving or answering its requests."""

    user_id: Any
    superuser: bool
    decide_permission: bool
    hidden: frozenset[str]  # listed agents this user is in no listed group of
    no_decide: frozenset[str]  # listed agents this user is in no can_decide group of
    starter_rule: frozenset[str]  # agents whose starter may not approve
    starter_rule_everywhere: bool

    def can_view(self, agent: str) -> bool:
        """May see this agent's runs, requests and transcripts (given the global view
        permission of the page, which callers check as before)."""
        return self.superuser or agent not in self.hidden

    def can_decide(self, agent: str, *, started_by_id: Any = None, approving: bool = True) -> bool:
        """May decide this agent's requests (cancel its runs). With `started_by_id` (the run's
        starter) and `approving`, the starter rule applies too."""
        if self.superuser:
            return not (approving and self._starter_blocked(agent, started_by_id))
        if not self.decide_permission or agent in self.hidden or agent in self.no_decide:
            return False
        return not (approving and self._starter_blocked(agent, started_by_id))

    def starter_blocked(self, agent: str, started_by_id: Any) -> bool:
        """Whether the starter rule alone keeps this user from approving."""
        return self._starter_blocked(agent, started_by_id)

    def _starter_blocked(self, agent: str, started_by_id: Any) -> bool:
        if started_by_id is None or self.user_id is None or started_by_id != self.user_id:
            return False
        return self.starter_rule_everywhere or agent in self.starter_rule


_RIGHTS_CACHE = "_toolnexus_agent_rights"
_PERM_CACHE = "_perm_cache"  # the attribute Django's ModelBackend caches permissions in


def _access_rows(user: Any, *, with_permissions: bool):
    """ONE query for a user's own and group permissions AND every agent access rule (each
    grant marked when the user is in its group): the permission check every page and API
    call makes anyway carries the per-agent rules at no extra round trip.

    Rows: ("p", app_label, codename, None, None, None, None) for permissions,
    ("a", agent, None, starter_cannot_approve, grant id, can_decide, member) for rules
    (the flags as the database gives them: SQLite's are 0 and 1).

    Every page, API call and live socket asks it, so for a signed-in user it is compiled once
    per database and run with the user's id (compiling it took longer than running it)."""
    user_id = user.pk if user is not None and user.is_authenticated else None
    key = get_user_model()._meta.pk
    if user_id is None or not isinstance(key, IntegerField):  # a UUID or text key: the ORM
        return list(_access_query(user_id, with_permissions=with_permissions))
    alias = router.db_for_read(Permission if with_permissions else AgentPolicy)
    sql, params = _compiled_access(alias, with_permissions)
    user_param = key.get_db_prep_value(user_id, connections[alias], prepared=False)
    bound = [user_param if p == _STAND_IN_USER else p for p in params]
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, bound)
        return cursor.fetchall()


# The user id `_compiled_access` compiles with (for integer keys), then replaced by the real
# one: a value no key takes (ids are positive) and the statement's only parameters of it.
_STAND_IN_USER = -7_301_931


@functools.lru_cache(maxsize=8)
def _compiled_access(alias: str, with_permissions: bool) -> tuple[str, tuple]:
    rows = _access_query(_STAND_IN_USER, with_permissions=with_permissions).using(alias)
    sql, params = rows.query.get_compiler(using=alias).as_sql()
    if list(params).count(_STAND_IN_USER) != (3 if with_permissions else 1):
        raise RuntimeError(f"the access query's user id is not where it was: {params}")
    return sql, tuple(params)


def _access_query(user_id: Any, *, with_permissions: bool):
    """The query `_access_rows` runs, for a user id (None: no user)."""
    text, flag, number = CharField(), BooleanField(), IntegerField()
    in_group = get_user_model().groups.through.objects.filter(
        user_id=user_id, group_id=OuterRef("grants__group_id")
    )
    rules = (
        AgentPolicy.objects.order_by()
        .annotate(
            kind=Value("a", output_field=text),
            nothing=Value(None, output_field=text),
            member=Exists(in_group),
        )
        .values_list(
            "kind",
            "agent",
            "nothing",
            "starter_cannot_approve",
            "grants__id",
            "grants__can_decide",
            "member",
        )
    )
    if not with_permissions:
        return rules
    perms = (
        Permission.objects.filter(Q(user__pk=user_id) | Q(group__user__pk=user_id))
        .order_by()
        .annotate(
            kind=Value("p", output_field=text),
            no_flag=Value(None, output_field=flag),
            no_number=Value(None, output_field=number),
        )
        .values_list(
            "kind",
            "content_type__app_label",
            "codename",
            "no_flag",
            "no_number",
            "no_flag",
            "no_flag",
        )
    )
    return perms.union(rules)  # UNION: a permission held twice comes once


def _load_access(user: Any, *, with_permissions: bool) -> None:
    """Fill the user's permission cache (if asked) and per-agent rights from one query."""
    rows = _access_rows(user, with_permissions=with_permissions)
    perms: set[str] = set()
    listed: set[str] = set()
    viewable: set[str] = set()
    decidable: set[str] = set()
    starter_rule: set[str] = set()
    for kind, name, codename, starter, grant_id, grant_decides, member in rows:
        if kind == "p":
            perms.add(f"{name}.{codename}")
            continue
        if starter:
            starter_rule.add(name)
        if grant_id is None:
            continue
        listed.add(name)
        if member:
            viewable.add(name)
            if grant_decides:
                decidable.add(name)
    if with_permissions:
        setattr(user, _PERM_CACHE, perms)
    authenticated = user is not None and user.is_authenticated and user.is_active
    superuser = bool(authenticated and user.is_superuser)
    rights = AgentRights(
        user_id=user.pk if authenticated else None,
        superuser=superuser,
        decide_permission=bool(authenticated and user.has_perm(DECIDE_PERMISSION)),
        hidden=frozenset() if superuser else frozenset(listed - viewable),
        no_decide=frozenset() if superuser else frozenset(listed - decidable),
        starter_rule=frozenset(starter_rule),
        starter_rule_everywhere=bool(app_settings.STARTER_CANNOT_APPROVE),
    )
    if user is not None:
        setattr(user, _RIGHTS_CACHE, rights)


def agent_rights(user: Any, *, fresh: bool = False) -> AgentRights:
    """The user's per-agent rights, cached on the user object like Django's permission
    cache: read with the user's permissions in one query (`PermissionBackend`), so a page or
    API call that checked a permission already holds them. A long-lived holder of a user
    object (a websocket consumer) passes `fresh=True` whenever it re-checks access: one
    query, the user's permissions re-read too."""
    if not fresh:
        cached = getattr(user, _RIGHTS_CACHE, None)
        if cached is not None:
            return cached
    elif user is not None:
        for attribute in (_RIGHTS_CACHE, _PERM_CACHE, "_user_perm_cache", "_group_perm_cache"):
            if hasattr(user, attribute):
                delattr(user, attribute)
    loads_permissions = (
        user is not None
        and user.is_authenticated
        and user.is_active
        and not hasattr(user, _PERM_CACHE)
    )
    _load_access(user, with_permissions=loads_permissions)
    return getattr(user, _RIGHTS_CACHE)


def hidden_agents(user: Any) -> frozenset[str]:
    """The agents whose runs and requests this user may not see: selectors exclude them."""
    rights = agent_rights(user)
    return frozenset() if rights.superuser else rights.hidden


def agents_visible_to(user: Any, names: Any) -> list[str]:
    """Of these agent names, the ones this user may see (e.g. the inbox's agent filter)."""
    hidden = hidden_agents(user)
    return [name for name in names if name not in hidden]


def can_view_agent(user: Any, agent: str) -> bool:
    return agent_rights(user).can_view(agent)


def _started_by_id(row: Any) -> Any:
    run = row.run if hasattr(row, "run_id") else row
    return run.started_by_id


def can_decide_request(user: Any, row: Any, *, approving: bool = True) -> bool:
    """May this user decide this request (`approving`: approve or answer it; False: decline
    it)? The global decide permission, the agent's rights, and the starter rule."""
    rights = agent_rights(user)
    if not approving or not (rights.starter_rule_everywhere or row.agent in rights.starter_rule):
        return rights.can_decide(row.agent, approving=False)  # no run read needed
    return rights.can_decide(row.agent, started_by_id=_started_by_id(row), approving=True)


def can_decide_run(user: Any, run: Any) -> bool:
    """May this user act on the run as a reviewer (cancel it)? The starter rule does not
    apply: stopping one's own run is always allowed."""
    return agent_rights(user).can_decide(run.agent, approving=False)


def require_visible(user: Any, row: Any) -> None:
    """A run or request of an agent hidden from this user does not exist for them (404)."""
    if not can_view_agent(user, row.agent):
        raise type(row).DoesNotExist(f"no such {type(row)._meta.verbose_name}")


def require_decide_request(user: Any, row: Any, *, approving: bool = True) -> None:
    """Services call this with the request row locked: 404 if its agent is hidden, 403 if
    the user may not decide it (and why)."""
    require_visible(user, row)
    rights = agent_rights(user)
    if can_decide_request(user, row, approving=approving):
        return
    if rights.can_decide(row.agent, approving=False):
        raise NotAllowed(
            "You need a second reviewer: whoever started a run may not approve or answer its"
            " requests (decline or cancel remain possible)"
        )
    if not rights.decide_permission:
        raise NotAllowed("you do not have permission to decide requests")
    raise NotAllowed(f"your groups may not decide requests of agent {row.agent!r}")


def require_decide_run(user: Any, run: Any) -> None:
    require_visible(user, run)
    if not can_decide_run(user, run):
        if not agent_rights(user).decide_permission:
            raise NotAllowed("you do not have permission to cancel runs")
        raise NotAllowed(f"your groups may not decide runs of agent {run.agent!r}")


# -- the client's address (throttling, sign-in lockout) --------------------------------------


def client_ip(request: Any) -> str | None:
    """The address a request came from: REMOTE_ADDR, or with TOOLNEXUS_TRUSTED_PROXIES = N
    (N proxies of yours in front of the app, each appending to X-Forwarded-For) the address
    the outermost of them saw. A client cannot pick its own address by sending the header:
    entries left of the ones your proxies appended are ignored. None when there is no valid
    address (a request built in code)."""
    meta = getattr(request, "META", None) or {}
    candidate = meta.get("REMOTE_ADDR") or ""
    proxies = int(app_settings.TRUSTED_PROXIES or 0)
    forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
    if proxies > 0 and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            candidate = hops[-min(proxies, len(hops))]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return None


def permission_needed(perm: str) -> str:
    """The sentence a 403 says: "You need the permission 'Can ...' (app.codename) ..."."""
    app_label, _, codename = perm.partition(".")
    name = (
        Permission.objects.filter(content_type__app_label=app_label, codename=codename)
        .values_list("name", flat=True)
        .first()
    )
    which = f"'{name}' ({perm})" if name else f"'{perm}'"
    return f"You need the permission {which} to do this. Ask an administrator to grant it."


REVIEWER_PERMISSIONS = [
    "decide_request",
    "view_approvalrequest",
    "view_run",
    "add_run",
    "view_event",
    "view_requestcall",
]
WATCHER_PERMISSIONS = ["view_approvalrequest", "view_run", "view_event", "view_requestcall"]
GROUPS = {"Reviewers": REVIEWER_PERMISSIONS, "Watchers": WATCHER_PERMISSIONS}


def ensure_groups() -> dict[str, Group]:
    """The Reviewers and Watchers groups, each with exactly its permissions (made if missing;
    `manage.py approvals_groups`). Needs the app's migrations applied."""
    groups = {}
    for name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            Permission.objects.filter(content_type__app_label=APP_LABEL, codename__in=codenames)
        )
        groups[name] = group
    return groups


# Marks the accounts `ensure_demo_accounts` made: only those are ever touched again.
DEMO_GROUP = "Demo accounts"
DEMO_ACCOUNTS = [
    ("reviewer", "Reviewers", "can decide"),
    ("reviewer2", "Reviewers", "can decide"),
    ("watcher", "Watchers", "view only"),
]
DEMO_SUPERUSER = ("admin", None, "superuser, Django admin at /admin/")


def ensure_demo_accounts(password: str, *, superuser: bool = True) -> list[tuple[str, str]]:
    """The demo accounts with `password`: `reviewer` and `reviewer2` decide, `watcher` only
    watches, and with `superuser` an `admin` superuser. Returns (username, role) of each
    account that now has `password`.

    An account is made once and put in the "Demo accounts" group; on later calls only
    members of that group get the new password (`serve` prints a fresh one at each start).
    A user of the same name that this did not make (a host project's own `admin`) is left
    exactly as it is, never given a password or made a superuser, and is not returned."""
    groups = ensure_groups()
    marker, _ = Group.objects.get_or_create(name=DEMO_GROUP)
    User = get_user_model()
    made = []
    for username, group, role in [*DEMO_ACCOUNTS, *([DEMO_SUPERUSER] if superuser else [])]:
        user = User._default_manager.filter(**{User.USERNAME_FIELD: username}).first()
        if user is None:
            user = User(**{User.USERNAME_FIELD: username})
        elif not user.groups.filter(pk=marker.pk).exists():
            continue  # not ours
        user.is_staff = user.is_superuser = group is None
        user.set_password(password)
        user.save()
        user.groups.add(marker, *([groups[group]] if group else []))
        made.append((username, role))
    return made


def demo_superusers() -> list[str]:
    """The active superusers `ensure_demo_accounts` made (their password was printed by a
    loopback start of `serve`)."""
    User = get_user_model()
    return sorted(
        User._default_manager.filter(groups__name=DEMO_GROUP, is_superuser=True, is_active=True)
        .values_list(User.USERNAME_FIELD, flat=True)
        .distinct()
    )


class OneQueryPermissionBackend(ModelBackend):
    """Django's ModelBackend, reading a user's own and group permissions in ONE query instead
    of two: every API call and page checks a permission on a freshly loaded user.

    Name it as `approvals.permissions.PermissionBackend` in AUTHENTICATION_BACKENDS: with
    django-axes installed that is this backend plus axes' lockout (`lockout`): while a
    username and address are locked out (too many failed passwords) even the right password
    is refused, and axes' middleware answers with the lockout page. One backend does both,
    so sessions keep naming one class (AUTHENTICATION_BACKENDS[0]) and permission checks
    keep their single query. Without axes (a project that does not use it) it is this
    class alone."""

    lockout: Any = None  # axes' AxesStandaloneBackend, in PermissionBackend

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is not None and self.lockout is not None:  # axes needs the request
            self.lockout.authenticate(self, request, username, password, **kwargs)
        return ModelBackend.authenticate(self, request, username, password, **kwargs)

    def get_all_permissions(self, user_obj, obj=None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, _PERM_CACHE):  # with the per-agent rights, one query
            _load_access(user_obj, with_permissions=True)
        return getattr(user_obj, _PERM_CACHE)


def _permission_backend() -> type:
    """PermissionBackend: made on first use, once the installed apps are known, so that a
    project without django-axes never imports it (its models need the app installed)."""
    if not django_apps.is_installed("axes"):
        return OneQueryPermissionBackend
    from axes.backends import AxesStandaloneBackend

    return type(
        "PermissionBackend",
        (OneQueryPermissionBackend, AxesStandaloneBackend),
        {
            "__module__": __name__,
            "__doc__": OneQueryPermissionBackend.__doc__,
            "lockout": AxesStandaloneBackend,
        },
    )


def __getattr__(name: str) -> Any:
    if name == "PermissionBackend":
        backend = globals()["PermissionBackend"] = _permission_backend()
        return backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

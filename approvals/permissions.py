"""Who may do what: the permission names, the check services make, the default groups, the
demo accounts `serve` prints, and the one-query permission backend."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db.models import Q

from .domain.exceptions import NotAllowed

VIEW_REQUESTS = "approvals.view_approvalrequest"
VIEW_RUNS = "approvals.view_run"
DECIDE_PERMISSION = "approvals.decide_request"
START_PERMISSION = "approvals.add_run"


def require(user: Any, permission: str, action: str) -> None:
    if user is None or not user.is_authenticated or not user.has_perm(permission):
        raise NotAllowed(f"you do not have permission to {action}")


def can_decide(user: Any) -> bool:
    return user.has_perm(DECIDE_PERMISSION)


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
    groups = {}
    for name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            Permission.objects.filter(content_type__app_label="approvals", codename__in=codenames)
        )
        groups[name] = group
    return groups


def ensure_demo_accounts(password: str) -> list[tuple[str, str]]:
    """`reviewer` and `reviewer2` decide; `watcher` only watches; `admin` is a superuser.
    Their passwords are (re)set to `password` on every start."""
    groups = ensure_groups()
    User = get_user_model()
    accounts = [
        ("reviewer", "Reviewers", "can decide"),
        ("reviewer2", "Reviewers", "can decide"),
        ("watcher", "Watchers", "view only"),
    ]
    made = []
    for username, group, role in accounts:
        user, _ = User.objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = False
        user.save()
        user.groups.add(groups[group])
        made.append((username, role))
    admin, _ = User.objects.get_or_create(username="admin")
    admin.is_staff = admin.is_superuser = True
    admin.set_password(password)
    admin.save()
    made.append(("admin", "superuser, Django admin at /admin/"))
    return made


class PermissionBackend(ModelBackend):
    """Django's ModelBackend, reading a user's own and group permissions in ONE query instead
    of two: every API call and page checks a permission on a freshly loaded user."""

    def get_all_permissions(self, user_obj, obj=None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):  # the cache attribute ModelBackend uses
            rows = (
                Permission.objects.filter(Q(user=user_obj) | Q(group__user=user_obj))
                .values_list("content_type__app_label", "codename")
                .order_by()
                .distinct()
            )
            user_obj._perm_cache = {f"{app}.{codename}" for app, codename in rows}
        return user_obj._perm_cache

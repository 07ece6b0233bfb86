"""Default groups and the demo accounts `serve` prints."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db.models import Q

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

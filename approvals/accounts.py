"""Default groups and the demo accounts `serve` prints."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

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

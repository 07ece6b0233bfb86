"""Live pages follow their viewer's access.

A sign-out closes the live pages of that session; a change of a user's own access (active
flag, password, groups, own permissions) makes their pages check it again at once. Changes to
a group's permissions reach pages within consumers.RECHECK_SECONDS.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import m2m_changed, post_save

from .consumers import session_tag
from .publisher import notify_user


def connect() -> None:
    User = get_user_model()
    user_logged_out.connect(_signed_out, dispatch_uid="approvals.live.signed_out")
    post_save.connect(_user_saved, sender=User, dispatch_uid="approvals.live.user_saved")
    for relation in ("groups", "user_permissions"):
        through = getattr(getattr(User, relation, None), "through", None)
        if through is not None:
            m2m_changed.connect(
                _access_changed, sender=through, dispatch_uid=f"approvals.live.{relation}"
            )


def _signed_out(sender, request=None, user=None, **kwargs) -> None:
    if user is None or user.pk is None:
        return
    session = getattr(request, "session", None)
    notify_user(
        user.pk,
        {
            "type": "approvals.session",
            "action": "logout",
            "session": session_tag(getattr(session, "session_key", None)),
        },
    )


def _user_saved(sender, instance, created=False, update_fields=None, **kwargs) -> None:
    # Signing in saves last_login only; a new user has no open page yet.
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return
    _recheck(instance.pk)


def _access_changed(sender, instance, action, reverse=False, pk_set=None, **kwargs) -> None:
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    if not reverse:
        _recheck(instance.pk)  # instance is the user
    else:  # edited from the group's or permission's side: its users (a clear names none)
        for pk in pk_set or ():
            _recheck(pk)


def _recheck(user_id) -> None:
    if user_id is not None:
        notify_user(user_id, {"type": "approvals.session", "action": "recheck"})

"""`manage.py approvals_groups`: the Reviewers and Watchers groups with their permissions."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from approvals.permissions import GROUPS, ensure_groups


class Command(BaseCommand):
    help = (
        "Create (or repair) the Reviewers group (view, decide, start runs) and the Watchers "
        "group (view only) with exactly their permissions. Run it after `migrate`; add people "
        "to the groups in the admin."
    )

    def handle(self, **options) -> None:
        groups = ensure_groups()
        for name, group in groups.items():
            held = sorted(group.permissions.values_list("codename", flat=True))
            missing = sorted(set(GROUPS[name]) - set(held))
            self.stdout.write(f"{name}: {', '.join(held)}")
            if missing:  # the app's migrations are not applied
                self.stderr.write(
                    self.style.WARNING(
                        f"{name} lacks {', '.join(missing)}: run `manage.py migrate` first"
                    )
                )

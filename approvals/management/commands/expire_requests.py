from django.core.management.base import BaseCommand

from approvals.execution import recovery


class Command(BaseCommand):
    help = 'Decline every overdue request with reason "expired"; their runs resume.'

    def handle(self, **options):
        count = recovery.requests_expire_overdue()
        self.stdout.write(f"expired {count} request(s)")

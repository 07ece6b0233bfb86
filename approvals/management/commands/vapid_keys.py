from django.core.management.base import BaseCommand

from approvals.domain.push import make_vapid_keys


class Command(BaseCommand):
    help = (
        "Print a fresh VAPID key pair for Web Push, as the two settings (environment"
        " variables) TOOLNEXUS_VAPID_PUBLIC_KEY and TOOLNEXUS_VAPID_PRIVATE_KEY. Nothing is"
        " stored: keep the private key secret. Changing the pair later means every browser"
        " turns push on again."
    )

    def handle(self, **options):
        keys = make_vapid_keys()
        self.stdout.write(f"TOOLNEXUS_VAPID_PUBLIC_KEY={keys.public_key}")
        self.stdout.write(f"TOOLNEXUS_VAPID_PRIVATE_KEY={keys.private_key}")

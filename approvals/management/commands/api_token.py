from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals import services


class Command(BaseCommand):
    help = "Create an API token for a user and print it (it is stored hashed and shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label to tell tokens apart")

    def handle(self, *, username, name, **options):
        User = get_user_model()
        try:
            user = User.objects.get_by_natural_key(username)
        except User.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        token, _ = services.api_token_create(user=user, name=name)
        self.stdout.write(token)

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals import services


class Command(BaseCommand):
    help = (
        "Create an API token for a user and print it (it is stored hashed and shown only once)."
        " It expires after TOOLNEXUS_TOKEN_DAYS days unless --days says otherwise."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label to tell tokens apart")
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="days until the token expires (0: never); default TOOLNEXUS_TOKEN_DAYS",
        )

    def handle(self, *, username, name, days, **options):
        User = get_user_model()
        try:
            user = User.objects.get_by_natural_key(username)
        except User.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        try:
            token, _ = services.api_token_create(user=user, name=name, days=days)
        except services.InvalidInput as exc:
            raise CommandError(f"--{exc}") from None
        self.stdout.write(token)

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from approvals import selectors, services
from approvals.models import ApiToken


class Command(BaseCommand):
    help = (
        "Revoke API tokens: by prefix (the characters `api_token` printed first, shown in the"
        " admin and by --list), or every token of a user with --user NAME --all."
        " A revoked token gets 401 at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("prefixes", nargs="*", help="token prefixes, e.g. tnx_AbCdEfGh")
        parser.add_argument("--user", help="only this user's tokens")
        parser.add_argument(
            "--all", dest="every", action="store_true", help="every token of --user"
        )
        parser.add_argument(
            "--list", dest="show", action="store_true", help="list --user's tokens, revoke nothing"
        )
        parser.add_argument("--reason", default="revoked by an operator")

    def handle(self, *, prefixes, user, every, show, reason, **options):
        tokens = ApiToken.objects.all()
        if user:
            User = get_user_model()
            try:
                owner = User.objects.get_by_natural_key(user)
            except User.DoesNotExist:
                raise CommandError(f"no user named {user!r}") from None
            tokens = tokens.filter(user=owner)
        if show:
            if not user:
                raise CommandError("--list needs --user NAME")
            now = timezone.now()
            for row in selectors.token_list(user=owner):
                expires = (
                    row.expires_at.isoformat(timespec="seconds") if row.expires_at else "never"
                )
                used = (
                    row.last_used_at.isoformat(timespec="seconds") if row.last_used_at else "never"
                )
                self.stdout.write(
                    f"{row.prefix}  {row.state_at(now):8}  name={row.name!r}  expires={expires}"
                    f"  last used={used}"
                )
            return
        if every:
            if not user or prefixes:
                raise CommandError("--all needs --user NAME and no prefixes")
        elif not prefixes:
            raise CommandError("name token prefixes, or --user NAME --all")
        else:
            missing = [p for p in prefixes if not tokens.filter(prefix=p).exists()]
            if missing:
                raise CommandError(f"no token with prefix {', '.join(missing)}")
            tokens = tokens.filter(prefix__in=prefixes)
        count = services.api_tokens_revoke(tokens=tokens, reason=reason)
        self.stdout.write(f"revoked {count} token(s)")

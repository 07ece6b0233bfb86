"""What a reviewer's chat URLs may be: apprise URLs whose scheme the server allows
(TOOLNEXUS_NOTIFICATION_CHAT_SCHEMES) and that apprise can use. Checked at save, so a bad
URL is refused at its field and never found out at send time."""

from __future__ import annotations

import apprise

from ..conf import app_settings


def allowed_schemes() -> list[str]:
    return sorted({s.lower() for s in app_settings.NOTIFICATION_CHAT_SCHEMES})


def chat_url_problems(text: str) -> list[str]:
    """Why the URLs (one a line) cannot be used: one message per bad line, [] when fine."""
    problems = []
    allowed = allowed_schemes()
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for number, line in enumerate(lines, start=1):
        scheme, sep, _ = line.partition("://")
        where = f"line {number}" if len(lines) > 1 else "the URL"
        if not sep or not scheme:
            problems.append(f"{where} is not a URL (scheme://...)")
        elif scheme.lower() not in allowed:
            problems.append(
                f"{where}: the scheme {scheme}:// is not allowed here"
                f" (allowed: {', '.join(allowed) or 'none'})"
            )
        elif apprise.Apprise.instantiate(line) is None:
            problems.append(f"{where}: apprise cannot use this {scheme}:// URL (malformed?)")
    return problems

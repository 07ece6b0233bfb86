"""The demo project's own page and assets (templates/base.html, static/toolnexus_web/): every
page of the app sits in it, with the project's icon and its brand stylesheet after the
app's, so the brand's custom properties win; the files are found by staticfiles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders

from .factories import make_user, session_client

pytestmark = pytest.mark.django_db


def _stylesheets(html: str) -> list[str]:
    return re.findall(r'<link rel="stylesheet" href="([^"]+)"', html)


@pytest.mark.parametrize("path", ["/", "/runs/", "/accounts/login/"])
def test_every_page_sits_in_the_projects_page_with_its_brand_after_the_apps_stylesheet(path):
    client = session_client(None if path == "/accounts/login/" else make_user())
    html = client.get(path).content.decode()
    sheets = _stylesheets(html)
    app = next(i for i, s in enumerate(sheets) if s.endswith("approvals/app.css"))
    brand = next(i for i, s in enumerate(sheets) if s.endswith("toolnexus_web/brand.css"))
    assert brand > app  # later in the page: its custom properties override the app's
    assert re.search(r'<link rel="icon" href="[^"]*toolnexus_web/icon\.svg"', html)
    assert 'class="skip" href="#main"' in html and '<main id="main">' in html


def test_the_projects_assets_are_found_and_the_brand_sets_a_dark_value_for_each_light_one():
    assert settings.TOOLNEXUS_BASE_TEMPLATE == "base.html"
    brand = finders.find("toolnexus_web/brand.css")
    assert brand and finders.find("toolnexus_web/icon.svg")
    css = Path(brand).read_text()
    light, dark = css.split("@media (prefers-color-scheme: dark)", 1)
    names = lambda text: set(re.findall(r"(--[a-z-]+):", text))  # noqa: E731
    assert names(light.split("}", 1)[0]) == names(dark.split("}", 1)[0]) != set()

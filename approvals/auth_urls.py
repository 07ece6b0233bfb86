"""Sign-in and sign-out pages for a project that has none of its own, in one line of the
project's URLconf (next to `approvals.urls`):

    path("accounts/", include("approvals.auth_urls")),

At `accounts/` the pages are where Django's default LOGIN_URL (/accounts/login/) points;
at another prefix, set LOGIN_URL = "login". The URL names are Django's own (`login`,
`logout`), as `django.contrib.auth.urls` names them; the views are Django's LoginView and
LogoutView with the app's templates (approvals/login.html, approvals/signed_out.html).
"""

from django.urls import path

from .web.signin import SignInView, SignOutView

urlpatterns = [
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", SignOutView.as_view(), name="logout"),
]

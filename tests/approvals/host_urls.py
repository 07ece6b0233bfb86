"""A host project's URLconf for tests: the app under /inbox/, next to the project's own `api`
namespace, with no admin, no handler403/404 and no auth URLs of the app's choosing."""

from django.http import HttpResponse
from django.urls import include, path


def shop_api(request):
    return HttpResponse("the shop's own API")


urlpatterns = [
    path("api/", include(([path("", shop_api, name="index")], "api"))),
    path("accounts/", include("django.contrib.auth.urls")),
    path("inbox/", include("approvals.urls")),
]

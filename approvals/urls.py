from django.urls import path
from django.views.generic import RedirectView

app_name = "approvals"

urlpatterns = [
    # Until the reviewers' inbox lands, the admin's request list is the inbox.
    path(
        "",
        RedirectView.as_view(url="/admin/approvals/approvalrequest/?state__exact=pending"),
        name="home",
    ),
]

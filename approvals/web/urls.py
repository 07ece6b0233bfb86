"""The app's pages (`approvals.urls` includes them with the API and the socket URLs). Each
view answers a refusal with the app's own 403 page and a signed-out htmx request with 401
(`views.app_page`)."""

from django.urls import path

from . import views

app_name = "approvals"
page = views.app_page

urlpatterns = [
    path("", page(views.inbox), name="inbox"),
    path("requests/<str:request_id>/", page(views.request_detail), name="request-detail"),
    path("requests/<str:request_id>/card/", page(views.request_card), name="request-card"),
    path("requests/<str:request_id>/approve/", page(views.request_approve), name="request-approve"),
    path("requests/<str:request_id>/output/", page(views.request_output), name="request-output"),
    path("requests/<str:request_id>/edit/", page(views.request_edit), name="request-edit"),
    path("requests/<str:request_id>/respond/", page(views.request_respond), name="request-respond"),
    path("requests/<str:request_id>/calls/", page(views.request_calls), name="request-calls"),
    path("requests/<str:request_id>/decline/", page(views.request_decline), name="request-decline"),
    path("runs/", page(views.run_list), name="run-list"),
    path("runs/new/", page(views.run_start), name="run-start"),
    path("runs/<int:run_id>/", page(views.run_detail), name="run-detail"),
    path("runs/<int:run_id>/retry/", page(views.run_retry), name="run-retry"),
    path("runs/<int:run_id>/cancel/", page(views.run_cancel), name="run-cancel"),
]

from django.urls import path

from . import views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("requests/<str:request_id>/", views.request_detail, name="request-detail"),
    path("requests/<str:request_id>/card/", views.request_card, name="request-card"),
    path("requests/<str:request_id>/approve/", views.request_approve, name="request-approve"),
    path("requests/<str:request_id>/output/", views.request_output, name="request-output"),
    path("requests/<str:request_id>/edit/", views.request_edit, name="request-edit"),
    path("requests/<str:request_id>/respond/", views.request_respond, name="request-respond"),
    path("requests/<str:request_id>/calls/", views.request_calls, name="request-calls"),
    path("requests/<str:request_id>/decline/", views.request_decline, name="request-decline"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/new/", views.run_start, name="run-start"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/retry/", views.run_retry, name="run-retry"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
]

"""The app's pages (`approvals.urls` includes them with the API and the socket URLs). Each
view answers a refusal with the app's own 403 page and a signed-out htmx request with 401
(`views.app_page`)."""

from django.urls import path

from . import (
    bulk_snapshot,
    follow_up,
    notifications,
    reports,
    request_pages,
    rules,
    slack,
    triage,
    views,
)

app_name = "approvals"
page = views.app_page
# Deciding a request another reviewer claimed asks first (approvals/web/triage.py).
guard = triage.claim_guard

urlpatterns = [
    path("", page(views.inbox), name="inbox"),
    # Before requests/<id>/: "bulk" is no request id.
    path("requests/bulk/", page(triage.requests_bulk), name="requests-bulk"),
    path(
        "requests/bulk/snapshot/",
        page(bulk_snapshot.requests_bulk_snapshot),
        name="requests-bulk-snapshot",
    ),
    path("requests/<str:request_id>/", page(request_pages.request_detail), name="request-detail"),
    path("requests/<str:request_id>/card/", page(request_pages.request_card), name="request-card"),
    path(
        "requests/<str:request_id>/approve/",
        page(guard(request_pages.request_approve)),
        name="request-approve",
    ),
    path(
        "requests/<str:request_id>/output/",
        page(guard(request_pages.request_output)),
        name="request-output",
    ),
    path(
        "requests/<str:request_id>/edit/",
        page(guard(request_pages.request_edit)),
        name="request-edit",
    ),
    path(
        "requests/<str:request_id>/respond/",
        page(guard(request_pages.request_respond)),
        name="request-respond",
    ),
    path(
        "requests/<str:request_id>/calls/",
        page(guard(request_pages.request_calls)),
        name="request-calls",
    ),
    path(
        "requests/<str:request_id>/decline/",
        page(guard(request_pages.request_decline)),
        name="request-decline",
    ),
    # Triage (approvals/web/triage.py): bulk decisions, claims, snooze / ignore / un-hide.
    path("requests/<str:request_id>/claim/", page(triage.request_claim), name="request-claim"),
    path(
        "requests/<str:request_id>/release/", page(triage.request_release), name="request-release"
    ),
    path(
        "requests/<str:request_id>/claim-bar/",
        page(triage.request_claim_bar),
        name="request-claim-bar",
    ),
    path("requests/<str:request_id>/snooze/", page(triage.request_snooze), name="request-snooze"),
    path("requests/<str:request_id>/ignore/", page(triage.request_ignore), name="request-ignore"),
    path("requests/<str:request_id>/unhide/", page(triage.request_unhide), name="request-unhide"),
    path("runs/", page(views.run_list), name="run-list"),
    path("runs/new/", page(views.run_start), name="run-start"),
    path("runs/<int:run_id>/", page(views.run_detail), name="run-detail"),
    path("runs/<int:run_id>/retry/", page(views.run_retry), name="run-retry"),
    path("runs/<int:run_id>/cancel/", page(views.run_cancel), name="run-cancel"),
    # Rules (approvals/web/rules.py): people with "manage rules" only.
    path("rules/", page(rules.rule_list), name="rule-list"),
    path("rules/<int:rule_id>/", page(rules.rule_edit), name="rule-edit"),
    path("rules/<int:rule_id>/switch/", page(rules.rule_switch), name="rule-switch"),
    path("rules/<int:rule_id>/dry-run/", page(rules.rule_dry_run), name="rule-dry-run"),
    path("rules/<int:rule_id>/apply/", page(rules.rule_apply), name="rule-apply"),
    path("rules/<int:rule_id>/delete/", page(rules.rule_delete), name="rule-delete"),
    path("runs/<int:run_id>/follow-up/", page(follow_up.run_follow_up), name="run-follow-up"),
    # Notifications (approvals/web/notifications.py): each person's own settings, and the
    # confirmation pages of an email's signed Approve / Decline links.
    path("notifications/", page(notifications.notification_settings), name="notifications"),
    path(
        "notifications/test/<str:channel>/",
        page(notifications.notification_test),
        name="notifications-test",
    ),
    path("notifications/link/<str:token>/", page(notifications.notify_link), name="notify-link"),
    # Web Push: a browser's subscription, removing one, and the service worker's script at
    # the app's root (its scope: every page of the app).
    path(
        "notifications/push/subscribe/",
        page(notifications.push_subscribe),
        name="push-subscribe",
    ),
    path(
        "notifications/push/<int:subscription_id>/remove/",
        page(notifications.push_remove),
        name="push-remove",
    ),
    path("sw.js", notifications.service_worker, name="service-worker"),
    # Slack (approvals/web/slack.py): the actions endpoint its buttons post to (signed by
    # Slack, no session), the page that links a Slack user to an account, and "Unlink".
    path("slack/actions/", slack.slack_actions, name="slack-actions"),
    path("slack/link/<str:token>/", page(slack.slack_link), name="slack-link"),
    path("slack/unlink/<int:link_id>/", page(slack.slack_unlink), name="slack-unlink"),
    # The team dashboard (approvals/web/reports.py): people with "view reports" only.
    path("reports/", page(reports.report_dashboard), name="reports"),
    path("reports/export.csv", page(reports.report_csv), name="reports-csv"),
]

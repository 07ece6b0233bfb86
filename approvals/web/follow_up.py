"""A follow-up on the run page: continue a finished run with a new user message."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from .. import services
from ..domain.exceptions import NotAllowed, ServiceError
from ..models import Run


@require_POST
@login_required
def run_follow_up(request: HttpRequest, run_id: int) -> HttpResponse:
    text = request.POST.get("message", "")
    try:
        services.run_follow_up(run_id=run_id, user=request.user, message=text)
    except Run.DoesNotExist:
        raise Http404("no such run") from None
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except ServiceError as exc:
        # The typed message comes back in the box (the session keeps it for one page).
        messages.warning(request, str(exc))
        request.session["follow_up_draft"] = {"run": run_id, "text": text[:20_000]}
        return redirect("approvals:run-detail", run_id)
    messages.success(request, "Sent: the run carries on with your message.")
    return redirect("approvals:run-detail", run_id)

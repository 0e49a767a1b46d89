"""Server-rendered pages: the dashboard, a job's page with its live timeline, a submit form.

Views parse, call one service, render. The submit form validates with the same serializer
as the REST API, so the browser and the API accept and refuse exactly the same jobs.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from costs.services import estimate_job
from jobs import services
from jobs.api.serializers import JobSerializer
from jobs.choices import FINISHED_JOB_STATES, JobState, Tolerance
from jobs.models import Job
from jobs.workloads.catalog import TEMPLATES
from migration import market_tick, pages
from migration.api.serializers import InterruptSerializer
from migration.interruptions import InstanceNotRunning, interrupt_instance
from migration.models import Accelerator, CapacityPool, Instance
from portal import job_form, tokens
from portal.forms import TokenForm
from portal.http import AuthenticatedHttpRequest
from portal.models import ApiToken

DASHBOARD_JOBS = 50


@login_required
def dashboard(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The user's jobs, newest first, filtered by state and name; totals above them."""
    jobs = Job.objects.visible_to(request.user)
    totals = jobs.aggregate(
        count=Count("pk"),
        active=Count("pk", filter=~Q(state__in=FINISHED_JOB_STATES)),
        cost=Sum("cost_so_far"),
        on_demand=Sum("on_demand_cost_so_far"),
    )
    totals["saved"] = (totals["on_demand"] or 0) - (totals["cost"] or 0)
    state = request.GET.get("state", "")
    query = request.GET.get("q", "").strip()
    if state == "active":
        jobs = jobs.exclude(state__in=FINISHED_JOB_STATES)
    elif state in JobState.values:
        jobs = jobs.filter(state=state)
    if query:
        jobs = jobs.filter(name__icontains=query)
    shown = list(
        jobs.select_related("accelerator", "project", "pool__region").order_by("-id")[
            :DASHBOARD_JOBS
        ]
    )
    return render(
        request,
        "portal/dashboard.html",
        {
            "jobs": shown,
            "totals": totals,
            "state": state,
            "query": query,
            "states": [("active", "Not finished"), *JobState.choices],
            "limit": DASHBOARD_JOBS,
        },
    )


def _visible_job(request: AuthenticatedHttpRequest, job_id: int) -> Job:
    """The job if the user may see it (a project member or staff), else 404."""
    return get_object_or_404(
        Job.objects.visible_to(request.user).select_related("accelerator", "project"),
        pk=job_id,
    )


@login_required
def job_detail(request: AuthenticatedHttpRequest, job_id: int) -> HttpResponse:
    """A job's page: its live parts (re-rendered by job_parts as events arrive), its live
    timeline over /ws/jobs/<id>/ and its log (static/js/job_page.js)."""
    job = _visible_job(request, job_id)
    context = {
        "job": job,
        "workload": pages.describe_workload(job.workload),
        "log_since": pages.log_tail_start(job),
        "phases": pages.PHASES,
        **pages.job_parts(job),
    }
    return render(request, "portal/job_detail.html", context)


@login_required
def job_parts(request: AuthenticatedHttpRequest, job_id: int) -> HttpResponse:
    """The parts of a job's page that change as it runs, as HTML for the page to swap in."""
    job = _visible_job(request, job_id)
    return render(request, "portal/job_parts.html", {"job": job, **pages.job_parts(job)})


@login_required
@require_POST
def job_cancel(request: AuthenticatedHttpRequest, job_id: int) -> HttpResponse:
    job = _visible_job(request, job_id)
    try:
        services.cancel_job(job.pk, request.user)
    except services.JobAlreadyFinished as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(request, "Cancelling: the job's instances are being released.")
    return redirect("job-detail", job_id=job.pk)


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The submission form; its estimate panel asks POST /api/estimates/ as fields change
    (static/js/job_form.js), and a press of Estimate without scripts renders it here."""
    errors: dict[str, str] = {}
    estimate: dict[str, Any] | None = None
    values: dict[str, Any] = {
        "nodes": 1,
        "gpus_per_node": 1,
        "total_steps": 1000,
        "tolerance": Tolerance.BALANCED,
        "template": "mlp_numpy",
        "workload_kind": "template",
        # The cheapest card that has capacity, so the first estimate has something to show.
        "accelerator": CapacityPool.objects.filter(enabled=True)
        .order_by("price_per_hour")
        .values_list("accelerator__name", flat=True)
        .first(),
        "allow_on_demand_fallback": "on",
    }
    if request.method == "POST":
        values = request.POST.dict()
        serializer = JobSerializer(
            data=job_form.job_body_from_form(request.POST), context={"request": request}
        )
        if not serializer.is_valid():
            errors = job_form.errors_by_field(serializer.errors, request.POST)
        elif request.POST.get("action") == "estimate":  # look before you launch, no scripts
            fields = {k: v for k, v in serializer.validated_data.items() if k != "project"}
            found = estimate_job(services.build_job(request.user, **fields))
            estimate = found.to_dict() if found else {}
        else:
            job = services.submit_job(request.user, **serializer.validated_data)
            return redirect("job-detail", job_id=job.pk)
    templates = [
        {
            "template": t,
            "fields": [
                {
                    "field": f,
                    "value": values.get(f.input_name, ""),
                    "error": errors.get(f.input_name),
                }
                for f in job_form.param_fields(t.name)
            ],
        }
        for t in TEMPLATES.values()
    ]
    return render(
        request,
        "portal/job_new.html",
        {
            "errors": errors,
            "estimate": estimate,
            "values": values,
            "templates": templates,
            "accelerators": Accelerator.objects.all(),
            "tolerances": [
                (value, label, job_form.TOLERANCE_SENTENCES[Tolerance(value)])
                for value, label in Tolerance.choices
            ],
            "can_run_command": request.user.has_perm("jobs.run_command"),
        },
    )


def _require_staff(request: AuthenticatedHttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("the fleet is for staff")


def _fleet_parts_context() -> dict[str, Any]:
    scale = market_tick.time_scale()
    return {
        "instances": pages.fleet_instances(),
        "market_scale": scale,
        "market_switched": scale != settings.BATON_MARKET_TIME_SCALE,
        "market_setting": settings.BATON_MARKET_TIME_SCALE,
        "market_scales": MARKET_SCALES,
    }


INTERRUPT_FIELDS = ("advance_notice_s", "final_window_s")
# The switch's choices: simulated seconds per wall second, in words.
MARKET_SCALES = [
    (60.0, "a minute a second"),
    (600.0, "ten minutes a second"),
    (3600.0, "an hour a second"),
]


@login_required
def fleet(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Staff: pools by accelerator and region, instances with their health and an Interrupt
    button each, the market simulator's switch, and a live feed of every job's events."""
    _require_staff(request)
    context = {
        **_fleet_parts_context(),
        "pool_groups": pages.fleet_pools(),
        "feed_since": pages.fleet_feed_start(),
    }
    return render(request, "portal/fleet.html", context)


@login_required
def fleet_parts(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The fleet page's changing parts, as HTML for the page to swap in."""
    _require_staff(request)
    if request.GET.get("part") == "pools":
        return render(request, "portal/fleet_pools.html", {"pool_groups": pages.fleet_pools()})
    return render(request, "portal/fleet_parts.html", _fleet_parts_context())


@login_required
@require_POST
def fleet_interrupt(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Staff: the chaos action of POST /api/instances/{id}/interrupt/, from a button; an empty
    field takes the pool's own window."""
    _require_staff(request)
    given = {k: request.POST[k] for k in INTERRUPT_FIELDS if request.POST.get(k, "").strip()}
    body = InterruptSerializer(data=given)
    instance_id = request.POST.get("instance", "")
    instance = (
        Instance.objects.select_related("pool").filter(pk=int(instance_id)).first()
        if instance_id.isdigit()
        else None
    )
    if instance is None:
        messages.error(request, "Not interrupted: no such instance.")
    elif not body.is_valid():
        problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in body.errors.items())
        messages.error(request, f"Not interrupted: {problems}")
    else:
        windows = {name: getattr(instance.pool, name) for name in INTERRUPT_FIELDS}
        windows.update(body.validated_data)
        try:
            interrupt_instance(instance.pk, source="manual", **windows)
        except InstanceNotRunning as exc:
            messages.warning(request, str(exc))
        else:
            messages.success(
                request, f"Instance {instance.pk} of job {instance.job_id} interrupted."
            )
    return redirect("fleet")


@login_required
@require_POST
def fleet_market(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Staff: switch the market simulator on at a scale, off, or back to its setting."""
    _require_staff(request)
    choice = request.POST.get("scale", "")
    allowed = {str(scale): scale for scale, _ in MARKET_SCALES}
    if choice == "setting":
        market_tick.set_time_scale(None)
    elif choice == "off":
        market_tick.set_time_scale(0.0)
    elif choice in allowed:
        market_tick.set_time_scale(allowed[choice])
    else:
        messages.error(request, "Choose a time scale, off, or the setting.")
    return redirect("fleet")


@login_required
@require_http_methods(["GET", "POST"])
def api_tokens(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The user's API tokens: make one (its key is shown once), revoke one."""
    form = TokenForm()
    new_key = ""
    if request.method == "POST" and "revoke" in request.POST:
        token_id = request.POST.get("revoke", "")
        if token_id.isdigit() and tokens.revoke_api_token(request.user, int(token_id)):
            messages.success(request, "Token revoked: it no longer works.")
        return redirect("api-tokens")
    if request.method == "POST":
        form = TokenForm(request.POST)
        if form.is_valid():
            issued = tokens.issue_api_token(
                request.user, name=form.cleaned_data["name"], days=form.cleaned_data["days"]
            )
            new_key, form = issued.key, TokenForm()
    return render(
        request,
        "portal/tokens.html",
        {
            "form": form,
            "new_key": new_key,
            "tokens": ApiToken.objects.live().filter(user=request.user),
        },
    )

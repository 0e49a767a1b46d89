"""The costs page: price history and interruption rates of an accelerator's pools, and what a
job on it would cost on spot against on-demand; the what-if replay page (charts drawn by
plotly.js from static)."""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import HttpResponse
from django.shortcuts import render

from costs import charts, selectors
from costs.estimator import EstimateRefused
from costs.forms import ReplayForm, WhatIfForm
from costs.services import replay_for_user, what_if
from costs.what_if import ReplayRefused
from jobs.services import build_job
from portal.http import AuthenticatedHttpRequest


@login_required
def costs_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = WhatIfForm(request.GET or None)
    context: dict[str, Any] = {"form": form}
    if not form.is_bound:
        form = WhatIfForm({name: field.initial for name, field in form.fields.items()})
        context["form"] = form
    if form.is_valid():
        data = form.cleaned_data
        job = build_job(
            request.user,
            workload={},
            accelerator=data["accelerator"],
            nodes=data["nodes"],
            total_steps=1,
            expected_hours=data["work_hours"],
            checkpoint_gb=data["checkpoint_gb"],
            tolerance=data["tolerance"],
        )
        try:
            shown = what_if(job)
        except EstimateRefused as refused:
            form.add_error("work_hours" if refused.field == "work_hours" else None, refused.message)
        else:
            context["figures"] = shown.figures
            if shown.estimate is not None:
                context["estimate"] = shown.estimate.to_dict()
    return render(request, "costs/costs.html", context)


# A replay's figure for the same form is kept this long: stored traces change only on import.
REPLAY_CACHE_SECONDS = 600


@login_required
def replay_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    """What-if replay: the job's policy against greedy, always-on-demand and the optimum."""
    names = selectors.stored_trace_names()
    form = ReplayForm(request.GET or None, trace_names=names)
    context: dict[str, Any] = {"form": form}
    if not form.is_bound:
        form = ReplayForm(
            {name: field.initial for name, field in form.fields.items()}, trace_names=names
        )
        context["form"] = form
    if form.is_valid():
        fields = {k: v for k, v in form.cleaned_data.items() if v not in (None, "")}
        key = (
            "costs:replay:"
            + hashlib.sha256(
                repr(sorted((k, getattr(v, "pk", v)) for k, v in fields.items())).encode()
            ).hexdigest()
        )
        shown = cache.get(key)
        if shown is None:
            try:
                body = replay_for_user(fields).to_dict()
            except ReplayRefused as refused:
                form.add_error(
                    refused.field if refused.field in form.fields else None, refused.message
                )
                return render(request, "costs/replay.html", context)
            shown = {"replay": body, "figure": charts.replay_decisions(body)}
            cache.set(key, shown, REPLAY_CACHE_SECONDS)
        context.update(shown)
    return render(request, "costs/replay.html", context)

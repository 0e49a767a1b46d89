"""The costs page: price history and interruption rates of an accelerator's pools, and what a
job on it would cost on spot against on-demand (charts drawn by plotly.js from static)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render

from costs.estimator import EstimateRefused
from costs.forms import WhatIfForm
from costs.services import what_if
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

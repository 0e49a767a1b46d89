"""The costs page: price history and interruption rates of an accelerator's pools, and what a
job on it would cost on spot against on-demand (charts drawn by plotly.js from static)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render

from costs import charts, selectors
from costs.estimator import estimate
from costs.forms import WhatIfForm
from costs.services import estimate_input
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
        name = data["accelerator"].name
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
        inputs = estimate_input(job)
        figures = {
            "prices": charts.price_history(selectors.price_series(name)),
            "rates": charts.interruption_rates(*selectors.pool_rates(name)),
        }
        if inputs is not None:
            figures["interval"] = charts.cost_against_interval(inputs)
            figures["completion"] = charts.completion_time(inputs)
            context["estimate"] = estimate(inputs).to_dict()
        context["figures"] = figures
    return render(request, "costs/costs.html", context)

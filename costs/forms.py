"""The what-if form of the costs page."""

from __future__ import annotations

from typing import Any

from django import forms

from costs.estimator import MAX_CHECKPOINT_GB, MAX_WORK_HOURS
from jobs.choices import Tolerance
from migration.choices import Market
from migration.models import Accelerator, CapacityPool


class WhatIfForm(forms.Form):
    accelerator = forms.ModelChoiceField(
        Accelerator.objects.all(), to_field_name="name", initial="V100-16GB"
    )
    nodes = forms.IntegerField(min_value=1, max_value=64, initial=1)
    work_hours = forms.FloatField(min_value=0.01, max_value=MAX_WORK_HOURS, initial=48.0)
    checkpoint_gb = forms.FloatField(
        label="Checkpoint size (GB)", min_value=0.001, max_value=MAX_CHECKPOINT_GB, initial=10.0
    )
    tolerance = forms.ChoiceField(choices=Tolerance.choices, initial=Tolerance.BALANCED)


class ReplayForm(forms.Form):
    """The what-if replay page: a job over a stored trace or a spot pool's own history."""

    trace = forms.ChoiceField(required=False, help_text="a stored trace")
    pool = forms.ModelChoiceField(
        CapacityPool.objects.filter(market=Market.SPOT).select_related("region", "accelerator"),
        required=False,
        help_text="a spot pool: its prices, and its history when no trace is chosen",
    )
    start_hours = forms.FloatField(required=False, min_value=0, max_value=100_000)
    task_hours = forms.FloatField(min_value=0.01, max_value=MAX_WORK_HOURS, initial=48.0)
    deadline_hours = forms.FloatField(min_value=0.01, max_value=MAX_WORK_HOURS, initial=52.0)
    restart_overhead_hours = forms.FloatField(required=False, min_value=0, max_value=24)
    tolerance = forms.ChoiceField(choices=Tolerance.choices, initial=Tolerance.BALANCED)
    nodes = forms.IntegerField(min_value=1, max_value=256, initial=1)

    def __init__(self, *args: Any, trace_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", "the pool's own history")] + [(n, n) for n in trace_names]
        self.fields["trace"].choices = choices  # type: ignore[attr-defined]
        if trace_names:
            self.fields["trace"].initial = trace_names[0]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("trace") and not data.get("pool"):
            raise forms.ValidationError("Choose a trace or a spot pool.")
        task, deadline = data.get("task_hours"), data.get("deadline_hours")
        if task is not None and deadline is not None and deadline < task:
            self.add_error("deadline_hours", "The deadline must be at least the work.")
        return data

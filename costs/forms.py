"""The what-if form of the costs page."""

from __future__ import annotations

from django import forms

from costs.estimator import MAX_CHECKPOINT_GB, MAX_WORK_HOURS
from jobs.choices import Tolerance
from migration.models import Accelerator


class WhatIfForm(forms.Form):
    accelerator = forms.ModelChoiceField(
        Accelerator.objects.all(), to_field_name="name", initial="V100-16GB"
    )
    nodes = forms.IntegerField(min_value=1, max_value=64, initial=1)
    work_hours = forms.FloatField(min_value=0.01, max_value=MAX_WORK_HOURS, initial=48.0)
    checkpoint_gb = forms.FloatField(min_value=0.001, max_value=MAX_CHECKPOINT_GB, initial=10.0)
    tolerance = forms.ChoiceField(choices=Tolerance.choices, initial=Tolerance.BALANCED)

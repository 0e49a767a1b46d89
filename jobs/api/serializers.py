"""Job JSON of DESIGN §9; every invalid field gets a field error."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from costs.estimator import MAX_CHECKPOINT_GB, MAX_WORK_HOURS
from jobs.models import Job, Project
from jobs.workloads.catalog import validate_directory_options, validate_params
from migration.models import Accelerator

# The seed's advice for spot: checkpoint every five minutes when the user says nothing.
DEFAULT_CHECKPOINT_EVERY_SECONDS = 300
MONTH_S = 30 * 24 * 3600


class WorkloadField(serializers.JSONField):
    """`{"template": NAME, "params": {...}}` or `{"command": [...], "mode": "directory"}`
    (with optional `resume_args` and `progress_pattern`)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError(
                'expected {"template", "params"} or {"command", "mode"}'
            )
        if "template" in value:
            extra = sorted(set(value) - {"template", "params"})
            if extra:
                raise serializers.ValidationError(f"unknown key(s) {', '.join(extra)}")
            try:
                params = validate_params(str(value["template"]), value.get("params", {}))
            except ValueError as exc:
                raise serializers.ValidationError(str(exc)) from None
            return {"template": value["template"], "params": params}
        if "command" in value:
            extra = sorted(set(value) - {"command", "mode", "resume_args", "progress_pattern"})
            if extra:
                raise serializers.ValidationError(f"unknown key(s) {', '.join(extra)}")
            command = value["command"]
            if not (
                isinstance(command, list) and command and all(isinstance(a, str) for a in command)
            ):
                raise serializers.ValidationError("command must be a non-empty list of strings")
            try:
                options = validate_directory_options(value)
            except ValueError as exc:
                raise serializers.ValidationError(str(exc)) from None
            mode = value.get("mode", "directory")
            if mode != "directory":
                raise serializers.ValidationError('mode must be "directory"')
            user = self.context["request"].user
            if not user.has_perm("jobs.run_command"):
                raise serializers.ValidationError(
                    "running a command needs the jobs.run_command permission; "
                    "use a template or ask an admin"
                )
            return {"command": command, "mode": mode, **options}
        raise serializers.ValidationError('expected a "template" or a "command"')


class JobSerializer(serializers.ModelSerializer):
    workload = WorkloadField()
    accelerator = serializers.SlugRelatedField(
        slug_field="name", queryset=Accelerator.objects.all()
    )
    project = serializers.PrimaryKeyRelatedField(
        queryset=Project.objects.none(), required=False, allow_null=True
    )
    # Bounded as the estimator is: its work grows with them, and 1e308 made it infinite (a 500).
    expected_hours = serializers.FloatField(
        required=False, min_value=1e-6, max_value=MAX_WORK_HOURS
    )
    checkpoint_gb = serializers.FloatField(
        required=False, min_value=1e-6, max_value=MAX_CHECKPOINT_GB
    )
    max_price_per_hour = serializers.DecimalField(
        max_digits=10,
        decimal_places=4,
        required=False,
        allow_null=True,
        min_value=Decimal("0.0001"),
    )
    savings_vs_on_demand = serializers.DecimalField(max_digits=12, decimal_places=4, read_only=True)
    checkpoint_key = serializers.CharField(read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "project",
            "state",
            "workload",
            "accelerator",
            "gpus_per_node",
            "nodes",
            "total_steps",
            "step",
            "expected_hours",
            "checkpoint_gb",
            "checkpoint_every_steps",
            "checkpoint_every_seconds",
            "tolerance",
            "max_price_per_hour",
            "deadline",
            "max_interruptions",
            "max_wait_s",
            "allow_model_parallel",
            "allow_on_demand_fallback",
            "market",
            "pool",
            "cost_so_far",
            "savings_vs_on_demand",
            "estimate",
            "result",
            "checkpoint_key",
            "created_at",
        ]
        read_only_fields = [
            "state",
            "step",
            "market",
            "pool",
            "cost_so_far",
            "estimate",
            "result",
            "created_at",
        ]
        extra_kwargs = {
            # Bounded: jobs run on real capacity now (no pool has more, and a gang larger than
            # this is not something one submission should be able to ask of the fleet).
            "gpus_per_node": {"min_value": 1, "max_value": 64},
            "nodes": {"min_value": 1, "max_value": 256},
            "total_steps": {"min_value": 1, "max_value": 10**9},
            "checkpoint_every_steps": {"min_value": 1, "max_value": 10**9},
            "checkpoint_every_seconds": {"min_value": 1, "max_value": MONTH_S},
            "max_interruptions": {"max_value": 10_000},
            "max_wait_s": {"max_value": MONTH_S},
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            self.fields["project"].queryset = Project.objects.filter(members=request.user)

    def validate_deadline(self, value: Any) -> Any:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("the deadline is in the past")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if (
            attrs.get("checkpoint_every_steps") is None
            and attrs.get("checkpoint_every_seconds") is None
        ):
            attrs["checkpoint_every_seconds"] = DEFAULT_CHECKPOINT_EVERY_SECONDS
        return attrs

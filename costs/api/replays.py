"""`POST /api/replays/`: a job's shape and tolerance replayed over a trace, what-if."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from costs.estimator import MAX_WORK_HOURS
from costs.policies import BALANCED, TOLERANCES
from costs.services import replay_for_user
from costs.what_if import ReplayRefused
from migration.choices import Market
from migration.models import CapacityPool

# An uploaded trace of more ticks than this is refused before it is parsed into a trace (a
# month of 30-second ticks; the shared traces have at most 20,000).
MAX_UPLOADED_TICKS = 100_000
MAX_PRICE_PER_HOUR = 100_000.0


class FiniteFloatField(serializers.FloatField):
    """A float that must be finite: NaN passes min/max checks, so it is refused here."""

    def to_internal_value(self, data: Any) -> float:
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            raise serializers.ValidationError("A finite number is required.")
        return value


class ReplayRequestSerializer(serializers.Serializer):
    """A what-if: the job, its tolerance, and the trace (stored, uploaded, or a pool's own)."""

    trace = serializers.CharField(
        required=False,
        max_length=200,
        help_text="a stored trace, e.g. aws-02-15-2023/us-east-1c_v100_1",
    )
    trace_data = serializers.JSONField(
        required=False,
        help_text='a trace in the shared format: {"metadata": {"gap_seconds": N}, "data": [...]}',
    )
    pool = serializers.PrimaryKeyRelatedField(
        queryset=CapacityPool.objects.filter(market=Market.SPOT).select_related(
            "region", "accelerator"
        ),
        required=False,
        help_text="a spot pool: its prices, and its own history when no trace is given",
    )
    start_hours = FiniteFloatField(required=False, min_value=0, max_value=100_000)
    task_hours = FiniteFloatField(min_value=0.01, max_value=MAX_WORK_HOURS)
    deadline_hours = FiniteFloatField(min_value=0.01, max_value=MAX_WORK_HOURS)
    restart_overhead_hours = FiniteFloatField(required=False, min_value=0, max_value=24)
    tolerance = serializers.ChoiceField(choices=list(TOLERANCES), default=BALANCED)
    nodes = serializers.IntegerField(min_value=1, max_value=256, default=1)
    spot_price = FiniteFloatField(required=False, min_value=0, max_value=MAX_PRICE_PER_HOUR)
    on_demand_price = FiniteFloatField(required=False, min_value=0, max_value=MAX_PRICE_PER_HOUR)
    max_wait_hours = FiniteFloatField(required=False, min_value=0, max_value=MAX_WORK_HOURS)
    max_interruptions = serializers.IntegerField(required=False, min_value=0, max_value=100_000)

    def validate_trace_data(self, value: Any) -> Any:
        data = value.get("data") if isinstance(value, dict) else None
        if isinstance(data, list) and len(data) > MAX_UPLOADED_TICKS:
            raise serializers.ValidationError(
                f"{len(data)} ticks; at most {MAX_UPLOADED_TICKS:,} can be replayed"
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "trace" in attrs and "trace_data" in attrs:
            raise serializers.ValidationError({"trace": "give trace or trace_data, not both"})
        if not ({"trace", "trace_data", "pool"} & set(attrs)):
            raise serializers.ValidationError(
                {"trace": "give a stored trace's name, trace_data, or a spot pool"}
            )
        if attrs["deadline_hours"] < attrs["task_hours"]:
            raise serializers.ValidationError({"deadline_hours": "must be at least task_hours"})
        return attrs


class ReplayView(APIView):
    """Replay the job under its tolerance's policy, next to greedy, always-on-demand and the
    omniscient optimum, with the decisions over time and the regret in dollars."""

    @extend_schema(request=ReplayRequestSerializer, responses={200: dict, 400: dict})
    def post(self, request: Request) -> Response:
        body = ReplayRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            result = replay_for_user(body.validated_data)
        except ReplayRefused as refused:
            return Response({refused.field: [refused.message]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(result.to_dict())

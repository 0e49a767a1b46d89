"""`POST /api/estimates/`: what a job would cost on spot and on-demand, before it launches."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from costs.estimator import EstimateRefused
from costs.services import estimate_job
from jobs.api.serializers import JobSerializer
from jobs.services import build_job


class MarketEstimateSerializer(serializers.Serializer):
    expected_cost = serializers.FloatField(allow_null=True)
    expected_hours = serializers.FloatField(allow_null=True)
    p90_hours = serializers.FloatField(allow_null=True)
    expected_interruptions = serializers.FloatField()
    expected_lost_hours = serializers.FloatField()


class EstimateSerializer(serializers.Serializer):
    spot = MarketEstimateSerializer()
    on_demand = MarketEstimateSerializer()
    recommendation = serializers.ChoiceField(choices=["spot", "on_demand"])
    checkpoint_interval_s = serializers.IntegerField()
    reasons = serializers.ListField(child=serializers.CharField())
    interruption_rate_per_hour = serializers.FloatField()
    interruption_rate_source = serializers.ChoiceField(
        choices=["history", "borrowed", "default", "pool"],
        help_text="history: the pool's own; borrowed: from the most similar pools with history "
        "(interruption_rate_borrowed_from); default: no similar history; pool: set by hand.",
    )
    interruption_rate_borrowed_from = serializers.ListField(child=serializers.CharField())


# The estimator's names of the inputs it refuses, as the job body names them.
JOB_FIELD_OF_INPUT = {
    "work_hours": "expected_hours",
    "deadline_hours": "deadline",
    "checkpoint_gb": "checkpoint_gb",
    "max_wait_hours": "max_wait_s",
}


def refused_response(refused: EstimateRefused) -> Response:
    """A 400 naming the job field behind the input the estimator refused."""
    field = JOB_FIELD_OF_INPUT.get(refused.field, "non_field_errors")
    return Response({field: [refused.message]}, status=status.HTTP_400_BAD_REQUEST)


class EstimateView(APIView):
    """The job body of `POST /api/jobs/`, validated the same way and not saved."""

    @extend_schema(request=JobSerializer, responses={200: EstimateSerializer, 400: dict, 409: dict})
    def post(self, request: Request) -> Response:
        body = JobSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        fields = {k: v for k, v in body.validated_data.items() if k != "project"}
        try:
            result = estimate_job(build_job(request.user, **fields), refuse=True)
        except EstimateRefused as refused:
            return refused_response(refused)
        if result is None:
            return Response(
                {
                    "detail": "no spot or on-demand pool can run this job (hardware, GPUs per "
                    "node or price cap)"
                },
                status=status.HTTP_409_CONFLICT,
            )
        return Response(result.to_dict())

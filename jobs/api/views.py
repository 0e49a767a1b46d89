"""Job endpoints: submit, list, detail, cancel, and the job's timeline, checkpoints,
migrations and logs. Declarations only; the work is in jobs.services and selectors."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs import services
from jobs.api.serializers import JobSerializer
from jobs.models import Job
from migration.api.serializers import (
    CheckpointSerializer,
    LogLineSerializer,
    MigrationSerializer,
    TimelineEventSerializer,
)


class SinceSerializer(serializers.Serializer):
    since = serializers.IntegerField(min_value=0, required=False, default=0)
    limit = serializers.IntegerField(min_value=1, max_value=10000, required=False, default=None)
    rank = serializers.IntegerField(min_value=0, required=False, default=None)


SINCE_PARAMS = [
    OpenApiParameter("since", int, description="Only items with an id above this one."),
    OpenApiParameter("limit", int, description="At most this many items."),
]


def _window(request: Request, items: QuerySet[Any]) -> QuerySet[Any]:
    params = SinceSerializer(data=request.query_params)
    params.is_valid(raise_exception=True)
    items = items.filter(id__gt=params.validated_data["since"]).order_by("id")
    if params.validated_data["rank"] is not None:
        items = items.filter(rank=params.validated_data["rank"])
    limit = params.validated_data["limit"]
    return items[:limit] if limit else items


class JobViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Jobs of the projects you belong to; anyone else's job is a 404."""

    serializer_class = JobSerializer
    filterset_fields = ["state", "project", "market"]

    def get_queryset(self) -> QuerySet[Job]:
        if getattr(self, "swagger_fake_view", False):  # the schema's anonymous request
            return Job.objects.none()
        return Job.objects.visible_to(self.request.user).select_related("accelerator")

    def perform_create(self, serializer: JobSerializer) -> None:  # type: ignore[override]
        serializer.instance = services.submit_job(self.request.user, **serializer.validated_data)

    @extend_schema(request=None, responses={202: JobSerializer, 409: dict})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            outcome = services.cancel_job(job.pk, request.user)
        except services.JobAlreadyFinished as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(
            JobSerializer(outcome.job, context={"request": request}).data,
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(parameters=SINCE_PARAMS, responses=TimelineEventSerializer(many=True))
    @action(detail=True, pagination_class=None)
    def timeline(self, request: Request, pk: str | None = None) -> Response:
        events = _window(request, self.get_object().events.all())
        return Response(TimelineEventSerializer(events, many=True).data)

    @extend_schema(responses=CheckpointSerializer(many=True))
    @action(detail=True, pagination_class=None)
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        """The job's checkpoints with their replicas; what they take in each region's store
        (as retention last measured it) in the Baton-Storage-Bytes and -Regions headers."""
        job = self.get_object()
        items = job.checkpoints.prefetch_related("replicas__region")
        response = Response(CheckpointSerializer(items, many=True).data)
        storage = job.checkpoint_storage or {}
        response["Baton-Storage-Bytes"] = str(storage.get("bytes", 0))
        response["Baton-Storage-Regions"] = ", ".join(
            f"{region}={size}" for region, size in sorted((storage.get("regions") or {}).items())
        )
        return response

    @extend_schema(responses=MigrationSerializer(many=True))
    @action(detail=True, pagination_class=None)
    def migrations(self, request: Request, pk: str | None = None) -> Response:
        return Response(MigrationSerializer(self.get_object().migrations.all(), many=True).data)

    @extend_schema(
        parameters=[*SINCE_PARAMS, OpenApiParameter("rank", int, description="Only this rank.")],
        responses=LogLineSerializer(many=True),
    )
    @action(detail=True, pagination_class=None)
    def logs(self, request: Request, pk: str | None = None) -> Response:
        lines = _window(request, self.get_object().log_lines.all())
        return Response(LogLineSerializer(lines, many=True).data)

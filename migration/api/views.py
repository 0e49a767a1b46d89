"""Pool and instance endpoints. Pools are readable by every signed-in user; instances only
for jobs you can see (staff see all)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.models import Job
from migration.api.serializers import InstanceSerializer, InterruptSerializer, PoolSerializer
from migration.interruptions import InstanceNotRunning, interrupt_instance
from migration.models import CapacityPool, Instance


class PoolViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = PoolSerializer
    pagination_class = None
    filterset_fields = ["market", "region__code", "accelerator__name", "backend"]

    def get_queryset(self) -> QuerySet[CapacityPool]:
        return (
            CapacityPool.objects.with_free()
            .with_mean_price()
            .filter(enabled=True)
            .select_related("region", "accelerator", "spot_history")
        )


class InstanceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = InstanceSerializer
    filterset_fields = ["job", "state", "pool"]

    def get_queryset(self) -> QuerySet[Instance]:
        jobs = Job.objects.visible_to(self.request.user)
        return Instance.objects.filter(job__in=jobs).select_related("pool").order_by("-id")

    @extend_schema(request=InterruptSerializer, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def interrupt(self, request: Request, pk: str | None = None) -> Response:
        """Staff: interrupt a running instance with a two-level notice (advance notice now when
        `advance_notice_s` > 0, the final notice that many seconds later, the reclaim
        `final_window_s` after it). 409 when the instance is not running."""
        instance = self.get_object()
        body = InterruptSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            instance = interrupt_instance(
                instance.pk,
                advance_notice_s=body.validated_data.get(
                    "advance_notice_s", instance.pool.advance_notice_s
                ),
                final_window_s=body.validated_data.get(
                    "final_window_s", instance.pool.final_window_s
                ),
                source="manual",
            )
        except InstanceNotRunning as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(InstanceSerializer(instance).data, status=status.HTTP_202_ACCEPTED)

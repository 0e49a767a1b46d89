"""Pool and instance endpoints. Pools are readable by every signed-in user; instances only
for jobs you can see (staff see all)."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import viewsets

from jobs.models import Job
from migration.api.serializers import InstanceSerializer, PoolSerializer
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
            .select_related("region", "accelerator")
        )


class InstanceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = InstanceSerializer
    filterset_fields = ["job", "state", "pool"]

    def get_queryset(self) -> QuerySet[Instance]:
        jobs = Job.objects.visible_to(self.request.user)
        return Instance.objects.filter(job__in=jobs).order_by("-id")

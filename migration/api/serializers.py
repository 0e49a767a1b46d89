"""Shapes of pools, instances, timeline events, checkpoints, migrations and log lines
(DESIGN §9: fields may be added, never renamed)."""

from __future__ import annotations

from rest_framework import serializers

from costs.selectors import rate_source
from migration.choices import Market
from migration.models import (
    CapacityPool,
    Checkpoint,
    CheckpointReplica,
    Instance,
    LogLine,
    Migration,
    TimelineEvent,
)


class PoolSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")
    accelerator = serializers.CharField(source="accelerator.name")
    free = serializers.IntegerField(read_only=True)
    mean_price_per_hour = serializers.FloatField(read_only=True, allow_null=True)
    mean_time_between_interruptions_hours = serializers.SerializerMethodField()
    interruption_rate_source = serializers.SerializerMethodField(
        help_text="history, borrowed (interruption_rate_borrowed_from), default, or pool (set "
        "on the pool by hand); null for on-demand"
    )
    interruption_rate_borrowed_from = serializers.SerializerMethodField()

    def _rate_source(self, pool: CapacityPool) -> tuple[str, list[str]] | None:
        if pool.market != Market.SPOT:
            return None
        history = getattr(pool, "spot_history", None)
        return rate_source(history, pool.interruption_rate_per_hour)

    def get_interruption_rate_source(self, pool: CapacityPool) -> str | None:
        found = self._rate_source(pool)
        return found[0] if found else None

    def get_interruption_rate_borrowed_from(self, pool: CapacityPool) -> list[str]:
        found = self._rate_source(pool)
        return found[1] if found else []

    def get_mean_time_between_interruptions_hours(self, pool: CapacityPool) -> float | None:
        rate = pool.interruption_rate_per_hour
        return round(1 / rate, 3) if rate > 0 else None

    class Meta:
        model = CapacityPool
        fields = [
            "id",
            "region",
            "zone",
            "instance_type",
            "accelerator",
            "gpus_per_instance",
            "market",
            "price_per_hour",
            "capacity",
            "free",
            "interruption_rate_per_hour",
            "interruption_rate_source",
            "interruption_rate_borrowed_from",
            "mean_time_between_interruptions_hours",
            "mean_price_per_hour",
            "last_preempted_at",
            "backend",
            "advance_notice_s",
            "final_window_s",
            "provisioning_delay_s",
        ]


class InterruptSerializer(serializers.Serializer):
    """Body of POST /api/instances/{id}/interrupt/: the two-level notice to simulate (the
    pool's own windows when omitted)."""

    advance_notice_s = serializers.FloatField(min_value=0, max_value=3600, required=False)
    final_window_s = serializers.FloatField(min_value=0, max_value=3600, required=False)


class InstanceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Instance
        fields = [
            "id",
            "job",
            "rank",
            "pool",
            "state",
            "awareness_abnormal",
            "last_heartbeat",
            "started_at",
            "ended_at",
            "advance_notice_at",
            "final_notice_at",
            "reclaim_at",
        ]


class TimelineEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = TimelineEvent
        fields = ["id", "job", "migration", "kind", "at", "data"]


class ReplicaSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")

    class Meta:
        model = CheckpointReplica
        fields = ["region", "status", "bytes", "completed_at"]


class CheckpointSerializer(serializers.ModelSerializer):
    replicas = ReplicaSerializer(many=True, read_only=True)

    class Meta:
        model = Checkpoint
        fields = [
            "id",
            "step",
            "kind",
            "status",
            "bytes_total",
            "bytes_new",
            "created_at",
            "manifest_key",
            "validation_reference",
            "replicas",
        ]


class MigrationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Migration
        fields = [
            "id",
            "trigger",
            "from_pool",
            "to_pool",
            "phase",
            "lost_steps",
            "started_at",
            "finished_at",
            "timings",
            "validation",
        ]


class LogLineSerializer(serializers.ModelSerializer):
    class Meta:
        model = LogLine
        fields = ["id", "rank", "instance", "at", "line"]

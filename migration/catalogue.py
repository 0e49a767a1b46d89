"""The demo catalogue: regions, accelerators, the compatibility matrix and capacity pools,
built from the real data in `data/` (AWS instance types and a spot price snapshot).
Idempotent: running it again updates in place. Pools' interruption rates and spot prices are
derived from history afterwards (costs.services), so a re-seed never overwrites them.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.db import transaction

from costs.history import latest_prices, read_spot_price_rows
from migration.choices import Backend, Market, RuleKind
from migration.models import Accelerator, CapacityPool, CompatibilityRule, Region, RegionLatency

logger = logging.getLogger(__name__)

REGIONS = {
    "us-east-1": ("US East (N. Virginia)", "use1", Decimal("1.00")),
    "us-west-2": ("US West (Oregon)", "usw2", Decimal("1.00")),
    "eu-west-1": ("Europe (Ireland)", "euw1", Decimal("1.10")),  # list prices ~10% above
}
# Typical round trips between the regions, in milliseconds.
LATENCIES_MS = {
    ("us-east-1", "us-west-2"): 65,
    ("us-east-1", "eu-west-1"): 70,
    ("us-west-2", "eu-west-1"): 130,
}

RULES = [
    # (source: what the job asked for, target, kind, target_count, operators, memory, comms)
    (
        "V100-16GB",
        "V100-32GB",
        RuleKind.LARGER_MEMORY,
        1,
        "identical (same Volta cores)",
        "same layout, headroom unused",
        "none",
    ),
    (
        "T4",
        "A10G",
        RuleKind.CROSS_GENERATION,
        1,
        "CUDA kernels built for sm_75 run on sm_86",
        "24 GiB instead of 16 GiB",
        "none",
    ),
    ("K80", "T4", RuleKind.CROSS_GENERATION, 1, "sm_37 code recompiled for sm_75", "", "none"),
    ("M60", "T4", RuleKind.CROSS_GENERATION, 1, "sm_52 code recompiled for sm_75", "", "none"),
    (
        "V100-16GB",
        "A100-40GB",
        RuleKind.CROSS_GENERATION,
        1,
        "TF32 off to keep V100 numerics",
        "40 GiB instead of 16 GiB",
        "NCCL over NVSwitch",
    ),
    (
        "V100-32GB",
        "V100-16GB",
        RuleKind.MODEL_PARALLEL,
        2,
        "identical",
        "model split in two 16 GiB halves",
        "NCCL tensor parallel over NVLink",
    ),
    (
        "A10G",
        "T4",
        RuleKind.MODEL_PARALLEL,
        2,
        "sm_86 kernels rebuilt for sm_75",
        "model split in two 16 GiB halves",
        "NCCL over PCIe",
    ),
]

INSTANCE_TYPES = "aws-gpu-instance-types.tsv"
SPOT_PRICES = "aws-gpu-spot-prices-2022-05-31.tsv"
TRACES = "spot-traces"

# Local backend: short windows so a demo interruption plays out in seconds. A pool created by
# hand gets the model's defaults, AWS's: a two-minute final window, a minute to provision.
LOCAL_NOTICE = {"advance_notice_s": 5, "final_window_s": 20, "provisioning_delay_s": 2.0}


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    accelerator: str
    generation: str
    memory_gib: int
    compute_capability: Decimal
    interconnect: str
    on_demand_price: Decimal


def read_instance_types(path: Path) -> dict[str, InstanceType]:
    with path.open(newline="") as handle:
        return {
            row["instance_type"]: InstanceType(
                row["instance_type"],
                int(row["gpus"]),
                row["accelerator"],
                row["generation"],
                int(row["gpu_memory_gib"]),
                Decimal(row["compute_capability"]),
                row["interconnect"],
                Decimal(row["on_demand_usd_per_hour_us_east_1"]),
            )
            for row in csv.DictReader(handle, delimiter="\t")
        }


def capacity_for(gpus: int, market: str) -> int:
    """Small pools, so waiting can be seen: 4 single-GPU spot instances, fewer of the rest."""
    if gpus == 1:
        return 4 if market == Market.SPOT else 3
    return 3 if gpus <= 4 and market == Market.SPOT else 2


@transaction.atomic
def seed_catalogue(data_dir: Path | None = None) -> dict[str, int]:
    """Create or update the whole demo catalogue; returns counts of what it holds."""
    data_dir = data_dir or settings.BATON_DATA_DIR
    types = read_instance_types(data_dir / INSTANCE_TYPES)
    prices = latest_prices(read_spot_price_rows(data_dir / SPOT_PRICES))

    regions = {
        code: Region.objects.update_or_create(code=code, defaults={"name": name})[0]
        for code, (name, _, _) in REGIONS.items()
    }
    for (a, b), ms in LATENCIES_MS.items():
        for source, target in ((a, b), (b, a)):
            RegionLatency.objects.update_or_create(
                source=regions[source], target=regions[target], defaults={"milliseconds": ms}
            )
    accelerators: dict[str, Accelerator] = {}
    for it in types.values():
        accelerators[it.accelerator] = Accelerator.objects.update_or_create(
            name=it.accelerator,
            defaults={
                "generation": it.generation,
                "memory_gib": it.memory_gib,
                "compute_capability": it.compute_capability,
                "interconnect": it.interconnect,
            },
        )[0]
    for source, target, kind, count, operators, memory, comms in RULES:
        CompatibilityRule.objects.update_or_create(
            source=accelerators[source],
            target=accelerators[target],
            target_count=count,
            defaults={
                "kind": kind,
                "operator_compatibility": operators,
                "memory_mapping": memory,
                "communication_adaptation": comms,
            },
        )

    pools = 0
    for code, (_, prefix, factor) in REGIONS.items():
        region_types: set[str] = set()
        for (zone, type_name), price in sorted(prices.items()):
            if not zone.startswith(prefix + "-") or type_name not in types:
                continue
            it = types[type_name]
            region_types.add(type_name)
            fixed = {
                "accelerator": accelerators[it.accelerator],
                "gpus_per_instance": it.gpus,
                "backend": Backend.LOCAL,
                "capacity": capacity_for(it.gpus, Market.SPOT),
                **LOCAL_NOTICE,
            }
            CapacityPool.objects.update_or_create(
                region=regions[code],
                zone=zone,
                instance_type=type_name,
                market=Market.SPOT,
                defaults=fixed,
                # Price and interruption rate are derived from history later: set them only
                # when the pool is new, so a re-seed never overwrites what history says.
                create_defaults={
                    **fixed,
                    "price_per_hour": price,
                    "interruption_rate_per_hour": settings.BATON_DEFAULT_INTERRUPTION_RATE,
                },
            )
            pools += 1
        for type_name in sorted(region_types):
            it = types[type_name]
            CapacityPool.objects.update_or_create(
                region=regions[code],
                zone="",
                instance_type=type_name,
                market=Market.ON_DEMAND,
                defaults={
                    "accelerator": accelerators[it.accelerator],
                    "gpus_per_instance": it.gpus,
                    "backend": Backend.LOCAL,
                    "price_per_hour": (it.on_demand_price * factor).quantize(Decimal("0.0001")),
                    "capacity": capacity_for(it.gpus, Market.ON_DEMAND),
                    "interruption_rate_per_hour": 0.0,
                    **LOCAL_NOTICE,
                },
            )
            pools += 1
    return {
        "regions": len(regions),
        "accelerators": len(accelerators),
        "rules": CompatibilityRule.objects.count(),
        "pools": pools,
    }

"""Importing traces and prices into history, and the pools' figures derived from it."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from costs import services
from costs.models import AvailabilitySample, PriceSample, SpotPoolHistory
from migration.models import CapacityPool
from portal.embedded_redis import free_port

pytestmark = pytest.mark.django_db
DATA = Path(settings.BATON_DATA_DIR)


@pytest.fixture
def seeded(catalogue: Any) -> None:
    from migration.catalogue import seed_catalogue

    seed_catalogue()


def independent_rate(files: list[Path], hours: float = 168.0) -> float:
    """Preemptions per hour of held spot over the last `hours` of each file, straight from the
    JSON, pooled over `files`."""
    preemptions = held_hours = 0.0
    for path in files:
        payload = json.loads(path.read_text())
        ticks = math.ceil(hours * 3600 / payload["metadata"]["gap_seconds"])
        data = np.array(payload["data"])[-ticks:]
        preemptions += np.count_nonzero((data[:-1] == 0) & (data[1:] == 1))
        held_hours += np.count_nonzero(data == 0) * payload["metadata"]["gap_seconds"] / 3600
    return preemptions / held_hours


def test_traces_become_runs_and_feed_the_pools_interruption_rate(seeded: None) -> None:
    report = services.import_spot_traces(DATA / "spot-traces")

    east = sorted((DATA / "spot-traces").rglob("us-east-1*.json"))
    pool = CapacityPool.objects.filter(
        region__code="us-east-1", accelerator__name="V100-16GB", market="spot"
    ).first()
    assert report.imported == 11 and len(report.skipped) == 2  # us-east-2 is not a demo region
    assert pool is not None
    assert pool.interruption_rate_per_hour == pytest.approx(independent_rate(east), abs=1e-4)
    assert AvailabilitySample.objects.count() < 5000  # runs, not 250,000 ticks


def test_runs_keep_every_tick_of_a_trace(seeded: None) -> None:
    from costs.history import Run, trace_from_runs
    from costs.traces import load_trace

    path = DATA / "spot-traces/preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json"
    services.import_spot_traces(path.parent)
    samples = AvailabilitySample.objects.filter(trace="aws-04-22-2023/us-west-2b_v100_1")
    rebuilt = trace_from_runs(
        "t", "us-west-2", "V100-16GB", 32, [Run(0, s.ticks, s.available) for s in samples]
    )

    assert np.array_equal(rebuilt.unavailable, load_trace(path).unavailable)
    first = samples.first()
    assert first is not None and first.at.isoformat().startswith("2023-04-22")


def test_importing_again_replaces_instead_of_doubling(seeded: None) -> None:
    folder = DATA / "spot-traces/preemption"
    services.import_spot_traces(folder)
    count = AvailabilitySample.objects.count()

    services.import_spot_traces(folder)

    assert AvailabilitySample.objects.count() == count


def _history(region: str, accelerator: str) -> SpotPoolHistory:
    found = SpotPoolHistory.objects.filter(
        pool__region__code=region, pool__accelerator__name=accelerator
    ).first()
    assert found is not None, f"no spot pool of {accelerator} in {region}"
    assert found.pool.interruption_rate_per_hour == found.interruption_rate_per_hour
    return found


def test_pools_without_history_borrow_from_the_most_similar_and_say_so(seeded: None) -> None:
    services.import_spot_traces(DATA / "spot-traces")

    own = _history("us-east-1", "V100-16GB")
    assert (own.source, own.borrowed_from) == ("history", [])
    assert own.mean_outage_hours > 0 and own.uptime_cv > 1 and own.history_hours > 0
    # Same card family in the same region first.
    larger = _history("us-east-1", "V100-32GB")
    assert (larger.source, larger.borrowed_from) == ("borrowed", ["V100-16GB in us-east-1"])
    assert larger.interruption_rate_per_hour == own.interruption_rate_per_hour
    # No V100 history in Europe: the same card elsewhere.
    europe = _history("eu-west-1", "V100-16GB")
    assert europe.source == "borrowed"
    assert europe.borrowed_from == ["V100-16GB in us-east-1", "V100-16GB in us-west-2"]
    # A T4 borrows from its region's other cards; in a region without any trace, the default.
    t4 = _history("us-east-1", "T4")
    assert (t4.source, t4.borrowed_from) == ("borrowed", ["V100-16GB in us-east-1"])
    nothing = _history("eu-west-1", "T4")
    assert (nothing.source, nothing.borrowed_from) == ("default", [])
    assert nothing.interruption_rate_per_hour == settings.BATON_DEFAULT_INTERRUPTION_RATE


def test_a_multi_node_trace_without_a_known_name_is_stored_per_node(
    seeded: None, tmp_path: Path
) -> None:
    path = tmp_path / "our-cluster.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [0, 2, 0, 1, 0]}))
    with pytest.raises(CommandError, match="its name says no region or card"):
        call_command("import_spot_traces", str(path), "--start", "2024-01-01")
    call_command(
        "import_spot_traces",
        str(path),
        "--region",
        "eu-west-1",
        "--accelerator",
        "T4",
        "--start",
        "2024-01-01",
    )

    names = set(AvailabilitySample.objects.values_list("trace", flat=True))
    assert names == {f"{tmp_path.name}/our-cluster#1", f"{tmp_path.name}/our-cluster#2"}
    t4 = _history("eu-west-1", "T4")
    assert t4.source == "history"
    assert t4.interruption_rate_per_hour == pytest.approx(3 / 7, abs=1e-4)


def test_the_commands_name_the_problem_with_bad_input(seeded: None, tmp_path: Path) -> None:
    (tmp_path / "prices.tsv").write_text("zone\tprice\nuse1-az1\t0.5\n")
    (tmp_path / "aws-01-01-2024").mkdir()
    (tmp_path / "aws-01-01-2024" / "us-east-1a_v100_1.json").write_text('{"data": [0, 1]}')

    with pytest.raises(CommandError, match="no trace files"):
        call_command("import_spot_traces", str(tmp_path / "empty"))
    with pytest.raises(CommandError, match="missing column"):
        call_command("import_spot_prices", str(tmp_path / "prices.tsv"))
    with pytest.raises(CommandError, match="gap_seconds"):
        call_command("import_spot_traces", str(tmp_path / "aws-01-01-2024"))


def test_prices_are_stored_per_pool_and_the_latest_becomes_the_pools_price(
    seeded: None, tmp_path: Path
) -> None:
    tsv = tmp_path / "later.tsv"
    tsv.write_text(
        "az_id\tinstance_type\tproduct\tspot_price_usd_per_hour\ttimestamp\n"
        "use1-az2\tp3.2xlarge\tLinux/UNIX\t0.950000\t2022-06-01T10:00:00+00:00\n"
        "use1-az2\tp3.2xlarge\tLinux/UNIX\t0.990000\t2022-06-01T12:00:00+00:00\n"
        "apne1-az1\tp3.2xlarge\tLinux/UNIX\t1.000000\t2022-06-01T12:00:00+00:00\n"
    )

    services.import_spot_prices(DATA / "aws-gpu-spot-prices-2022-05-31.tsv")
    report = services.import_spot_prices(tsv)

    pool = CapacityPool.objects.get(zone="use1-az2", instance_type="p3.2xlarge", market="spot")
    assert report.imported == 2 and "1 zone/instance types with no pool" in report.skipped[0]
    assert pool.price_per_hour == Decimal("0.9900")
    assert PriceSample.objects.filter(pool=pool).count() == 3


@pytest.fixture
def moto_ec2(tmp_path: Path, monkeypatch: Any, settings: Any) -> Iterator[str]:
    """moto's server mode standing in for the EC2 control plane."""
    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            break
        except OSError:
            assert time.monotonic() < end, "moto_server did not start"
            time.sleep(0.2)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings.BATON_EC2_ENDPOINT = url
    yield url
    proc.terminate()
    proc.wait(10)


def test_the_refresh_pulls_spot_prices_from_aws_mapped_to_zone_ids(
    seeded: None, moto_ec2: str
) -> None:
    outcome = services.refresh_spot_prices_from_aws()

    stored = PriceSample.objects.filter(source="aws")
    assert outcome.startswith("stored") and stored.exists()
    assert set(stored.values_list("pool__zone", flat=True)) <= set(
        CapacityPool.objects.values_list("zone", flat=True)
    )
    assert all(
        zone.split("-")[1].startswith("az") for zone in stored.values_list("pool__zone", flat=True)
    )


def test_the_refresh_does_nothing_without_credentials(
    seeded: None, monkeypatch: Any, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    assert services.refresh_spot_prices_from_aws() == "skipped: no AWS credentials configured"
    assert not PriceSample.objects.exists()


def test_copying_the_data_keeps_the_dataset_date(tmp_path: Path) -> None:
    from costs.history import trace_start

    target = tmp_path / "aws-04-22-2023" / "us-east-1c_v100_1.json"
    target.parent.mkdir()
    shutil.copy(
        DATA / "spot-traces/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json", target
    )

    assert trace_start(target).isoformat() == "2023-04-22T00:00:00+00:00"

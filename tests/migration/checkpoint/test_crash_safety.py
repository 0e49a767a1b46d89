"""Crash safety: a killed writer, a damaged chunk, and an S3 store that vanishes mid-upload."""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from migration.checkpoint import LocalStore, SaveCancelled, StoreUnavailable, open_store
from migration.checkpoint.s3 import S3Store

from .conftest import TEST_CHUNK, new_s3_store
from .procs import Proc, python
from .s3server import BUCKET, FlakyProxy, S3Server
from .test_store_contract import newest

WRITER = """
import sys
import numpy as np
from migration.checkpoint import LocalStore

store = LocalStore(sys.argv[1], chunk_size=1 << 20)
latest = store.latest("job-k")
step = latest.step + 1 if latest else 1
while True:
    # Every chunk differs at every step, so every save writes all of them.
    state = {"w": np.arange(12 << 20, dtype=np.float32) + step, "step": step}
    print(f"saving step={step}", flush=True)
    store.save("job-k", step, state)
    print(f"saved step={step}", flush=True)
    step += 1
"""


SAVING = re.compile(r"^saving step=(\d+)$")


def expected_w(step: int) -> np.ndarray:
    return np.arange(12 << 20, dtype=np.float32) + step


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_as_latest(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = tmp_path / "store"
    rng = random.Random(7)
    previous_kept = 0
    for _ in range(3):
        proc = Proc(python(str(script), str(root)), {"PYTHONPATH": str(Path.cwd())})
        first = int(proc.wait_for(r"saved step=(\d+)").group(1))
        proc.wait_for(rf"saving step=({first + 1})")
        time.sleep(rng.uniform(0.0, 0.15))  # somewhere inside the 48 MiB save
        proc.kill()
        assert proc.finish() == -signal.SIGKILL
        # The save the kill interrupted (on a loaded machine, maybe a later one than above).
        saving = max(int(m.group(1)) for line in proc.stdout if (m := SAVING.match(line)))
        store = LocalStore(root)
        latest = store.latest("job-k")
        assert latest is not None and latest.step in (saving - 1, saving)
        previous_kept += latest.step == saving - 1
        store.verify(latest)
        loaded = store.load(latest)
        assert loaded.state["step"] == latest.step
        assert np.array_equal(loaded.state["w"], expected_w(latest.step))
    assert previous_kept >= 1  # at least one kill landed inside a save
    # Temporaries the killed writers left behind are invisible and collected.
    store = LocalStore(root)
    store.gc("job-k", keep=1, grace_s=0)
    leftovers = [p for p in (root / "chunks").rglob("*") if p.name.startswith(".")]
    assert leftovers == []
    store.verify(newest(store, "job-k"))


def _proxied_store(server: S3Server, proxy: FlakyProxy, prefix: str, **options: object) -> S3Store:
    store = open_store(f"s3://{BUCKET}/{prefix}", endpoint=proxy.endpoint, **options)
    assert isinstance(store, S3Store)
    return store


def test_an_upload_cut_off_mid_way_is_retried_and_commits_intact(s3_env: S3Server) -> None:
    proxy = FlakyProxy(int(s3_env.endpoint.rsplit(":", 1)[1]))
    prefix = f"flaky-{random.randrange(1 << 30)}"
    store = _proxied_store(
        s3_env, proxy, prefix, chunk_size=TEST_CHUNK, retry_seconds=30, workers=4
    )
    state = {"w": np.random.default_rng(3).random(24 * TEST_CHUNK // 4, dtype=np.float32)}

    def partition() -> None:
        while proxy.bytes_up < 6 * TEST_CHUNK:
            time.sleep(0.005)
        proxy.cut()
        time.sleep(1.0)
        proxy.heal()

    cutter = threading.Thread(target=partition)
    cutter.start()
    try:
        result = store.save("job-f", 1, state)
    finally:
        cutter.join()
        proxy.close()
    assert proxy.dropped > 0  # the partition really hit the upload
    direct = new_s3_store(s3_env, prefix)
    assert direct.latest("job-f") == result.ref
    direct.verify(result.ref)
    assert np.array_equal(direct.load(result.ref).state["w"], state["w"])
    store.close()
    direct.close()


def test_an_outage_longer_than_the_retry_budget_commits_nothing(s3_env: S3Server) -> None:
    proxy = FlakyProxy(int(s3_env.endpoint.rsplit(":", 1)[1]))
    prefix = f"down-{random.randrange(1 << 30)}"
    store = _proxied_store(
        s3_env, proxy, prefix, chunk_size=TEST_CHUNK, retry_seconds=1.0, workers=4
    )
    previous = store.save("job-f", 1, {"w": np.zeros(2 * TEST_CHUNK // 4, np.float32)})
    state = {"w": np.random.default_rng(4).random(16 * TEST_CHUNK // 4, dtype=np.float32)}

    def outage() -> None:
        start = proxy.bytes_up
        while proxy.bytes_up < start + 4 * TEST_CHUNK:
            time.sleep(0.005)
        proxy.cut()

    cutter = threading.Thread(target=outage)
    cutter.start()
    with pytest.raises((StoreUnavailable, SaveCancelled)):
        store.save("job-f", 2, state)
    cutter.join()
    proxy.close()
    direct = new_s3_store(s3_env, prefix)
    assert direct.list("job-f") == [previous.ref]
    direct.verify(previous.ref)
    store.close()
    direct.close()

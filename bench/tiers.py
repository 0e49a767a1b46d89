"""Two-tier checkpoint benchmark: what asynchronous checkpoints through the instance's local disk
cost the training loop, and how fast an emergency checkpoint reaches the region's store.

    .venv/bin/python bench/tiers.py [--sizes 1024] [--repeats 5] [--train-mb 32] [--every-s 0.75]
        [--sections loop,emergency,reuse]

- loop: a numpy MLP whose `--train-mb` state changes entirely at every step trains in blocks
  of four checkpoint intervals of about `--every-s` seconds, three ways taking turns (the order
  rotating every repetition): without checkpoints (the baseline), with two tiers (a local
  folder, then a real S3 server, SeaweedFS, as the region's store, uploaded in the background)
  and with every periodic save going straight to that S3 store (one tier, the SDK without
  BATON_LOCAL_STORE_URL). A block's time stops at its last step; the persist and the uploads
  still running then are waited for outside it, so each block starts from the same point. The
  S3 server runs on the same machine, so its own CPU time is charged to the loop here, which
  a remote store would not do. Two more rows give the part of each block spent in the calls
  that saved (the snapshot, and any wait for the previous persist), two tiers against one.
- emergency: a state of each of `--sizes` MiB is checkpointed periodically with two tiers (the
  upload of that checkpoint is under way), changed entirely, then the final notice comes: the
  time from the notice at a step boundary to the emergency checkpoint committed in the region's
  store (a local folder, and S3), against a 30 s notice window, and against the raw write of the
  same bytes to the same place in the same run (one fsynced file; 16 MiB objects put by 8
  threads on S3).

- reuse: the upload of a checkpoint whose `--reuse-chunks` chunks are all in the S3 store
  already (a frozen base saved again), by the store that committed and checked the previous one:
  the check after its commit lists gc's trash and asks whether that earlier manifest is still
  up, against the same save from the same store with its checked commits forgotten, which asks
  about every reused chunk (decision 005), taking turns. Then the first such save from a store
  opened anew (as after a migration) that restored the newest checkpoint first, against one
  that did not, which asks about every chunk before reusing it and again after its commit.

    .venv/bin/python bench/tiers.py --sections reuse [--reuse-chunks 256] [--repeats 9]

Every row prints min / median / max over `--repeats` and the median of its per-repetition
ratios to the baseline measured in the same run. `rows(args, work)` returns the loop and
emergency rows for bench/replication.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The training loop computes with one BLAS thread, as the host side of an accelerator job does;
# the other core is what checkpoint I/O may use. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loop import TrainingLoop  # noqa: E402
from bench.table import Row, print_machine, print_table, sections  # noqa: E402
from migration.checkpoint import LocalStore, Store, open_store  # noqa: E402
from migration.checkpoint.s3 import S3Store  # noqa: E402
from migration.checkpoint.sdk import Checkpointer  # noqa: E402

MIB = 1024 * 1024
WINDOW_S = 30.0
BUCKET = "baton-bench"
INTERVALS_PER_BLOCK = 4
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "baton-bench",
    "AWS_SECRET_ACCESS_KEY": "baton-bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
DEFAULTS = {"sizes": "1024", "repeats": 5, "train_mb": 32.0, "every_s": 0.75}
SECTIONS = ("loop", "emergency", "reuse")
# The reuse section's chunks are small: the check's cost is per chunk, whatever its size.
REUSE_CHUNK = 256 * 1024


def option(args: argparse.Namespace, name: str) -> Any:
    """An option of this bench, with its default when the caller (bench/replication.py) has
    other options."""
    return getattr(args, name, DEFAULTS[name])


@contextmanager
def s3_server(work: Path) -> Iterator[Any]:
    """A SeaweedFS S3 server on loopback (the one the test suite uses) with the bench bucket."""
    from tests.migration.checkpoint.s3server import S3Server

    os.environ.update(S3_ENV)
    server = S3Server(fresh(work / "weed"))
    server.start()
    try:
        store = s3_store(server)
        store.ensure_bucket()
        store.close()
        yield server
    finally:
        server.stop()


def s3_store(server: Any) -> S3Store:
    """A store under a fresh prefix of the bench bucket."""
    store = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}", endpoint=server.endpoint)
    assert isinstance(store, S3Store)
    return store


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def checkpointer(region: Store, local: Store | None, job: str) -> Checkpointer:
    return Checkpointer(
        region,
        job=job,
        local_store=local,
        every_steps=None,
        every_seconds=None,
        install_signal_handlers=False,
    )


def settle(ckpt: Checkpointer) -> None:
    """Wait for the persist in flight and the upload of the newest local commit."""
    ckpt.wait()
    if ckpt.uploader is not None:
        ckpt.uploader.drain()


# ---- the training loop --------------------------------------------------------------------------


def loop_rows(args: argparse.Namespace, work: Path, server: Any) -> list[Row]:
    loop = TrainingLoop(float(option(args, "train_mb")))
    repeats = int(option(args, "repeats"))
    two_tiers = checkpointer(s3_store(server), LocalStore(fresh(work / "local")), "tiers")
    one_tier = checkpointer(s3_store(server), None, "direct")

    def block(ckpt: Checkpointer | None, steps: int) -> tuple[float, float]:
        """Seconds of a block, and of those the seconds spent in calls that saved."""
        timed = loop.block(ckpt, INTERVALS_PER_BLOCK, steps)
        if ckpt is not None:
            settle(ckpt)
        return timed.seconds, timed.blocked

    rate = loop.steps_per_second()
    steps = max(5, round(rate * float(option(args, "every_s"))))
    contenders: dict[str, Checkpointer | None] = {
        "none": None,
        "two tiers": two_tiers,
        "one tier": one_tier,
    }
    for ckpt in contenders.values():  # unmeasured: allocates the snapshot buffers
        block(ckpt, steps)
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    blocked: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for i in range(repeats):
        for name in names[i % 3 :] + names[: i % 3]:
            total, in_saves = block(contenders[name], steps)
            seconds[name].append(total)
            blocked[name].append(in_saves)
    assert two_tiers.uploader is not None
    skipped = two_tiers.uploader.uploads_skipped
    uploaded = two_tiers.uploader.uploads_done
    for ckpt in (two_tiers, one_tier):
        ckpt.close()
        ckpt.store.close()
        if ckpt.local_store is not None:
            ckpt.local_store.close()
    print(
        f"loop: {option(args, 'train_mb'):g} MiB state changing at every step, a checkpoint "
        f"every {steps} steps (~{steps / rate:.2f} s without checkpoints), blocks of "
        f"{INTERVALS_PER_BLOCK} intervals; two tiers uploaded {uploaded} checkpoints and "
        f"skipped {skipped} for a newer one"
    )

    def against_none(name: str) -> list[float]:
        return [a / b for a, b in zip(seconds[name], seconds["none"], strict=True)]

    per_block = f"s per {INTERVALS_PER_BLOCK * steps} steps"
    return [
        Row(f"no checkpoints ({per_block}, baseline)", seconds["none"], [1.0] * repeats),
        Row("two tiers: local disk, then S3", seconds["two tiers"], against_none("two tiers")),
        Row("one tier: straight to S3", seconds["one tier"], against_none("one tier")),
        Row(
            "  of which at checkpoints, two tiers",
            blocked["two tiers"],
            ratios(blocked["two tiers"], blocked["one tier"]),
        ),
        Row("  of which at checkpoints, one tier (base)", blocked["one tier"], [1.0] * repeats),
    ]


# ---- the emergency checkpoint -------------------------------------------------------------------


def make_state(mib: int) -> dict[str, np.ndarray]:
    """`mib` MiB of float32 in 64 MiB tensors (the last one smaller)."""
    rng = np.random.default_rng(mib)
    sizes = [64] * (mib // 64) + ([mib % 64] if mib % 64 else [])
    return {f"layer{i}": rng.random(n * MIB // 4, dtype=np.float32) for i, n in enumerate(sizes)}


def raw_folder_write(state: dict[str, np.ndarray], folder: Path) -> float:
    """The same bytes written to one file in `folder` and fsynced."""
    path = folder / "raw.bin"
    started = time.perf_counter()
    with path.open("wb") as out:
        for array in state.values():
            out.write(array.data.cast("B"))
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def raw_s3_write(state: dict[str, np.ndarray], server: Any) -> float:
    """The same bytes put as 16 MiB objects by 8 threads (the store's own parallelism)."""
    store = s3_store(server)
    client, bucket, prefix = store._client, store.bucket, store.prefix
    pieces = [
        array.data.cast("B")[offset : offset + 16 * MIB]
        for array in state.values()
        for offset in range(0, array.nbytes, 16 * MIB)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda item: client.put_object(
                    Bucket=bucket, Key=f"{prefix}/raw/{item[0]}", Body=bytes(item[1])
                ),
                enumerate(pieces),
            )
        )
    seconds = time.perf_counter() - started
    client.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": f"{prefix}/raw/{i}"} for i in range(len(pieces))]},
    )
    store.close()
    return seconds


def emergency_seconds(state: dict[str, np.ndarray], region: Store, local: Store) -> float:
    """A periodic two-tier checkpoint (its upload under way), the state changed entirely, then
    the final notice: seconds from the notice to the emergency checkpoint in the region."""
    ckpt = checkpointer(region, local, "emergency")
    ckpt.request_checkpoint()
    ckpt.maybe_save(1, state)
    ckpt.wait()  # the local write; the upload goes on
    for array in state.values():
        array += 1.0
    ckpt.request_stop()
    started = time.perf_counter()
    ckpt.maybe_save(2, state)
    seconds = time.perf_counter() - started
    newest = region.latest("emergency")
    if not ckpt.should_stop or newest is None or newest.kind != "emergency":
        raise RuntimeError(f"the emergency checkpoint did not commit: {ckpt.last_error}")
    ckpt.close()
    region.retain("emergency", set(), grace_s=0)
    local.retain("emergency", set(), grace_s=0)
    return seconds


def emergency_rows(args: argparse.Namespace, work: Path, server: Any) -> list[Row]:
    repeats = int(option(args, "repeats"))
    sizes = [int(size) for size in str(option(args, "sizes")).split(",") if size.strip()]
    rows = [row for mib in sizes for row in size_rows(mib, repeats, work, server)]
    print(
        "emergency: from the final notice at a step boundary to the emergency checkpoint "
        f"committed in the region's store, against a {WINDOW_S:g} s window (target)"
    )
    return rows


def size_rows(mib: int, repeats: int, work: Path, server: Any) -> list[Row]:
    """The emergency rows of one state size: to a folder, then to S3, each against a raw write
    to the same place, taking turns (the order alternating)."""
    state = make_state(mib)

    def raw_folder() -> float:
        return raw_folder_write(state, fresh(work / "raw"))

    def raw_s3() -> float:
        return raw_s3_write(state, server)

    def folder_store() -> Store:
        return LocalStore(fresh(work / "region"))

    def s3() -> Store:
        return s3_store(server)

    rows: list[Row] = []
    for where, open_region, raw in (("folder", folder_store, raw_folder), ("S3", s3, raw_s3)):
        emergency: list[float] = []
        baseline: list[float] = []
        for i in range(repeats):
            for ours in (True, False) if i % 2 == 0 else (False, True):
                if not ours:
                    baseline.append(raw())
                    continue
                region, local = open_region(), LocalStore(fresh(work / "local"))
                emergency.append(emergency_seconds(state, region, local))
                region.close()
                local.close()
        ratio = ratios(emergency, baseline)
        rows.append(Row(f"emergency, {mib} MiB -> {where}", emergency, ratio, WINDOW_S))
        rows.append(Row(f"  baseline: raw write -> {where}", baseline, [1.0] * repeats))
    return rows


# ---- the check after a save that reuses every chunk ---------------------------------------------


def reuse_rows(chunks: int, repeats: int, server: Any) -> tuple[list[Row], list[Row]]:
    """A store saves a state of `chunks` chunks once, then again and again unchanged: each
    later save uploads only its manifest, then checks the chunks it reused. Taking turns, the
    store either remembers the save before (one LIST and one HEAD) or has forgotten its
    checked commits (a HEAD per chunk). Then the first save of a store opened anew, as on the
    instance a job moved to, after restoring the newest checkpoint or without. The rows of the
    two tables."""
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    store = open_store(url, endpoint=server.endpoint, chunk_size=REUSE_CHUNK)
    assert isinstance(store, S3Store)
    base = {"base": np.random.default_rng(0).random(chunks * REUSE_CHUNK // 8)}
    store.save("reuse", 0, base)
    remembered: list[float] = []
    forgotten: list[float] = []
    step = 0
    for i in range(repeats):
        for remember in (True, False) if i % 2 == 0 else (False, True):
            step += 1
            if not remember:
                store._checked.clear()
            started = time.perf_counter()
            result = store.save("reuse", step, base)
            (remembered if remember else forgotten).append(time.perf_counter() - started)
            assert result.manifest.chunks_new == 0 and result.manifest.chunks_total == chunks
    store.close()
    restored: list[float] = []
    unread: list[float] = []
    for i in range(repeats):
        for restore in (True, False) if i % 2 == 0 else (False, True):
            step += 1
            moved = open_store(url, endpoint=server.endpoint, chunk_size=REUSE_CHUNK)
            if restore:
                moved.load(result.ref)  # the newest checkpoint
            started = time.perf_counter()
            result = moved.save("reuse", step, base)
            (restored if restore else unread).append(time.perf_counter() - started)
            assert result.manifest.chunks_new == 0
            moved.close()
    print(
        f"reuse: a save into S3 whose {chunks} chunks of {REUSE_CHUNK // 1024} KiB are all "
        "there already, from the store that committed the save before, and from a store opened "
        "anew (the restore itself not timed)"
    )
    return [
        Row(
            f"save reusing {chunks} chunks, one manifest asked",
            remembered,
            ratios(remembered, forgotten),
        ),
        Row("  baseline: each reused chunk asked", forgotten, [1.0] * repeats),
    ], [
        Row("restored the newest checkpoint first", restored, ratios(restored, unread)),
        Row("  baseline: nothing restored", unread, [1.0] * repeats),
    ]


def ratios(values: list[float], baseline: list[float]) -> list[float]:
    return [a / b for a, b in zip(values, baseline, strict=True)]


# ---- entry points -------------------------------------------------------------------------------


def rows(args: argparse.Namespace, work: Path) -> list[Row]:
    """Both sections' rows (for bench/replication.py); starts an S3 server of its own."""
    base = fresh(work / "tiers")
    with s3_server(base) as server:
        return loop_rows(args, base, server) + emergency_rows(args, base, server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULTS["sizes"], help="emergency state sizes, MiB")
    parser.add_argument("--repeats", type=int, default=DEFAULTS["repeats"])
    parser.add_argument("--train-mb", type=float, default=DEFAULTS["train_mb"])
    parser.add_argument("--every-s", type=float, default=DEFAULTS["every_s"])
    parser.add_argument("--reuse-chunks", type=int, default=256, help="chunks of the reuse save")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    args = parser.parse_args()
    names = sections(parser, args.sections, SECTIONS)
    print_machine(parser, args.repeats)
    work = Path(tempfile.mkdtemp(prefix="baton-bench-tiers-"))
    try:
        with s3_server(work) as server:
            tables = []
            if "loop" in names:
                loop = loop_rows(args, work, server)
                tables.append(("two tiers: training loop", loop, "no checkpoints"))
            if "emergency" in names:
                emergency = emergency_rows(args, work, server)
                tables.append(("two tiers: emergency checkpoint", emergency, "a raw write"))
            if "reuse" in names:
                reuse, reopened = reuse_rows(args.reuse_chunks, args.repeats, server)
                tables.append(("S3: the check after a save", reuse, "each chunk asked"))
                tables.append(
                    ("S3: the first save of a store opened anew", reopened, "nothing restored")
                )
        for title, table, baseline in tables:
            print_table(title, "seconds", table, baseline)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoint benchmark: Baton's store and SDK against the usual ways of saving a model.

    .venv/bin/python bench/checkpoint.py [--sizes 64,256,1024] [--repeat 5] [--dir D]
        [--async-mb 256] [--async-pairs 10] [--async-max-pairs 30] [--async-interval 4]
        [--async-per-block 3]
        [--sections limits,sizes,lora,directory,async] [--sweep]

Prints two tables. The first gives this machine's own limits: a memory copy, BLAKE3 on one
thread and on every core, and the disk's raw sequential write (through the page cache, with
O_DIRECT, and with O_DIRECT from huge pages, each fsynced, and the last also in the 1 MiB
requests a streamed save makes and over the blocks of an existing file, as a save writes over
recycled chunk files) and read (from disk, page cache evicted). The second compares Baton
with the alternatives. Every ratio is measured in this run against a baseline run in the same
process, interleaved with it repetition by repetition (the contenders take turns, the order
rotating), and printed as the median of the per-repetition ratios with their minimum and
maximum, so a noisy neighbour shows as spread instead of skewing one side:

- full save of a state of N MiB against the raw write of the same bytes (the fastest by
  median of buffered, O_DIRECT and O_DIRECT from huge pages, fsynced), torch.save, safetensors
  save_file, numpy.savez and PyTorch's distributed checkpoint
  (`torch.distributed.checkpoint.save`, one process), and the raw write of the same bytes as
  one file per 16 MiB chunk, written at once (the store's layout without hashing, copying or
  manifest: what the layout alone costs on this disk), also while every core copies and
  hashes other memory (what a save's own work beside its writes costs the disk), and the
  cores the save kept busy, with the part of them in the kernel, and the save's time in parts
  (the state's capture, the chunk writes, the commit that makes them durable). Every
  contender writes a fresh file, folder or store and fsyncs it; timing stops when the bytes
  are durable;
- asynchronous saves: the part that blocks the caller and the time until durable, Baton's SDK
  against `torch.distributed.checkpoint.async_save`;
- restore against torch.load, each in a fresh process reading from disk (the files' pages are
  evicted from the page cache with posix_fadvise before every read, for both);
- emergency save: from SIGTERM to the committed manifest, against the raw write in the same
  place (the fastest way above, after a previous write and the same second of training
  steps the emergency save's job runs before its notice; the ratio to the raw write right
  after other writes is printed beside), in a job that has run for a while (it saved twice
  and retention collected the older checkpoint, whose chunk files the store recycled) and in
  a job's first checkpoint interval (one save before, nothing recycled);
- incremental save of lora_sim (frozen base of the largest size, ~2 % trainable): bytes written
  over bytes changed, and time against the full save of the same state;
- directory mode (bench/directory.py): a torch.save file of a 256 MiB model in which 5% of the
  tensors change per sync, bytes stored over bytes changed, content-defined chunks against
  fixed 16 MiB ones;
- asynchronous checkpointing: training steps per second of a numpy MLP in paired blocks, one
  with a checkpoint every few seconds and one without, the median of the pairs' ratios with its
  90% interval (and the same from the training thread's CPU time, which a busy machine
  disturbs less, and the pause at each checkpoint while the state is copied and its reference
  loss taken: the part of the cost the loop pays at once); more pairs are measured, up to
  --async-max-pairs, while that interval straddles the 2 % target.

`--sweep` adds the measurements behind docs/decisions/001 and 002 (hash, chunk size).
Torch, DCP and safetensors rows are skipped when those packages are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

# The training loop of the async measurement computes with one BLAS thread, as the host side
# of an accelerator job does; the other cores are what the checkpoint I/O may use. Set before
# numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loop import TrainingLoop
from bench.table import median_interval, print_columns, sections
from migration.checkpoint import LocalStore
from migration.checkpoint.hashing import digest, new_hasher
from migration.checkpoint.local import _STREAM_PIECE as STREAM_PIECE
from migration.checkpoint.sdk import Checkpointer, capture_rng_states
from migration.checkpoint.snapshot import Snapshot, aligned_empty
from migration.checkpoint.store import DEFAULT_CHUNK_SIZE

MIB = 1024 * 1024
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None
# Of the interval the asynchronous cost's median is judged by.
CONFIDENCE = 0.9

Row = tuple[str, ...]
LIMITS: list[Row] = []
ROWS: list[Row] = []


@dataclass
class Spread:
    """Repeated measurements of one quantity."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def ratio(self) -> str:
        """`median (min-max)` of ratios."""
        return self.summary("x")

    def summary(self, unit: str) -> str:
        """`median<unit> (min-max)`."""
        return f"{self.median:.2f}{unit} ({min(self.values):.2f}-{max(self.values):.2f})"

    def rate(self, nbytes: int) -> str:
        """`median (min-max) GiB/s` of `nbytes` moved in each of the measured seconds."""
        rates = sorted(nbytes / v / 2**30 for v in self.values)
        return f"{statistics.median(rates):.2f} ({rates[0]:.2f}-{rates[-1]:.2f}) GiB/s"


def row(
    what: str,
    size: str,
    seconds: Spread | None,
    rate: str,
    ratio: str,
    target: str = "",
    met: str = "",
) -> None:
    """Add one line to the results (and show progress on stderr)."""
    secs = f"{seconds.median:.3f}" if seconds is not None else ""
    ROWS.append((what, size, secs, rate, ratio, target, met))
    print(f"  {what} {size} {secs} {ratio}", file=sys.stderr, flush=True)


def verdict(value: float, limit: float) -> str:
    return "met" if value <= limit else "MISSED"


def judged(interval: tuple[float, float], limit: float) -> str:
    """A target on a median, judged by the median's confidence interval: met or missed only
    when the whole interval is on one side of the limit."""
    if interval[1] <= limit:
        return "met"
    if interval[0] > limit:
        return "MISSED"
    return "not judged (the interval straddles the target)"


def gibps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 2**30:.2f} GiB/s"


# ---- helpers ----------------------------------------------------------------------------------


def make_state(mib: int, seed: int = 0) -> dict[str, np.ndarray]:
    """N MiB of float32 in 16 MiB tensors (or smaller), plus 64 small 1 KiB tensors."""
    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {}
    left = mib * MIB
    i = 0
    while left > 0:
        n = min(16 * MIB, left)
        state[f"layer{i:03d}.weight"] = rng.random(n // 4, dtype=np.float32)
        left -= n
        i += 1
    for j in range(64):
        state[f"norm{j:03d}.bias"] = rng.random(256, dtype=np.float32)
    return state


def nbytes_of(state: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in state.values())


def flatten(state: dict[str, np.ndarray], *, huge: bool = False) -> np.ndarray:
    """The state's bytes in one page-aligned buffer (what a raw write of it writes), in huge
    pages if asked."""
    flat = aligned_empty(nbytes_of(state), huge=huge)
    np.concatenate([a.view(np.uint8) for a in state.values()], out=flat)
    return flat


def write_file(
    flat: np.ndarray, path: Path, direct: bool, *, over: bool = False, piece: int = 64 * MIB
) -> float:
    """Seconds to write `flat` sequentially as one new file, or `over` the blocks of the file
    at `path` (as long as `flat`), one write of `piece` bytes at a time, and fsync it."""
    if not over:
        fresh(path)
    flags = os.O_WRONLY | (0 if over else os.O_CREAT | os.O_TRUNC) | (os.O_DIRECT if direct else 0)
    started = time.perf_counter()
    fd = os.open(path, flags, 0o644)
    view = flat.data
    body = len(view) - len(view) % 4096 if direct else len(view)
    rest = view[:body]
    while rest:
        rest = rest[os.write(fd, rest[:piece]) :]
    if body < len(view):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        os.write(fd, view[body:])
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - started


def read_file(out: np.ndarray, path: Path, direct: bool) -> float:
    """Seconds to read a file sequentially from disk (its pages evicted first) into `out`."""
    evict([path])
    started = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    view = out.data
    filled = 0
    while filled < len(view):
        n = os.readv(fd, [view[filled : filled + 64 * MIB]])
        if n == 0:
            break
        filled += n
    os.close(fd)
    return time.perf_counter() - started


RAW_WAYS = ("buffered", "O_DIRECT", "O_DIRECT from huge pages")


def raw_writes(flats: tuple[np.ndarray, np.ndarray], work: Path) -> dict[str, Callable[[], float]]:
    """The disk's limit: the same bytes as one file, written sequentially and fsynced, three
    ways (through the page cache, with O_DIRECT from ordinary pages, and with O_DIRECT from
    huge pages: the second of `flats`; a store stages its writes in huge pages), each a
    contender of its own; `fastest_raw` takes the fastest."""
    return {f"raw {name}": raw_way(flats, name, work / "raw.bin") for name in RAW_WAYS}


def raw_way(
    flats: tuple[np.ndarray, np.ndarray],
    name: str,
    path: Path,
    before: Callable[[], None] | None = None,
) -> Callable[[], float]:
    """The raw write one of `RAW_WAYS` (`flats`: from ordinary pages, from huge pages), timed
    after `before` (untimed)."""
    plain, huge = flats
    flat = huge if name == RAW_WAYS[2] else plain
    direct = name != RAW_WAYS[0]

    def run() -> float:
        if before is not None:
            before()
        seconds = write_file(flat, path, direct)
        fresh(path)
        return seconds

    return run


def chunk_files_write(
    huge: np.ndarray, work: Path, pool: ThreadPoolExecutor
) -> Callable[[], float]:
    """The disk's limit for the store's layout: the same bytes as one new file per
    `DEFAULT_CHUNK_SIZE` chunk, all written at once on `pool` (O_DIRECT from huge pages, one
    write each) and fsynced, then their folder; no hashing, copying, renames or manifest.
    Against the raw write it shows what the layout alone costs on this disk; against it, what
    a save adds."""
    folder = work / "chunk-files"

    def run() -> float:
        fresh(folder).mkdir()
        starts = range(0, huge.nbytes, DEFAULT_CHUNK_SIZE)
        started = time.perf_counter()
        list(
            pool.map(
                lambda i: write_file(huge[i : i + DEFAULT_CHUNK_SIZE], folder / f"{i}", True),
                starts,
            )
        )
        fsync_path(folder)
        seconds = time.perf_counter() - started
        fresh(folder)
        return seconds

    return run


def while_cores_busy(run: Callable[[], float]) -> Callable[[], float]:
    """`run` while every core copies 1 MiB pieces of other memory and hashes them (what a
    save's workers do beside its writes): on a virtual disk the writes can need CPU time of
    their own, which this shows (decision 055)."""
    source = np.ones(64 * MIB, np.uint8)

    def spin(stop: threading.Event) -> None:
        piece = np.empty(MIB, np.uint8)
        hasher = new_hasher()
        while not stop.is_set():
            for start in range(0, source.nbytes, MIB):
                piece[:] = source[start : start + MIB]
                hasher.update(piece.data)
                if stop.is_set():
                    break

    def busy() -> float:
        stop = threading.Event()
        threads = [
            threading.Thread(target=spin, args=(stop,), daemon=True)
            for _ in range(os.cpu_count() or 1)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.005)  # the cores are busy before the writes start
        try:
            return run()
        finally:
            stop.set()
            for thread in threads:
                thread.join()

    return busy


def fastest_raw(times: dict[str, list[float]]) -> tuple[str, list[float], list[float]]:
    """The way of raw writing with the lowest median and its times, taken out of `times`, and
    the fastest of the three ways in each repetition. The way is chosen once for the run: the
    fastest of three samples in each repetition is biased low by the noise alone, against a
    contender timed once (printed beside, for comparison with earlier runs)."""
    ways = {name: times.pop(f"raw {name}") for name in RAW_WAYS}
    name = min(ways, key=lambda n: statistics.median(ways[n]))
    each = [min(samples) for samples in zip(*ways.values(), strict=True)]
    return name, ways[name], each


def row_against_each_fastest(label: str, seconds: list[float], fastest_each: list[float]) -> None:
    """The row above against the fastest raw way in each repetition (the biased-low baseline
    of earlier runs, printed for comparison)."""
    row(
        "  the same / the fastest raw way in each repetition (biased low)",
        label,
        None,
        "",
        f"{ratios(seconds, fastest_each).ratio()} raw",
    )


def restore_in_child(kind: str, path: Path, key: str) -> float:
    """Seconds a fresh process takes to load a checkpoint, timed inside it around the load
    call alone (imports and cache eviction excluded)."""
    out = subprocess.run(
        [sys.executable, __file__, "--restore-child", kind, str(path), key],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    return float(out.stdout.strip().splitlines()[-1])


def restore_child(kind: str, path: Path, key: str) -> None:
    """The child side of `restore_in_child`: print the seconds of one load."""
    if kind == "torch":
        import torch

        evict([path])
        started = time.perf_counter()
        loaded = torch.load(path)
        seconds = time.perf_counter() - started
        assert len(loaded) > 0
    else:
        store = LocalStore(path)
        store.start()
        evict(files_under(path))
        started = time.perf_counter()
        checkpoint = store.load(key)
        seconds = time.perf_counter() - started
        assert checkpoint.state["layer000.weight"].size > 0
    print(f"{seconds:.6f}")


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (they are clean after fsync)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def fresh(path: Path) -> Path:
    """Remove what `path` holds, and commit the removal: otherwise the file system frees the
    blocks of the previous contender's output in the journal commit of the next fsync, which
    charges one contender for another's cleanup."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    else:
        return path
    fsync_path(path.parent)
    return path


def interleaved(contenders: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Run every contender `repeat` times, taking turns and rotating the order; the seconds of
    each repetition, in repetition order (so ratios pair measurements taken side by side)."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            times[name].append(contenders[name]())
    return times


def ratios(values: list[float], baseline: list[float]) -> Spread:
    """Per-repetition ratios of two interleaved measurements."""
    return Spread([v / b for v, b in zip(values, baseline, strict=True)])


def touch_every_chunk(state: dict[str, np.ndarray]) -> None:
    """Change every 4 KiB of the state a little, so no chunk of the next save already exists."""
    for arr in state.values():
        arr[:: 1024 if arr.size > 1024 else 1] += np.float32(1e-3)


# What the emergency save's job does between its previous save and the notice.
NOTICE_AFTER_S = 1.0


def training_step(state: dict[str, np.ndarray]) -> None:
    """One step of the emergency benchmark's training loop: every chunk changes."""
    touch_every_chunk(state)
    time.sleep(0.001)


# ---- the machine's own limits -----------------------------------------------------------------


def bench_limits(mib: int, work: Path, repeat: int) -> None:
    """Memory copy, BLAKE3 on one thread and on every core, raw disk write and read."""
    nbytes = mib * MIB
    src = aligned_empty(nbytes)
    src[:] = np.frombuffer(np.random.default_rng(1).bytes(nbytes), np.uint8)
    dst = aligned_empty(nbytes)
    dst[:] = 0
    huge_src = aligned_empty(nbytes, huge=True)
    huge_src[:] = src
    huge_dst = aligned_empty(nbytes, huge=True)
    huge_dst[:] = 0
    cores = os.cpu_count() or 1
    pool = ThreadPoolExecutor(cores)

    def timed(fn: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started

        return run

    def hash_all_cores() -> None:
        step = -(-nbytes // cores)
        list(pool.map(lambda i: digest(src.data[i : i + step]), range(0, nbytes, step)))

    path = work / "limits.bin"
    write_file(src, path, direct=True)
    contenders = {
        "memory copy (numpy.copyto)": timed(lambda: np.copyto(dst, src)),
        "BLAKE3, one thread": timed(lambda: digest(src.data)),
        f"BLAKE3, {cores} threads": timed(hash_all_cores),
        "disk write, buffered + fsync": lambda: write_file(src, work / "w.bin", direct=False),
        "disk write, O_DIRECT + fsync": lambda: write_file(src, work / "w.bin", direct=True),
        "disk write, O_DIRECT from huge pages + fsync": lambda: write_file(
            huge_src, work / "w.bin", direct=True
        ),
        # What the disk charges for the requests of a streamed save's size: against the row
        # above, what a save's pieces cost a new file here (decision 055, sixteenth pass).
        f"disk write in {STREAM_PIECE // MIB} MiB requests, one at a time, the same way": (
            lambda: write_file(huge_src, work / "w.bin", direct=True, piece=STREAM_PIECE)
        ),
        # What a save pays writing over recycled chunk files instead of new ones.
        "disk write over an existing file's blocks, the same way": lambda: write_file(
            huge_src, path, direct=True, over=True
        ),
        "disk read, buffered (from disk)": lambda: read_file(dst, path, direct=False),
        "disk read, O_DIRECT": lambda: read_file(dst, path, direct=True),
        "disk read, O_DIRECT into huge pages": lambda: read_file(huge_dst, path, direct=True),
    }
    times = interleaved(contenders, repeat)
    pool.shutdown()
    for name, values in times.items():
        LIMITS.append((name, f"{mib} MiB", Spread(values).rate(nbytes)))
    for leftover in ("limits.bin", "w.bin"):
        fresh(work / leftover)


# ---- full save, asynchronous save and restore -------------------------------------------------


def bench_size(mib: int, work: Path, repeat: int) -> None:
    state = make_state(mib)
    total = nbytes_of(state)
    flat = (flatten(state), flatten(state, huge=True))
    label = f"{mib} MiB"
    tensors: dict[str, Any] = {}
    if HAS_TORCH:
        import torch

        tensors = {k: torch.from_numpy(v) for k, v in state.items()}

    store_dir = work / "store"
    # The process's CPU seconds per second of each save, and those of them in the kernel (the
    # writes' submission and completion, the hand-offs between the save's threads).
    cores_busy: list[float] = []
    cores_kernel: list[float] = []
    # Where each save's time went, in ms: before its chunks (the state's capture), writing
    # them, and making them durable with the manifest's commit (`SaveResult.write_seconds`).
    parts: list[tuple[float, float, float]] = []

    def baton() -> float:
        store = LocalStore(fresh(store_dir))
        store.start()
        started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        result = store.save("bench", 1, state)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        kernel = after.ru_stime - before.ru_stime
        cores_busy.append((after.ru_utime - before.ru_utime + kernel) / seconds)
        cores_kernel.append(kernel / seconds)
        parts.append(
            (
                (seconds - result.seconds) * 1000,
                result.write_seconds * 1000,
                (result.seconds - result.write_seconds) * 1000,
            )
        )
        store.close()
        return seconds

    def torch_save() -> float:
        import torch

        path = fresh(work / "model.pt")
        started = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(tensors, f)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - started

    def safetensors_save() -> float:
        from safetensors.numpy import save_file

        path = fresh(work / "model.safetensors")
        started = time.perf_counter()
        save_file(state, str(path))
        fsync_path(path)
        return time.perf_counter() - started

    def numpy_save() -> float:
        path = fresh(work / "model.npz")
        started = time.perf_counter()
        with open(path, "wb") as f:
            np.savez(f, **cast(dict[str, Any], state))
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - started

    def dcp_save() -> float:
        import torch.distributed.checkpoint as dcp

        path = fresh(work / "dcp")
        started = time.perf_counter()
        dcp.save(tensors, checkpoint_id=str(path))  # fsyncs its files (sync_files=True)
        return time.perf_counter() - started

    # As many threads as a store has workers, started outside the timing.
    writers = ThreadPoolExecutor(8)
    list(writers.map(lambda _: None, range(8)))
    chunk_files = chunk_files_write(flat[1], work, writers)
    contenders: dict[str, Callable[[], float]] = {
        **raw_writes(flat, work),
        "chunk files": chunk_files,
        "chunk files, cores busy": while_cores_busy(chunk_files),
        "baton": baton,
    }
    if HAS_TORCH:
        contenders["torch.save"] = torch_save
        contenders["DCP"] = dcp_save
    if HAS_SAFETENSORS:
        contenders["safetensors"] = safetensors_save
    contenders["numpy.savez"] = numpy_save
    saves = interleaved(contenders, repeat)
    writers.shutdown()
    way, saves["raw"], fastest_each = fastest_raw(saves)
    row(
        f"raw write + fsync, the fastest way by median ({way})",
        label,
        Spread(saves["raw"]),
        gibps(total, Spread(saves["raw"]).median),
        "1.00x",
    )

    def against_raw(name: str, title: str) -> None:
        seconds = Spread(saves[name])
        rate = gibps(total, seconds.median)
        row(title, label, seconds, rate, f"{ratios(saves[name], saves['raw']).ratio()} raw")

    against_raw(
        "chunk files",
        f"raw write as {DEFAULT_CHUNK_SIZE // MIB} MiB chunk files at once (the store's layout)",
    )
    against_raw(
        "chunk files, cores busy", "  the same while every core copies and hashes other memory"
    )
    spread = ratios(saves["baton"], saves["raw"])
    row(
        "Baton full save (store.save)",
        label,
        Spread(saves["baton"]),
        gibps(total, Spread(saves["baton"]).median),
        f"{spread.ratio()} raw",
        "<= 1.05x raw",
        verdict(spread.median, 1.05),
    )
    row_against_each_fastest(label, saves["baton"], fastest_each)
    row(
        "  the same / the raw write as chunk files",
        label,
        None,
        "",
        f"{ratios(saves['baton'], saves['chunk files']).ratio()} chunk files",
    )
    # A save copies and hashes every byte beside its writes; on a virtual disk that work can
    # slow the writes themselves (decision 055, fifteenth pass): these rows show how busy the
    # cores were and how the save compares with the bare layout under the same kind of load.
    row(
        "  the same / the raw write as chunk files while the cores copy and hash",
        label,
        None,
        "",
        f"{ratios(saves['baton'], saves['chunk files, cores busy']).ratio()} chunk files",
    )
    row(
        "  the same, the process's CPU time / the save's time",
        label,
        None,
        "",
        f"{Spread(cores_busy).summary(' cores')} of {os.cpu_count() or 1}, "
        f"{Spread(cores_kernel).summary('')} in the kernel",
    )
    row(
        "  the same, in parts: capture / chunk writes / durable and committed",
        label,
        None,
        "",
        " / ".join(Spread([p[i] for p in parts]).summary(" ms") for i in range(3)),
    )
    for name, title in (
        ("torch.save", "torch.save + fsync"),
        ("safetensors", "safetensors save_file + fsync"),
        ("DCP", "torch.distributed.checkpoint.save"),
        ("numpy.savez", "numpy.savez + fsync"),
    ):
        if name in saves:
            against_raw(name, title)
    rivals = [name for name in ("torch.save", "safetensors", "DCP") if name in saves]
    if rivals:
        fastest = [min(saves[name][i] for name in rivals) for i in range(repeat)]
        spread = ratios(saves["baton"], fastest)
        row(
            f"Baton full save / fastest of {', '.join(rivals)}",
            label,
            None,
            "",
            spread.ratio(),
            "<= 1.00x",
            verdict(spread.median, 1.0),
        )
    if HAS_TORCH:
        bench_async_save(state, tensors, work, repeat, label)

    # Restore: both from disk (pages evicted before every read), each in a fresh process as on
    # a new instance (in a long-lived process the allocator would hand back warm memory).
    store = LocalStore(fresh(store_dir))
    ref = store.save("bench", 1, state).ref
    store.close()
    if HAS_TORCH:
        torch_save()

        def baton_load() -> float:
            return restore_in_child("baton", store_dir, ref.key)

        def torch_load() -> float:
            return restore_in_child("torch", work / "model.pt", "")

        loads = interleaved({"torch.load": torch_load, "baton": baton_load}, repeat)
        row(
            "torch.load (from disk, fresh process)",
            label,
            Spread(loads["torch.load"]),
            gibps(total, Spread(loads["torch.load"]).median),
            "1.00x",
        )
        spread = ratios(loads["baton"], loads["torch.load"])
        row(
            "Baton restore (store.load, hash-checked, fresh process)",
            label,
            Spread(loads["baton"]),
            gibps(total, Spread(loads["baton"]).median),
            f"{spread.ratio()} torch.load",
            "<= 1.00x",
            verdict(spread.median, 1.0),
        )

    # Emergency save: SIGTERM -> committed manifest. The job saved before (so its store and
    # worker threads exist, as in a job that ran for a while), a second before the notice
    # (not right before it: the disk would still be busy with that save), and every training
    # step changes every chunk since, so the emergency save writes the whole state again.
    # Either the job is in its first checkpoint interval (one save before, after which the
    # SDK reserved room in the store for the next save to write over), or it has run for a
    # while: it saved twice and retention collected the older checkpoint, whose chunk files
    # the store recycled for later saves to write over. Or it has not saved yet (a job
    # interrupted early on a new instance): the SDK reserved room at its first step.
    def emergency(saves: str) -> float:
        store = LocalStore(fresh(store_dir))
        ckpt = Checkpointer(store, job="bench", every_seconds=None, every_steps=None)
        if saves != "none":
            ckpt.save(0, state)
        if saves == "collected":
            ckpt.wait()  # and its reservation, long done in a job that ran for a while
            touch_every_chunk(state)
            ckpt.save(1, state)
            assert store.gc("bench", keep=1, grace_s=0).chunks_removed > 0
            assert next((store.root / "chunks").glob(".recycled-*"), None) is not None
        sent: list[float] = []

        def notice() -> None:
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGTERM)

        timer = threading.Timer(NOTICE_AFTER_S, notice)
        timer.start()
        step = 0
        while not ckpt.should_stop:
            step += 1
            training_step(state)
            ckpt.maybe_save(step, state)
        done = time.perf_counter()
        timer.join()
        committed = ckpt.last_committed
        assert committed is not None and committed.ref.kind == "emergency"
        assert committed.bytes_new == committed.bytes_total, "an emergency save wrote less"
        ckpt.close()
        store.close()
        return done - sent[0]

    # Its baseline is the raw write in the same place: after a previous write, then the same
    # second of training steps. Right after other writes, as the raw ways run, a disk can be
    # quicker than after a second without I/O (a virtual disk here took 1.14x as long).
    previous = raw_way(flat, way, work / "previous.bin")

    def train_after_previous_write() -> None:
        previous()
        until = time.perf_counter() + NOTICE_AFTER_S
        while time.perf_counter() < until:
            training_step(state)

    result = interleaved(
        {
            **raw_writes(flat, work),
            "raw after steps": raw_way(flat, way, work / "raw.bin", train_after_previous_write),
            "emergency": functools.partial(emergency, "collected"),
            "emergency, first interval": functools.partial(emergency, "one"),
            "emergency, before a save": functools.partial(emergency, "none"),
        },
        repeat,
    )
    _, result["raw"], fastest_each = fastest_raw(result)
    after_steps = Spread(result["raw after steps"])
    row(
        f"raw write after a write and a second of training steps ({way})",
        label,
        after_steps,
        gibps(total, after_steps.median),
        f"{ratios(result['raw after steps'], result['raw']).ratio()} raw",
    )
    for name, title in (
        ("emergency", "Baton emergency save (SIGTERM -> commit), older checkpoints collected"),
        ("emergency, first interval", "Baton emergency save in a job's first interval"),
        ("emergency, before a save", "Baton emergency save before a job's first checkpoint"),
    ):
        spread = ratios(result[name], result["raw after steps"])
        row(
            title,
            label,
            Spread(result[name]),
            gibps(total, Spread(result[name]).median),
            f"{spread.ratio()} raw after steps",
            "<= 1.10x raw",
            verdict(spread.median, 1.1),
        )
        row(
            "  the same / the raw write right after other writes",
            label,
            None,
            "",
            f"{ratios(result[name], result['raw']).ratio()} raw",
        )
        row_against_each_fastest(label, result[name], fastest_each)
    for leftover in (
        "raw.bin",
        "previous.bin",
        "chunk-files",
        "model.pt",
        "model.safetensors",
        "model.npz",
        "dcp",
        "store",
    ):
        fresh(work / leftover)


def bench_async_save(
    state: dict[str, np.ndarray], tensors: dict[str, Any], work: Path, repeat: int, label: str
) -> None:
    """Baton's asynchronous save against DCP's async_save: the part that blocks the training
    loop, and the time until the checkpoint is durable. Every repetition changes every chunk,
    and both sides are warmed up once (Baton's snapshot buffers, DCP's staging), as in a
    training run where these saves repeat."""
    import torch.distributed.checkpoint as dcp

    store = LocalStore(fresh(work / "async-store"))
    ckpt = Checkpointer(
        store, job="bench", every_seconds=None, every_steps=None, install_signal_handlers=False
    )
    step = 0

    def baton() -> tuple[float, float]:
        nonlocal step
        touch_every_chunk(state)
        step += 1
        ckpt.request_checkpoint()
        started = time.perf_counter()
        ckpt.maybe_save(step, state)
        blocked = time.perf_counter() - started
        ckpt.wait()
        return blocked, time.perf_counter() - started

    def dcp_async() -> tuple[float, float]:
        touch_every_chunk(state)
        path = fresh(work / "dcp-async")
        started = time.perf_counter()
        future = dcp.async_save(tensors, checkpoint_id=str(path))
        blocked = time.perf_counter() - started
        cast(Any, future).result()
        return blocked, time.perf_counter() - started

    sides = {"baton": baton, "DCP": dcp_async}
    for side in sides.values():
        side()
    blocked: dict[str, list[float]] = {name: [] for name in sides}
    durable: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(repeat):
        for name in list(sides)[rep % 2 :] + list(sides)[: rep % 2]:
            b, d = sides[name]()
            blocked[name].append(b)
            durable[name].append(d)
    ckpt.close()
    store.close()
    for name, title in (("baton", "Baton async save (SDK)"), ("DCP", "DCP async_save")):
        row(
            f"{title}: blocking part",
            label,
            Spread(blocked[name]),
            "",
            f"{ratios(blocked[name], blocked['DCP']).ratio()} DCP's",
        )
        row(
            f"{title}: until durable",
            label,
            Spread(durable[name]),
            "",
            f"{ratios(durable[name], durable['DCP']).ratio()} DCP's",
        )
    fresh(work / "async-store")
    fresh(work / "dcp-async")


# ---- incremental (lora_sim) -------------------------------------------------------------------


def changed_bytes(before: dict[str, bytes], after: dict[str, bytes]) -> int:
    return sum(len(v) for k, v in after.items() if before.get(k) != v)


def flat_bytes(state: object, extra: object) -> dict[str, bytes]:
    snap = Snapshot.capture(state, extra, copy=True, small_limit=0, pack_limit=0)
    return {t.name: bytes(t.data) for t in snap.tensors if t.data is not None}


def bench_lora(base_mib: int, work: Path, repeat: int) -> None:
    from jobs.workloads.lora_sim import LoraSim

    args = argparse.Namespace(
        seed=0,
        steps=1000,
        base_mb=float(base_mib),
        trainable_fraction=0.02,
        state_mb=0.0,
        step_ms=0.0,
        lr=0.01,
    )
    model = LoraSim(args)
    store = LocalStore(fresh(work / "lora"))
    ckpt = Checkpointer(
        store, job="lora", every_seconds=None, verify=False, install_signal_handlers=False
    )
    started = time.perf_counter()
    ckpt.save(0, model.state())
    full_s = time.perf_counter() - started
    for step in range(3):  # past the first steps, where some adapter halves still sit at zero
        model.train_step(step)
    written_over_changed, times, written, changed = [], [], [], []
    for step in range(3, 3 + repeat):
        before = flat_bytes(model.state(), {"user": None, "rng": capture_rng_states()})
        model.train_step(step)
        after = flat_bytes(model.state(), {"user": None, "rng": capture_rng_states()})
        delta = changed_bytes(before, after)
        started = time.perf_counter()
        result = ckpt.save(step + 1, model.state())
        times.append(time.perf_counter() - started)
        written.append(result.bytes_new)
        changed.append(delta)
        written_over_changed.append(result.bytes_new / delta)
    total = result.bytes_total
    row(
        f"lora_sim full save ({base_mib} MiB frozen base)",
        f"{total / MIB:.0f} MiB",
        Spread([full_s]),
        gibps(total, full_s),
        "1.00x",
    )
    ratio = Spread(written_over_changed)
    row(
        "lora_sim incremental save: bytes written / changed",
        f"{statistics.median(written) / MIB:.1f} of {statistics.median(changed) / MIB:.1f} MiB",
        Spread(times),
        "",
        ratio.summary(""),
        "<= 1.10",
        verdict(ratio.median, 1.10),
    )
    row(
        "lora_sim incremental save: time vs full save",
        "",
        Spread(times),
        "",
        f"{Spread([t / full_s for t in times]).ratio()} full",
    )
    ckpt.close()
    store.close()
    fresh(work / "lora")


# ---- directory mode (bench/directory.py) -------------------------------------------------------


def bench_directory(repeat: int) -> None:
    """A torch.save file of a 256 MiB model in which 5% of the tensors change per sync: bytes a
    directory sync stores against the bytes that changed (content-defined chunks, target
    <= 1.2), against fixed 16 MiB chunks on the same files."""
    if not HAS_TORCH:
        return
    from bench.directory import directory_rows

    cdc, fixed, _seconds = directory_rows(repeats=max(repeat, 5))
    for found, target in ((cdc, 1.2), (fixed, None)):
        spread = Spread(found.values)
        row(
            f"directory sync, torch.save 256 MiB, 5% changed: {found.name}",
            "stored / changed",
            None,
            "",
            spread.summary(""),
            f"<= {target:.2f}" if target else "",
            verdict(spread.median, target) if target else "",
        )


# ---- asynchronous checkpointing ---------------------------------------------------------------


def bench_async(
    state_mib: int, work: Path, pairs: int, interval_s: float, per_block: int, max_pairs: int
) -> None:
    """Training throughput with asynchronous checkpoints against without, in paired blocks.

    A numpy MLP whose state is padded to `state_mib` (every chunk changes every step) trains in
    blocks of `per_block` checkpoint intervals of `interval_s` seconds: a block with a
    checkpoint at the start of every interval (each persist waited for before the block ends)
    next to a block without any, the pair's order alternating. The cost is 1 - the median over
    the pairs of (steps/s with) / (steps/s without), printed with the 90% interval of that
    median and the pairs' minimum and maximum; the target is judged only when the interval is
    on one side of it. Pairs rather than a few long blocks: a neighbour's burst of load lasts
    seconds, so two blocks side by side see much the same load and the median over the pairs
    discards the bursts; several checkpoints per block, so one persist's luck does not make a
    pair's cost (with one, the pairs spread over ±4-13%; decision 055). One block of each kind
    runs first, unmeasured (the first checkpoint allocates the snapshot buffers). After `pairs`
    pairs, more are measured while the interval still straddles the target, up to `max_pairs`
    (the interval narrows with the square root of the pairs; looking after every pair makes a
    wrong verdict a little likelier than the interval's 10 %, which the row's pair count shows).
    """
    loop = TrainingLoop(state_mib)
    store = LocalStore(fresh(work / "async"))
    ckpt = Checkpointer(
        store, job="async", every_steps=None, every_seconds=None, install_signal_handlers=False
    )

    def block(intervals: int, steps: int, checkpoint: bool) -> tuple[float, float, float]:
        """Wall seconds and CPU seconds of the training thread of one block (its last persist
        waited for), and of its wall seconds those in the steps that captured a checkpoint."""
        started, cpu = time.perf_counter(), time.thread_time()
        paused = loop.block(ckpt, intervals, steps, checkpoint=checkpoint).blocked
        ckpt.wait()
        return time.perf_counter() - started, time.thread_time() - cpu, paused

    block(1, 50, True)
    rate = 300 / block(1, 300, False)[0]
    steps = max(10, round(rate * interval_s))
    block(1, steps, False)
    block(1, steps, True)
    plain: list[tuple[float, float, float]] = []
    with_ckpt: list[tuple[float, float, float]] = []

    def costs(kind: int) -> list[float]:
        # Per pair: 1 - throughput with / without = 1 - seconds without / seconds with.
        return [(1 - p[kind] / c[kind]) * 100 for p, c in zip(plain, with_ckpt, strict=True)]

    def undecided() -> bool:
        return judged(median_interval(costs(0), CONFIDENCE), 2.0).startswith("not judged")

    while len(plain) < pairs or (len(plain) < max_pairs and undecided()):
        i = len(plain)
        for checkpoint in (False, True) if i % 2 == 0 else (True, False):
            (with_ckpt if checkpoint else plain).append(block(per_block, steps, checkpoint))
        print(f"  async: {i + 1} pairs measured", file=sys.stderr, flush=True)
    pairs = len(plain)
    saves = len(store.list("async"))
    ckpt.close()
    store.close()
    assert saves == 2 + pairs * per_block, saves

    def cost(kind: int) -> tuple[tuple[float, float], str]:
        values = costs(kind)
        low, high = median_interval(values, CONFIDENCE)
        return (low, high), (
            f"{statistics.median(values):+.1f}% ({CONFIDENCE:.0%} interval of the median "
            f"{low:+.1f} to {high:+.1f}; min-max {min(values):+.1f} to {max(values):+.1f})"
        )

    none_rate = per_block * steps / statistics.median(p[0] for p in plain)
    label = f"{state_mib} MiB state"
    row("training without checkpoints (baseline)", label, None, f"{none_rate:.1f} steps/s", "")
    interval, spread = cost(0)
    row(
        f"training, async checkpoint every {steps} steps (~{steps / none_rate:.1f} s), "
        f"{pairs} pairs of {per_block}",
        label,
        None,
        f"{per_block * steps / statistics.median(c[0] for c in with_ckpt):.1f} steps/s",
        f"cost {spread}",
        "cost <= 2%",
        judged(interval, 2.0),
    )
    # The training thread's own CPU time does not count waits for a core that other
    # processes took, so a busy machine spreads it less; it misses what the persist takes
    # from the loop by holding a core or the GIL, so it is a floor, not the target.
    row(
        "  the same pairs, CPU time of the training thread",
        label,
        None,
        "",
        f"cost {cost(1)[1]}",
    )
    # The part of the cost the loop pays at the step that starts a checkpoint (the copy of
    # the state and the validation loss recorded as its reference); the rest is what the
    # persist running beside the loop takes from it.
    pauses = Spread([c[2] / per_block * 1000 for c in with_ckpt])
    shares = Spread([c[2] / c[0] * 100 for c in with_ckpt])
    row(
        "  of it, the pause at each checkpoint (the state's copy, its reference loss)",
        label,
        None,
        "",
        f"{pauses.summary(' ms')} per checkpoint, {shares.summary('%')} of the time",
    )
    fresh(work / "async")


# ---- sweeps behind the decision notes ---------------------------------------------------------


def sweep(work: Path, repeat: int, mib: int) -> None:
    import blake3

    data = np.random.default_rng(0).bytes(256 * MIB)
    view = memoryview(data)
    chunk = 4 * MIB
    hashers: dict[str, Callable[[memoryview], object]] = {
        "blake3": lambda b: blake3.blake3(b).digest(),
        "sha256": lambda b: hashlib.sha256(b).digest(),
        "sha1": lambda b: hashlib.sha1(b).digest(),
        "blake2b": lambda b: hashlib.blake2b(b).digest(),
        "md5": lambda b: hashlib.md5(b).digest(),
        "crc32 (not a content address)": lambda b: zlib.crc32(b),
    }
    for name, fn in hashers.items():
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            for offset in range(0, len(data), chunk):
                fn(view[offset : offset + chunk])
            samples.append(time.perf_counter() - started)
        seconds = Spread(samples)
        row(f"hash {name}, 4 MiB pieces", "256 MiB", seconds, seconds.rate(len(data)), "")
    state = make_state(mib)
    total = nbytes_of(state)
    flat = (flatten(state), flatten(state, huge=True))

    def saver(size: int) -> Callable[[], float]:
        def save() -> float:
            store = LocalStore(fresh(work / f"sweep-save-{size}"), chunk_size=size * MIB)
            store.start()
            started = time.perf_counter()
            store.save("sweep", 1, state)
            seconds = time.perf_counter() - started
            store.close()
            return seconds

        return save

    def loader(size: int) -> Callable[[], float]:
        folder = fresh(work / f"sweep-load-{size}")
        LocalStore(folder, chunk_size=size * MIB).save("sweep", 1, state)

        def load() -> float:
            store = LocalStore(folder, chunk_size=size * MIB)
            store.start()
            evict(files_under(folder))
            started = time.perf_counter()
            store.load(store.list("sweep")[-1])
            seconds = time.perf_counter() - started
            store.close()
            return seconds

        return load

    sizes = [1, 4, 8, 16, 32]
    contenders: dict[str, Callable[[], float]] = raw_writes(flat, work)
    for size in sizes:
        contenders[f"save {size}"] = saver(size)
        contenders[f"load {size}"] = loader(size)
    result = interleaved(contenders, repeat)
    _, result["raw"], _ = fastest_raw(result)
    for kind, title in (("save", "full save"), ("load", "restore")):
        for size in sizes:
            seconds = Spread(result[f"{kind} {size}"])
            row(
                f"{title}, {size} MiB chunks",
                f"{mib} MiB",
                seconds,
                gibps(total, seconds.median),
                f"{ratios(seconds.values, result['raw']).ratio()} raw write",
            )
    for size in sizes:
        fresh(work / f"sweep-save-{size}")
        fresh(work / f"sweep-load-{size}")


SECTIONS = ("limits", "sizes", "lora", "directory", "async")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024", help="State sizes in MiB.")
    parser.add_argument("--dir", default=None, help="Scratch folder (default: a temp folder).")
    parser.add_argument(
        "--repeat", type=int, default=5, help="Repetitions per measurement (at least 5)."
    )
    parser.add_argument("--async-mb", type=int, default=256, help="State size of the async run.")
    parser.add_argument(
        "--async-interval", type=float, default=4.0, help="Seconds of training per checkpoint."
    )
    parser.add_argument(
        "--async-pairs", type=int, default=10, help="Pairs of blocks (with / without) measured."
    )
    parser.add_argument(
        "--async-max-pairs",
        type=int,
        default=30,
        help="Pairs measured at most while the interval straddles the target.",
    )
    parser.add_argument(
        "--async-per-block", type=int, default=3, help="Checkpoints in each measured block."
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"Comma-separated parts to run (default: all of {', '.join(SECTIONS)}).",
    )
    parser.add_argument("--sweep", action="store_true", help="Also the hash/chunk-size sweeps.")
    parser.add_argument("--restore-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restore_child:
        kind, path, key = args.restore_child
        restore_child(kind, Path(path), key)
        return 0
    if args.repeat < 5:
        parser.error("--repeat must be at least 5: a median of fewer says little here")
    names = sections(parser, args.sections, SECTIONS)
    warnings.filterwarnings("ignore", module="torch.distributed")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        parser.error("--sizes names no size")
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="baton-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    started = time.perf_counter()
    try:
        if "limits" in names:
            bench_limits(min(max(sizes), 1024), work, args.repeat)
        if args.sweep:
            sweep(work, args.repeat, max(sizes))
        if "sizes" in names:
            for mib in sizes:
                bench_size(mib, work, args.repeat)
        if "lora" in names:
            bench_lora(max(sizes), work, args.repeat)
        if "directory" in names:
            bench_directory(args.repeat)
        if "async" in names:
            bench_async(
                args.async_mb,
                work,
                args.async_pairs,
                args.async_interval,
                args.async_per_block,
                max(args.async_max_pairs, args.async_pairs),
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.dir:  # a folder given with --dir is left as it was
            with contextlib.suppress(OSError):
                scratch.rmdir()
    print(
        f"Baton checkpoint benchmark: chunk size {DEFAULT_CHUNK_SIZE // MIB} MiB, "
        f"{os.cpu_count()} CPUs, {args.repeat} interleaved repetitions, "
        f"{time.perf_counter() - started:.0f} s"
    )
    print()
    if LIMITS:
        print("This machine's limits, median (min-max) over the repetitions:")
        print_columns(("limit", "size", "rate"), LIMITS)
        print()
    print("Ratios: median of the per-repetition ratios (min-max):")
    print_columns(("measurement", "size", "median s", "rate", "ratio", "target", ""), ROWS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

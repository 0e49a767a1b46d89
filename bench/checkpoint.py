"""Checkpoint benchmark: Baton's store and SDK against the usual ways of saving a model.

    .venv/bin/python bench/checkpoint.py [--sizes 64,256,1024] [--dir D] [--repeat R] [--sweep]

Prints one table. Every ratio is measured in this run against a baseline run in the same
process, interleaved with it repetition by repetition (the median of per-repetition ratios, so
a noisy neighbour slows both sides of a ratio alike):

- full save of a state of N MiB against torch.save, safetensors save_file, numpy.savez and a
  raw sequential write of the same bytes (the disk's limit: the faster of a buffered and an
  O_DIRECT write, each fsynced). Every contender writes a fresh
  file (or fresh store) and fsyncs it; timing stops when the bytes are durable;
- restore against torch.load, each reading from disk (the files' pages are evicted from the
  page cache with posix_fadvise before every read, for both);
- emergency save: from SIGTERM to the committed manifest, against the raw write;
- incremental save of lora_sim (frozen base of the largest size, ~2 % trainable): bytes written
  over bytes changed, and time against the full save of the same state;
- asynchronous checkpointing every N steps: training steps per second against no checkpoints.

`--sweep` adds the measurements behind docs/decisions/001 and 002 (hash, chunk size).
Torch and safetensors rows are skipped when those packages are missing.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

# The training loop of the async measurement computes with one BLAS thread, as the host side
# of an accelerator job does; the second core is what the checkpoint I/O may use. Set before
# numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from migration.checkpoint import LocalStore
from migration.checkpoint.sdk import Checkpointer, capture_rng_states
from migration.checkpoint.snapshot import Snapshot, aligned_empty
from migration.checkpoint.store import DEFAULT_CHUNK_SIZE

MIB = 1024 * 1024
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None

Row = tuple[str, str, str, str, str, str, str]
ROWS: list[Row] = []


def row(
    what: str,
    size: str,
    median_s: float | None,
    rate: str,
    ratio: str,
    target: str = "",
    met: str = "",
) -> None:
    """Add one line to the table (and show progress on stderr)."""
    secs = f"{median_s:.3f}" if median_s is not None else ""
    ROWS.append((what, size, secs, rate, ratio, target, met))
    print(f"  {what} {size} {secs} {ratio}", file=sys.stderr, flush=True)


def verdict(value: float, limit: float, larger_is_better: bool = False) -> str:
    ok = value >= limit if larger_is_better else value <= limit
    return "met" if ok else "MISSED"


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


def raw_write(flat: np.ndarray, work: Path) -> float:
    """The disk's limit: the same bytes as one file, written sequentially and fsynced. Both
    ways are timed, through the page cache and with O_DIRECT, and the faster one counts."""
    best = float("inf")
    for direct in (False, True):
        path = fresh(work / "raw.bin")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        started = time.perf_counter()
        fd = os.open(path, flags, 0o644)
        view = flat.data
        body = len(view) - len(view) % 4096 if direct else len(view)
        rest = view[:body]
        while rest:
            rest = rest[os.write(fd, rest[: 64 * MIB]) :]
        if body < len(view):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            os.write(fd, view[body:])
        os.fsync(fd)
        os.close(fd)
        best = min(best, time.perf_counter() - started)
    fresh(work / "raw.bin")
    return best


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
        store._executor()
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
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    return path


def interleaved(
    contenders: dict[str, Callable[[], float]], baseline: str, repeat: int
) -> dict[str, tuple[float, float]]:
    """Run every contender `repeat` times, rotating the order; per contender the median time
    and the median of its per-repetition ratio to the baseline."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            times[name].append(contenders[name]())
    result = {}
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, times[baseline], strict=True)]
        result[name] = (statistics.median(values), statistics.median(ratios))
    return result


# ---- full save and restore --------------------------------------------------------------------


def bench_size(mib: int, work: Path, repeat: int) -> None:
    state = make_state(mib)
    total = nbytes_of(state)
    flat = aligned_empty(total)
    np.concatenate([a.view(np.uint8) for a in state.values()], out=flat)
    label = f"{mib} MiB"
    tensors: dict[str, Any] = {}
    if HAS_TORCH:
        import torch

        tensors = {k: torch.from_numpy(v) for k, v in state.items()}

    def raw() -> float:
        return raw_write(flat, work)

    store_dir = work / "store"

    def baton() -> float:
        store = LocalStore(fresh(store_dir))
        store._executor()
        started = time.perf_counter()
        store.save("bench", 1, state)
        seconds = time.perf_counter() - started
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

    contenders: dict[str, Callable[[], float]] = {"raw": raw, "baton": baton}
    if HAS_TORCH:
        contenders["torch.save"] = torch_save
    if HAS_SAFETENSORS:
        contenders["safetensors"] = safetensors_save
    contenders["numpy.savez"] = numpy_save
    saves = interleaved(contenders, "raw", repeat)
    row(
        "raw write + fsync, best of buffered/O_DIRECT",
        label,
        saves["raw"][0],
        gibps(total, saves["raw"][0]),
        "1.00x",
    )
    seconds, ratio = saves["baton"]
    row(
        "Baton full save (store.save)",
        label,
        seconds,
        gibps(total, seconds),
        f"{ratio:.2f}x raw",
        "<= 1.30x raw",
        verdict(ratio, 1.30),
    )
    for name, title in (
        ("torch.save", "torch.save + fsync"),
        ("safetensors", "safetensors save_file + fsync"),
        ("numpy.savez", "numpy.savez + fsync"),
    ):
        if name in saves:
            seconds, ratio = saves[name]
            row(title, label, seconds, gibps(total, seconds), f"{ratio:.2f}x raw")

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

    if HAS_TORCH:
        loads = interleaved({"torch.load": torch_load, "baton": baton_load}, "torch.load", repeat)
        row(
            "torch.load (from disk, fresh process)",
            label,
            loads["torch.load"][0],
            gibps(total, loads["torch.load"][0]),
            "1.00x",
        )
        seconds, ratio = loads["baton"]
        row(
            "Baton restore (store.load, hash-checked, fresh process)",
            label,
            seconds,
            gibps(total, seconds),
            f"{ratio:.2f}x torch.load",
            "<= 1.00x",
            verdict(ratio, 1.0),
        )

    # Emergency save: SIGTERM -> committed manifest, training state changing every step.
    def emergency() -> float:
        store = LocalStore(fresh(store_dir))
        ckpt = Checkpointer(store, job="bench", every_seconds=None, every_steps=None)
        sent: list[float] = []

        def notice() -> None:
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGTERM)

        timer = threading.Timer(0.15, notice)
        timer.start()
        step = 0
        while not ckpt.should_stop:
            step += 1
            for tensor in state.values():  # a training step touches every tensor
                tensor[step % tensor.size] += 1e-3
            time.sleep(0.005)
            ckpt.maybe_save(step, state)
        done = time.perf_counter()
        timer.join()
        ckpt.close()
        store.close()
        return done - sent[0]

    result = interleaved({"raw": raw, "emergency": emergency}, "raw", repeat)
    seconds, ratio = result["emergency"]
    target, met = ("<= 1.50x raw", verdict(ratio, 1.5)) if mib >= 1024 else ("", "")
    row(
        "Baton emergency save (SIGTERM -> commit)",
        label,
        seconds,
        gibps(total, seconds),
        f"{ratio:.2f}x raw",
        target,
        met,
    )
    for leftover in ("raw.bin", "model.pt", "model.safetensors", "model.npz", "store"):
        fresh(work / leftover)


# ---- incremental (lora_sim) -------------------------------------------------------------------


def changed_bytes(before: dict[str, bytes], after: dict[str, bytes]) -> int:
    return sum(len(v) for k, v in after.items() if before.get(k) != v)


def flat_bytes(state: object, extra: object) -> dict[str, bytes]:
    snap = Snapshot.capture(state, extra, copy=True, small_limit=0)
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
    ratios, times, written, changed = [], [], [], []
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
        ratios.append(result.bytes_new / delta)
    total = result.bytes_total
    ratio = statistics.median(ratios)
    row(
        f"lora_sim full save ({base_mib} MiB frozen base)",
        f"{total / MIB:.0f} MiB",
        full_s,
        gibps(total, full_s),
        "1.00x",
    )
    incr = statistics.median(times)
    row(
        "lora_sim incremental save: bytes written / changed",
        f"{statistics.median(written) / MIB:.1f} of {statistics.median(changed) / MIB:.1f} MiB",
        incr,
        "",
        f"{ratio:.3f}",
        "<= 1.10",
        verdict(ratio, 1.10),
    )
    row("lora_sim incremental save: time vs full save", "", incr, "", f"{incr / full_s:.3f}x full")
    ckpt.close()
    store.close()
    fresh(work / "lora")


# ---- asynchronous checkpointing ---------------------------------------------------------------


def bench_async(state_mib: int, work: Path, pairs: int, interval_s: float) -> None:
    """Steps/s of a numpy MLP whose state is padded to `state_mib` (every chunk changes every
    step), in alternating blocks of `interval_s` seconds of training: blocks that start with an
    asynchronous checkpoint (and wait for its persist before they end) against blocks without.
    Alternating blocks inside one process keep a noisy neighbour from favouring either side;
    one checkpoint is taken before measuring, as the first one allocates the snapshot buffers.
    """
    from jobs.workloads.mlp_numpy import NumpyMLP

    model = NumpyMLP(
        argparse.Namespace(
            seed=0,
            steps=10**9,
            batch=256,
            hidden=1024,
            lr=0.01,
            state_mb=float(state_mib),
            step_ms=0.0,
        )
    )
    store = LocalStore(fresh(work / "async"))
    ckpt = Checkpointer(
        store, job="async", every_steps=None, every_seconds=None, install_signal_handlers=False
    )
    step = 0

    def block(steps: int, checkpoint: bool) -> float:
        nonlocal step
        if checkpoint:
            ckpt.request_checkpoint()
        started = time.perf_counter()
        for _ in range(steps):
            model.train_step(step)
            step += 1
            ckpt.maybe_save(step, model.state(), val_loss=model.val_loss)
        ckpt.wait()
        return time.perf_counter() - started

    block(50, True)  # warm-up, and the first snapshot's buffers
    rate = 100 / block(100, False)
    steps = max(10, round(rate * interval_s))
    plain: list[float] = []
    with_ckpt: list[float] = []
    for i in range(pairs):
        for checkpoint in (False, True) if i % 2 == 0 else (True, False):
            (with_ckpt if checkpoint else plain).append(block(steps, checkpoint))
    saves = len(store.list("async"))
    ckpt.close()
    store.close()
    assert saves == pairs + 1
    ratio = statistics.median(p / c for p, c in zip(plain, with_ckpt, strict=True))
    cost = 1 - ratio
    none_rate = steps / statistics.median(plain)
    row(
        "training without checkpoints (baseline)",
        f"{state_mib} MiB state",
        None,
        f"{none_rate:.1f} steps/s",
        "1.00x",
    )
    row(
        f"training, async checkpoint every {steps} steps (~{steps / none_rate:.1f} s)",
        f"{state_mib} MiB state",
        None,
        f"{steps / statistics.median(with_ckpt):.1f} steps/s",
        f"{ratio:.3f}x ({cost * 100:+.1f}% cost)",
        "cost <= 5%",
        verdict(cost, 0.05),
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
        seconds = statistics.median(samples)
        row(f"hash {name}, 4 MiB pieces", "256 MiB", seconds, gibps(len(data), seconds), "")
    state = make_state(mib)
    total = nbytes_of(state)
    flat = aligned_empty(total)
    np.concatenate([a.view(np.uint8) for a in state.values()], out=flat)

    def raw() -> float:
        return raw_write(flat, work)

    def saver(size: int) -> Callable[[], float]:
        def save() -> float:
            store = LocalStore(fresh(work / f"sweep-save-{size}"), chunk_size=size * MIB)
            store._executor()
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
            store._executor()
            evict(files_under(folder))
            started = time.perf_counter()
            store.load(store.list("sweep")[-1])
            seconds = time.perf_counter() - started
            store.close()
            return seconds

        return load

    sizes = [1, 4, 8, 16, 32]
    contenders: dict[str, Callable[[], float]] = {"raw": raw}
    for size in sizes:
        contenders[f"save {size}"] = saver(size)
        contenders[f"load {size}"] = loader(size)
    result = interleaved(contenders, "raw", repeat)
    for size in sizes:
        seconds, ratio = result[f"save {size}"]
        row(
            f"full save, {size} MiB chunks",
            f"{mib} MiB",
            seconds,
            gibps(total, seconds),
            f"{ratio:.2f}x raw",
        )
    for size in sizes:
        seconds, ratio = result[f"load {size}"]
        row(
            f"restore, {size} MiB chunks",
            f"{mib} MiB",
            seconds,
            gibps(total, seconds),
            f"{ratio:.2f}x raw write",
        )
        fresh(work / f"sweep-{size}")


def print_table() -> None:
    header: Row = ("measurement", "size", "median s", "rate", "ratio", "target", "")
    widths = [max(len(r[i]) for r in [header, *ROWS]) for i in range(len(header))]
    for line in [header, tuple("-" * w for w in widths), *ROWS]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024", help="State sizes in MiB.")
    parser.add_argument("--dir", default=None, help="Scratch folder (default: a temp folder).")
    parser.add_argument("--repeat", type=int, default=5, help="Repetitions per measurement.")
    parser.add_argument("--async-mb", type=int, default=256, help="State size of the async run.")
    parser.add_argument(
        "--async-interval", type=float, default=5.0, help="Seconds of training per checkpoint."
    )
    parser.add_argument("--sweep", action="store_true", help="Also the hash/chunk-size sweeps.")
    parser.add_argument("--restore-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restore_child:
        kind, path, key = args.restore_child
        restore_child(kind, Path(path), key)
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="baton-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    started = time.perf_counter()
    try:
        if args.sweep:
            sweep(work, args.repeat, max(sizes))
        for mib in sizes:
            bench_size(mib, work, args.repeat if mib < 1024 else max(3, args.repeat - 2))
        bench_lora(max(sizes), work, args.repeat)
        bench_async(args.async_mb, work, args.repeat + 1, args.async_interval)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"Baton checkpoint benchmark: chunk size {DEFAULT_CHUNK_SIZE // MIB} MiB, "
        f"{os.cpu_count()} CPUs, scratch {scratch}, {time.perf_counter() - started:.0f} s"
    )
    print_table()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

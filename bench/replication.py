"""Replication benchmark: what copying checkpoints between regions costs, and what a replica
near the job saves at restore.

    .venv/bin/python bench/replication.py [--sections copy,restore,tiers] [--repeats 5]
        [--base-mb 256] [--restore-mb 256] [--latency-ms 80]

- copy: `lora_sim` (a frozen base of `--base-mb` and a small trained adapter) checkpoints
  through the SDK into its home region's store, one training step apart. Each checkpoint is
  replicated to a second region's store as Baton does it (`Store.copy`: only the chunks the
  region lacks) and, as the baseline, copied whole into an empty store (a naive full copy),
  interleaved. Rows: bytes copied over the bytes that really changed (compared tensor by
  tensor, target <= 1.1), and the time of each copy.
- restore: a `--restore-mb` checkpoint is restored from a real S3 server (SeaweedFS) in two
  ways, interleaved: through a link that adds the latency matrix's `--latency-ms` to every
  packet (the home region, far away) and directly (a replica in the job's own region). One
  machine cannot reproduce a slower cross-region bandwidth, so only latency is added: the
  difference is a lower bound of what a nearby replica saves.
- tiers: the two-tier rows of bench/tiers.py (training-loop overhead of asynchronous two-tier
  checkpoints; an emergency checkpoint of 1 GiB committed in the region's store against a
  30 s window), when that module is present.

Every row prints min / median / max over the repetitions and the ratio of its median to the
baseline's median, measured in the same run.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.table import Row, print_machine, print_table, sections  # noqa: E402
from bench.tiers import BUCKET, fresh, s3_server  # noqa: E402
from migration.checkpoint import LocalStore, Store, open_store  # noqa: E402
from migration.checkpoint.sdk import Checkpointer  # noqa: E402

MIB = 1024 * 1024


def arrays(state: Any, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
    """Every array of a nested state, by path."""
    if isinstance(state, dict):
        for key, value in state.items():
            yield from arrays(value, f"{prefix}/{key}")
    elif isinstance(state, np.ndarray):
        yield prefix, state


def changed_bytes(before: dict[str, np.ndarray], state: Any) -> int:
    """Bytes of the arrays of `state` that differ from the copies in `before`."""
    return sum(
        a.nbytes
        for path, a in arrays(state)
        if path not in before or not np.array_equal(before[path], a)
    )


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = run()
    return time.perf_counter() - started, result


# --- copy: incremental replication against a naive full copy -------------------------------------


def section_copy(args: argparse.Namespace, work: Path) -> list[Row]:
    from jobs.workloads.lora_sim import LoraSim

    model = LoraSim(
        argparse.Namespace(
            seed=0, steps=1000, base_mb=args.base_mb, trainable_fraction=0.02, state_mb=0.0, lr=0.01
        )
    )
    home = LocalStore(fresh(work / "home"))
    replica = LocalStore(fresh(work / "replica"))
    sdk = Checkpointer(
        home, job="lora", every_seconds=None, verify=False, install_signal_handlers=False
    )
    for step in range(3):  # past the first steps, where half of each adapter is still zero
        model.train_step(step)
    first = sdk.save(3, model.state())
    home.copy(first.ref, replica)  # the region already holds the previous checkpoint
    over_changed, over_naive_bytes, incremental_s, naive_s = [], [], [], []
    for step in range(4, 4 + args.repeats):
        before = {path: a.copy() for path, a in arrays(model.state())}
        model.train_step(step)
        saved = sdk.save(step, model.state())
        changed = changed_bytes(before, model.state())
        seconds, stats = timed(lambda ref=saved.ref: home.copy(ref, replica))
        empty = LocalStore(fresh(work / "naive"))
        full_s, full = timed(lambda ref=saved.ref, target=empty: home.copy(ref, target))
        empty.close()
        over_changed.append(stats.bytes_copied / changed)
        over_naive_bytes.append(stats.bytes_copied / full.bytes_copied)
        incremental_s.append(seconds)
        naive_s.append(full_s)
    sdk.close()
    print(
        f"copy: lora_sim, {args.base_mb:g} MiB frozen base, checkpoint of "
        f"{first.bytes_total / MIB:.0f} MiB, {args.repeats} successive checkpoints"
    )
    return [
        Row("incremental copy: bytes / changed bytes", over_changed, over_changed, 1.1),
        Row("incremental copy: bytes / naive copy bytes", over_naive_bytes, over_naive_bytes),
        Row(
            "incremental copy: seconds",
            incremental_s,
            [a / b for a, b in zip(incremental_s, naive_s, strict=True)],
        ),
        Row("baseline: naive full copy, seconds", naive_s, [1.0] * len(naive_s)),
    ]


# --- restore: a replica in the job's region against the home region far away ---------------------


class DelayLink:
    """A TCP forwarder that delivers every packet `delay_s` late in each direction (a delay
    line: throughput is kept, latency added), like a link to a distant region."""

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target_port, self.delay_s = target_port, delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for src, dst in ((client, upstream), (upstream, client)):
                line: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(src, line), daemon=True).start()
                threading.Thread(target=self._deliver, args=(dst, line), daemon=True).start()

    def _read(self, src: socket.socket, line: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            line.put((time.monotonic() + self.delay_s, data))
            if not data:
                return

    @staticmethod
    def _deliver(dst: socket.socket, line: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            due, data = line.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.server.close()


def section_restore(args: argparse.Namespace, work: Path) -> list[Row]:
    rng = np.random.default_rng(1)
    layers = max(1, int(args.restore_mb // 16))
    per_layer = int(args.restore_mb * MIB / layers) // 4
    state = {f"layer{i}": rng.random(per_layer, dtype=np.float32) for i in range(layers)}
    with s3_server(work) as server:
        port = int(server.endpoint.rsplit(":", 1)[1])
        link = DelayLink(port, args.latency_ms / 2000)  # half the round trip each way
        near = open_store(f"s3://{BUCKET}/near", endpoint=server.endpoint)
        ref = near.save("bench", 1, state).ref
        far = open_store(f"s3://{BUCKET}/near", endpoint=f"http://127.0.0.1:{link.port}")

        def restore(store: Store) -> Callable[[], float]:
            return lambda: timed(lambda: store.load(ref))[0]

        near_s, far_s = [], []
        for _ in range(args.repeats):
            far_s.append(restore(far)())
            near_s.append(restore(near)())
        near.close()
        far.close()
        link.close()
    print(
        f"restore: {args.restore_mb:g} MiB checkpoint from a real S3 server; the home region's "
        f"link adds {args.latency_ms:g} ms per round trip"
    )
    return [
        Row(
            "restore from the replica in the job's region",
            near_s,
            [a / b for a, b in zip(near_s, far_s, strict=True)],
        ),
        Row(
            f"baseline: restore from home ({args.latency_ms:g} ms away)", far_s, [1.0] * len(far_s)
        ),
    ]


# --- tiers: from bench/tiers.py ------------------------------------------------------------------


def section_tiers(args: argparse.Namespace, work: Path) -> list[Row]:
    try:
        from bench import tiers
    except ImportError:
        print("tiers: bench/tiers.py is not here; skipped")
        return []
    return list(tiers.rows(argparse.Namespace(**vars(args)), work))


SECTIONS: dict[str, tuple[Callable[[argparse.Namespace, Path], list[Row]], str, str]] = {
    "copy": (section_copy, "ratio or seconds", "a naive full copy"),
    "restore": (section_restore, "seconds", "a restore from the home region"),
    "tiers": (section_tiers, "as each row says", "each row's own baseline"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="copy,restore,tiers")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--base-mb", type=float, default=256.0)
    parser.add_argument("--restore-mb", type=float, default=256.0)
    parser.add_argument("--latency-ms", type=float, default=80.0)
    args = parser.parse_args()
    names = sections(parser, args.sections, SECTIONS)
    print_machine(parser, args.repeats)
    work = Path(tempfile.mkdtemp(prefix="baton-bench-replication-"))
    try:
        for name in names:
            section, unit, baseline = SECTIONS[name]
            rows = section(args, work)
            if rows:
                print_table(name, unit, rows, baseline)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Directory-mode benchmark: what a sync of a rewritten `torch.save` file stores.

    .venv/bin/python bench/directory.py [--model-mb 256] [--fraction 0.05] [--repeats 7]

A model of about 256 MiB (weight matrices of 4 MiB and 256 KiB, with 4 KiB biases) is saved
with `torch.save` into a folder that is synced to a local store as the agent does
(`save_directory`). Before each sync, 5% of the tensors (picked at random) change and the file
is saved again in place. Each sync's stored bytes (`bytes_new`) are divided by the bytes of the
tensors that changed: 1.0 would store exactly what changed.

The baseline, measured on the very same files in the same run, is the fixed 16 MiB chunking
the SDK uses for tensors (and directory mode used before): every 16 MiB piece of the file
hashed, and the pieces not seen before counted as stored. The ratio column is the median of
the per-sync ratios content-defined / fixed. `directory_rows()` returns the rows, so another
benchmark can print them in its own table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.table import Row, print_table  # noqa: E402
from migration.checkpoint import LocalStore  # noqa: E402
from migration.checkpoint.cdc import AVG_SIZE  # noqa: E402
from migration.checkpoint.hashing import digest  # noqa: E402

MIB = 1024 * 1024
FIXED_CHUNK = 16 * MIB
TARGET = 1.2


def make_model(model_mb: float, seed: int) -> dict[str, object]:
    """About `model_mb` MiB of float32 tensors: 4 MiB and 256 KiB matrices, 4 KiB biases."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    model: dict[str, object] = {}
    total, layer = 0, 0
    while total < model_mb * MIB:
        rows = 1024 if layer % 4 else 256  # one small layer in four
        model[f"layer{layer}.weight"] = torch.randn(rows, 1024, generator=generator)
        model[f"layer{layer}.bias"] = torch.randn(1024, generator=generator)
        total += (rows + 1) * 1024 * 4
        layer += 1
    return model


def fixed_chunks(path: Path) -> list[tuple[str, int]]:
    """The baseline: the hash and size of each fixed 16 MiB piece of the file, in order."""
    pieces = []
    with path.open("rb") as f:
        while piece := f.read(FIXED_CHUNK):
            pieces.append((digest(piece), len(piece)))
    return pieces


def directory_rows(
    model_mb: float = 256, fraction: float = 0.05, repeats: int = 7, seed: int = 0
) -> list[Row]:
    """Stored bytes over changed bytes per sync: content-defined chunks, then the baseline."""
    import torch

    rng = np.random.default_rng(seed)
    model = make_model(model_mb, seed)
    names = sorted(model)
    cdc_ratios: list[float] = []
    fixed_ratios: list[float] = []
    seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="baton-bench-dir-") as work:
        folder = Path(work) / "checkpoint"
        folder.mkdir()
        path = folder / "model.pt"
        with LocalStore(Path(work) / "store") as store:
            torch.save(model, path)
            parent = store.save_directory("bench", folder, 0).ref
            seen = {chunk for chunk, _ in fixed_chunks(path)}
            for repeat in range(1, repeats + 1):
                picked = rng.choice(len(names), max(1, round(len(names) * fraction)), False)
                changed = 0
                for index in picked:
                    tensor = model[names[index]]
                    assert isinstance(tensor, torch.Tensor)
                    tensor.add_(1e-3)
                    changed += tensor.numel() * tensor.element_size()
                torch.save(model, path)  # in place, as training scripts do
                started = time.perf_counter()
                result = store.save_directory("bench", folder, repeat, parent=parent)
                seconds.append(time.perf_counter() - started)
                parent = result.ref
                cdc_ratios.append(result.bytes_new / changed)
                pieces = fixed_chunks(path)
                fixed_new = sum(size for chunk, size in dict(pieces).items() if chunk not in seen)
                seen |= {chunk for chunk, _ in pieces}
                fixed_ratios.append(fixed_new / changed)
    return [
        Row(
            f"content-defined chunks (FastCDC, {AVG_SIZE // 1024} KiB avg)",
            cdc_ratios,
            [c / f for c, f in zip(cdc_ratios, fixed_ratios, strict=True)],
            target=TARGET,
        ),
        Row("fixed 16 MiB chunks (baseline)", fixed_ratios, [1.0] * len(fixed_ratios)),
        Row("seconds per sync (content-defined)", seconds, [1.0] * len(seconds)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-mb", type=float, default=256.0)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench/directory.py needs torch: pip install -e '.[torch]'", file=sys.stderr)
        return 2
    rows = directory_rows(args.model_mb, args.fraction, args.repeats, args.seed)
    ratio_rows, time_row = rows[:2], rows[2]
    print_table(
        f"directory mode: torch.save of a {args.model_mb:g} MiB model, "
        f"{args.fraction:.0%} of the tensors changed per sync",
        "stored bytes / changed bytes, per sync",
        ratio_rows,
        baseline="fixed 16 MiB chunks",
    )
    times = time_row.values
    print(
        f"\nseconds per content-defined sync: min {min(times):.3f}, "
        f"median {statistics.median(times):.3f}, max {max(times):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

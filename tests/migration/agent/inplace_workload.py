"""A training script as many are written: it saves its checkpoint in place, not atomically.

`--checkpoint FILE` is rewritten every `--every` steps with `open(FILE, "wb")` and a series of
writes (header, payload in pieces, checksum last), so a reader that comes in the middle finds a
truncated or half-new file. On start it resumes from FILE when it exists and *crashes* when
FILE is damaged, as a real script reading a half-written `torch.save` would. It prints
`iter N` every step and, at the end, `final step=N val_loss=X weights_sha256=H`.

By default SIGTERM kills it at once (no handler); with `--on-sigterm save` it saves once more
(in place, slowly) and exits 0, so a short window kills it in the middle of that save.
The weights after N steps depend only on N, however often the run was stopped and resumed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import struct
import sys
import time
from pathlib import Path
from types import FrameType

import numpy as np

MAGIC = b"INPLACE1"
PIECE = 64 * 1024


def initial(size_mb: float) -> tuple[np.ndarray, np.ndarray]:
    """The trained weights and the frozen padding that makes the file large."""
    weights = np.random.default_rng(0).standard_normal(256)
    padding = np.random.default_rng(1).standard_normal(max(int(size_mb * (1 << 20)) // 8, 1))
    return weights, padding


def train_step(weights: np.ndarray, step: int) -> np.ndarray:
    """One deterministic update: the same step gives the same weights, bit for bit."""
    gradient = np.sin(weights * 0.5 + step * 0.01)
    return weights - 0.001 * gradient


def save(path: Path, step: int, weights: np.ndarray, padding: np.ndarray, pause: float) -> None:
    """Rewrite `path` in place: header, payload in pieces, checksum last."""
    payload = weights.tobytes() + padding.tobytes()
    print(f"saving step {step}", flush=True)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<QQQ", step, weights.size, padding.size))
        for start in range(0, len(payload), PIECE):
            f.write(payload[start : start + PIECE])
            f.flush()
            if pause:
                time.sleep(pause)
        f.write(hashlib.sha256(payload).digest())
    print(f"saved step {step}", flush=True)


def load(path: Path) -> tuple[int, np.ndarray, np.ndarray]:
    """Read a checkpoint; raise on any damage (the script then dies, as real ones do)."""
    data = path.read_bytes()
    if data[:8] != MAGIC or len(data) < 32 + 32:
        raise RuntimeError(f"{path} is damaged: bad header ({len(data)} bytes)")
    step, n_weights, n_padding = struct.unpack("<QQQ", data[8:32])
    end = 32 + 8 * (n_weights + n_padding)
    payload, digest = data[32:end], data[end:]
    if len(payload) != end - 32 or hashlib.sha256(payload).digest() != digest:
        raise RuntimeError(f"{path} is damaged: truncated or checksum mismatch")
    values = np.frombuffer(payload, dtype=np.float64)
    return step, values[:n_weights].copy(), values[n_weights:].copy()


def main(argv: list[str] | None = None) -> int:
    """Train, saving in place every few steps; resume from the checkpoint when there is one."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--size-mb", type=float, default=4.0)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--write-pause-ms", type=float, default=2.0)
    parser.add_argument("--on-sigterm", choices=("die", "save"), default="die")
    args = parser.parse_args(argv)
    stop = {"requested": False}
    if args.on_sigterm == "save":

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            stop["requested"] = True

        signal.signal(signal.SIGTERM, on_sigterm)

    pause = args.write_pause_ms / 1000
    if args.checkpoint.exists():
        step, weights, padding = load(args.checkpoint)
        print(f"resumed from step {step} (BATON_RESUMED={os.environ.get('BATON_RESUMED')})")
    else:
        step, (weights, padding) = 0, initial(args.size_mb)
        print("starting from scratch")
    while step < args.steps and not stop["requested"]:
        weights = train_step(weights, step)
        step += 1
        print(f"iter {step}", flush=True)
        if step % args.every == 0:
            save(args.checkpoint, step, weights, padding, pause)
        time.sleep(args.step_ms / 1000)
    save(args.checkpoint, step, weights, padding, pause)
    if stop["requested"] and step < args.steps:
        print(f"stopped at step {step}", flush=True)
        return 0
    loss = float(np.mean(weights**2))
    sha = hashlib.sha256(weights.tobytes()).hexdigest()
    print(f"final step={step} val_loss={loss:.6f} weights_sha256={sha}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A plain training script for directory mode: it knows nothing of Baton.

It trains a small numpy MLP on synthetic data, writes its own checkpoint into
`--checkpoint-dir` every K steps and when it gets SIGTERM (`state.npz`, the trained state;
`frozen.npy`, the padding that never changes; `state.json`, a small human-readable summary),
and resumes with `--resume-from-checkpoint DIR` like many training scripts do. Under the
agent the command passes `{checkpoint_dir}` to both flags; the agent syncs that folder to the
store and puts the checkpoint to resume from back in place.

    python -m jobs.workloads.dir_mode_example --steps 400 --seed 1 \\
        --checkpoint-dir ckpt --resume-from-checkpoint ckpt

A run is deterministic for a seed: the batch of step t depends only on (seed, t), and the
checkpoint holds every array the next step reads, so a run stopped and resumed any number of
times ends with the same weights as one that never stopped. The last line is
`final step=<n> val_loss=<x> weights_sha256=<hex>`; after a SIGTERM it is `stopped step=<n>`.
"""

from __future__ import annotations

import os

# One BLAS thread: the same sums in the same order on every run, so the weights are bit-equal.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402 - after the thread settings, which numpy reads when imported
import hashlib  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any, BinaryIO  # noqa: E402

import numpy as np  # noqa: E402

STATE_FILE = "state.npz"
SUMMARY_FILE = "state.json"
FROZEN_FILE = "frozen.npy"
INPUTS, HIDDEN, BATCH = 16, 32, 64
LR, MOMENTUM = 0.05, 0.9
WEIGHTS = ("w1", "b1", "w2", "b2")


def say(line: str) -> None:
    """Write one line of the script's output protocol to stdout, at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def initial_state(seed: int, state_mb: float) -> dict[str, np.ndarray]:
    """Weights, momentum buffers and the padding that stands in for a large frozen model."""
    rng = np.random.default_rng([seed, 0])
    state = {
        "w1": rng.normal(0, 1 / np.sqrt(INPUTS), (INPUTS, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, 1)),
        "b2": np.zeros(1),
    }
    for name in WEIGHTS:
        state["m_" + name] = np.zeros_like(state[name])
    pad = int(state_mb * (1 << 20)) // 8
    state["padding"] = np.random.default_rng([seed, 3]).standard_normal(pad)
    return state


def teacher(seed: int) -> np.ndarray:
    """The fixed linear map (through tanh) the model learns."""
    return np.random.default_rng([seed, 1]).normal(0, 1, (INPUTS, 1))


def batch(seed: int, step: int, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The examples of `step`: a function of (seed, step) only, so a resumed run sees the same."""
    x = np.random.default_rng([seed, 2, step]).normal(0, 1, (BATCH, INPUTS))
    return x, np.tanh(x @ target)


def validation_loss(state: dict[str, np.ndarray], seed: int, target: np.ndarray) -> float:
    """Mean squared error on a fixed validation batch."""
    x = np.random.default_rng([seed, 4]).normal(0, 1, (256, INPUTS))
    y = np.tanh(x @ target)
    prediction = np.tanh(x @ state["w1"] + state["b1"]) @ state["w2"] + state["b2"]
    return float(np.mean((prediction - y) ** 2))


def train_step(state: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """One SGD-with-momentum step on (x, y); returns the batch loss."""
    hidden = np.tanh(x @ state["w1"] + state["b1"])
    error = hidden @ state["w2"] + state["b2"] - y
    loss = float(np.mean(error**2))
    d_out = 2 * error / len(x)
    d_hidden = (d_out @ state["w2"].T) * (1 - hidden**2)
    grads = {
        "w2": hidden.T @ d_out,
        "b2": d_out.sum(axis=0),
        "w1": x.T @ d_hidden,
        "b1": d_hidden.sum(axis=0),
    }
    for name in WEIGHTS:
        state["m_" + name] = MOMENTUM * state["m_" + name] + grads[name]
        state[name] = state[name] - LR * state["m_" + name]
    return loss


def weights_sha256(state: dict[str, np.ndarray]) -> str:
    """The SHA-256 of every trained array and the padding, in a fixed order."""
    digest = hashlib.sha256()
    for name in (*WEIGHTS, "padding"):
        digest.update(np.ascontiguousarray(state[name], dtype="<f8").tobytes())
    return digest.hexdigest()


def _write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    with tmp.open("wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    folder: Path, state: dict[str, np.ndarray], step: int, seed: int, val_loss: float
) -> None:
    """Write the state, then the summary, each atomically (a reader sees old or new, whole).

    The padding stands in for frozen weights: it never changes, so it has a file of its own,
    written once, and a sync of the folder finds nothing new in it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / FROZEN_FILE).is_file():
        _write_atomically(folder / FROZEN_FILE, lambda f: np.save(f, state["padding"]))
    arrays: dict[str, Any] = {name: value for name, value in state.items() if name != "padding"}
    arrays.update(step=np.int64(step), seed=np.int64(seed))
    _write_atomically(folder / STATE_FILE, lambda f: np.savez(f, **arrays))
    summary = {"step": step, "seed": seed, "val_loss": val_loss, "format": 1}
    _write_atomically(folder / SUMMARY_FILE, lambda f: f.write(json.dumps(summary).encode()))


def load_checkpoint(folder: Path, seed: int) -> tuple[dict[str, np.ndarray], int] | None:
    """The state and step saved in `folder`, or None when it holds no checkpoint."""
    path = folder / STATE_FILE
    if not path.is_file():
        return None
    with np.load(path) as saved:
        if int(saved["seed"]) != seed:
            raise SystemExit(f"{path} was written with seed {int(saved['seed'])}, not {seed}")
        step = int(saved["step"])
        state = {name: saved[name].copy() for name in saved.files if name not in ("step", "seed")}
    state["padding"] = np.load(folder / FROZEN_FILE)
    return state, step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (the same names as the template's params, plus the folders)."""
    every = int(os.environ.get("BATON_CHECKPOINT_EVERY_STEPS") or 0) or 20
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, required=True, help="Total training steps.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    parser.add_argument("--step-ms", type=float, default=0.0, help="Minimum wall time per step.")
    parser.add_argument("--state-mb", type=float, default=0.0, help="Pads the state to ~MiB.")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get("BATON_CHECKPOINT_DIR") or "checkpoints"),
        help="Where checkpoints are written.",
    )
    parser.add_argument(
        "--resume-from-checkpoint",
        type=Path,
        default=None,
        metavar="DIR",
        help="Resume from the checkpoint in DIR (default: the checkpoint dir, if it holds one).",
    )
    parser.add_argument("--checkpoint-every", type=int, default=every, help="Steps between saves.")
    parser.add_argument("--log-every", type=int, default=10, help="Steps between progress lines.")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.log_every < 1:
        parser.error("--steps must be >= 0, --checkpoint-every and --log-every >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Train, checkpointing as asked; stop cleanly after a checkpoint on SIGTERM."""
    args = parse_args(argv)
    stop = {"requested": False}

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_sigterm)

    target = teacher(args.seed)
    resumed = load_checkpoint(args.resume_from_checkpoint or args.checkpoint_dir, args.seed)
    if resumed is None:
        state, step = initial_state(args.seed, args.state_mb), 0
        say(f"starting from scratch, seed {args.seed}")
    else:
        state, step = resumed
        say(f"resumed from step {step}")

    while step < args.steps and not stop["requested"]:
        started = time.monotonic()
        x, y = batch(args.seed, step, target)
        loss = train_step(state, x, y)
        step += 1
        if step % args.log_every == 0:
            say(f"step={step} loss={loss:.6f}")
        if step % args.checkpoint_every == 0 and step < args.steps:
            save_checkpoint(
                args.checkpoint_dir,
                state,
                step,
                args.seed,
                validation_loss(state, args.seed, target),
            )
        spare = args.step_ms / 1000 - (time.monotonic() - started)
        if spare > 0 and not stop["requested"]:
            time.sleep(spare)

    val_loss = validation_loss(state, args.seed, target)
    save_checkpoint(args.checkpoint_dir, state, step, args.seed, val_loss)
    if step < args.steps:
        say(f"stopped step={step}")
        return 0
    say(f"final step={step} val_loss={val_loss:.6f} weights_sha256={weights_sha256(state)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

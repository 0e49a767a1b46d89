"""The loop shared by the built-in SDK workloads (mlp_numpy, lora_sim, mlp_torch).

Each workload supplies a model object; this module parses the template's flags (from the
catalog, so the portal and the command line never disagree), wires the model to a
`Checkpointer` configured from the BATON_* environment, and prints the lines other parts rely
on: `started step=0` or `resumed step=<n> ...` first, then either
`stopped step=<n>` (after the emergency checkpoint on SIGTERM) or, as the last line,
`final step=<n> val_loss=<x> weights_sha256=<hex>`.

A workload whose ranks train one model together (mlp_torch with BATON_WORLD_SIZE > 1) passes
`join`, which connects the ranks; the loop then takes every save and stop decision together
(`GangNotices`), so all ranks checkpoint and stop at the same steps.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any, Protocol

import numpy as np

from migration.checkpoint.sdk import Checkpointer

from .catalog import TEMPLATES

D_IN = 32
D_OUT = 8
VAL_EXAMPLES = 256
PAD_ROW = 1024  # float32 elements: one pad element per 4 KiB changes every step

logger = logging.getLogger(__name__)


class Model(Protocol):
    """What a workload's model offers the shared loop."""

    def state(self) -> dict[str, Any]:
        """The nested state to checkpoint (model, optimizer, scheduler)."""
        ...

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a restored state."""
        ...

    def train_step(self, step: int) -> None:
        """One optimisation step on the batch of `step` (the data-loader position)."""
        ...

    def val_loss(self) -> float:
        """Loss on the fixed validation batch (no dropout)."""
        ...

    def weights(self) -> Iterable[tuple[str, np.ndarray]]:
        """The model's weights by name, as numpy arrays (what weights_sha256 covers)."""
        ...


class GangError(RuntimeError):
    """The ranks of a gang cannot work together: they could not connect, disagree on where
    they resumed, or the batch cannot be shared among them."""


class Collective(Protocol):
    """The processes that train one model together, as the loop sees them."""

    world_size: int

    def any_flags(self, flags: Sequence[bool]) -> list[bool]:
        """Each flag True on every process if it is True on any."""
        ...

    def same_on_all(self, value: int) -> bool:
        """True on every process if every process passed the same value."""
        ...

    def close(self) -> None:
        """Leave the group."""
        ...


class Solo:
    """A single process: every collective is the identity."""

    world_size = 1

    def any_flags(self, flags: Sequence[bool]) -> list[bool]:
        return list(flags)

    def same_on_all(self, value: int) -> bool:
        return True

    def close(self) -> None:
        pass


Join = Callable[[int, int], Collective]  # (rank, world size) -> the connected gang


class GangNotices:
    """Notices and timed saves decided by the whole gang, so every rank saves and stops at
    the same step.

    A notice reaches one rank (each instance's agent signals its own process), and each rank's
    clock has its own idea of when a timed save is due. So the signal handlers here only take
    note; at every step boundary, before `maybe_save`, the ranks OR their notes together and
    each tells its own Checkpointer (`request_stop`, `request_checkpoint`). The Checkpointer
    never sees a signal itself: one landing between that agreement and `maybe_save` would
    otherwise make a single rank save or stop on its own. Its timer is switched off for the
    same reason; the gang's timed save is due when any rank's is (and is asked for like an
    advance notice, the one public way to ask for a periodic save now).
    """

    def __init__(self, ckpt: Checkpointer) -> None:
        self.ckpt = ckpt
        self.every_seconds = ckpt.every_seconds
        ckpt.every_seconds = None
        self.final = False
        self.advances = 0  # a count, so a notice landing while one is handled is not lost
        self._handled = 0
        self._last_save: float | None = None  # starts at the first boundary, after joining
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum, handler in (
                (signal.SIGUSR1, self._on_advance),
                (signal.SIGTERM, self._on_final),
            ):
                self._previous[signum] = signal.signal(signum, handler)

    def _on_advance(self, signum: int, frame: FrameType | None) -> None:
        self.advances += 1

    def _on_final(self, signum: int, frame: FrameType | None) -> None:
        self.final = True

    def decide(self, gang: Collective, step: int) -> None:
        """At the boundary after `step` steps, on every rank: one collective, then the same
        request to each rank's Checkpointer."""
        now = time.monotonic()
        if self._last_save is None:
            self._last_save = now
        advances = self.advances
        timed = self.every_seconds is not None and now - self._last_save >= self.every_seconds
        final, advance, timed = gang.any_flags([self.final, advances != self._handled, timed])
        self._handled = advances
        if final:
            self.ckpt.request_stop()
        elif advance or timed:
            self.ckpt.request_checkpoint()
        every = self.ckpt.every_steps
        if advance or timed or (every and step % every == 0):
            self._last_save = now

    def close(self) -> None:
        """Give the signals back to whoever had them."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def parse_args(template: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`--steps` plus every parameter the catalog lists for `template`."""
    spec = TEMPLATES[template]
    parser = argparse.ArgumentParser(prog=f"python -m {spec.module}", description=spec.description)
    parser.add_argument("--steps", type=int, required=True, help="Total training steps.")
    for name, param in spec.params.items():
        parser.add_argument(
            "--" + name.replace("_", "-"), type=param.kind, default=param.default, help=param.help
        )
    args = parser.parse_args(argv)
    for name, param in spec.params.items():
        try:
            param.parse(name, getattr(args, name))
        except ValueError as exc:
            parser.error(str(exc))
    return args


def teacher(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed random network the synthetic targets come from."""
    rng = np.random.default_rng([seed, 1])
    t1 = rng.standard_normal((D_IN, 64)).astype(np.float32) / np.sqrt(D_IN)
    t2 = rng.standard_normal((64, D_OUT)).astype(np.float32) / 8.0
    return t1, t2


def batch(
    seed: int, step: int, size: int, weights: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The training batch of `step`: a pure function of seed and step, so the data-loader
    position of a run is its step and a resumed run sees exactly the same data."""
    rng = np.random.default_rng([seed, 2, step])
    x = rng.standard_normal((size, D_IN)).astype(np.float32)
    return x, np.tanh(x @ weights[0]) @ weights[1]


def validation_batch(
    seed: int, weights: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The fixed validation batch (the validation reference of every checkpoint)."""
    rng = np.random.default_rng([seed, 3])
    x = rng.standard_normal((VAL_EXAMPLES, D_IN)).astype(np.float32)
    return x, np.tanh(x @ weights[0]) @ weights[1]


def make_pad(seed: int, state_mb: float) -> np.ndarray | None:
    """`state_mb` MiB of extra model state (None when 0), float32 rows of PAD_ROW elements."""
    rows = int(state_mb * 1024 * 1024) // (4 * PAD_ROW)
    if rows <= 0:
        return None
    return np.random.default_rng([seed, 5]).random((rows, PAD_ROW), dtype=np.float32)


def touch_pad(pad: np.ndarray, step: int) -> None:
    """Change one element in every 4 KiB of the pad: every checkpoint chunk of it changes at
    every step (like real weights) for a negligible cost per step."""
    pad[:, step % PAD_ROW] += np.float32(1e-3)


def lr_at(step: int, total: int, base: float) -> float:
    """Warm-up then cosine decay (the scheduler)."""
    warmup = max(1, min(100, total // 10))
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + np.cos(np.pi * min(1.0, progress)))


def jitter() -> float:
    """A small random factor on the learning rate, drawn from Python's `random` so a resume
    that failed to restore that generator would train differently."""
    return 1.0 + 0.1 * (random.random() - 0.5)


def weights_sha256(weights: Iterable[tuple[str, np.ndarray]]) -> str:
    """SHA-256 over every weight's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, arr in sorted(weights, key=lambda item: item[0]):
        arr = np.ascontiguousarray(arr)
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def configure_logging() -> None:
    """Library logs to stderr (stdout carries the workload's own lines)."""
    logging.basicConfig(
        level=os.environ.get("BATON_LOG_LEVEL", "INFO").upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def say(line: str) -> None:
    """One line on stdout, flushed (parents read it while we run)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(
    template: str,
    build: Callable[[argparse.Namespace], Model],
    argv: Sequence[str] | None = None,
    *,
    join: Join | None = None,
) -> int:
    """Train `template` to `--steps`, checkpointing through the SDK; the process's exit code.

    With `join` and BATON_WORLD_SIZE > 1 this process is one rank of a gang: `join` connects
    the ranks (before the model is built, so the model can find them) and the loop decides
    saves and stops with them; otherwise the run is a single process."""
    args = parse_args(template, argv)
    configure_logging()
    # The global generators are seeded before the model is built; a restore replaces them.
    random.seed(args.seed)
    np.random.seed(args.seed)
    ckpt = Checkpointer.from_env(install_signal_handlers=False)
    gang: Collective = Solo()
    notices: GangNotices | None = None
    try:
        if join is not None and ckpt.world_size > 1:
            notices = GangNotices(ckpt)  # before joining: a notice meanwhile is not lost
            gang = join(ckpt.rank, ckpt.world_size)
        else:
            ckpt.install_signal_handlers()
        model = build(args)
        restored = ckpt.restore()
        step = 0 if restored is None else restored.step
        if not gang.same_on_all(step):
            raise GangError(f"rank {ckpt.rank} resumed at step={step}, another rank did not")
        if restored is None:
            say("started step=0")
        else:
            model.load_state(restored.state)
            loss = model.val_loss()
            matches = ckpt.report_restore(loss)
            say(f"resumed step={step} val_loss={loss:.8g} reference_matches={matches}")
        step_s = args.step_ms / 1000.0
        while step < args.steps:
            started = time.monotonic()
            model.train_step(step)
            step += 1
            if step_s > 0:
                left = step_s - (time.monotonic() - started)
                if left > 0:
                    time.sleep(left)
            if notices is not None:
                notices.decide(gang, step)
            ckpt.maybe_save(step, model.state(), {"loader_offset": step}, val_loss=model.val_loss)
            if ckpt.should_stop:
                say(f"stopped step={step}")
                return 0
        loss = model.val_loss()
        ckpt.save_final(step, model.state(), {"loader_offset": step}, val_loss=loss)
        digest = weights_sha256(model.weights())
        ckpt.report_result(step, loss, digest)
        say(f"final step={step} val_loss={loss:.8g} weights_sha256={digest}")
        return 0
    except GangError as exc:
        logger.error("%s", exc)
        return 1
    finally:
        if notices is not None:
            notices.close()
        gang.close()
        ckpt.close()

"""The training loop the checkpoint benchmarks time checkpoints in: a numpy MLP whose state is
padded to a given size, so every chunk of it changes at every step.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Block:
    """One timed stretch of training."""

    seconds: float  # wall clock
    cpu: float  # CPU time of the training thread
    blocked: float  # of `seconds`, in the `maybe_save` calls that started a checkpoint


class TrainingLoop:
    """Trains the MLP step after step; `block` times a stretch of it with checkpoints."""

    def __init__(self, state_mib: float) -> None:
        from jobs.workloads.mlp_numpy import NumpyMLP

        self.model = NumpyMLP(
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
        self.step = 0

    def steps_per_second(self, steps: int = 20) -> float:
        """The loop's rate without checkpoints, from `steps` steps."""
        started = time.perf_counter()
        for _ in range(steps):
            self.model.train_step(self.step)
            self.step += 1
        return steps / (time.perf_counter() - started)

    def block(self, ckpt: Any, intervals: int, steps: int, *, checkpoint: bool = True) -> Block:
        """`intervals` stretches of `steps` steps, each starting with a checkpoint request to
        `ckpt` when `checkpoint` (a Checkpointer, or None for none at all)."""
        blocked = 0.0
        started, cpu = time.perf_counter(), time.thread_time()
        for _ in range(intervals):
            if ckpt is not None and checkpoint:
                ckpt.request_checkpoint()
            for _ in range(steps):
                self.model.train_step(self.step)
                self.step += 1
                if ckpt is not None:
                    called = time.perf_counter()
                    if ckpt.maybe_save(self.step, self.model.state(), val_loss=self.model.val_loss):
                        blocked += time.perf_counter() - called
        return Block(time.perf_counter() - started, time.thread_time() - cpu, blocked)

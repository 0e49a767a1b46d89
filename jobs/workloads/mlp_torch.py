"""The mlp_numpy workload in torch (nn.Module, torch.optim.Adam, LambdaLR); needs torch.

    python -m jobs.workloads.mlp_torch --steps 500 --seed 0 [--step-ms 20] [--state-mb 64]

Same synthetic data as mlp_numpy (a pure function of seed and step). Dropout draws from torch's
generator and the learning-rate jitter from Python's, so the SDK must restore both.

With BATON_WORLD_SIZE > 1 each process is one rank of a data-parallel gang (torch.distributed,
gloo; see distributed.py): every rank builds the same weights from the seed, takes rows
rank::world_size of each step's batch and averages its gradients with the others' before the
optimizer step, so all ranks hold the same weights. Each rank's dropout draws from its own
stream; the learning-rate jitter is the same on every rank (same seed, same draws).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from .distributed import average_gradients, join_gang, position
from .training import (
    D_IN,
    D_OUT,
    PAD_ROW,
    GangError,
    batch,
    jitter,
    lr_at,
    make_pad,
    run,
    teacher,
    validation_batch,
)

DROPOUT = 0.1


class TorchMLP:
    """Two-layer ReLU MLP with dropout, Adam and a warm-up + cosine LambdaLR schedule."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(args.seed)
        torch.use_deterministic_algorithms(True)
        self.seed = args.seed
        self.batch_size = args.batch
        self.total = args.steps
        self.teacher = teacher(args.seed)
        val_x, val_y = validation_batch(args.seed, self.teacher)
        self.val = (torch.from_numpy(val_x), torch.from_numpy(val_y))
        self.model = nn.Sequential(
            nn.Linear(D_IN, args.hidden),
            nn.ReLU(),
            nn.Dropout(DROPOUT),
            nn.Linear(args.hidden, D_OUT),
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        total, base = args.steps, args.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_at(step, total, base) / base if base else 0.0
        )
        pad = make_pad(args.seed, args.state_mb)
        self.pad = torch.from_numpy(pad) if pad is not None else None
        self.rank, self.world_size = position()
        if self.batch_size < self.world_size:
            raise GangError(f"--batch {self.batch_size} leaves a rank of {self.world_size} idle")
        if self.world_size > 1:
            # The weights above are the same on every rank; dropout masks should not be.
            seed = np.random.default_rng([args.seed, 8, self.rank]).integers(2**63)
            torch.manual_seed(int(seed))

    def state(self) -> dict[str, Any]:
        model: dict[str, Any] = dict(self.model.state_dict())
        if self.pad is not None:
            model["pad"] = self.pad
        return {
            "model": model,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        model = dict(state["model"])
        pad = model.pop("pad", None)
        self.model.load_state_dict(model)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.pad = pad.clone() if pad is not None else None

    def train_step(self, step: int) -> None:
        x, y = batch(self.seed, step, self.batch_size, self.teacher)
        if self.world_size > 1:  # this rank's shard of the step's batch
            x = np.ascontiguousarray(x[self.rank :: self.world_size])
            y = np.ascontiguousarray(y[self.rank :: self.world_size])
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        average_gradients(self.model.parameters())
        factor = jitter()
        for group in self.optimizer.param_groups:
            group["lr"] = self.scheduler.get_last_lr()[0] * factor
        self.optimizer.step()
        self.scheduler.step()
        if self.pad is not None:
            with torch.no_grad():
                self.pad[:, step % PAD_ROW] += 1e-3

    def val_loss(self) -> float:
        self.model.eval()
        with torch.no_grad():
            return float(nn.functional.mse_loss(self.model(self.val[0]), self.val[1]))

    def weights(self) -> Iterable[tuple[str, np.ndarray]]:
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach().cpu().numpy()
        if self.pad is not None:
            yield "pad", self.pad.numpy()


def main() -> int:
    """Entry point: `python -m jobs.workloads.mlp_torch --steps N --seed S ...`."""
    return run("mlp_torch", TorchMLP, join=join_gang)


if __name__ == "__main__":
    raise SystemExit(main())

"""A large frozen base model with a small trainable low-rank adapter (shows incremental saves).

    python -m jobs.workloads.lora_sim --steps 200 --seed 0 --base-mb 1024 --trainable-fraction 0.02

The base is generated from the seed (standing in for downloaded pretrained weights) and marked
read-only, which also tells the SDK it cannot change: after the first checkpoint only the
adapter, its optimizer state and the scheduler are written again.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .training import jitter, lr_at, make_pad, run, touch_pad

WIDTH = 1024
LAYER_MIB = 16.0
BATCH = 16
DROPOUT = 0.1
BETAS = (0.9, 0.999)
EPS = 1e-8


def layer_rows(base_mb: float) -> list[int]:
    """Rows (of WIDTH float32) of each base layer: up to LAYER_MIB each, base_mb in total."""
    total = max(1, int(base_mb * 1024 * 1024) // (4 * WIDTH))
    per_layer = int(LAYER_MIB * 1024 * 1024) // (4 * WIDTH)
    rows = [per_layer] * (total // per_layer)
    if total % per_layer:
        rows.append(total % per_layer)
    return rows


class LoraSim:
    """Per frozen base layer W, learn A @ B so that x @ A @ B matches x scaled by W's first row."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.seed = args.seed
        self.total = args.steps
        self.base_lr = args.lr if hasattr(args, "lr") else 0.01
        rows = layer_rows(args.base_mb)
        self.base: dict[str, np.ndarray] = {}
        self.adapter: dict[str, np.ndarray] = {}
        rng = np.random.default_rng([args.seed, 7])
        for i, n in enumerate(rows):
            layer = np.random.default_rng([args.seed, 6, i]).random((n, WIDTH), dtype=np.float32)
            layer.setflags(write=False)
            self.base[f"layer{i:03d}"] = layer
            rank = max(1, round(args.trainable_fraction * n / 2))
            self.adapter[f"layer{i:03d}.a"] = (
                rng.standard_normal((WIDTH, rank)) / math.sqrt(WIDTH)
            ).astype(np.float32)
            self.adapter[f"layer{i:03d}.b"] = np.zeros((rank, WIDTH), np.float32)
        self.m = {k: np.zeros_like(v) for k, v in self.adapter.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.adapter.items()}
        self.t = 0
        self.pad = make_pad(args.seed, args.state_mb)
        val_rng = np.random.default_rng([args.seed, 3])
        self.val_x = val_rng.standard_normal((64, WIDTH)).astype(np.float32)

    def state(self) -> dict[str, Any]:
        model: dict[str, Any] = {"base": self.base, "adapter": self.adapter}
        if self.pad is not None:
            model["pad"] = self.pad
        return {
            "model": model,
            "optimizer": {"m": self.m, "v": self.v, "t": self.t},
            "scheduler": {"last_step": self.t, "base_lr": self.base_lr, "total": self.total},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.base = dict(state["model"]["base"])
        for layer in self.base.values():
            layer.setflags(write=False)
        self.adapter = dict(state["model"]["adapter"])
        self.pad = state["model"].get("pad")
        self.m = dict(state["optimizer"]["m"])
        self.v = dict(state["optimizer"]["v"])
        self.t = int(state["optimizer"]["t"])

    def _loss_and_grads(self, x: np.ndarray, dropout: bool) -> tuple[float, dict[str, np.ndarray]]:
        loss = 0.0
        grads: dict[str, np.ndarray] = {}
        xi = x
        if dropout:
            xi = x * (np.random.random(x.shape) >= DROPOUT).astype(np.float32) / (1 - DROPOUT)
        for name, layer in self.base.items():
            a, b = self.adapter[f"{name}.a"], self.adapter[f"{name}.b"]
            target = x * (layer[0] - 0.5)
            hidden = xi @ a
            err = hidden @ b - target
            loss += float(np.mean(err * err))
            g = (2.0 / err.size) * err
            grads[f"{name}.b"] = hidden.T @ g
            grads[f"{name}.a"] = xi.T @ (g @ b.T)
        return loss / len(self.base), grads

    def train_step(self, step: int) -> None:
        x = np.random.default_rng([self.seed, 2, step]).standard_normal((BATCH, WIDTH))
        _, grads = self._loss_and_grads(x.astype(np.float32), dropout=True)
        self.t += 1
        lr = lr_at(self.t - 1, self.total, self.base_lr) * jitter()
        b1, b2 = BETAS
        for name, g in grads.items():
            g = g.astype(np.float32)
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            step_size = lr / (1 - b1**self.t)
            update = step_size * self.m[name] / (np.sqrt(self.v[name] / (1 - b2**self.t)) + EPS)
            self.adapter[name] = (self.adapter[name] - update).astype(np.float32)
        if self.pad is not None:
            touch_pad(self.pad, step)

    def val_loss(self) -> float:
        loss, _ = self._loss_and_grads(self.val_x, dropout=False)
        return loss

    def weights(self) -> Iterable[tuple[str, np.ndarray]]:
        for name, layer in self.base.items():
            yield f"base.{name}", layer
        yield from self.adapter.items()
        if self.pad is not None:
            yield "pad", self.pad


def main() -> int:
    """Entry point: `python -m jobs.workloads.lora_sim --steps N --seed S ...`."""
    return run("lora_sim", LoraSim)


if __name__ == "__main__":
    raise SystemExit(main())

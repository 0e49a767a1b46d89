"""A numpy-only MLP trained with Adam on synthetic data (the reference SDK workload).

    python -m jobs.workloads.mlp_numpy --steps 500 --seed 0 [--step-ms 20] [--state-mb 64]

Batches are a pure function of seed and step (the data-loader position is the step); dropout
draws from numpy's global generator and the learning-rate jitter from Python's, so a resume
gives the same weights as an uninterrupted run only if the SDK restores both generators.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import numpy as np

from .training import (
    D_IN,
    D_OUT,
    batch,
    jitter,
    lr_at,
    make_pad,
    run,
    teacher,
    touch_pad,
    validation_batch,
)

DROPOUT = 0.1
BETAS = (0.9, 0.999)
EPS = 1e-8
PARAMS = ("w1", "b1", "w2", "b2")


class NumpyMLP:
    """Two-layer ReLU MLP with dropout, Adam and a warm-up + cosine schedule."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.seed = args.seed
        self.batch_size = args.batch
        self.total = args.steps
        self.base_lr = args.lr
        self.teacher = teacher(args.seed)
        self.val = validation_batch(args.seed, self.teacher)
        rng = np.random.default_rng([args.seed, 4])
        hidden = args.hidden
        self.params: dict[str, np.ndarray] = {
            "w1": (rng.standard_normal((D_IN, hidden)) / np.sqrt(D_IN)).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "w2": (rng.standard_normal((hidden, D_OUT)) / np.sqrt(hidden)).astype(np.float32),
            "b2": np.zeros(D_OUT, np.float32),
        }
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.t = 0
        self.pad = make_pad(args.seed, args.state_mb)

    def state(self) -> dict[str, Any]:
        model: dict[str, Any] = dict(self.params)
        if self.pad is not None:
            model["pad"] = self.pad
        return {
            "model": model,
            "optimizer": {"m": self.m, "v": self.v, "t": self.t, "betas": BETAS, "eps": EPS},
            "scheduler": {"last_step": self.t, "base_lr": self.base_lr, "total": self.total},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.params = {k: state["model"][k] for k in PARAMS}
        self.pad = state["model"].get("pad")
        self.m = dict(state["optimizer"]["m"])
        self.v = dict(state["optimizer"]["v"])
        self.t = int(state["optimizer"]["t"])

    def _forward(self, x: np.ndarray, dropout: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = self.params
        pre = x @ p["w1"] + p["b1"]
        h = np.maximum(pre, 0)
        mask = np.ones_like(h)
        if dropout:
            mask = (np.random.random(h.shape) >= DROPOUT).astype(np.float32) / (1 - DROPOUT)
        hd = h * mask
        return hd @ p["w2"] + p["b2"], hd, mask * (pre > 0)

    def train_step(self, step: int) -> None:
        x, y = batch(self.seed, step, self.batch_size, self.teacher)
        out, hd, dmask = self._forward(x, dropout=True)
        g_out = (2.0 / out.size) * (out - y)
        grads = {
            "w2": hd.T @ g_out,
            "b2": g_out.sum(axis=0),
        }
        g_h = (g_out @ self.params["w2"].T) * dmask
        grads["w1"] = x.T @ g_h
        grads["b1"] = g_h.sum(axis=0)
        self.t += 1
        lr = lr_at(self.t - 1, self.total, self.base_lr) * jitter()
        b1, b2 = BETAS
        for name in PARAMS:
            g = grads[name].astype(np.float32)
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            m_hat = self.m[name] / (1 - b1**self.t)
            v_hat = self.v[name] / (1 - b2**self.t)
            self.params[name] = (self.params[name] - lr * m_hat / (np.sqrt(v_hat) + EPS)).astype(
                np.float32
            )
        if self.pad is not None:
            touch_pad(self.pad, step)

    def val_loss(self) -> float:
        out, _, _ = self._forward(self.val[0], dropout=False)
        return float(np.mean((out - self.val[1]) ** 2))

    def weights(self) -> Iterable[tuple[str, np.ndarray]]:
        yield from self.params.items()
        if self.pad is not None:
            yield "pad", self.pad


def main() -> int:
    """Entry point: `python -m jobs.workloads.mlp_numpy --steps N --seed S ...`."""
    return run("mlp_numpy", NumpyMLP)


if __name__ == "__main__":
    raise SystemExit(main())

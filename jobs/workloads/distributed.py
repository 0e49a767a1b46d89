"""torch.distributed for the torch workload: the ranks of a gang train one model together.

Each process is one rank (`BATON_RANK` of `BATON_WORLD_SIZE`). Rank 0 hosts the rendezvous at
`BATON_MASTER_ADDR:BATON_MASTER_PORT`; the ranks join a gloo process group, average their
gradients every step and take the loop's decisions together (`TorchGang` is the `Collective`
the shared loop in training.py asks).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from .training import GangError

logger = logging.getLogger(__name__)

# Reaching rank 0 (or, on rank 0, waiting for the others) gives up after this long.
JOIN_TIMEOUT = timedelta(seconds=60)
# A collective waits for the slowest rank, which may be waiting for its own checkpoint to
# persist (back-pressure) or restoring a large one: torch's own default, not the join's.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


class TorchGang:
    """The gloo process group of this run, as the shared loop's `Collective`."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def any_flags(self, flags: Sequence[bool]) -> list[bool]:
        """Each flag True on every rank if it is True on any (one all-reduce, MAX)."""
        tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [bool(value) for value in tensor.tolist()]

    def same_on_all(self, value: int) -> bool:
        """True on every rank if every rank passed the same value (MAX of value and -value)."""
        tensor = torch.tensor([value, -value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        highest, lowest = tensor[0].item(), -tensor[1].item()
        return highest == lowest

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def join_gang(
    rank: int,
    world_size: int,
    environ: Mapping[str, str] | None = None,
    *,
    timeout: timedelta = JOIN_TIMEOUT,
) -> TorchGang:
    """Join the gloo process group of `world_size` ranks at BATON_MASTER_ADDR:PORT.

    Raises GangError, in words, when the address is missing or rank 0 (on rank 0: one of the
    others) cannot be reached within `timeout`."""
    env = os.environ if environ is None else environ
    addr = env.get("BATON_MASTER_ADDR", "").strip()
    port = env.get("BATON_MASTER_PORT", "").strip()
    if not addr or not port.isdigit():
        raise GangError(
            f"rank {rank} of {world_size}: BATON_MASTER_ADDR and BATON_MASTER_PORT must name "
            f"rank 0 (got {addr!r}:{port!r})"
        )
    where = f"{addr}:{port}"
    try:
        # Rank 0 serves the rendezvous and waits until every rank has connected to it.
        store = dist.TCPStore(addr, int(port), world_size, is_master=rank == 0, timeout=timeout)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
        )
    except (RuntimeError, ValueError) as exc:  # torch's DistError family derives from these
        detail = next(iter(str(exc).splitlines()), type(exc).__name__)
        seconds = f"{timeout.total_seconds():g}s"
        if rank == 0:
            problem = f"could not gather every rank at {where} within {seconds}"
        else:
            problem = f"could not reach rank 0 at {where} within {seconds}"
        raise GangError(f"rank {rank} of {world_size} {problem}: {detail}") from exc
    logger.info("rank %d of %d joined the gang at %s", rank, world_size, where)
    return TorchGang(world_size)


def position() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a process group."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def average_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Replace every gradient by its mean over the ranks (one all-reduce for all of them)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()

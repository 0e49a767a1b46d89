"""Capacity backends: what starts, stops and describes the machine behind an Instance.

The orchestrator codes against `CapacityBackend`; `local` runs each instance as an agent
process on this machine. An AWS (EC2) or Kubernetes backend implements the same three calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from django.conf import settings

if TYPE_CHECKING:
    from migration.models import CapacityPool, Instance


@dataclass(frozen=True)
class AgentSpec:
    """What to run for one instance, built by the orchestrator."""

    argv: list[str]
    environ: dict[str, str]
    delay_s: float


@dataclass(frozen=True)
class BackendStatus:
    state: str  # "provisioning" | "running" | "gone"
    detail: str = ""


class CapacityBackend(Protocol):
    name: str

    def launch(self, instance: Instance, agent: AgentSpec) -> str:
        """Start the instance's agent after `agent.delay_s`; returns the backend's id (local:
        the pid; EC2: the instance id). A second call for a live instance starts nothing."""
        ...

    def release(self, instance: Instance, grace_s: float = 0.0) -> None:
        """End the instance: at once (grace 0, as a cloud reclaims), or a stop request (the
        agent's SIGTERM) and the end after `grace_s`, without blocking the caller for it.
        Idempotent, also for an instance that is already gone."""
        ...

    def describe(self, instance: Instance) -> BackendStatus:
        """Whether the machine is still being provisioned, runs its agent, or is gone."""
        ...


class BackendUnavailable(NotImplementedError):
    """The pool names a backend this installation cannot drive (yet)."""


def instance_dir(instance_id: int) -> Path:
    """BATON_HOME/instances/<id>/: the instance's folder (agent state, logs, checkpoint dir)."""
    return Path(settings.BATON_INSTANCE_ROOT) / str(instance_id)


def provisioning_delay(pool: CapacityPool) -> float:
    """The pool's provisioning delay, or BATON_PROVISIONING_DELAY_S when set."""
    forced = settings.BATON_PROVISIONING_DELAY_S
    return float(pool.provisioning_delay_s if forced is None else forced)


def get_backend(name: str) -> CapacityBackend:
    """The backend a pool names (`CapacityPool.backend`)."""
    if name == "local":
        from migration.backends.local import LocalBackend

        return LocalBackend()
    if name == "aws":
        raise BackendUnavailable(
            "the 'aws' capacity backend (EC2 through boto3) is not implemented yet; "
            "pools must use the local backend"
        )
    raise BackendUnavailable(f"there is no capacity backend named {name!r}")

"""The local backend: every instance is an agent process tree on this machine, in its own
folder `BATON_HOME/instances/<id>/` (see `localproc` for how its processes are found and
which of them may be signalled)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from migration.backends import AgentSpec, BackendStatus, instance_dir, localproc

if TYPE_CHECKING:
    from migration.models import Instance


logger = logging.getLogger(__name__)


class LocalBackend:
    name = "local"

    def launch(self, instance: Instance, agent: AgentSpec) -> str:
        folder = instance_dir(instance.pk)
        running = localproc.read_pid(folder)
        if running is not None and localproc.is_ours(running, folder):
            return str(running)  # launched already: never a second agent for one instance
        aside = localproc.set_aside(folder)
        if aside is not None:
            logger.warning(
                "instance %s: its folder held an earlier instance's files; moved to %s",
                instance.pk,
                aside,
            )
        environ = localproc.agent_environment(
            {**agent.environ, "BATON_INSTANCE_ID": str(instance.pk)}
        )
        return str(localproc.spawn(folder, agent.argv, environ, agent.delay_s))

    def release(self, instance: Instance, grace_s: float = 0.0) -> None:
        localproc.stop(instance_dir(instance.pk), grace_s)

    def describe(self, instance: Instance) -> BackendStatus:
        """From the instance's first process alone (the sweep asks this of every running
        instance every few seconds): without its agent an instance is gone, whatever it left
        behind; `release` ends that."""
        folder = instance_dir(instance.pk)
        pid = localproc.read_pid(folder)
        if pid is None and instance.backend_id.isdigit():
            pid = int(instance.backend_id)
        if pid is None or not localproc.is_ours(pid, folder):
            return BackendStatus("gone", "no agent process")
        if localproc.still_waiting(pid):
            return BackendStatus("provisioning", f"pid {pid}, waiting out the delay")
        return BackendStatus("running", f"pid {pid}")

"""The local backend: every instance is an agent process group on this machine, in its own
folder `BATON_HOME/instances/<id>/` (see `localproc` for how processes are handled)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from migration.backends import AgentSpec, BackendStatus, instance_dir, localproc

if TYPE_CHECKING:
    from migration.models import Instance


class LocalBackend:
    name = "local"

    def launch(self, instance: Instance, agent: AgentSpec) -> str:
        folder = instance_dir(instance.pk)
        running = localproc.read_pid(folder)
        if running is not None and localproc.is_ours(running, str(instance.pk)):
            return str(running)  # launched already: never a second agent for one instance
        environ = localproc.agent_environment(
            {**agent.environ, "BATON_INSTANCE_ID": str(instance.pk)}
        )
        return str(localproc.spawn(folder, agent.argv, environ, agent.delay_s))

    def _pid(self, instance: Instance) -> int | None:
        if instance.backend_id.isdigit():
            return int(instance.backend_id)
        return localproc.read_pid(instance_dir(instance.pk))

    def release(self, instance: Instance, grace_s: float = 0.0) -> None:
        pid = self._pid(instance)
        if pid is not None:
            localproc.stop(pid, str(instance.pk), grace_s)

    def describe(self, instance: Instance) -> BackendStatus:
        pid = self._pid(instance)
        if pid is None or not localproc.is_ours(pid, str(instance.pk)):
            return BackendStatus("gone", "no process")
        if localproc.still_waiting(pid):
            return BackendStatus("provisioning", f"pid {pid}, waiting out the delay")
        return BackendStatus("running", f"pid {pid}")

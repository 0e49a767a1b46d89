"""The built-in workload templates a job may name, with the parameters each accepts.

Shared by the portal (validates `{"template", "params"}` and derives the estimator's inputs)
and the instance side (turns params into command-line flags). No Django here.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Param:
    """One template parameter: `name` in params, `--name-with-dashes` on the command line."""

    kind: type
    default: float | int
    minimum: float | int = 0
    help: str = ""
    # Bounds what one job can ask of a machine (memory, time per step) now that jobs run.
    maximum: float | int = 2**31 - 1

    def parse(self, name: str, value: object) -> float | int:
        """Coerce a JSON value; raise ValueError with a message naming the problem."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number")
        if self.kind is int and value != int(value):
            raise ValueError(f"{name} must be a whole number")
        if value < self.minimum:
            raise ValueError(f"{name} must be at least {self.minimum}")
        if value > self.maximum:
            raise ValueError(f"{name} must be at most {self.maximum}")
        return self.kind(value)


COMMON: dict[str, Param] = {
    "seed": Param(
        int, 0, maximum=2**32 - 1, help="Random seed; the same seed gives the same weights."
    ),
    "step_ms": Param(
        float,
        0.0,
        maximum=60_000,
        help="Minimum wall time per step (stands in for a GPU's pace).",
    ),
    "state_mb": Param(
        float, 0.0, maximum=16_384, help="Pads the model state to about this many MiB."
    ),
}
MLP: dict[str, Param] = {
    "hidden": Param(int, 64, minimum=1, maximum=65_536, help="Hidden units."),
    "batch": Param(int, 64, minimum=1, maximum=65_536, help="Examples per step."),
    "lr": Param(float, 0.05, minimum=0.0, maximum=100.0, help="Learning rate."),
}


@dataclass(frozen=True)
class Template:
    name: str
    module: str
    sdk: bool
    params: dict[str, Param] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    description: str = ""

    def defaults(self) -> dict[str, float | int]:
        return {name: p.default for name, p in self.params.items()}

    def argv(self, steps: int, params: dict[str, float | int]) -> list[str]:
        """The command that runs this template for `steps` steps with `params`."""
        cmd = [sys.executable, "-m", self.module, "--steps", str(steps)]
        for name, value in sorted({**self.defaults(), **params}.items()):
            cmd += ["--" + name.replace("_", "-"), str(value)]
        return cmd

    def checkpoint_gb(self, params: dict[str, float | int]) -> float:
        """Size of one full checkpoint, for the estimator."""
        merged = {**self.defaults(), **params}
        mib = float(merged.get("state_mb", 0)) + float(merged.get("base_mb", 0))
        mib += 0.1  # the model itself and the extra state
        return mib / 1024

    def expected_hours(self, steps: int, params: dict[str, float | int]) -> float:
        """Work on the requested hardware: the minimum pace per step, at least 10 ms."""
        step_ms = max(float({**self.defaults(), **params}.get("step_ms", 0)), 10.0)
        return steps * step_ms / 3_600_000


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template(
            "mlp_numpy",
            "jobs.workloads.mlp_numpy",
            sdk=True,
            params={**COMMON, **MLP},
            description="A numpy MLP on synthetic data with a fixed validation batch.",
        ),
        Template(
            "mlp_torch",
            "jobs.workloads.mlp_torch",
            sdk=True,
            params={**COMMON, **MLP},
            needs=("torch",),
            description="The same MLP in torch (needs torch installed).",
        ),
        Template(
            "lora_sim",
            "jobs.workloads.lora_sim",
            sdk=True,
            params={
                **COMMON,
                "base_mb": Param(
                    float, 64.0, maximum=16_384, help="Size of the frozen base model in MiB."
                ),
                "trainable_fraction": Param(
                    float,
                    0.02,
                    minimum=0.0001,
                    maximum=1.0,
                    help="Share of parameters the adapter trains.",
                ),
            },
            description="A large frozen base and a small trainable adapter (incremental saves).",
        ),
        Template(
            "dir_mode_example",
            "jobs.workloads.dir_mode_example",
            sdk=False,
            params=dict(COMMON),
            description="A plain script with --resume-from-checkpoint DIR (directory mode).",
        ),
    )
}


def validate_params(template: str, params: object) -> dict[str, float | int]:
    """Check `params` against the template; raise ValueError naming the problem."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown workload template {template!r}; choose from {sorted(TEMPLATES)}")
    if not isinstance(params, dict):
        raise ValueError("params must be an object")
    spec = TEMPLATES[template].params
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for {template}; it accepts {sorted(spec)}"
        )
    return {name: spec[name].parse(name, value) for name, value in params.items()}


def validate_directory_options(workload: dict[str, object]) -> dict[str, object]:
    """The optional keys of a directory-mode command; raise ValueError naming the problem.

    `resume_args`: arguments added to the command only when it resumes from a checkpoint.
    `progress_pattern`: a regex whose first group is the step, read from the command's output.
    """
    options: dict[str, object] = {}
    if "resume_args" in workload:
        args = workload["resume_args"]
        if not (isinstance(args, list) and all(isinstance(a, str) and a for a in args)):
            raise ValueError("resume_args must be a list of non-empty strings")
        options["resume_args"] = args
    if "progress_pattern" in workload:
        pattern = workload["progress_pattern"]
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("progress_pattern must be a non-empty string")
        try:
            groups = re.compile(pattern).groups
        except re.error as exc:
            raise ValueError(f"progress_pattern is not a valid regex ({exc})") from None
        if groups < 1:
            raise ValueError("progress_pattern needs a group that captures the step")
        options["progress_pattern"] = pattern
    return options

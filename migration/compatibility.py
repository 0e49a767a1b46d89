"""Which hardware may run a job: the exact accelerator, or a substitute the matrix allows.

Pure domain code over dataclasses (no Django): the service layer turns rows into `Rule`s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """An enabled or disabled cell of the compatibility matrix."""

    source: str
    target: str
    kind: str  # larger_memory | cross_generation | model_parallel
    target_count: int = 1
    enabled: bool = True


@dataclass(frozen=True)
class HardwareOption:
    """One way to run a node of the job: `gpus_per_instance` cards of `accelerator`."""

    accelerator: str
    gpus_per_instance: int
    rule_kind: str | None = None  # None for the exact match
    target_count: int = 1

    @property
    def substitute(self) -> bool:
        return self.rule_kind is not None

    def describe(self, requested: str) -> str:
        if not self.substitute:
            return f"exact match ({self.gpus_per_instance} x {self.accelerator})"
        kind = (self.rule_kind or "").replace("_", " ")
        return f"substitute for {requested}: {self.gpus_per_instance} x {self.accelerator} ({kind})"


def hardware_options(
    accelerator: str, gpus_per_node: int, rules: list[Rule], allow_model_parallel: bool
) -> list[HardwareOption]:
    """The exact match first, then every enabled substitute from `accelerator`.

    A pool fits an option when its GPUs per instance equal the job's GPUs per node times the
    rule's target count (DESIGN §6); model-parallel substitutes only when the job allows them.
    """
    options = [HardwareOption(accelerator, gpus_per_node)]
    for rule in rules:
        if not rule.enabled or rule.source != accelerator or rule.target == accelerator:
            continue
        if rule.kind == "model_parallel" and not allow_model_parallel:
            continue
        options.append(
            HardwareOption(
                rule.target, gpus_per_node * rule.target_count, rule.kind, rule.target_count
            )
        )
    return options

"""The submission form's fields as the API's job body, and its errors back on the fields.

The page posts plain form fields (a field per template parameter, a command one argument per
line); `static/js/job_form.js` builds the same body for the live estimate, so the form, the
estimate and `POST /api/jobs/` see one job. The serializer does every check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.choices import Tolerance
from jobs.workloads.catalog import TEMPLATES, Param

# Fields copied as they are when filled in (the serializer parses and bounds them).
PLAIN_FIELDS = (
    "name",
    "accelerator",
    "gpus_per_node",
    "nodes",
    "total_steps",
    "tolerance",
    "max_price_per_hour",
    "deadline",
    "checkpoint_every_steps",
    "checkpoint_every_seconds",
    "max_interruptions",
    "max_wait_s",
)
FLAGS = ("allow_model_parallel", "allow_on_demand_fallback")

# What each tolerance does, in one sentence (costs/policies.py decides).
TOLERANCE_SENTENCES = {
    Tolerance.AGGRESSIVE: "Takes the cheapest spot and goes on-demand only after waiting "
    "the longest wait below without spot.",
    Tolerance.BALANCED: "Takes whichever of spot and on-demand is cheaper to finish, "
    "counting the work interruptions would cost.",
    Tolerance.CONSERVATIVE: "Uses only spot interrupted at most 0.5 times an hour, and "
    "on-demand once the job reaches its maximum interruptions.",
}


@dataclass(frozen=True)
class ParamField:
    """One template parameter as a form input."""

    template: str
    name: str
    spec: Param

    @property
    def input_name(self) -> str:
        return f"param-{self.template}-{self.name}"

    @property
    def step(self) -> str:
        return "1" if self.spec.kind is int else "any"


def param_fields(template: str) -> list[ParamField]:
    return [ParamField(template, name, spec) for name, spec in TEMPLATES[template].params.items()]


def _number(text: str) -> Any:
    """A form's number as JSON would carry it; anything else is left for the serializer to
    refuse by name."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def workload_from_form(post: Any) -> dict[str, Any]:
    if post.get("workload_kind") == "command":
        workload: dict[str, Any] = {"command": _lines(post.get("command", "")), "mode": "directory"}
        resume_args = _lines(post.get("resume_args", ""))
        if resume_args:
            workload["resume_args"] = resume_args
        pattern = post.get("progress_pattern", "").strip()
        if pattern:
            workload["progress_pattern"] = pattern
        return workload
    template = post.get("template", "")
    params = {}
    if template in TEMPLATES:
        for field in param_fields(template):
            value = post.get(field.input_name, "").strip()
            if value:
                params[field.name] = _number(value)
    return {"template": template, "params": params}


def job_body_from_form(post: Any) -> dict[str, Any]:
    """The form's fields as the API's JSON body (empty fields left out). A deadline is read in
    UTC, as the form says."""
    body: dict[str, Any] = {"workload": workload_from_form(post)}
    for name in PLAIN_FIELDS:
        value = post.get(name, "").strip()
        if value:
            body[name] = value + "Z" if name == "deadline" and len(value) <= 19 else value
    for flag in FLAGS:
        body[flag] = post.get(flag) == "on"
    return body


def errors_by_field(errors: dict[str, Any], post: Any) -> dict[str, str]:
    """The serializer's errors by form input: a template parameter's own error goes next to its
    field (the catalogue's messages start with the parameter's name)."""
    shown = {name: " ".join(str(m) for m in messages) for name, messages in errors.items()}
    workload = shown.get("workload", "")
    template = post.get("template", "")
    if workload and post.get("workload_kind") != "command" and template in TEMPLATES:
        for field in param_fields(template):
            if workload.startswith(field.name + " "):
                shown[field.input_name] = shown.pop("workload")
                break
    return shown

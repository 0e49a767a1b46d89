"""API fuzzing: schemathesis draws requests from /api/schema/ for every operation, fitting the
schema and not. No answer is a 5xx, every 400 names the fields it refuses, and every answer
comes within 2 s whatever the numbers. Examples are few and, under CI, the same on every run.

Hypothesis drives schemathesis's strategies directly (schemathesis's pytest plugin does not
work with the pytest we use)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.cache import cache
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from portal.tokens import issue_api_token
from tests.conftest import submit

pytestmark = pytest.mark.django_db

MAX_SECONDS = 2.0
EXAMPLES = 10
# A job body drawn at random names no accelerator that exists and no workload Baton knows, so
# it never gets past them to the numbers; half the draws get real ones, keeping the rest.
JOB_BODY_EXAMPLES = 40
REAL_ACCELERATORS = ["T4", "A10G", "V100-16GB"]
REAL_WORKLOADS = [
    {"template": "mlp_numpy", "params": {}},
    {"template": "lora_sim", "params": {"step_ms": 1}},
    {"template": "dir_mode_example", "params": {}},
]


@pytest.fixture
def api_schema(db: None) -> Iterator[Any]:
    """The schema, served in-process by Django's WSGI handler. As Django's test client does,
    requests keep the test's database connection (they would close it when they finish)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def auth_headers(catalogue: Any, make_user: Any) -> dict[str, str]:
    """Staff (every endpoint open to them) with a few jobs, so ids in paths sometimes exist."""
    user = make_user("fuzzer", staff=True)
    for _ in range(3):
        submit(user, catalogue)
    return {"Authorization": f"Token {issue_api_token(user).key}"}


def fields_of(case: Any) -> set[str]:
    """Names a 400 may point at: the operation's body properties and parameters, what the
    request sent, and DRF's catch-alls."""
    raw = case.operation.definition.raw
    components = case.operation.schema.raw_schema.get("components", {}).get("schemas", {})
    names = {"non_field_errors", "detail"}
    for media in raw.get("requestBody", {}).get("content", {}).values():
        component = media.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
        names.update(components.get(component, {}).get("properties", {}))
    names.update(parameter.get("name", "") for parameter in raw.get("parameters", []))
    for sent in (case.body, case.query):
        if isinstance(sent, dict):
            names.update(str(key) for key in sent)
    return names


def takes_a_job_body(operation: Any) -> bool:
    return operation.path in {"/api/jobs/", "/api/estimates/"} and operation.method == "post"


def with_real_names(drawn: tuple[Any, str | None, dict[str, Any] | None]) -> Any:
    case, accelerator, workload = drawn
    if isinstance(case.body, dict):
        if accelerator:
            case.body["accelerator"] = accelerator
            case.body.pop("project", None)  # random ids and dates rarely exist or lie ahead
            case.body.pop("deadline", None)
        if workload:
            case.body["workload"] = workload
    return case


def strategy_for(operation: Any, mode: GenerationMode) -> Any:
    cases = operation.as_strategy(generation_mode=mode)
    if not takes_a_job_body(operation):
        return cases
    return st.tuples(
        cases,
        st.sampled_from([None, *REAL_ACCELERATORS]),
        st.sampled_from([None, *REAL_WORKLOADS]),
    ).map(with_real_names)


def check_answer(case: Any, headers: dict[str, str], timings: list[tuple[float, str]]) -> None:
    cache.clear()  # the token endpoint's rate limit would turn every later draw into a 429
    started = time.monotonic()
    response = case.call(headers=headers)
    took = time.monotonic() - started
    timings.append((took, f"{case.method} {case.formatted_path}"))

    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
    assert took < MAX_SECONDS, f"{took:.2f} s for {case.as_curl_command()}"
    if response.status_code == 400:
        errors = response.json()
        assert isinstance(errors, dict) and errors, response.text[:500]
        vague = set(errors) - fields_of(case)
        assert not vague, f"a 400 naming no field of the request: {errors}"


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_5xx_or_a_vague_400_or_waits(
    api_schema: Any, auth_headers: dict[str, str], mode: GenerationMode
) -> None:
    failures: dict[str, str] = {}
    timings: list[tuple[float, str]] = []
    no_invalid_input: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    for operation in operations:

        @given(case=strategy_for(operation, mode))
        @settings(
            max_examples=JOB_BODY_EXAMPLES if takes_a_job_body(operation) else EXAMPLES,
            deadline=None,
            derandomize=bool(os.environ.get("CI")),
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            check_answer(case, auth_headers, timings)

        try:
            fuzz()
        except AssertionError as failure:
            failures[operation.label] = str(failure)[:1000]
        except Unsatisfiable:  # nothing of it can be invalid (a GET without parameters)
            assert mode == GenerationMode.NEGATIVE, operation.label
            no_invalid_input.append(operation.label)

    slowest = max(timings)
    print(
        f"\n{mode}: {len(timings)} requests over {len(operations)} operations "
        f"({len(no_invalid_input)} with no invalid input: {', '.join(no_invalid_input)}); "
        f"slowest {slowest[0]:.2f} s ({slowest[1]})"
    )
    assert len(operations) >= 15
    assert not failures, "\n\n".join(f"{label}: {why}" for label, why in failures.items())

"""CSRF on every form, no way out of a folder through names Baton is given (workload
templates, checkpoint manifest keys, directory-mode paths), and no secret in API output."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from migration.agent_tokens import issue_agent_token
from migration.checkpoint.errors import StoreConfigError
from migration.checkpoint.manifest import ManifestRef
from migration.models import Checkpoint
from portal.models import ApiToken
from portal.tokens import issue_api_token
from tests.conftest import job_body, placed_instance

pytestmark = pytest.mark.django_db

FORMS = [
    ("/login/", {"username": "alice", "password": "pw"}),
    ("/logout/", {}),
    ("/tokens/", {"name": "x", "days": "7"}),
    ("/jobs/new/", {"name": "x", "template": "mlp_numpy", "accelerator": "T4"}),
]


@pytest.mark.parametrize(("path", "data"), FORMS)
def test_every_form_needs_its_csrf_token(
    catalogue: Any, alice: Any, path: str, data: dict[str, str]
) -> None:
    client = Client(enforce_csrf_checks=True)
    if path != "/login/":
        client.force_login(alice)

    response = client.post(path, data)

    assert response.status_code == 403
    assert not ApiToken.objects.exists()


def test_the_session_api_needs_the_csrf_token_too(catalogue: Any, alice: Any) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.login(username="alice", password="pw")

    response = client.post("/api/jobs/", job_body(), format="json")

    assert response.status_code == 403 and "CSRF" in response.json()["detail"]


@pytest.mark.parametrize("name", ["../mlp_numpy", "mlp_numpy/../../etc", "/etc/passwd", "os"])
def test_a_workload_name_is_one_of_the_templates_or_nothing(
    catalogue: Any, alice: Any, client_for: Any, name: str
) -> None:
    body = job_body(workload={"template": name, "params": {}})

    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400 and "workload" in response.json()


@pytest.mark.parametrize(
    "key",
    [
        "jobs/1/manifests/../../../etc/passwd",
        "../jobs/1/manifests/000000000010-periodic-r0.json",
        "jobs/1/../2/manifests/000000000010-periodic-r0.json",
        "/etc/passwd",
    ],
)
def test_a_manifest_key_cannot_leave_the_store(key: str) -> None:
    with pytest.raises(StoreConfigError):
        ManifestRef.parse(key)


def test_an_agent_cannot_report_a_checkpoint_outside_its_jobs_folder(
    catalogue: Any, alice: Any
) -> None:
    instance = placed_instance(alice, catalogue)
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Agent {issue_agent_token(instance)}")
    manifests = [
        "jobs/1/manifests/../../../../etc/passwd",
        f"jobs/{instance.job_id + 1}/manifests/000000000010-periodic-r0.json",
    ]
    events = [
        {"seq": seq, "type": "checkpoint", "manifest": key, "step": 10, "kind": "periodic"}
        for seq, key in enumerate(manifests, start=1)
    ]

    response = agent.post("/api/agent/events/", {"events": events}, format="json")

    assert response.status_code == 200
    assert not Checkpoint.objects.exists()


def test_directory_mode_restores_no_path_outside_its_folder(tmp_path: Any) -> None:
    from migration.checkpoint.directory import _safe_relative
    from migration.checkpoint.errors import StoreError

    for path in ("../escape", "/etc/passwd", "a/../../b", "", "a//b"):
        with pytest.raises(StoreError):
            _safe_relative(path)
    assert str(_safe_relative("sub/file.bin")) == "sub/file.bin"


def test_no_token_or_hash_appears_in_api_output(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    instance = placed_instance(alice, catalogue)
    agent_token = issue_agent_token(instance)
    issued = issue_api_token(alice)
    client = client_for(alice)

    outputs = [
        client.get(path).content.decode()
        for path in (
            f"/api/jobs/{instance.job_id}/",
            "/api/jobs/",
            f"/api/instances/?job={instance.job_id}",
            f"/api/instances/{instance.pk}/",
            f"/api/jobs/{instance.job_id}/timeline/",
        )
    ]
    instance.refresh_from_db()
    secrets = {agent_token, issued.key, issued.token.key_hash}
    secrets |= {v for k, v in vars(instance).items() if "token" in k and isinstance(v, str) and v}

    for output in outputs:
        assert json.loads(output) is not None
        assert not [s for s in secrets if s in output]

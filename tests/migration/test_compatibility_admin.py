"""The compatibility matrix in the admin: rules inline on each card, clear validation."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from migration.models import CompatibilityRule
from tests.conftest import submit

pytestmark = pytest.mark.django_db


def rule(catalogue: Any, source: str, target: str, kind: str, count: int = 1) -> CompatibilityRule:
    acc = catalogue["accelerators"]
    return CompatibilityRule(source=acc[source], target=acc[target], kind=kind, target_count=count)


@pytest.mark.parametrize(
    ("source", "target", "kind", "count", "field", "message"),
    [
        ("T4", "T4", "cross_generation", 1, "target", "no rule to run on itself"),
        ("V100-32GB", "V100-16GB", "model_parallel", 1, "target_count", "N >= 2"),
        ("V100-16GB", "V100-32GB", "larger_memory", 2, "target_count", "Only model-parallel"),
        ("V100-32GB", "V100-16GB", "larger_memory", 1, "target", "more than 32 GiB"),
        ("A10G", "T4", "cross_generation", 1, "target", "newer card"),
        ("T4", "A10G", "cross_generation", 1, "target", "exists"),  # the catalogue has it
    ],
)
def test_it_rejects_a_rule_the_matrix_cannot_mean(
    catalogue: Any, source: str, target: str, kind: str, count: int, field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as error:
        rule(catalogue, source, target, kind, count).full_clean()

    assert message in " ".join(error.value.message_dict[field])


def test_it_accepts_the_rules_of_the_seed(catalogue: Any) -> None:
    rule(catalogue, "V100-16GB", "V100-32GB", "larger_memory").full_clean()
    rule(catalogue, "V100-32GB", "V100-16GB", "model_parallel", 2).full_clean()


@pytest.fixture
def admin_client(client: Any, make_user: Any) -> Any:
    client.force_login(make_user("root", staff=True))
    return client


def test_rules_are_managed_inline_on_the_card(catalogue: Any, admin_client: Any) -> None:
    v100 = catalogue["accelerators"]["V100-16GB"]
    url = reverse("admin:migration_accelerator_change", args=[v100.pk])
    form = {
        "name": "V100-16GB",
        "generation": "Volta",
        "memory_gib": 16,
        "compute_capability": "7.0",
        "interconnect": "nvlink",
        "rules-TOTAL_FORMS": 1,
        "rules-INITIAL_FORMS": 0,
        "rules-0-target": v100.pk,
        "rules-0-kind": "larger_memory",
        "rules-0-target_count": 1,
        "rules-0-enabled": "on",
    }

    refused = admin_client.post(url, form)
    form["rules-0-target"] = catalogue["accelerators"]["V100-32GB"].pk
    saved = admin_client.post(url, form)

    assert refused.status_code == 200
    assert "A card needs no rule to run on itself" in refused.content.decode()
    assert saved.status_code == 302
    assert CompatibilityRule.objects.filter(source=v100, kind="larger_memory").count() == 1


def test_every_admin_list_page_opens(catalogue: Any, admin_client: Any, alice: Any) -> None:

    submit(alice, catalogue)
    for model in [
        "migration/region",
        "migration/accelerator",
        "migration/compatibilityrule",
        "migration/capacitypool",
        "migration/instance",
        "migration/interruptionevent",
        "migration/migration",
        "migration/timelineevent",
        "migration/checkpoint",
        "migration/logline",
        "jobs/job",
        "jobs/project",
        "costs/pricesample",
        "costs/availabilitysample",
    ]:
        response = admin_client.get(
            f"/admin/{model}/?kind__exact=larger_memory" if "rule" in model else f"/admin/{model}/"
        )
        assert response.status_code == 200, model


def test_the_admin_is_for_staff_only(client: Any, alice: Any) -> None:
    client.force_login(alice)

    assert client.get("/admin/migration/capacitypool/").status_code == 302

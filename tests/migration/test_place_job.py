"""The placement service: state changes, reservations, waiting and fallback, events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from costs.policies import decide_market
from jobs import services as job_services
from jobs.models import Job
from migration import selectors, services, sweeps
from migration.models import CapacityPool, Instance, TimelineEvent
from tests.conftest import submit

pytestmark = pytest.mark.django_db


def kinds(job: Job) -> list[str]:
    return list(TimelineEvent.objects.filter(job=job).values_list("kind", flat=True))


def test_it_reserves_the_cheapest_spot_pool_and_records_why(catalogue: Any, alice: Any) -> None:
    job = submit(alice, catalogue)

    outcome = services.place_job(job.pk)

    job.refresh_from_db()
    assert outcome.placed
    assert job.state == "starting" and job.market == "spot"
    assert job.pool == catalogue["pools"]["t4_spot"]
    assert Instance.objects.filter(job=job, state="provisioning").count() == 1
    event = TimelineEvent.objects.get(job=job, kind="placement_decided")
    assert event.data["pool"] == job.pool_id and event.data["market"] == "spot"
    assert "cheapest compatible spot pool" in event.data["reason"].lower()
    assert event.data["policy"] == "spot"


def test_placing_twice_does_not_reserve_twice(catalogue: Any, alice: Any) -> None:
    job = submit(alice, catalogue)

    services.place_job(job.pk)
    again = services.place_job(job.pk)

    assert not again.placed and "starting" in again.reason
    assert Instance.objects.filter(job=job).count() == 1


def test_a_gang_is_placed_in_one_pool(catalogue: Any, alice: Any) -> None:
    job = submit(alice, catalogue, nodes=3)

    services.place_job(job.pk)

    instances = Instance.objects.filter(job=job)
    assert sorted(instances.values_list("rank", flat=True)) == [0, 1, 2]
    assert instances.values("pool").distinct().count() == 1


def test_a_job_waits_for_spot_up_to_its_max_wait_then_falls_back_to_on_demand(
    catalogue: Any, alice: Any
) -> None:
    first = submit(alice, catalogue, accelerator="V100-16GB")
    second = submit(alice, catalogue, accelerator="V100-16GB", max_wait_s=600)
    services.place_job(first.pk)

    services.place_job(second.pk)
    services.place_job(second.pk)  # beat's retry: still waiting, told once
    second.refresh_from_db()
    assert second.state == "waiting" and kinds(second).count("waiting") == 1
    Job.objects.filter(pk=second.pk).update(waiting_since=timezone.now() - timedelta(minutes=11))
    services.place_job(second.pk)

    second.refresh_from_db()
    assert second.market == "on_demand" and second.pool == catalogue["pools"]["v100_od"]
    assert kinds(second)[-2:] == ["fallback_on_demand", "placement_decided"]
    fallback = TimelineEvent.objects.get(job=second, kind="fallback_on_demand").data
    assert fallback["policy"] == "max_wait" and "max wait" in fallback["reason"]


def test_a_conservative_job_avoids_spot_that_is_interrupted_often(
    catalogue: Any, alice: Any
) -> None:
    CapacityPool.objects.filter(market="spot").update(interruption_rate_per_hour=1.2)
    job = submit(alice, catalogue, tolerance="conservative")

    services.place_job(job.pk)

    job.refresh_from_db()
    assert job.market == "on_demand"
    assert (
        TimelineEvent.objects.get(job=job, kind="fallback_on_demand").data["policy"]
        == "conservative_rate"
    )


def test_a_balanced_job_takes_on_demand_when_spot_is_expected_to_cost_more(
    catalogue: Any, alice: Any
) -> None:
    CapacityPool.objects.filter(market="spot", accelerator__name="V100-16GB").update(
        interruption_rate_per_hour=30.0
    )
    job = submit(alice, catalogue, accelerator="V100-16GB", tolerance="balanced")

    services.place_job(job.pk)

    job.refresh_from_db()
    assert job.market == "on_demand"
    assert (
        "expected to cost"
        in TimelineEvent.objects.get(job=job, kind="fallback_on_demand").data["reason"]
    )


def tight_deadline_job(alice: Any, catalogue: Any) -> Any:
    """Two hours of work, five minutes of slack: no room for a restart."""
    return submit(
        alice,
        catalogue,
        tolerance="aggressive",
        expected_hours=2.0,
        deadline=timezone.now() + timedelta(hours=2, minutes=5),
    )


def test_a_deadline_without_slack_goes_straight_to_on_demand(catalogue: Any, alice: Any) -> None:
    job = tight_deadline_job(alice, catalogue)

    services.place_job(job.pk)

    job.refresh_from_db()
    assert job.market == "on_demand"
    assert (
        TimelineEvent.objects.get(job=job, kind="fallback_on_demand").data["policy"] == "safety_net"
    )


def test_a_deadline_with_slack_stays_on_spot(catalogue: Any, alice: Any) -> None:
    job = submit(
        alice,
        catalogue,
        tolerance="aggressive",
        expected_hours=2.0,
        deadline=timezone.now() + timedelta(hours=10),
    )

    services.place_job(job.pk)

    job.refresh_from_db()
    assert job.market == "spot"


def test_a_job_waits_when_nothing_fits_and_is_placed_when_capacity_frees(
    catalogue: Any, alice: Any
) -> None:
    jobs = [
        submit(alice, catalogue, accelerator="V100-16GB", allow_on_demand_fallback=False)
        for _ in range(2)
    ]
    for job in jobs:
        services.place_job(job.pk)
    waiting = Job.objects.get(pk=jobs[1].pk)
    assert waiting.state == "waiting" and kinds(waiting)[-1] == "waiting"
    assert services.jobs_to_retry() == [waiting.pk]

    job_services.cancel_job(jobs[0].pk, alice)
    services.place_job(waiting.pk)

    waiting.refresh_from_db()
    assert waiting.state == "starting" and waiting.waiting_since is None


def test_pool_capacity_is_never_oversubscribed(catalogue: Any, alice: Any) -> None:
    jobs = [submit(alice, catalogue, allow_on_demand_fallback=False) for _ in range(8)]
    for job in jobs:
        services.place_job(job.pk)

    for pool in catalogue["pools"].values():
        assert Instance.objects.filter(pool=pool).count() <= pool.capacity
    states = sorted(Job.objects.values_list("state", flat=True))
    # T4 spot: 3 + 3 (us-west-2) exact, then 2 on A10G through the cross-generation rule.
    assert states.count("starting") == 8


def test_jobs_beyond_every_compatible_pool_wait(catalogue: Any, alice: Any) -> None:
    jobs = [submit(alice, catalogue, allow_on_demand_fallback=False) for _ in range(9)]
    for job in jobs:
        services.place_job(job.pk)

    assert Job.objects.filter(state="waiting").count() == 1


def test_recovery_after_a_crash_ends_orphans_and_requeues_their_jobs(
    catalogue: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = submit(alice, catalogue)
    services.place_job(job.pk)

    with django_capture_on_commit_callbacks(execute=False):
        requeued = sweeps.recover_local_instances()

    job.refresh_from_db()
    assert requeued == [job.pk]
    assert job.state == "migrating"
    assert not Instance.objects.filter(job=job, state="provisioning").exists()
    released = job.events.get(kind="released")
    assert released.migration is not None and released.migration.phase == "placing"


@pytest.mark.django_db(transaction=True)
def test_pool_capacity_holds_when_jobs_are_placed_at_the_same_time(
    catalogue: Any, alice: Any
) -> None:
    import threading

    from django.db import connection

    jobs = [submit(alice, catalogue, accelerator="V100-16GB") for _ in range(6)]
    start = threading.Barrier(len(jobs))

    def place(job_id: int) -> None:
        start.wait()
        try:
            services.place_job(job_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=place, args=(job.pk,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    for pool in CapacityPool.objects.filter(accelerator__name="V100-16GB"):
        held = Instance.objects.filter(pool=pool, state="provisioning").count()
        assert held <= pool.capacity, pool
    states = sorted(Job.objects.values_list("state", flat=True))
    assert set(states) == {"starting", "waiting"}  # every job decided, none lost or doubled
    assert Instance.objects.count() == states.count("starting")


def fill(*pools: CapacityPool, capacity: int = 0) -> None:
    CapacityPool.objects.filter(pk__in=[p.pk for p in pools]).update(capacity=capacity)


def test_the_policy_judges_the_spot_pool_with_room_not_a_cheaper_full_one(
    catalogue: Any, alice: Any
) -> None:
    pools = catalogue["pools"]
    fill(pools["t4_spot"])  # the cheapest and calmest spot pool, but full
    CapacityPool.objects.filter(market="spot").exclude(pk=pools["t4_spot"].pk).update(
        interruption_rate_per_hour=30.0
    )
    job = submit(alice, catalogue, tolerance="balanced")

    choice, decision, reason = selectors.placement_decision(job)

    assert decision.rule == "cheaper_on_demand"
    assert "30.00 interruptions per hour" in decision.reason
    assert choice is not None and choice.pool.id == pools["t4_od"].pk
    assert reason.startswith(decision.reason)


def test_with_no_spot_room_spot_is_unavailable_to_the_policy(catalogue: Any, alice: Any) -> None:
    pools = catalogue["pools"]
    fill(pools["t4_spot"], pools["t4_spot_west"], pools["a10g_spot"])
    aggressive = submit(alice, catalogue, tolerance="aggressive", max_wait_s=600)

    choice, decision, _reason = selectors.placement_decision(aggressive)

    assert choice is None and decision.wait and decision.rule == "wait_for_spot"
    Job.objects.filter(pk=aggressive.pk).update(
        waiting_since=timezone.now() - timedelta(minutes=11)
    )
    aggressive.refresh_from_db()
    choice, decision, _reason = selectors.placement_decision(aggressive)
    assert decision.rule == "max_wait" and choice is not None
    assert choice.pool.id == pools["t4_od"].pk


def test_a_deadline_at_risk_takes_spot_with_room_when_on_demand_is_full(
    catalogue: Any, alice: Any
) -> None:
    fill(catalogue["pools"]["t4_od"])
    job = tight_deadline_job(alice, catalogue)

    services.place_job(job.pk)

    job.refresh_from_db()
    assert job.state == "starting" and job.market == "spot"
    event = TimelineEvent.objects.get(job=job, kind="placement_decided").data
    assert event["policy"] == "safety_net_spot"
    assert "Deadline at risk" in event["reason"] and "waiting spends slack" in event["reason"]


def test_placement_leaves_out_excluded_pools_and_weighs_the_checkpoint_copy(
    catalogue: Any, alice: Any
) -> None:
    pools = catalogue["pools"]
    job = submit(alice, catalogue, expected_hours=1.0, checkpoint_gb=200.0)

    choice, _decision, _reason = selectors.placement_decision(
        job, exclude_pools=frozenset({pools["t4_spot"].pk, pools["a10g_spot"].pk})
    )
    near, _decision, reason = selectors.placement_decision(
        job, replica_regions=frozenset({"us-west-2"})
    )

    assert choice is not None and choice.pool.id == pools["t4_spot_west"].pk
    # 200 GB would take 33 min to copy to us-east-1: the replica's region wins at 0.20/h.
    assert near is not None and near.pool.id == pools["t4_spot_west"].pk
    assert "the ready checkpoint replica decided" in reason


def running(job: Job, pool: CapacityPool, **fields: Any) -> Job:
    Job.objects.filter(pk=job.pk).update(state="running", pool=pool, market=pool.market, **fields)
    job.refresh_from_db()
    return job


def running_behind_plan(job: Job, pool: CapacityPool) -> Job:
    """Running in `pool` behind its uniform plan, with 10 h of slack: 10 h of work left (of 10)
    and 20 h to a deadline set 30 h ago."""
    now = timezone.now()
    return running(
        job, pool, created_at=now - timedelta(hours=10), deadline=now + timedelta(hours=20)
    )


def test_a_spot_job_on_plan_stays_on_spot_while_other_spot_pools_are_full(
    catalogue: Any, alice: Any
) -> None:
    pools = catalogue["pools"]
    job = submit(alice, catalogue, tolerance="aggressive", expected_hours=10.0)
    services.place_job(job.pk)
    fill(pools["t4_spot"], capacity=1)  # the job's own instance is the pool's last slot
    fill(pools["t4_spot_west"], pools["a10g_spot"])
    # Behind its plan but running on spot: the pool it holds is spot with room, so nothing
    # calls for on-demand.
    job = running_behind_plan(job, pools["t4_spot"])

    assert selectors.market_review(job) is None


def test_an_on_demand_job_with_slack_returns_to_spot_only_when_spot_costs_less(
    catalogue: Any, alice: Any
) -> None:
    pools = catalogue["pools"]
    job = submit(
        alice,
        catalogue,
        tolerance="aggressive",
        expected_hours=10.0,
        deadline=timezone.now() + timedelta(hours=30),
    )
    job = running(job, pools["t4_od"])

    decision = selectors.market_review(job)

    assert decision is not None and decision.market == "spot"
    assert decision.rule == "spot_with_slack" and "expected to cost" in decision.reason
    CapacityPool.objects.filter(market="spot").update(interruption_rate_per_hour=30.0)
    assert selectors.market_review(job) is None


def test_an_on_demand_job_behind_its_plan_returns_to_spot_once_the_pool_has_held_long_enough(
    catalogue: Any, alice: Any
) -> None:
    pools = catalogue["pools"]
    job = submit(alice, catalogue, tolerance="aggressive", expected_hours=10.0)
    job = running_behind_plan(job, pools["t4_od"])
    now = timezone.now()
    spot = CapacityPool.objects.filter(market="spot")

    spot.update(last_preempted_at=now - timedelta(minutes=1))
    situation = selectors.market_situation(job, selectors.prospects(job))
    assert situation.spot_available and situation.spot_available_hours == pytest.approx(
        1 / 60, abs=0.01
    )
    assert decide_market(situation).rule == "spot_too_recent"
    assert selectors.market_review(job) is None  # a spell of a minute: it stays on on-demand

    spot.update(last_preempted_at=now - timedelta(days=1))
    decision = selectors.market_review(job)
    assert decision is not None and decision.market == "spot"

    spot.update(last_preempted_at=None)  # never preempted: nothing holds it back
    decision = selectors.market_review(job)
    assert decision is not None and decision.market == "spot"


def test_a_spot_job_whose_slack_is_gone_is_told_to_move_to_on_demand(
    catalogue: Any, alice: Any
) -> None:
    pools = catalogue["pools"]
    job = submit(alice, catalogue, tolerance="balanced", expected_hours=10.0)
    job = running(job, pools["t4_spot"], deadline=timezone.now() + timedelta(hours=10, minutes=5))

    decision = selectors.market_review(job)

    assert decision is not None and decision.market == "on_demand"
    assert decision.rule == "safety_net"
    fill(pools["t4_od"])
    assert selectors.market_review(job) is None  # no on-demand room: it stays where it runs

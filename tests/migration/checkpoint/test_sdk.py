"""The Checkpointer SDK, in process: saving policy, restore, async persistence, notices, reports."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migration.checkpoint import (
    LocalStore,
    ManifestNotFound,
    ManifestRef,
    Store,
    StoreConfigError,
)
from migration.checkpoint import snapshot as snapshot_module
from migration.checkpoint.sdk import Checkpointer
from migration.checkpoint.snapshot import FrozenCache, Snapshot, is_frozen

from .conftest import new_s3_store
from .procs import in_forked_child
from .s3server import S3Server
from .test_store_contract import flip_byte, newest
from .test_two_tiers import GatedStore

MIB = 1024 * 1024


def make_ckpt(store: Store, **options: Any) -> Checkpointer:
    options.setdefault("job", "job-1")
    options.setdefault("every_seconds", None)
    options.setdefault("install_signal_handlers", False)
    return Checkpointer(store, **options)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    opened = LocalStore(tmp_path / "store", chunk_size=MIB)
    yield opened
    opened.close()


def test_restore_is_none_on_a_fresh_store(store: LocalStore) -> None:
    ckpt = make_ckpt(store, every_steps=2)
    assert ckpt.restore() is None
    ckpt.close()


def test_it_saves_every_n_steps_and_restores_the_last_commit_with_rng_states(
    store: LocalStore,
) -> None:
    ckpt = make_ckpt(store, every_steps=3)
    w = np.zeros(1000, np.float32)
    random.seed(5)
    np.random.seed(5)
    for step in range(1, 8):
        w += 1
        ckpt.maybe_save(step, {"model": {"w": w}}, {"loader_offset": step * 10}, val_loss=0.5)
        ckpt.wait()
        if step == 6:
            expected_python, expected_numpy = random.random(), np.random.random()
    ckpt.close()
    assert [r.step for r in store.list("job-1")] == [3, 6]
    random.seed(99)
    np.random.seed(99)
    again = make_ckpt(store, every_steps=3)
    restored = again.restore()
    assert restored is not None
    assert restored.step == 6 and restored.loader_offset == 60
    assert np.array_equal(restored.state["model"]["w"], np.full(1000, 6, np.float32))
    assert restored.validation_reference == 0.5
    assert (random.random(), np.random.random()) == (expected_python, expected_numpy)
    again.close()


def test_it_saves_every_t_seconds(store: LocalStore) -> None:
    ckpt = make_ckpt(store, every_seconds=0.2)
    for step in range(1, 30):
        ckpt.maybe_save(step, {"x": np.arange(10) + step})
        time.sleep(0.02)
    ckpt.close()
    steps = [r.step for r in store.list("job-1")]
    assert 1 <= len(steps) <= 4
    assert all(b - a >= 5 for a, b in itertools.pairwise(steps))


def test_a_snapshot_is_isolated_from_training_that_continues(store: LocalStore) -> None:
    ckpt = make_ckpt(store, every_steps=1)
    w = np.arange(4 * MIB // 4, dtype=np.float32)
    ckpt.maybe_save(1, {"w": w})
    w[:] = -1  # the next step overwrites the weights while the persist may still run
    ckpt.wait()
    ckpt.close()
    loaded = store.load(newest(store, "job-1"))
    assert np.array_equal(loaded.state["w"], np.arange(4 * MIB // 4, dtype=np.float32))


def test_a_save_that_comes_due_during_a_persist_waits_instead_of_piling_up(
    store: LocalStore,
) -> None:
    ckpt = make_ckpt(store, every_steps=1)
    w = np.zeros(16 * MIB // 4, np.float32)
    for step in range(1, 6):
        w += 1
        ckpt.maybe_save(step, {"w": w})
        # One snapshot's worth, never a second one piled up (page alignment adds a few KiB).
        assert ckpt._buffers.nbytes <= w.nbytes + 64 * 1024
    ckpt.close()
    assert [r.step for r in store.list("job-1")] == [1, 2, 3, 4, 5]
    assert float(store.load(newest(store, "job-1")).state["w"][0]) == 5.0


def _nice_of_threads(prefix: str) -> set[int]:
    """The nice values of this process's threads whose names start with `prefix`."""
    return {
        os.getpriority(os.PRIO_PROCESS, t.native_id)
        for t in threading.enumerate()
        if t.name.startswith(prefix) and t.native_id is not None
    }


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values")
def test_a_persist_runs_at_the_lowest_cpu_priority_and_an_emergency_save_at_the_loops(
    store: LocalStore,
) -> None:
    ckpt = make_ckpt(store, every_steps=1)
    w = np.zeros(4 * MIB // 4, np.float32)
    ckpt.maybe_save(1, {"w": w})
    ckpt.wait()
    loop = os.getpriority(os.PRIO_PROCESS, 0)
    # Eight workers at +10 took half a core from a training loop that used every core.
    assert _nice_of_threads("baton-persist") == {19}
    assert _nice_of_threads("baton-store-bg") == {19}
    assert _nice_of_threads("baton-store_") == {loop}  # the emergency save's workers
    ckpt.close()


def test_an_unchanged_tensor_is_not_written_again_by_periodic_saves(store: LocalStore) -> None:
    ckpt = make_ckpt(store, every_steps=1)
    frozen = np.random.default_rng(0).random(8 * MIB // 4, dtype=np.float32)
    frozen.setflags(write=False)
    adapter = np.zeros(MIB // 8, np.float32)
    for step in range(1, 4):
        adapter += 1
        ckpt.maybe_save(step, {"base": frozen, "adapter": adapter})
        ckpt.wait()
        committed = ckpt.last_committed
        assert committed is not None and committed.ref.step == step
        if step == 1:
            assert committed.bytes_new >= frozen.nbytes
        else:
            assert committed.bytes_new <= 2 * adapter.nbytes
    ckpt.close()


def test_a_frozen_array_is_neither_copied_nor_rehashed_after_its_first_save() -> None:
    cache = FrozenCache()
    frozen = np.ones(MIB, np.float32)
    frozen.setflags(write=False)
    first = Snapshot.capture({"base": frozen}, copy=True, frozen=cache)
    assert first.tensors[0].known_chunks is None
    cache.remember(frozen, [("a" * 64, frozen.nbytes)])
    second = Snapshot.capture({"base": frozen}, copy=True, frozen=cache)
    assert second.tensors[0].known_chunks == [("a" * 64, frozen.nbytes)]
    data = second.tensors[0].data
    assert data is not None and np.shares_memory(np.frombuffer(data, np.uint8), frozen)
    # Read-only views of memory that is still writeable elsewhere are not trusted.
    writeable = np.ones(2 * MIB, np.float32)  # 8 MiB: above the pack limit
    view = writeable.view()
    view.setflags(write=False)
    assert not is_frozen(view)
    cache.remember(view, [("b" * 64, view.nbytes)])
    again = Snapshot.capture({"base": view}, copy=True, frozen=cache)
    assert again.tensors[0].known_chunks is None


@pytest.mark.parametrize("cores", [1, 3])
def test_a_copying_capture_holds_the_state_as_it_was(
    cores: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The copies go in pieces over the cores; a tensor that ends inside a piece, and one of
    # several pieces, come out whole, and training on after the capture changes neither.
    monkeypatch.setattr(snapshot_module, "_copy_threads", lambda: cores)
    rng = np.random.default_rng(3)
    state: dict[str, np.ndarray] = {
        "big": rng.random(5 * MIB // 2 + 7),
        "odd": rng.random(MIB + 3).astype(np.float32),
    }
    before = {name: value.copy() for name, value in state.items()}

    snap = Snapshot.capture(state, copy=True)
    for value in state.values():
        value += 1

    copied = {source.name: source.data for source in snap.tensors}
    assert copied.keys() == {"state/big", "state/odd"}
    for name, value in before.items():
        data = copied[f"state/{name}"]
        assert data is not None and bytes(data) == value.tobytes()


def test_the_size_of_a_state_is_what_a_save_captures_without_copying_it() -> None:
    torch = pytest.importorskip("torch")
    state = {
        "w": np.zeros((3, 5), np.float32),
        "layers": [torch.ones(7, dtype=torch.bfloat16), (np.int64(4), b"opaque")],
        "step": 12,
    }
    expected = Snapshot.capture(state, copy=False, small_limit=0, pack_limit=0).bytes_total
    assert snapshot_module.state_nbytes(state) == 3 * 5 * 4 + 7 * 2 + 8 == expected


def test_a_forked_child_captures_with_copiers_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # A child forked after a capture has none of its parent's helper threads: work handed to
    # them would never run, and its first capture would wait forever.
    monkeypatch.setattr(snapshot_module, "_copy_threads", lambda: 2)
    state = {"w": np.ones(3 * MIB)}
    Snapshot.capture(state, copy=True)
    pid = os.fork()
    if pid == 0:
        snap = Snapshot.capture(state, copy=True)
        os._exit(0 if bytes(snap.tensors[0].data or b"") == state["w"].tobytes() else 1)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if done == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's capture did not finish")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_a_final_notice_during_a_persist_ends_with_a_committed_emergency_checkpoint(
    store: LocalStore,
) -> None:
    ckpt = make_ckpt(store, every_steps=1)
    w = np.random.default_rng(1).random(32 * MIB // 4, dtype=np.float32)
    ckpt.maybe_save(1, {"w": w})
    w += 1
    ckpt.request_stop()  # what the SIGTERM handler does, while step 1 is being persisted
    ckpt.maybe_save(2, {"w": w})
    assert ckpt.should_stop
    ckpt.close()
    latest = store.latest("job-1")
    assert latest == ManifestRef("job-1", 2, "emergency", 0)
    store.verify(latest)
    assert np.array_equal(store.load(latest).state["w"], w)


def test_an_advance_notice_checkpoints_at_the_next_step_and_calls_back(
    store: LocalStore,
) -> None:
    ckpt = make_ckpt(store, every_steps=1000, install_signal_handlers=True)
    heard: list[str] = []
    ckpt.on_advance_notice(heard.append)
    ckpt.on_final_notice(heard.append)
    try:
        ckpt.maybe_save(1, {"x": np.arange(3)})
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert ckpt.notice == "advance"
        ckpt.maybe_save(2, {"x": np.arange(3)})
        ckpt.wait()
        assert heard == ["advance"]
        assert [r.step for r in store.list("job-1")] == [2]
        ckpt.request_stop()
        ckpt.maybe_save(3, {"x": np.arange(3)})
        assert heard == ["advance", "final"] and ckpt.should_stop
    finally:
        ckpt.close()
    assert signal.getsignal(signal.SIGUSR1) is not ckpt._on_sigusr1


def test_restore_honours_baton_resume_over_the_latest(store: LocalStore) -> None:
    for step in (10, 20, 30):
        store.save("job-1", step, {"x": np.full(4, step)})
    ckpt = make_ckpt(store, resume="jobs/job-1/manifests/000000000020-periodic-r0.json")
    restored = ckpt.restore()
    assert restored is not None and restored.step == 20
    ckpt.close()
    missing = make_ckpt(store, resume="jobs/job-1/manifests/000000000025-periodic-r0.json")
    with pytest.raises(ManifestNotFound):
        missing.restore()
    missing.close()


def test_restore_skips_a_corrupt_latest_checkpoint_for_the_previous_one(
    store: LocalStore,
) -> None:
    store.save("job-1", 10, {"x": np.full(MIB, 1.0)})
    bad = store.save("job-1", 20, {"x": np.full(MIB, 2.0)})
    chunk, size = bad.manifest.tensors["state/x"]["chunks"][0]
    flip_byte(store, chunk, size)
    ckpt = make_ckpt(store)
    restored = ckpt.restore()
    assert restored is not None and restored.step == 10
    ckpt.close()


def test_a_gang_restores_the_newest_step_every_rank_committed(store: LocalStore) -> None:
    for rank in (0, 1):
        store.save("job-1", 10, {"rank": np.full(2, rank)}, rank=rank, world_size=2)
    store.save("job-1", 20, {"rank": np.full(2, 0)}, rank=0, world_size=2)
    ckpt = make_ckpt(store, rank=1, world_size=2)
    restored = ckpt.restore()
    assert restored is not None and restored.step == 10
    assert restored.state["rank"].tolist() == [1, 1]
    ckpt.close()


def test_from_env_reads_the_baton_environment(tmp_path: Path) -> None:
    env = {
        "BATON_STORE_URL": (tmp_path / "s").as_uri(),
        "BATON_JOB_ID": "42",
        "BATON_RANK": "1",
        "BATON_WORLD_SIZE": "2",
        "BATON_CHECKPOINT_EVERY_STEPS": "7",
        "BATON_CHECKPOINT_EVERY_SECONDS": "0",
        "BATON_RESUME": "",
    }
    ckpt = Checkpointer.from_env(env, install_signal_handlers=False)
    assert (ckpt.job, ckpt.rank, ckpt.world_size) == ("42", 1, 2)
    assert (ckpt.every_steps, ckpt.every_seconds, ckpt.resume) == (7, None, None)
    assert ckpt.store.url == (tmp_path / "s").as_uri()
    ckpt.close()
    standalone = Checkpointer.from_env(
        {"BATON_CHECKPOINT_DIR": str(tmp_path / "d")}, install_signal_handlers=False
    )
    assert standalone.job == "local" and standalone.every_seconds == 300.0
    assert standalone.store.url == (tmp_path / "d").as_uri()
    standalone.close()
    with pytest.raises(StoreConfigError, match="BATON_CHECKPOINT_EVERY_STEPS"):
        Checkpointer.from_env({**env, "BATON_CHECKPOINT_EVERY_STEPS": "often"})
    with pytest.raises(StoreConfigError, match="not supported"):
        Checkpointer.from_env({"BATON_STORE_URL": "ftp://x/y"})


class AgentStandIn:
    """A real HTTP server recording what the SDK posts, like the agent's local endpoint."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append((self.path, json.loads(body)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [path for path, _ in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_it_reports_progress_commits_restores_and_the_result_to_the_agent(
    store: LocalStore,
) -> None:
    agent = AgentStandIn()
    try:
        ckpt = make_ckpt(store, every_steps=2, agent_url=agent.url, world_size=1)
        ckpt.maybe_save(1, {"w": np.ones(10)})
        ckpt.maybe_save(2, {"w": np.ones(10)}, val_loss=lambda: 0.75)
        ckpt.wait()
        ckpt.report_result(2, 0.7, "ab" * 32)
        ckpt.close()
        again = make_ckpt(store, agent_url=agent.url)
        again.restore()
        assert again.report_restore(0.75) is True
        assert again.report_restore(0.9) is False
        again.close()
    finally:
        agent.close()
    bodies = dict(agent.received)
    assert agent.paths()[0] == "/progress" and bodies["/progress"] == {"step": 1}
    assert bodies["/checkpoint"] == {
        "manifest": "jobs/job-1/manifests/000000000002-periodic-r0.json",
        "step": 2,
        "kind": "periodic",
        "bytes_new": bodies["/checkpoint"]["bytes_new"],
        "bytes_total": bodies["/checkpoint"]["bytes_total"],
        "validation_reference": 0.75,
        "rank": 0,
        "world_size": 1,
    }
    assert bodies["/result"] == {"step": 2, "val_loss": 0.7, "weights_sha256": "ab" * 32}
    restores = [body for path, body in agent.received if path == "/restore"]
    assert restores[0] == {
        "manifest": "jobs/job-1/manifests/000000000002-periodic-r0.json",
        "step": 2,
        "val_loss": 0.75,
        "reference": 0.75,
    }


def test_it_works_the_same_without_a_reachable_agent(store: LocalStore) -> None:
    dead = f"http://127.0.0.1:{_unused_port()}"
    started = time.monotonic()
    ckpt = make_ckpt(store, every_steps=1, agent_url=dead)
    for step in range(1, 4):
        ckpt.maybe_save(step, {"w": np.ones(10) * step})
    ckpt.report_result(3, 0.1, "00" * 32)
    ckpt.close()
    assert time.monotonic() - started < 5
    assert [r.step for r in store.list("job-1")] == [1, 2, 3]
    assert ckpt.reporter.failed >= 1 and ckpt.reporter.sent == 0


def test_a_child_forked_during_a_persist_saves_and_reports_with_threads_of_its_own(
    tmp_path: Path,
) -> None:
    """A child forked while the parent's persist is in flight (a trial forked beside training)
    neither waits for that persist nor hands work to the parent's threads: its saves commit
    and its reports reach the agent, and the parent's persist goes on (decision 073)."""
    store = GatedStore(tmp_path / "store", chunk_size=MIB)
    agent = AgentStandIn()
    ckpt = make_ckpt(store, every_steps=1, agent_url=agent.url)
    state = {step: {"w": np.full(MIB, step, np.float32)} for step in (1, 2, 3)}
    try:
        store.gate.clear()
        ckpt.maybe_save(1, state[1])
        assert store.waiting.wait(10)

        def save_in_the_child() -> None:
            store.gate.set()  # the child's copy of the gate
            ckpt.save(2, state[2], val_loss=0.5)
            ckpt.maybe_save(3, state[3])
            ckpt.close()

        code = in_forked_child(save_in_the_child, timeout=30)
        store.gate.set()
        ckpt.close()
    finally:
        store.gate.set()
        store.close()
        agent.close()
    assert code == 0, "the child's saves failed or never finished (-9)"
    assert [r.step for r in store.list("job-1")] == [1, 2, 3]
    for step in (1, 2, 3):
        loaded = store.load(ManifestRef("job-1", step, "periodic", 0)).state["w"]
        assert np.array_equal(loaded, state[step]["w"])
    reported = sorted(body["step"] for path, body in agent.received if path == "/checkpoint")
    assert reported == [1, 2, 3]


def _unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_torch_state_dicts_round_trip_with_their_dtypes(store: LocalStore) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "half": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "big": torch.randn(MIB),
    }
    torch.manual_seed(3)
    ckpt = make_ckpt(store, every_steps=1)
    ckpt.maybe_save(1, state)
    expected_draw = torch.rand(1).item()
    ckpt.close()
    torch.manual_seed(100)
    again = make_ckpt(store)
    restored = again.restore()
    again.close()
    assert restored is not None
    assert torch.rand(1).item() == expected_draw
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    fresh.load_state_dict(restored.state["model"])
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    fresh_opt.load_state_dict(restored.state["optimizer"])
    assert restored.state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert restored.state["half"].dtype == torch.bfloat16
    assert torch.equal(restored.state["half"], state["half"])
    assert torch.equal(restored.state["big"], state["big"])


def test_the_sdk_checkpoints_to_s3_and_verifies_periodic_saves_there(s3_env: S3Server) -> None:
    store = new_s3_store(s3_env)
    ckpt = make_ckpt(store, every_steps=2)
    assert ckpt.verify  # a remote store reads periodic saves back by default
    w = np.random.default_rng(2).random(3 * MIB // 4, dtype=np.float32)
    for step in range(1, 5):
        w += 1
        ckpt.maybe_save(step, {"w": w})
    ckpt.request_stop()
    w += 1
    ckpt.maybe_save(5, {"w": w})
    ckpt.close()
    assert [(r.step, r.kind) for r in store.list("job-1")][-1] == (5, "emergency")
    again = make_ckpt(store)
    restored = again.restore()
    again.close()
    assert restored is not None and np.array_equal(restored.state["w"], w)
    store.close()

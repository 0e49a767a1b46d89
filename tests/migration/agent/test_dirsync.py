"""The directory sync on its own: steps, kinds, gangs and what is (not) worth a checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from migration.agent.dirsync import DirectorySync, RestoreError
from migration.checkpoint import open_store


class Events:
    """Collects what the sync would send to the portal."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def __call__(self, event_type: str, **fields: Any) -> None:
        self.sent.append({"type": event_type, **fields})


def make_sync(
    store_url: str, folder: Path, rank: int = 0, world_size: int = 1, **kwargs: Any
) -> tuple[DirectorySync, Events]:
    events = Events()
    hint = kwargs.pop("hint", None)
    sync = DirectorySync(
        open_store(store_url),
        "job-1",
        folder,
        events,
        lambda: hint,
        rank=rank,
        world_size=world_size,
        interval=0,
        **kwargs,
    )
    return sync, events


def test_an_empty_folder_is_not_worth_a_checkpoint(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "ckpt" / "sub").mkdir(parents=True)
    sync, events = make_sync(store_url, tmp_path / "ckpt")
    assert sync.restore() is None
    assert sync.sync() is None
    assert sync.stop("emergency") is None
    assert events.sent == []


def test_steps_come_from_the_step_file_and_never_go_back(store_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    sync, events = make_sync(store_url, folder, step_file="state.json")
    (folder / "state.json").write_text('{"step": 40}')
    assert sync.sync() is not None
    assert sync.sync() is None, "nothing changed"
    (folder / "weights.bin").write_bytes(b"new weights")  # changed, same step file
    sync.sync()
    (folder / "state.json").write_text('{"global_step": 80}')
    sync.sync()
    (folder / "state.json").write_text('{"step": 70}')  # a step file that went back
    sync.sync()
    sync.stop("emergency")
    assert [(e["step"], e["kind"]) for e in events.sent] == [
        (40, "periodic"),
        (40, "periodic"),  # replaces the first: the newer files win
        (80, "periodic"),
        (80, "periodic"),
        (80, "emergency"),  # unchanged: the same step, under the new kind
    ]
    store = open_store(store_url)
    assert [(r.step, r.kind) for r in store.list("job-1")] == [
        (40, "periodic"),
        (80, "periodic"),
        (80, "emergency"),
    ]
    folder_again = tmp_path / "again"
    again, _ = make_sync(store_url, folder_again)
    again.restore()
    assert (folder_again / "state.json").read_text() == '{"step": 70}'


def test_a_periodic_sync_after_an_emergency_checkpoint_goes_one_step_higher(
    store_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "state.json").write_text('{"step": 30}')
    open_store(store_url).save_directory("job-1", source, 30, "emergency")
    folder = tmp_path / "ckpt"
    sync, events = make_sync(store_url, folder, step_file="state.json")
    assert sync.restore() is not None
    (folder / "notes.txt").write_text("written before the next checkpoint")
    sync.sync()
    assert (events.sent[0]["step"], events.sent[0]["kind"]) == (31, "periodic")
    latest = open_store(store_url).latest("job-1")
    assert latest is not None and (latest.step, latest.kind) == (31, "periodic")


def test_without_a_step_file_the_hint_is_used(store_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"x")
    sync, events = make_sync(store_url, folder, hint=120)
    sync.sync()
    assert events.sent[0]["step"] == 120
    assert events.sent[0]["bytes_total"] == 1


def test_a_gang_rank_restores_the_newest_step_every_rank_committed(
    store_url: str, tmp_path: Path
) -> None:
    store = open_store(store_url)
    for rank, steps in ((0, (10, 20, 30)), (1, (10, 20))):
        for step in steps:
            source = tmp_path / f"r{rank}-{step}"
            source.mkdir()
            (source / "shard.bin").write_text(f"rank {rank} step {step}")
            store.save_directory("job-1", source, step, "periodic", rank=rank, world_size=2)
    folder = tmp_path / "restored"
    sync, _ = make_sync(store_url, folder, rank=1, world_size=2)
    restored = sync.restore()
    assert restored is not None and restored["step"] == 20
    assert (folder / "shard.bin").read_text() == "rank 1 step 20"
    # BATON_RESUME names rank 0's manifest; rank 1 takes its sibling.
    sync, _ = make_sync(store_url, tmp_path / "again", rank=1, world_size=2)
    restored = sync.restore("jobs/job-1/manifests/000000000010-periodic-r0.json")
    assert restored is not None
    assert restored["manifest"] == "jobs/job-1/manifests/000000000010-periodic-r1.json"


def test_a_restore_replaces_what_was_in_the_folder(store_url: str, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_text("from the store")
    open_store(store_url).save_directory("job-1", source, 5, "emergency")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "stale.txt").write_text("left from before")
    sync, _ = make_sync(store_url, folder)
    restored = sync.restore()
    assert restored is not None and restored["kind"] == "emergency"
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]


@pytest.mark.parametrize(
    "resume", ["not-a-key", "jobs/job-1/manifests/000000000099-periodic-r0.json"]
)
def test_a_bad_resume_key_is_a_restore_error(store_url: str, tmp_path: Path, resume: str) -> None:
    sync, _ = make_sync(store_url, tmp_path / "ckpt")
    with pytest.raises(RestoreError):
        sync.restore(resume)


def test_a_sync_sends_only_what_changed(store_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "frozen.bin").write_bytes(os.urandom(2 << 20))  # 2 MiB, never changes
    (folder / "state.json").write_text('{"step": 1}')
    sync, events = make_sync(store_url, folder, step_file="state.json")
    sync.sync()
    (folder / "state.json").write_text('{"step": 2}')
    sync.sync()
    first, second = events.sent
    assert first["bytes_new"] == first["bytes_total"] > 2_000_000
    assert second["bytes_total"] == first["bytes_total"]
    assert second["bytes_new"] < 100


def test_a_file_held_while_it_was_written_is_synced_once_it_settles(
    store_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "other.txt").write_text("settled")
    sync, _ = make_sync(store_url, folder)
    assert sync.restore() is None
    # The workload holds ckpt.pt open for writing until told, then closes it and lives on.
    script = (
        "import sys; f = open(sys.argv[1], 'ab'); f.write(b'x' * 1000); f.flush();"
        "print('writing', flush=True); sys.stdin.readline(); f.close();"
        "print('closed', flush=True); sys.stdin.read()"
    )
    workload = subprocess.Popen(
        [sys.executable, "-c", script, str(folder / "ckpt.pt")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert workload.stdin is not None and workload.stdout is not None
    try:
        assert workload.stdout.readline().strip() == "writing"
        sync.watch(workload.pid)
        sync.observe()
        sync.observe()
        held = sync.sync()
        assert held is not None and set(held.manifest.files or {}) == {"other.txt"}

        workload.stdin.write("close\n")
        workload.stdin.flush()
        assert workload.stdout.readline().strip() == "closed"
        # Unchanged since the last sync, but now settled: the next sync records it.
        sync.observe()
        sync.observe()
        result = sync.sync()
        assert result is not None
        assert set(result.manifest.files or {}) == {"other.txt", "ckpt.pt"}
    finally:
        workload.stdin.close()
        workload.wait()

"""Which files of a folder a workload's processes hold open for writing, from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from migration.agent import writers

# Opens one file for writing and one for reading, in a child of its own (another process of
# the session), then waits.
HOLDER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time; w = open(sys.argv[1], 'ab'); r = open(sys.argv[2], 'rb');"
    "print('ready', flush=True); time.sleep(60)", sys.argv[1], sys.argv[2]],
    stdout=sys.stdout)
child.wait()
"""


def test_it_finds_a_file_a_child_of_the_session_writes_and_not_one_it_reads(
    tmp_path: Path,
) -> None:
    (tmp_path / "read.bin").write_bytes(b"r")
    (tmp_path / "sub").mkdir()
    leader = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "sub" / "written.bin"),
         str(tmp_path / "read.bin")],
        stdout=subprocess.PIPE, start_new_session=True, text=True,
    )  # fmt: skip
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == "ready"
        session = writers.Session(leader.pid)

        assert writers.files_being_written(session, tmp_path) == {"sub/written.bin"}
        assert writers.alive(leader.pid)
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
    time.sleep(0.1)
    assert not writers.alive(leader.pid)
    assert writers.files_being_written(writers.Session(leader.pid), tmp_path) == set()

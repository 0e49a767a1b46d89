"""The signal self-check: a probe started like the workload receives the notice signals."""

from __future__ import annotations

import signal

from migration.agent import selfcheck


def test_the_probe_receives_both_notice_signals_every_time() -> None:
    # Back to back, many times: the probe once printed from a signal handler and died when
    # the second signal interrupted that print (a false "cannot hear notices" under load).
    for _ in range(25):
        result = selfcheck.check_signals([signal.SIGUSR1, signal.SIGTERM], timeout=10)
        assert result == {"ok": True, "signals": ["SIGUSR1", "SIGTERM"]}


def test_a_signal_that_never_arrives_fails_the_check() -> None:
    result = selfcheck.check_signals([signal.SIGKILL, signal.SIGTERM], timeout=5)

    assert result["ok"] is False
    assert result["signals"] == ["SIGKILL", "SIGTERM"]

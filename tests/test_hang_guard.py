"""The suite's guard against a hung daemon (conftest.abort_hung_mounts), tried for real.

A test blocked in a read of a mount whose daemon never answers cannot be interrupted by
pytest-timeout, so one hung daemon used to hang the whole CI run (stop 31). The guard
prints the daemon's stacks and aborts the mount's FUSE connection; this test makes a daemon
that never answers (SIGSTOP) and checks that the blocked reader is freed (ECONNABORTED), and
that the report names the mount and holds the daemon's stacks.
"""

from __future__ import annotations

import errno
import os
import signal
import threading

import pytest
from conftest import abort_hung_mounts, daemon_pids, fuse_mounts_under


# a stopped daemon blocks whatever walks the machine's mounts beside it (df, zvfs status):
# run alone, as the other tests that stop one
@pytest.mark.exclusive
def test_a_read_blocked_on_a_stopped_daemon_is_freed_and_the_daemon_shown(
        zarr_dir, mount, capfd) -> None:
    m = mount(zarr_dir)
    (pid,) = daemon_pids(m.path)
    assert [mp for mp, _dev in fuse_mounts_under(m.path.parent)] == [str(m.path)]
    outcome: list[BaseException | bytes] = []
    reader = threading.Thread(target=lambda: outcome.append(_read(m.path / "temperature" / "zarr.json")))
    os.kill(pid, signal.SIGSTOP)
    try:
        reader.start()
        reader.join(2)
        assert reader.is_alive(), outcome  # blocked: the daemon cannot answer
        assert abort_hung_mounts(m.path.parent, "a test of the guard") == [str(m.path)]
        reader.join(30)
        assert not reader.is_alive(), "the reader is still blocked after the abort"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome
    # ECONNABORTED for the request the kernel had sent, ENOTCONN for one it had not yet
    assert outcome[0].errno in (errno.ECONNABORTED, errno.ENOTCONN), outcome
    report = capfd.readouterr().err
    assert f"-- daemon {pid} of {m.path}:" in report, report
    assert '(idle): "MainThread"' in report, report  # py-spy's dump of its threads
    assert f"-- the end of {m.log}:" in report and "INFO mounted" in report, report
    assert f"aborted {m.path}" in report, report


def _read(path) -> bytes | BaseException:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return exc

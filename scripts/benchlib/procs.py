"""Every process and mount the benchmark starts, and their cleanup.

Processes are ended by the PID we got from Popen, never by name. Mounts are
undone with ``fusermount3 -u`` (lazy as a last resort). Cleanup runs from
try/finally in the callers, from atexit, and on SIGTERM/SIGINT/SIGHUP.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_procs: dict[int, subprocess.Popen] = {}
_mounts: list[str] = []


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the bench dies, even by SIGKILL (no orphaned servers)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001  (not Linux/glibc: atexit and signal handlers remain)
        pass


def start(cmd: list[str], *, log_path: Path | None = None, env: dict | None = None,
          cwd: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own process group and remember its PID."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, cwd=cwd, start_new_session=True,
                             preexec_fn=_die_with_parent)
    finally:
        if log_path:
            out.close()
    _procs[p.pid] = p
    return p


def stop(p: subprocess.Popen, timeout: float = 10.0) -> None:
    """End a process we started: SIGTERM to its PID, then SIGKILL after ``timeout``."""
    try:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(5)
    finally:
        _procs.pop(p.pid, None)


def mounted_paths() -> set[str]:
    out = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            out.add(parts[4].replace("\\040", " "))
    return out


def is_mounted(path: str | Path) -> bool:
    return os.path.realpath(path) in mounted_paths()


def wait_mounted(path: str | Path, proc: subprocess.Popen | None, timeout: float) -> None:
    """Poll the mount table every 2 ms until ``path`` is mounted: the mount-time rows are
    0.07-0.3 s, and a 20 ms poll added 10 ms on average (up to 20) to every system's."""
    path = os.path.realpath(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path in mounted_paths():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mount process exited with {proc.returncode} before {path} was mounted")
        time.sleep(0.002)
    raise RuntimeError(f"{path} not mounted after {timeout:.0f}s")


def register_mount(path: str | Path) -> None:
    _mounts.append(os.path.realpath(path))


def unmount(path: str | Path, timeout: float = 20.0) -> None:
    """Unmount with fusermount3 -u, retrying while busy; lazy unmount as a last resort."""
    path = os.path.realpath(path)
    deadline = time.monotonic() + timeout
    while is_mounted(path):
        r = subprocess.run(["fusermount3", "-u", path], capture_output=True)
        if r.returncode == 0 or not is_mounted(path):
            break
        if time.monotonic() > deadline:
            subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)
            break
        time.sleep(0.2)
    if path in _mounts:
        _mounts.remove(path)


#: called after every drop of the page cache (benchlib.memory: pages for the cell to come)
AFTER_DROP: list[Callable[[], None]] = []
#: called by cleanup(), even on a signal (benchlib.memory: the machine's settings put back)
AT_CLEANUP: list[Callable[[], None]] = []


def cleanup() -> None:
    for fn in list(AT_CLEANUP):
        with contextlib.suppress(Exception):
            fn()
    for m in list(reversed(_mounts)):
        with contextlib.suppress(Exception):
            unmount(m, timeout=5)
        with contextlib.suppress(OSError):
            os.rmdir(m)  # an empty mount point left behind would fail a later run's cell
    for p in list(_procs.values()):
        with contextlib.suppress(Exception):
            stop(p, timeout=5)


def _on_signal(signum, _frame):
    """Clean up, then leave at once: a SystemExit would wait at interpreter exit for the
    workload's pool threads (a reader blocked in a read of a mount just ended), so the
    first SIGTERM did not end the run."""
    cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def install_handlers() -> None:
    atexit.register(cleanup)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)


def drop_caches(level: int = 3) -> None:
    """``sync; echo LEVEL > /proc/sys/vm/drop_caches``: 3 drops every cached page and the
    dentries and inodes, 2 the dentries and inodes only (the kernel then forgets the inodes
    of every FUSE mount). Machine-wide, so nothing relying on those caches may run beside
    it: the test suite runs the tests that come here on their own (marked ``exclusive``),
    and a parallel pytest worker is refused here, loudly, rather than flaking its peers."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        raise RuntimeError("drop_caches in a parallel pytest worker: mark the test "
                           "@pytest.mark.exclusive (scripts/test runs those alone)")
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{level}\n")
    except OSError as e:  # not root: the numbers are then not cold; say so once
        global _warned
        if not _warned:
            log(f"cannot drop the page cache ({e}); cold runs are not cold")
            _warned = True
    for fn in AFTER_DROP:
        fn()


_warned = False


def peak_rss_kib(pid: int) -> int | None:
    """VmHWM of ``pid`` (and its children, summed) in KiB, or None if unreadable."""
    total = 0
    found = False
    for p in [pid, *children(pid)]:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
                        found = True
        except OSError:
            pass
    return total if found else None


#: how long a daemon's peak RSS must stay put to be read as settled (see below)
SETTLE_SECONDS = 3.0


def settled_peak_rss_kib(pid: int, quiet: float = SETTLE_SECONDS, limit: float = 15.0) -> int | None:
    """VmHWM of ``pid`` (as :func:`peak_rss_kib`) once it has stopped growing for ``quiet``
    seconds (at most ``limit`` seconds): the work a daemon does in the background after a
    workload (zvfs imports its decoded views after it answers) belongs to its footprint.
    ``quiet`` outlasts zvfs's wait for a second without requests before that import (about
    17 MiB, begun 1.3-1.5 s after a `find` of the 4-key store ended): with 1 s the 4-key
    store's figure sometimes missed it and the 200,000 keys' did not, which put about 87
    bytes on each key (375 B/key in the full run after be353bb, 288 in the one before)."""
    last = peak_rss_kib(pid)
    start = stable_since = time.monotonic()
    while time.monotonic() - stable_since < quiet and time.monotonic() - start < limit:
        time.sleep(0.1)
        now = peak_rss_kib(pid)
        if now != last:
            last, stable_since = now, time.monotonic()
    return last


def children(pid: int) -> list[int]:
    """All descendants of ``pid`` (via /proc/PID/task/*/children)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            stack.extend(kids)
    return out

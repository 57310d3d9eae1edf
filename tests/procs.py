"""Ending a process that a test or script started: by its own PID, never by name."""

from __future__ import annotations

import subprocess


def stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds; waits for it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)

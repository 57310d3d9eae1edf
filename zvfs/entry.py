"""The console scripts' entry points (``zvfs``, ``mount.zvfs``, ``python -m zvfs``).

They exist so a mount's start-up read-ahead (:mod:`zvfs.warmup`) begins before the CLI
and everything after it is imported, not after: those imports are what it speeds up.
"""

from __future__ import annotations

import os
import signal
import sys

# zvfs does no linear algebra, but numpy's OpenBLAS starts a thread per core when numpy
# is first imported (during a mount's first decoded read) and that thread spins for a
# while before it sleeps: on 2 cores it took a tenth of the daemon's CPU during a cold
# read. Set before anything imports numpy; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from zvfs import warmup  # noqa: E402

#: the signals that stop a mount and, left to their default, end the process at once
#: (zvfs.daemon.SignalStop takes them over before it mounts; SIGINT raises KeyboardInterrupt,
#: which the CLI answers)
_STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _stopped_while_starting(signum: int, _frame: object) -> None:
    """A stop before the CLI has put in its own handlers (while importing: up to a second on
    a loaded machine) ended the process with no word, in the log or out. Nothing is mounted
    yet: say so, then die of the signal as before (systemd counts that a clean stop)."""
    name = signal.Signals(signum).name
    os.write(2, f"zvfs: stopped by {name} while starting, before anything was mounted\n".encode())
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _watch_early_stops() -> None:
    for signum in _STOPS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _stopped_while_starting)


def main() -> int:
    if sys.argv[1:2] == ["mount"]:
        _watch_early_stops()
        warmup.start()
    from zvfs.cli import main as cli_main

    return cli_main()


def mount_helper_main() -> int:
    _watch_early_stops()
    if "-N" not in sys.argv[1:]:  # entering a mount namespace needs a single thread
        warmup.start()
    from zvfs.cli import mount_helper_main as helper

    return helper()

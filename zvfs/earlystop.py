"""Stops that come while a mount starts, before anything is mounted.

Until :class:`zvfs.daemon.SignalStop` takes the stop signals over (just before it mounts),
their default action ends the process at once: while Python imports (up to a second on a
loaded machine) a SIGTERM ended ``zvfs mount`` with no word, in the log or out. The entry
point puts :func:`watch` in place; whatever takes the signals over calls :func:`forget`
first, so that this handler, which says "before anything was mounted", never comes back
once something may be (it did: SignalStop restored it after unmounting).
"""

from __future__ import annotations

import os
import signal

#: the signals that stop a mount and, left to their default, end the process at once
#: (SIGINT raises KeyboardInterrupt, which the CLI answers)
STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _stopped_while_starting(signum: int, _frame: object) -> None:
    """Say so, then die of the signal as before (systemd counts that a clean stop)."""
    name = signal.Signals(signum).name
    os.write(2, f"zvfs: stopped by {name} while starting, before anything was mounted\n".encode())
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def watch() -> None:
    """Put the handler in for the stop signals left to their default (an ignored one, as
    nohup leaves SIGHUP, stays ignored)."""
    for signum in STOPS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _stopped_while_starting)


def forget() -> None:
    """Give the stop signals whose handler is this module's their default back."""
    for signum in STOPS:
        if signal.getsignal(signum) is _stopped_while_starting:
            signal.signal(signum, signal.SIG_DFL)

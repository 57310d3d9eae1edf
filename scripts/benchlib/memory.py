"""Guest memory that stays fast to touch for the length of a run (virtual machines only).

A VM with a free-page-reporting balloon (virtio_balloon) hands memory the guest frees back
to the host at once, and the host drops it. The next time the guest touches such a page the
host must fault it in again: measured here, a fresh 256 MiB array took from 0.04 s to 0.6 s
to fill, run to run (437 to 6,318 MiB/s). Every cell allocates hundreds of MiB (page cache
after ``drop_caches``, readers' arrays, decode buffers), so which pages it happened to get
decided much of its time: the bimodal figures of earlier runs, on both sides of a ratio.

So for the run the guest keeps what it frees (the reporting delay and the memory allowed to
wait are raised to their largest values), and the original settings are put back at the
end (also when the run is interrupted). The longest delay this kernel takes is 100 s,
though, and a full run still handed 8.4 GiB back to the host between cells: memory a big
cell freed sat unused for longer than that. So each drop of the page cache before a cell
is followed by touching TOUCH_GIB once (freed again at once, it is what the cell's first
allocations get), outside the timed part. (Touching 4 GiB at once made this kernel report
1.3 GiB of it straight away, whatever the knobs said: 2 GiB did not.) Neither zvfs nor any peer is changed; a machine
without this knob (bare metal, other hypervisors) is left as it is, and the report says which.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from . import procs

PARAMS = Path("/sys/module/page_reporting/parameters")
#: what this kernel's reporting waits for, each tried from the largest value down (kernels
#: bound them differently): how long a page stays free before it is reported, and how much
#: freed memory may wait before it is reported anyway
HOLD = {"min_free_ms": (100000, 60000, 30000, 10000),
        "max_waiting_mib": (65536, 32768, 16384)}
REPORTED = PARAMS / "reported_kib"
#: seconds between raising the knobs and touching memory (see held)
SETTLE_S = 3.0
#: memory made resident before each cell: a cell's page cache, arrays and buffers
TOUCH_GIB = 2


def _reported_kib() -> int | None:
    try:
        return int(REPORTED.read_text())
    except (OSError, ValueError):
        return None


def _touch(gib: int = TOUCH_GIB) -> None:
    """Fill ``gib`` GiB once, 1 GiB at a time, then free it (kept by the guest now)."""
    import numpy as np

    keep = [np.ones(1 << 30, np.uint8) for _ in range(gib)]
    del keep


def _raise(name: str) -> tuple[str, int] | None:
    """Set knob ``name`` to the largest value it takes: (its value before, the new one)."""
    path = PARAMS / name
    try:
        before = path.read_text().strip()
    except OSError:
        return None
    for value in HOLD[name]:
        try:
            path.write_text(str(value))
            return before, value
        except OSError:
            continue
    return None


@contextlib.contextmanager
def held() -> Iterator[list[str]]:
    """Hold freed guest memory while the block runs. Yields the report's lines about it,
    complete once the block has ended (what was handed back to the host meanwhile)."""
    notes: list[str] = []
    if not (PARAMS / "min_free_ms").exists():
        notes.append("free page reporting: not present (no memory is handed back to a host)")
        yield notes
        return
    changed = {name: got for name in HOLD if (got := _raise(name))}
    if "min_free_ms" not in changed:
        notes.append("free page reporting: its delay could not be raised (not root?): cells "
                     "may hit memory the host dropped")

    def put_back() -> None:
        for name, (before, _) in changed.items():
            with contextlib.suppress(OSError):
                (PARAMS / name).write_text(before)

    r0 = None
    try:
        if changed:
            procs.AT_CLEANUP.append(put_back)
            time.sleep(SETTLE_S)  # a reporting pass already under way ends with the old values
            _touch()
            procs.AFTER_DROP.append(_touch)
            r0 = _reported_kib()
            notes.append("free page reporting (a VM balloon's) held for the run: " + ", ".join(
                f"{k} {b} → {v}" for k, (b, v) in changed.items())
                + f"; {TOUCH_GIB} GiB touched after each drop of the page cache, before "
                "the cell (why: scripts/benchlib/memory.py)")
        yield notes
    finally:
        if _touch in procs.AFTER_DROP:
            procs.AFTER_DROP.remove(_touch)
        put_back()
        if put_back in procs.AT_CLEANUP:
            procs.AT_CLEANUP.remove(put_back)
    r1 = _reported_kib()
    if r0 is not None and r1 is not None:
        notes.append(f"memory handed back to the host during the run: {(r1 - r0) / 2**20:.2f} GiB")

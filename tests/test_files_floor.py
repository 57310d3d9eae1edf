"""scripts/files-floor keeps working: one round on a tiny corpus, every system measured.

No timing threshold is asserted (speed targets live in scripts/bench); each system only
has to be there with a finite, positive figure, every member read at its listed size (the
bench's reader fails the round otherwise), and no mount left behind.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("floor", "floor+poll", "zvfs", "fuse-zip")


@pytest.mark.exclusive  # scripts/files-floor drops the page cache
def test_files_floor_tiny_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "files-floor"), "--tiny", "--runs", "1",
         "--work", str(work)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert not (work / "mnt").exists() or not any((work / "mnt").iterdir()), \
        "scripts/files-floor left mount points behind"
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in SYSTEMS:
            rows[cells[0]] = cells
    assert list(rows) == list(SYSTEMS), proc.stdout
    for name, (_, rate, micros, rounds) in rows.items():
        for value in (float(rate.replace(",", "")), float(micros), float(rounds.replace(",", ""))):
            assert math.isfinite(value) and value > 0, (name, rate, micros, rounds)
    # the tiny corpus: 400 chunk keys, with the group's and the array's metadata
    assert "the bench's 404-member zip" in proc.stdout, proc.stdout

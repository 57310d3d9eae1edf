"""scripts/decoded-floor keeps working: one run on a tiny corpus, every stage measured.

No timing threshold is asserted (speed targets live in scripts/bench); each stage only
has to be there with finite, positive figures, and the transport stage must really have
been served from chunks the daemon held (the script checks that itself and fails if not).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ("decode", "fetch", "transport", "cold cat", "tensorstore")


@pytest.mark.exclusive  # scripts/decoded-floor drops the page cache
def test_decoded_floor_tiny_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "decoded-floor"), "--tiny", "--runs", "1",
         "--work", str(work)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert not (work / "mnt").exists() or not any((work / "mnt").iterdir()), \
        "scripts/decoded-floor left mount points behind"
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in STAGES:
            rows[cells[0]] = cells
    assert list(rows) == list(STAGES), proc.stdout
    for name, (_, seconds, rate, _runs, cpu) in rows.items():
        for value in (float(seconds), float(rate)):
            assert math.isfinite(value) and value > 0, (name, seconds, rate)
        if name != "tensorstore":
            figures = [float(x) for x in re.findall(r"\d+\.\d+", cpu)]
            assert figures and all(f >= 0 for f in figures), (name, cpu)
    assert re.search(r"one after the other: \d+\.\d+ s; the pipelined cold cat: \d+\.\d+ s",
                     proc.stdout)

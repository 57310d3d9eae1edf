"""scripts/decoded-floor and scripts/files-floor keep working: one run each on a tiny
corpus, every stage or system measured.

No timing threshold is asserted (speed targets live in scripts/bench); each row only has
to be there with finite, positive figures. decoded-floor's transport stage must really
have been served from chunks the daemon held (the script checks that itself and fails if
not); files-floor's reader fails its round if a member reads at another size than listed.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_tiny(script: str, names: tuple[str, ...], work: Path,
             *extra: str) -> tuple[str, dict[str, list[str]]]:
    """Run ``scripts/<script> --tiny --runs 1`` (then ``extra``): its output, and the cells
    of each table row named in ``names``, which must all be there, in that order. No mount
    may be left."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), "--tiny", "--runs", "1", "--work", str(work),
         *extra], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert not (work / "mnt").exists() or not any((work / "mnt").iterdir()), \
        f"scripts/{script} left mount points behind"
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in names:
            rows[cells[0]] = cells
    assert list(rows) == list(names), proc.stdout
    return proc.stdout, rows


def positive(*texts: str) -> bool:
    return all(math.isfinite(v := float(t.replace(",", ""))) and v > 0 for t in texts)


@pytest.mark.exclusive  # scripts/decoded-floor drops the page cache
def test_decoded_floor_tiny_run(tmp_path: Path) -> None:
    out, rows = run_tiny("decoded-floor", ("decode", "fetch", "transport", "cold cat", "tensorstore"),
                         tmp_path / "work")
    for name, (_, seconds, rate, _runs, cpu) in rows.items():
        assert positive(seconds, rate), (name, seconds, rate)
        if name != "tensorstore":
            figures = [float(x) for x in re.findall(r"\d+\.\d+", cpu)]
            assert figures and all(f >= 0 for f in figures), (name, cpu)
    assert re.search(r"one after the other: \d+\.\d+ s; the pipelined cold cat: \d+\.\d+ s", out)


@pytest.mark.exclusive  # scripts/files-floor drops the page cache
def test_files_floor_tiny_run(tmp_path: Path) -> None:
    out, rows = run_tiny("files-floor", ("floor", "floor+poll", "zvfs", "fuse-zip"), tmp_path / "work")
    for name, (_, rate, micros, rounds) in rows.items():
        assert positive(rate, micros, rounds), (name, rate, micros, rounds)
    # the tiny corpus: 400 chunk keys, with the group's and the array's metadata
    assert "the bench's 404-member zip" in out, out


def test_files_floor_handlers_in_process(tmp_path: Path) -> None:
    """--handlers --vs: zvfs's handlers called in process (no mount, no root needed), this
    checkout and the one named (here the same) in turn: each column gives CPU a file for
    every request kind, and every one of the 404 members was opened, pushed or read."""
    out, rows = run_tiny("files-floor", ("lookup", "open", "read", "release", "all", "wall",
                                         "process CPU (workers too)", "reads", "opens pushed"),
                         tmp_path / "work", "--handlers", "--vs", str(REPO))
    assert f"| handler | zvfs | zvfs at {REPO} |" in out, out
    for name in ("lookup", "open", "release", "all", "wall", "process CPU (workers too)"):
        assert positive(*rows[name][1:]), rows[name]
    for reads, pushed in zip(rows["reads"][1:], rows["opens pushed"][1:], strict=True):
        # a member not pushed at its open is read (the kernel would); the empty are neither
        assert 0 < int(pushed.replace(",", "")) <= 404 and int(reads.replace(",", "")) >= 0, (reads, pushed)

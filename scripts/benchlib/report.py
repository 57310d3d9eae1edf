"""The markdown report: summary table (zvfs against the best peer per row), every
system's numbers, the issue's targets, and the machine description."""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ANALYSIS_MARK = "<!-- analysis: everything below this line is kept when scripts/bench rewrites the page -->"


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    unit: str
    higher_is_better: bool


class Results:
    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.values: dict[str, dict[str, list[float]]] = {r.id: {} for r in rows}
        self.errors: dict[str, dict[str, str]] = {r.id: {} for r in rows}
        self.order: dict[str, list[str]] = {r.id: [] for r in rows}

    def _touch(self, row: str, system: str) -> None:
        if system not in self.order[row]:
            self.order[row].append(system)

    def add(self, row: str, system: str, value: float | None) -> None:
        self._touch(row, system)
        if value is not None:
            self.values[row].setdefault(system, []).append(float(value))

    def fail(self, row: str, system: str, msg: str) -> None:
        self._touch(row, system)
        self.errors[row].setdefault(system, msg)

    def median(self, row: str, system: str) -> float | None:
        v = self.values[row].get(system)
        return statistics.median(v) if v else None

    def best_peer(self, row: Row) -> tuple[str, float] | None:
        cands = [(s, self.median(row.id, s)) for s in self.order[row.id] if s != "zvfs"]
        cands = [(s, v) for s, v in cands if v is not None]
        if not cands:
            return None
        pick = max if row.higher_is_better else min
        return pick(cands, key=lambda sv: sv[1])

    def ratio(self, row: Row) -> float | None:
        z = self.median(row.id, "zvfs")
        b = self.best_peer(row)
        if z is None or b is None or b[1] == 0:
            return None
        return z / b[1]

    def to_json(self) -> dict:
        return {r.id: {"label": r.label, "unit": r.unit, "higher_is_better": r.higher_is_better,
                       "runs": self.values[r.id], "median": {s: self.median(r.id, s)
                                                             for s in self.values[r.id]},
                       "errors": self.errors[r.id], "ratio": self.ratio(r)} for r in self.rows}


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "—"
    if unit in ("requests", "files/s"):
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def cell(text: str) -> str:
    """``text`` as one markdown table cell: a "|" in it (find | wc -l) must not split it."""
    return text.replace("|", "\\|")


def summary_table(res: Results) -> str:
    lines = ["| workload | unit | better | zvfs | best peer | peer value | zvfs / best peer |",
             "|---|---|---|---|---|---|---|"]
    for r in res.rows:
        z = res.median(r.id, "zvfs")
        zs = fmt(z, r.unit) if z is not None else ("error" if "zvfs" in res.errors[r.id] else "—")
        b = res.best_peer(r)
        ratio = res.ratio(r)
        lines.append(f"| {cell(r.label)} | {r.unit} | {'higher' if r.higher_is_better else 'lower'} | "
                     f"{zs} | {b[0] if b else '—'} | {fmt(b[1], r.unit) if b else '—'} | "
                     f"{(fmt(ratio) + '×') if ratio is not None else '—'} |")
    return "\n".join(lines)


def detail_table(res: Results) -> str:
    lines = ["| workload | system | median | unit | runs | note |", "|---|---|---|---|---|---|"]
    for r in res.rows:
        for s in res.order[r.id]:
            runs = ", ".join(fmt(v, r.unit) for v in res.values[r.id].get(s, []))
            err = res.errors[r.id].get(s, "").replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| {cell(r.label)} | {s} | {fmt(res.median(r.id, s), r.unit)} | {r.unit} | {runs} | {err} |")
    return "\n".join(lines)


def targets_table(res: Results, cache_size_mib: float | None, stream_mib: float | None) -> str:
    """The issues' targets, checked against this run: issue 11's, and the targets of issues
    5, 9 and 10 it keeps."""
    def med(row, sys_):
        return res.median(row, sys_) if row in res.values else None

    def best_of(row, names, higher=True):
        vals = [v for s in res.order.get(row, []) if any(s.startswith(n) for n in names)
                if (v := med(row, s)) is not None]
        if not vals:
            return None
        return max(vals) if higher else min(vals)

    out = ["| target | issue | measured | verdict |", "|---|---|---|---|"]

    def add(name: str, issue: int, measured: float | None, goal: float, higher: bool,
            unit: str = "×") -> None:
        if measured is None:
            out.append(f"| {cell(name)} | {issue} | — | not measured |")
            return
        ok = measured >= goal if higher else measured <= goal
        if not higher and measured <= 0:
            # a cost below zero: a difference of two peaks smaller than their noise (the
            # per-key RSS of the tiny run's 400 keys)
            verdict = "not measurable at this scale: within the noise"
        elif ok:
            verdict = "met"
        elif higher:
            verdict = f"missed: reached {measured / goal:.0%} of the target"
        else:
            verdict = f"missed: {measured / goal:.2f}× the allowed value"
        out.append(f"| {cell(name)} | {issue} | {fmt(measured)}{unit} | {verdict} |")

    def rel(row, names, higher=True):
        z = med(row, "zvfs")
        b = best_of(row, names, higher)
        return None if z is None or b is None or b == 0 else z / b

    labels = {r.id: r.label for r in res.rows}
    # issue 11: decoded reads against the in-process readers
    add("decoded data.raw, directory store, cold: ≥ 1× the best of zarr-python, zarr-python "
        "+ zarrs, tensorstore", 11, rel("dec_dir", ["zarr-python", "tensorstore"]), 1, True)
    add("decoded, S3 (20 ms), cold: ≥ 1× tensorstore's S3 kvstore", 11,
        rel("dec_s3", ["tensorstore"]), 1, True)
    zs3, zdir = med("dec_s3", "zvfs"), med("dec_dir", "zvfs")
    add("decoded, S3 (20 ms), cold: ≥ 0.8× zvfs's own directory figure", 11,
        zs3 / zdir if zs3 and zdir else None, 0.8, True)
    add("decoded, zip, cold: ≥ 1× the best of zarr-python ZipStore and tensorstore's zip "
        "kvstore", 11, rel("dec_zip", ["zarr-python", "tensorstore"]), 1, True)
    # raw trees
    for rid in ("zip_read1", "zip_read4"):
        add(f"{labels.get(rid, rid)}: ≥ 1× ratarmount", 11, rel(rid, ["ratarmount"]), 1, True)
        add(f"{labels.get(rid, rid)}: ≥ 1× fuse-zip", 11, rel(rid, ["fuse-zip"]), 1, True)
    add(f"{labels.get('zip_read_keys', 'zip_read_keys')}: ≥ 1.5× ratarmount", 5,
        rel("zip_read_keys", ["ratarmount"]), 1.5, True)
    add(f"{labels.get('zip_read_keys', 'zip_read_keys')}: ≥ 1× fuse-zip", 5,
        rel("zip_read_keys", ["fuse-zip"]), 1, True)
    add("raw tree over a directory, cold: ≥ 0.8× reading the directory itself", 11,
        rel("dir_read_cold", ["directory"]), 0.8, True)
    add("raw tree over a directory, warm: ≥ 0.5× reading the directory itself", 11,
        rel("dir_read_warm", ["directory"]), 0.5, True)
    # mount time, memory
    add("mount until the mount point answers, S3 (20 ms): ≤ 0.3 s", 11,
        med("s3_mount_large", "zvfs"), 0.3, False, " s")
    add("mount until the mount point answers, directory: ≤ 0.2 s", 11,
        med("dir_mount", "zvfs"), 0.2, False, " s")
    add("mount until the mount point answers, zip: ≤ 0.2 s", 11,
        med("zip_mount", "zvfs"), 0.2, False, " s")
    add("daemon peak RSS after the S3 cold raw read: ≤ 100 MiB", 11, med("rss_s3", "zvfs"),
        100, False, " MiB")
    for kind in ("dir", "s3"):
        rid = f"keys_{kind}"
        add(f"{labels.get(rid, rid)}: ≤ 0.5× rclone's time", 11, rel(rid, ["rclone"], False),
            0.5, False)
        rid += "_rss"
        add(f"{labels.get(rid, rid)}: ≤ 300 bytes per key", 11, med(rid, "zvfs"), 300, False,
            " B/key")
    # issues 5, 9 and 10, kept
    s3peers = ["rclone", "s3fs"]
    add("S3 cold read, 1 reader: ≥ 2× best of rclone/s3fs", 5, rel("s3_read1", s3peers), 2, True)
    add("S3 cold read, 4 readers: ≥ 2× best of rclone/s3fs", 5, rel("s3_read4", s3peers), 2,
        True)
    for rid in ("s3_find_small", "s3_ls_small", "s3_find_large", "s3_ls_large"):
        add(f"{labels.get(rid, rid)}: ≤ 0.5× best peer's time", 5, rel(rid, s3peers, False),
            0.5, False)
    add("S3 +20 ms: cp -r of the big store into the mount (until in the bucket): ≥ 2× best of "
        "rclone (writes)/s3fs", 9, rel("s3_write", s3peers), 2, True)
    add("xarray open_dataset(.zvfs/netcdf/root.nc).load(): ≥ 1× xarray open_zarr(store).load()",
        10, rel("xr_netcdf", ["xarray open_zarr"]), 1, True)
    warm = med("warm", "zvfs")
    add("warm re-read of data.raw: ≥ 3 GB/s", 5, warm * (1 << 20) / 1e9 if warm else None, 3,
        True, " GB/s")
    rss = med("rss_stream", "zvfs")
    if cache_size_mib is not None:
        add(f"daemon peak RSS streaming {fmt(stream_mib)} MiB decoded: ≤ cache size "
            f"({cache_size_mib:.0f} MiB) + 150 MiB", 5, rss, cache_size_mib + 150, False, " MiB")
    return "\n".join(out)


def _cmd(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class LoadSampler:
    """The 1-minute load average every ``every`` seconds while the run goes on, in a thread.

    A shared machine's other jobs show as load above the core count, and cells measured
    then are suspect; the load before and after the run alone missed them (the run at
    ad165e0 had many cells whose first round ran a quarter to a half faster than the other
    two, and no record of the load between). The bench's own work counts too: about one
    core's worth in most cells, both cores in the million-key finds and the in-process
    decoded reads."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.samples: list[tuple[float, float]] = []  # (Unix time, load)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 1)

    def _run(self) -> None:
        while True:
            try:
                load = float(loadavg().split()[0])  # "?" when it cannot be read
            except ValueError:
                load = None
            if load is not None:
                self.samples.append((round(time.time(), 1), load))
            if self._stop.wait(self.every):
                return

    def line(self) -> str:
        """What the samples say, for the report's Machine section."""
        loads = sorted(load for _, load in self.samples)
        if not loads:
            return f"- load average (1 min) during the run, every {self.every:g} s: no samples"
        cores = os.cpu_count() or 1
        above = sum(1 for load in loads if load > cores)
        return (f"- load average (1 min) during the run, sampled every {self.every:g} s: "
                f"{loads[0]:.2f}-{loads[-1]:.2f}, median {statistics.median(loads):.2f}, "
                f"above the core count ({cores}) in {above} of {len(loads)} samples "
                "(results.json holds each with its Unix time, to set beside the cells' times "
                "in the log)")


def machine(versions: dict[str, str], load_before: str = "?", during: str = "") -> str:
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1) if m else "?"
    except OSError:
        pass
    osname = "?"
    try:
        m = re.search(r'PRETTY_NAME="?([^"\n]*)', Path("/etc/os-release").read_text())
        osname = m.group(1) if m else "?"
    except OSError:
        pass
    repo = Path(__file__).resolve().parents[2]
    # a run from an exported snapshot (git archive) names its commit in ZVFS_BENCH_COMMIT
    commit = (os.environ.get("ZVFS_BENCH_COMMIT")
              or _cmd(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"]) or "?")
    if _cmd(["git", "-C", str(repo), "status", "--porcelain", "--", "zvfs"]):
        commit += " (with uncommitted changes under zvfs/)"
    lines = [
        f"- CPU: {os.cpu_count()} × {cpu} (nproc {_cmd(['nproc'])})",
        f"- memory: {mem}",
        f"- kernel: {platform.release()} ({osname})",
        f"- python: {platform.python_version()}",
        f"- zvfs commit: {commit}",
        f"- load average (1, 5, 15 min) before the run: {load_before}; after: {loadavg()} "
        "(the machine is shared; a load above the core count means other jobs ran alongside)",
        *([during] if during else []),
    ]
    lines += [f"- {k}: {v}" for k, v in sorted(versions.items())]
    return "\n".join(lines)


def write(path: Path, body: str) -> None:
    """Write ``body``, keeping any analysis written below ANALYSIS_MARK in the old page."""
    tail = ""
    if path.exists():
        old = path.read_text()
        if ANALYSIS_MARK in old:
            tail = old[old.index(ANALYSIS_MARK):]
    if not tail:
        tail = (ANALYSIS_MARK + "\n\n## Analysis\n\n"
                "(Where a target is missed: by how much, what limits it, what would close the gap.)\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body.rstrip() + "\n\n" + tail)

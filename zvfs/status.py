"""``zvfs status [MOUNTPOINT] [--json]``: every zvfs mount of this machine, and its health.

The mount table says where zvfs is mounted and from what. Everything else
(pid, uptime, options, traffic, errors, cache) comes from the mount's own
``.zvfs/stats.json``, read in a child process: a hung mount then costs a
timeout, never a stuck ``zvfs status``. The mounts are probed at once, so several
hung ones cost one timeout, not one each.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zvfs.mounts import (
    MountEntry,
    is_dead,
    mount_around,
    mount_entry,
    mount_table,
    source_of_table,
)
from zvfs.options import metrics_url
from zvfs.stats import ERROR_KINDS

#: run in a child: statfs proves the daemon answers; stats.json may be absent (decoded=off),
#: or the store's own (decoded=off shows the store's .zvfs/ keys: a copy of another mount's
#: was shown as this one's source, pid and counters): the daemon's is rendered at its open,
#: so its "time" lies between the probe's open and the end of its read
_PROBE = r"""
import errno, json, os, sys, time
mp = sys.argv[1]
try:
    os.statvfs(mp)
except OSError as e:
    print(json.dumps({"health": "dead" if e.errno in (errno.ENOTCONN, errno.ECONNABORTED) else "error",
                      "error": e.strerror}))
    sys.exit()
try:
    opened = time.time()
    with open(os.path.join(mp, ".zvfs", "stats.json"), "rb") as f:
        raw = f.read()
    read = time.time()
    try:
        stats = json.loads(raw)
    except ValueError:
        stats = None
    stamp = stats.get("time") if isinstance(stats, dict) else None
    if not (isinstance(stamp, (int, float)) and opened - 1 <= stamp <= read + 1):
        stats = None  # not the daemon's
except OSError as e:
    # statfs by a user the mount does not let in is answered by the kernel, not the daemon
    if e.errno in (errno.EACCES, errno.EPERM):
        print(json.dumps({"health": "unknown", "error": "this user may not enter the mount "
                          "(mounted by another user without allow_other): run as that user or root"}))
        sys.exit()
    if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
        print(json.dumps({"health": "dead", "error": e.strerror}))
        sys.exit()
    stats = None if e.errno == errno.ENOENT else {"error": e.strerror}
print(json.dumps({"health": "ok", "stats": stats}))
"""


def zvfs_mounts() -> list[MountEntry]:
    return [e for e in mount_table() if e.fstype == "fuse.zvfs"]


def probe(mountpoint: str, timeout: float) -> dict[str, Any]:
    """Health ('ok', 'dead', 'hung', 'error', or 'unknown' to a user the mount does not let
    in) and stats.json of one mount ('starting', told by stats.json, comes in describe)."""
    proc = subprocess.Popen([sys.executable, "-c", _PROBE, mountpoint], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # killed, and not waited for: a probe whose lookup waits for another's of the same
        # name (or for a directory lock a stuck request holds) sleeps uninterruptibly, and
        # ends only when that does; subprocess.run's wait after the kill held `zvfs status`
        # as long (a helper's audit). It is left to end on its own.
        proc.kill()
        return {"health": "hung", "error": f"no answer within {timeout:g} s"}
    try:
        return json.loads(out)
    except ValueError:
        return {"health": "error", "error": (err.strip().splitlines() or ["probe failed"])[-1]}


#: mounts probed at once (each probe is a child process)
PROBES_AT_ONCE = 16


def describe_all(entries: list[MountEntry], timeout: float) -> list[dict[str, Any]]:
    """``describe`` of each entry, in order, probed side by side: one after the other,
    a machine with many mounts waited for each in turn, and each hung one added a whole
    timeout (a helper saw `zvfs status` take 47 s on a busy machine)."""
    if len(entries) <= 1:
        return [describe(e, timeout) for e in entries]
    with ThreadPoolExecutor(min(PROBES_AT_ONCE, len(entries))) as pool:
        return list(pool.map(lambda e: describe(e, timeout), entries))


def describe(entry: MountEntry, timeout: float) -> dict[str, Any]:
    """What ``--json`` prints for one mount."""
    found = probe(entry.mountpoint, timeout)
    stats = found.get("stats") or {}
    if "error" in stats:  # stats.json could not be read
        found = {**found, "error": f"stats.json: {stats['error']}"}
        stats = {}
    enclosing = _dead_enclosing(entry.mountpoint) if found["health"] == "dead" else None
    if enclosing is not None:
        # its own daemon may live, but no path reaches it: the mount it sits in is the one to
        # clear (fusermount3 cannot enter a dead parent to unmount this one alone)
        found = {**found, "error": f"the mount it is inside, {enclosing}, is dead"}
    if found["health"] == "ok" and stats.get("ready") is False:
        # it answers, but its source is still being opened (an S3 probe, a zip's directory):
        # "ok" said so of a mount whose every listing waited, and that may yet be undone
        found = {**found, "health": "starting",
                 "error": "its source is still being opened: requests that need it wait"}
    out: dict[str, Any] = {
        "mountpoint": entry.mountpoint,
        "source": stats.get("source") or source_of_table(entry.source),
        "health": found["health"],
        "error": found.get("error"),
        "pid": stats.get("pid"),
        "version": stats.get("version"),
        "uptime_seconds": stats.get("uptime_seconds"),
        "options": stats.get("options"),
        "mount_options": entry.options,
        "metrics": _metrics(stats.get("options")),
    }
    if enclosing is not None:
        out["inside_dead"] = enclosing
    if stats:
        chunk = stats.get("chunk_cache", {})
        lookups = chunk.get("hits", 0) + chunk.get("misses", 0)
        out["store"] = {
            "requests": stats.get("store_requests", 0) + stats.get("store_list_requests", 0),
            "bytes": stats.get("store_bytes", 0),
            "retries": stats.get("store_retries", 0),
            "errors": {k: stats.get(f"store_errors_{k}", 0) for k in ERROR_KINDS},
        }
        out["cache"] = {
            "bytes": chunk.get("bytes", 0),
            "max_bytes": chunk.get("max_bytes", 0),
            "hits": chunk.get("hits", 0),
            "misses": chunk.get("misses", 0),
            "hit_rate": round(chunk.get("hits", 0) / lookups, 4) if lookups else None,
        }
        out["last_error"] = stats.get("last_error")
    return out


def _dead_enclosing(mountpoint: str) -> str | None:
    """The innermost mount ``mountpoint`` lies inside, if that one is dead; else None."""
    inner = mount_around(mountpoint)
    return inner if inner is not None and is_dead(inner) else None


def _metrics(options: dict[str, Any] | None) -> str | None:
    """Where the mount serves its metrics, or None: its option in effect is the address bound,
    so a mount asked for port 0 shows the port the OS chose."""
    addr = (options or {}).get("metrics_addr")
    return metrics_url(addr) if addr else None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _duration(s: float) -> str:
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d" if d else "") + (f"{h}h" if d or h else "") + (f"{m}m" if d or h or m else "") + f"{s}s"


def render_text(info: dict[str, Any]) -> str:
    lines = [f"{info['mountpoint']}: {info['health']}" + (f" ({info['error']})" if info.get("error") else "")]
    lines.append(f"  source:     {info['source']}")
    if info["health"] in ("dead", "hung"):  # zvfs unmount asks the daemon nothing: it clears both
        lines.append(f"  {'' if info['health'] == 'dead' else 'if it stays hung, '}clear it with: "
                     f"zvfs unmount {info.get('inside_dead') or info['mountpoint']}")
    if info.get("pid") is not None:
        lines.append(f"  process:    pid {info['pid']}, up {_duration(info['uptime_seconds'] or 0)}, "
                     f"zvfs {info['version']}")
    if info.get("options"):
        opts = " ".join(f"{k}={v}" for k, v in sorted(info["options"].items()) if v not in (None, False))
        lines.append(f"  options:    {opts}")
    if info.get("metrics"):
        lines.append(f"  metrics:    {info['metrics']}")
    if "store" in info:
        st = info["store"]
        errors = sum(st["errors"].values())
        kinds = ", ".join(f"{k} {n}" for k, n in st["errors"].items() if n)
        lines.append(f"  store:      {st['requests']} requests, {_size(st['bytes'])}, {st['retries']} retries, "
                     f"{errors} errors" + (f" ({kinds})" if kinds else ""))
        c = info["cache"]
        rate = "n/a" if c["hit_rate"] is None else f"{100 * c['hit_rate']:.1f}%"
        lines.append(f"  cache:      {_size(c['bytes'])} of {_size(c['max_bytes'])}, hit rate {rate} "
                     f"({c['hits']} hits, {c['misses']} misses)")
        last = info.get("last_error")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["time"])) if last else ""
        lines.append(f"  last error: {when + ' ' + last['message'] if last else 'none'}")
    elif info["health"] == "ok" and not info.get("error"):
        lines.append("  counters:   not available (.zvfs/stats.json is off with decoded=off)")
    return "\n".join(lines)


def main(mountpoint: str | None, as_json: bool = False, timeout: float = 5.0) -> int:
    """Exit 0 when every mount shown is healthy, 1 otherwise (and when MOUNTPOINT is no zvfs mount)."""
    if mountpoint is not None:
        entry = mount_entry(mountpoint)
        if entry is None or entry.fstype != "fuse.zvfs":
            print(f"zvfs: error: {mountpoint} is not a zvfs mount; `zvfs status` lists them all",
                  file=sys.stderr)
            return 1
        entries = [entry]
    else:
        entries = zvfs_mounts()
    infos = describe_all(entries, timeout)
    if as_json:
        print(json.dumps(infos, indent=2))
    elif not infos:
        print("no zvfs mounts")
    else:
        print("\n\n".join(render_text(i) for i in infos))
    return 0 if all(i["health"] == "ok" for i in infos) else 1

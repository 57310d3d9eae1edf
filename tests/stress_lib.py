"""Concurrency stress of one zvfs mount: many readers, a small chunk cache, forget churn.

Shared by ``tests/test_stress.py`` (about a minute in the suite) and
``scripts/soak`` (as long as you like). Not a conftest and not a test module.

* :func:`build_store` writes a ~72 MiB (decoded) hierarchy with zarr-python 3:
  v3 zstd, v2 big-endian F-order blosc, v3 sharded big-endian, and a sparse
  v3 array with a NaN fill. The references are what zarr-python reads back.
* :class:`ForegroundMount` runs ``zvfs mount -f`` as a child process, so the
  daemon's PID is ours (peak RSS from its ``/proc/PID/status``), and stops it
  by that PID.
* :func:`run_stress` starts N reader threads (random ranges of ``data.raw``,
  ``data.npy``, ``chunks/…`` and raw store files, plain and O_DIRECT opens)
  and a churn thread (``find`` over the tree and ``.zvfs``, then
  ``echo 2 > /proc/sys/vm/drop_caches``) and returns a :class:`StressResult`.
"""

from __future__ import annotations

import errno
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from benchlib.procs import drop_caches
from procs import stop

MiB = 1 << 20

# --------------------------------------------------------------------------- the store


@dataclass
class ArrayRef:
    path: str  # array path in the store (and below .zvfs/arrays/)
    ref: np.ndarray  # what zarr-python reads back, in the declared dtype
    chunks: tuple[int, ...]  # the unit chunk of chunks/ (inner chunk when sharded)
    raw: bytes = b""  # ref in C order, the bytes data.raw must hold

    def __post_init__(self) -> None:
        self.raw = self.ref.tobytes(order="C")

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-n // c) for n, c in zip(self.ref.shape, self.chunks, strict=True))

    def chunk_bytes(self, idx: tuple[int, ...]) -> bytes:
        box = tuple(slice(i * c, min(n, (i + 1) * c))
                    for i, c, n in zip(idx, self.chunks, self.ref.shape, strict=True))  # fmt: skip
        return self.ref[box].tobytes(order="C")


def build_store(root: Path, scale: int = 1) -> list[ArrayRef]:
    """Write the stress hierarchy at ``root`` with zarr-python 3; ``scale`` multiplies the
    first axis of every array (1: ~72 MiB decoded)."""
    import numcodecs
    import zarr
    from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec

    rng = np.random.default_rng(2026)
    store = zarr.storage.LocalStore(str(root))
    zarr.open_group(store, mode="w", zarr_format=3, attributes={"about": "zvfs stress"})
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # v3, zstd, float64: 32 MiB in 1 MiB chunks
        shape = (64 * scale, 256, 256)
        a = zarr.create_array(store, name="grid/f64", shape=shape, chunks=(8, 128, 128),
                              dtype="float64", compressors=[ZstdCodec(level=1)], zarr_format=3)  # fmt: skip
        a[...] = rng.integers(-500, 500, shape).astype("float64") / 4
        out.append(ArrayRef("grid/f64", np.asarray(a[...]).astype("<f8"), (8, 128, 128)))
        # v2, big-endian int32, F order, blosc: 16 MiB in 512 KiB chunks
        shape = (1024 * scale, 4096)
        b = zarr.create_array(store, name="legacy/i4be", shape=shape, chunks=(256, 512),
                              dtype=">i4", order="F", compressors=numcodecs.Blosc(cname="lz4"),
                              zarr_format=2)  # fmt: skip
        b[...] = rng.integers(-(2**20), 2**20, shape, dtype="<i4")
        out.append(ArrayRef("legacy/i4be", np.asarray(b[...]).astype(">i4"), (256, 512)))
        # v3 sharded, big-endian uint16, 64 KiB inner chunks in 2 MiB shards: 16 MiB
        shape = (2048 * scale, 4096)
        c = zarr.create_array(store, name="sharded/u2", shape=shape, chunks=(128, 256),
                              shards=(1024, 1024), dtype="uint16",
                              serializer=BytesCodec(endian="big"),
                              compressors=[BloscCodec(cname="zstd", clevel=1)], zarr_format=3)  # fmt: skip
        c[...] = rng.integers(0, 4096, shape, dtype="<u2")
        out.append(ArrayRef("sharded/u2", np.asarray(c[...]).astype(">u2"), (128, 256)))
        # v3 float32 with NaN fill, a quarter never written, edge chunks partial: ~8 MiB
        shape = (1000 * scale, 2100)
        d = zarr.create_array(store, name="sparse/f4", shape=shape, chunks=(256, 256),
                              dtype="float32", fill_value=float("nan"), zarr_format=3)  # fmt: skip
        d[: shape[0] // 2, :] = rng.standard_normal((shape[0] // 2, shape[1])).astype("float32")
        d[shape[0] // 2 :, : shape[1] // 2] = 1.5
        out.append(ArrayRef("sparse/f4", np.asarray(d[...]).astype("<f4"), (256, 256)))
    return out


def store_files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def upload(client, bucket: str, prefix: str, root: Path) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from moto_server import upload_tree

    upload_tree(client, bucket, prefix.rstrip("/") + "/", root)


# --------------------------------------------------------------------------- the mount


def zvfs_exe() -> str:
    for candidate in (Path(sysconfig.get_path("scripts")) / "zvfs", Path(sys.executable).parent / "zvfs"):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("zvfs")
    if not found:
        raise RuntimeError("the zvfs command is not installed")
    return found


def is_mounted(path: Path | str) -> bool:
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
            if mp == target:
                return True
    return False


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM (bytes) of a process."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


# --------------------------------------------------------------------------- processes

ZYGOTE = "zvfs.decoders.zygote"


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent PID, start time) of ``pid`` from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (read from /proc/*/stat)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st is not None and st[1] == pid:
                out.append(int(d))
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def zygote(pid: int) -> int:
    """The daemon's zygote: its one child, which forks the decoder processes."""
    kids = [c for c in children(pid) if ZYGOTE in cmdline(c)]
    assert len(kids) == 1, [(c, cmdline(c)) for c in children(pid)]
    return kids[0]


def decoder_children(pid: int) -> list[int]:
    """The daemon's decoder processes (running or stopped; not zombies): its zygote's children."""
    return [c for c in children(zygote(pid)) if (proc_stat(c) or "Z")[0] != "Z"]


class ForegroundMount:
    """``zvfs mount -f SOURCE MOUNTPOINT ...`` as our child; stopped by its PID."""

    def __init__(self, source: str, mountpoint: Path, *args: str, env: dict | None = None,
                 log: Path | None = None, timeout: float = 90) -> None:  # fmt: skip
        self.mountpoint = mountpoint
        self.log = log or mountpoint.with_name(mountpoint.name + ".log")
        mountpoint.mkdir(parents=True, exist_ok=True)
        cmd = [zvfs_exe(), "mount", "-f", source, str(mountpoint), "--log-file", str(self.log),
               "--log-level", "info", *args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not is_mounted(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.stop()
                raise RuntimeError(f"zvfs mount -f {source} did not mount: {err}\n{self.log_text()}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> int | None:
        """Unmount and wait for our daemon; terminate, then kill, only our PID if it lingers."""
        mp = str(self.mountpoint)
        if is_mounted(mp):
            subprocess.run(["fusermount3", "-u", mp], capture_output=True, timeout=30)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            stop(self.proc)
        if is_mounted(mp):
            subprocess.run(["fusermount3", "-uz", mp], capture_output=True, timeout=30)
        if self.proc.stderr:
            self.proc.stderr.close()
        return self.proc.returncode


# --------------------------------------------------------------------------- the readers


@dataclass
class StressResult:
    duration: float = 0.0
    reads: int = 0
    bytes_read: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # I/O errors, failed churn commands
    wrong: list[str] = field(default_factory=list)  # reads whose bytes differ
    worst_latency: float = 0.0
    churn_rounds: int = 0
    peak_rss: int = 0  # VmHWM of the daemon
    rss_samples: list[int] = field(default_factory=list)
    chaos_kills: int = 0  # decoder processes killed (SIGKILL) by the chaos thread
    chaos_stops: int = 0  # decoder processes stopped for a moment (SIGSTOP, then SIGCONT)

    def summary(self) -> str:
        return (f"{self.reads} reads ({self.bytes_read / MiB:.1f} MiB, {self.by_kind}) in "
                f"{self.duration:.1f} s, {len(self.errors)} errors, {len(self.wrong)} wrong, "
                f"worst latency {self.worst_latency:.2f} s, {self.churn_rounds} churn rounds, "
                f"daemon peak RSS {self.peak_rss / MiB:.0f} MiB"
                + (f", decoder processes killed {self.chaos_kills} and stopped {self.chaos_stops} times"
                   if self.chaos_kills or self.chaos_stops else ""))  # fmt: skip


@dataclass
class Target:
    kind: str
    rel: str  # path relative to the mountpoint
    size: int
    expected: object  # bytes, an ArrayRef chunk (array, idx) or a local Path


def targets(mnt: Path, arrays: list[ArrayRef], raw_files: dict[str, Path]) -> list[Target]:
    """Every file the readers pick from; data.npy headers are read once and checked."""
    out: list[Target] = []
    for a in arrays:
        base = f".zvfs/arrays/{a.path}"
        out.append(Target("data.raw", f"{base}/data.raw", len(a.raw), a.raw))
        head = (mnt / base / "data.npy").open("rb").read(4096)
        f = io.BytesIO(head)
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(f)
        if (tuple(shape), fortran, dtype) != (a.ref.shape, False, a.ref.dtype):
            raise AssertionError(f"{base}/data.npy header says {shape, fortran, dtype}")
        header = head[: f.tell()]
        out.append(Target("data.npy", f"{base}/data.npy", len(header) + len(a.raw), (header, a.raw)))
        for idx in np.ndindex(*a.grid):
            name = ".".join(map(str, idx))
            out.append(Target("chunk", f"{base}/chunks/{name}", 0, (a, idx)))
    for rel, p in raw_files.items():
        out.append(Target("rawfile", rel, p.stat().st_size, p))
    return out


def _expected(t: Target, offset: int, length: int) -> bytes:
    if t.kind == "data.raw":
        return t.expected[offset : offset + length]  # type: ignore[index]
    if t.kind == "data.npy":
        header, raw = t.expected  # type: ignore[misc]
        whole_head = header[offset : offset + length]
        rest = max(0, length - len(whole_head))
        start = max(0, offset - len(header))
        return whole_head + raw[start : start + rest]
    if t.kind == "chunk":
        a, idx = t.expected  # type: ignore[misc]
        return a.chunk_bytes(idx)[offset : offset + length]
    with open(t.expected, "rb") as f:  # type: ignore[arg-type]
        return os.pread(f.fileno(), length, offset)


def _chunk_size(t: Target) -> int:
    a, idx = t.expected  # type: ignore[misc]
    n = a.ref.dtype.itemsize
    for i, c, s in zip(idx, a.chunks, a.ref.shape, strict=True):
        n *= min(s, (i + 1) * c) - i * c
    return n


def _reader(mnt: Path, pool: list[Target], deadline: float, seed: int, res: StressResult,
            lock: threading.Lock) -> None:  # fmt: skip
    rng = random.Random(seed)
    reads = nbytes = 0
    kinds: dict[str, int] = {}
    worst = 0.0
    by_kind = {k: [t for t in pool if t.kind == k] for k in ("data.raw", "data.npy", "chunk", "rawfile")}
    weights = [("data.raw", 3), ("data.npy", 2), ("chunk", 3), ("rawfile", 2)]
    names = [k for k, w in weights for _ in range(w) if by_kind[k]]
    while time.monotonic() < deadline:
        t = rng.choice(by_kind[rng.choice(names)])
        size = t.size if t.kind != "chunk" else _chunk_size(t)
        offset = rng.randrange(0, size + 1)
        length = rng.choice([rng.randint(1, 4096), rng.randint(1, 128 << 10), rng.randint(1, 1 << 20)])
        direct = rng.random() < 0.5
        t0 = time.monotonic()
        try:
            fd = os.open(mnt / t.rel, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            try:
                if rng.random() < 0.2:  # fstat as programs do before reading
                    st_size = os.fstat(fd).st_size
                    if st_size != size:
                        with lock:
                            res.wrong.append(f"{t.rel}: st_size {st_size}, expected {size}")
                got = b""
                while len(got) < length:
                    part = os.pread(fd, length - len(got), offset + len(got))
                    if not part:
                        break
                    got += part
            finally:
                os.close(fd)
        except OSError as exc:
            with lock:
                res.errors.append(f"{t.rel} [{offset}+{length}] {'O_DIRECT ' if direct else ''}"
                                  f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc}")  # fmt: skip
            continue
        worst = max(worst, time.monotonic() - t0)
        want = _expected(t, offset, length)
        if got != want:
            first = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), min(len(got), len(want)))
            with lock:
                res.wrong.append(f"{t.rel} [{offset}+{length}] {'O_DIRECT ' if direct else ''}"
                                 f"got {len(got)} bytes, expected {len(want)}, first difference at +{first}")  # fmt: skip
        reads += 1
        nbytes += len(got)
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    with lock:
        res.reads += reads
        res.bytes_read += nbytes
        res.worst_latency = max(res.worst_latency, worst)
        for k, v in kinds.items():
            res.by_kind[k] = res.by_kind.get(k, 0) + v


def _churn(mnt: Path, deadline: float, res: StressResult, lock: threading.Lock) -> None:
    """``find`` over the raw tree and the decoded views, then drop dentries and inodes,
    so the kernel sends FORGET for what the readers hold and look up again."""
    rounds = 0
    while time.monotonic() < deadline:
        where = mnt if rounds % 2 == 0 else mnt / ".zvfs"  # the raw tree, then the decoded views
        rounds += 1
        r = subprocess.run(["find", str(where)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
        if r.returncode != 0:
            with lock:
                res.errors.append(f"find {where} exited {r.returncode}: {r.stderr.strip()[:500]}")
        drop_caches(2)
        with lock:
            res.churn_rounds += 1
        time.sleep(0.1)


#: decoder processes the chaos thread kills at most: the pool turns itself off after 8 ends
CHAOS_KILLS = 6


def _decoder_chaos(daemon_pid: int, deadline: float, seed: int, res: StressResult,
                   lock: threading.Lock) -> None:  # fmt: skip
    """Every 0.1-0.3 s, one of the daemon's decoder processes is stopped for 0.02-0.3 s
    (SIGSTOP, then SIGCONT) or, every fourth time until CHAOS_KILLS, killed: the
    faults a decoder process meets (an operator's signal, the OOM killer, a debugger). Only
    the children of this daemon's zygote are signalled, by PID."""
    rng = random.Random(seed)
    kills = stops = rounds = 0
    killed: set[int] = set()  # a process killed may take a moment to end: never one kill twice
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.1, 0.3))
            kids = [k for k in decoder_children(daemon_pid) if k not in killed]
            if not kids:
                continue
            victim = rng.choice(kids)
            rounds += 1
            try:
                if kills < CHAOS_KILLS and rounds % 4 == 0:  # all of them in the first seconds
                    os.kill(victim, signal.SIGKILL)
                    killed.add(victim)
                    kills += 1
                    continue
                os.kill(victim, signal.SIGSTOP)
                stops += 1
                try:
                    time.sleep(rng.uniform(0.02, 0.3))
                finally:
                    os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:  # it ended meanwhile
                continue
    except Exception as exc:  # noqa: BLE001 - reported as a failure of the run
        with lock:
            res.errors.append(f"decoder chaos: {type(exc).__name__}: {exc}")
    with lock:
        res.chaos_kills += kills
        res.chaos_stops += stops


def run_stress(mnt: Path, daemon_pid: int, arrays: list[ArrayRef], raw_files: dict[str, Path],
               duration: float, threads: int = 64, seed: int = 0,
               decoder_chaos: bool = False) -> StressResult:  # fmt: skip
    """``threads`` readers and one churn loop for ``duration`` seconds; the daemon's RSS is
    sampled every 0.5 s and its peak (VmHWM) read at the end. With ``decoder_chaos``, a
    thread also stops and kills the daemon's decoder processes (:func:`_decoder_chaos`)."""
    res = StressResult()
    lock = threading.Lock()
    pool = targets(mnt, arrays, raw_files)
    start = time.monotonic()
    deadline = start + duration
    workers = [threading.Thread(target=_reader, args=(mnt, pool, deadline, seed * 1000 + i, res, lock),
                                name=f"reader{i}", daemon=True) for i in range(threads)]  # fmt: skip
    workers.append(threading.Thread(target=_churn, args=(mnt, deadline, res, lock), name="churn", daemon=True))
    if decoder_chaos:
        workers.append(threading.Thread(target=_decoder_chaos, args=(daemon_pid, deadline, seed, res, lock),
                                        name="decoder chaos", daemon=True))  # fmt: skip
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        try:
            res.rss_samples.append(proc_status(daemon_pid)["VmRSS"])
        except (OSError, KeyError):
            res.errors.append("the daemon is gone")
            break
        time.sleep(0.5)
    for w in workers:
        w.join(timeout=300)
        if w.is_alive():
            res.errors.append(f"{w.name} still blocked 300 s after the deadline")
    res.duration = time.monotonic() - start
    try:
        res.peak_rss = proc_status(daemon_pid)["VmHWM"]
    except (OSError, KeyError):
        res.errors.append("the daemon is gone")
    return res

"""One measurement each: every function mounts fresh (when it mounts), drops the page cache
before the cold part, and returns a number (or raises)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import procs
from .corpus import BIG_ARRAY, Corpus
from .systems import Mounted, Mounter, System, kill_mount

READER = str(Path(__file__).with_name("reader.py"))
MiB = 1 << 20


class WorkloadError(RuntimeError):
    pass


def _run_child(argv: list[str], timeout: float, mounted: Mounted | None = None,
               env: dict | None = None, capture: bool = True) -> subprocess.CompletedProcess:
    """Run a workload process; on timeout end the daemon first so blocked reads return."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                         preexec_fn=procs._die_with_parent)
    procs._procs[p.pid] = p
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if mounted is not None:
            kill_mount(mounted)
        p.kill()
        p.communicate(timeout=30)
        raise WorkloadError(f"{os.path.basename(argv[0])} timed out after {timeout:.0f}s") from None
    finally:
        procs._procs.pop(p.pid, None)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _reader(args: list[str], timeout: float, mounted: Mounted | None = None,
            env: dict | None = None) -> dict:
    r = _run_child([sys.executable, READER, *args], timeout, mounted, env)
    if r.returncode != 0:
        raise WorkloadError(f"reader exited {r.returncode}: {r.stderr.strip()[-300:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res.get("errors"):
        raise WorkloadError(f"{res.get('nerrors', len(res['errors']))} read errors, "
                            f"first: {res['errors'][0]}")
    return res


class Bench:
    def __init__(self, work: Path, corpus: Corpus, mounter: Mounter, timeout: float) -> None:
        self.work = work
        self.corpus = corpus
        self.m = mounter
        self.timeout = timeout
        self.lists: dict[str, Path] = {}
        #: seconds a daemon's peak RSS must not grow before it is read (mount_find); the tiny
        #: run's RSS rows are noise anyway, and its 8 key cells spent 24 s waiting at 3 s
        self.settle = procs.SETTLE_SECONDS

    def _listfile(self, mnt: Path, store: str) -> Path:
        files = self.corpus.files(store)
        lf = self.work / "scratch" / f"list-{os.getpid()}-{mnt.name}"
        lf.parent.mkdir(parents=True, exist_ok=True)
        lf.write_text("".join(f"{mnt / rel}\t{size}\n" for rel, size in files))
        return lf

    def read_all(self, system: System, store: str, nreaders: int,
                 per_file: bool = False) -> tuple[float, int | None]:
        """Cold read of every file of ``store``: (MiB/s or files/s, daemon peak RSS in KiB)."""
        procs.drop_caches()  # before mounting: the workload starts as soon as the mount answers
        with self.m.mount(system, store) as mt:
            lf = self._listfile(mt.path, store)
            try:
                res = _reader(["files", str(lf), str(nreaders)], self.timeout, mt)
            finally:
                lf.unlink(missing_ok=True)
            rss = procs.peak_rss_kib(mt.pid)
        if per_file:
            return len(self.corpus.files(store)) / res["seconds"][0], rss
        return res["bytes"] / MiB / res["seconds"][0], rss

    def read_twice(self, system: System | None, store: str) -> tuple[float, float]:
        """Cold, then warm, read of every file of ``store`` (1 reader), through a fresh mount
        of ``system``, or straight from the directory when ``system`` is None: (cold MiB/s,
        warm MiB/s). Warm is the second pass, page cache kept (zvfs: the same mount)."""
        procs.drop_caches()
        with contextlib.ExitStack() as stack:
            if system is None:
                base, mt = self.corpus.store(store), None
            else:
                mt = stack.enter_context(self.m.mount(system, store))
                base = mt.path
            lf = self._listfile(base, store)
            stack.callback(lf.unlink, missing_ok=True)
            rates = []
            for _ in range(2):
                res = _reader(["files", str(lf), "1"], self.timeout, mt)
                rates.append(res["bytes"] / MiB / res["seconds"][0])
        return rates[0], rates[1]

    def mount_time(self, system: System, store: str) -> float:
        """Seconds from starting the mounter until the mount point answers a stat, caches
        dropped first."""
        procs.drop_caches()
        with self.m.mount(system, store):
            return self.m.last_mount_seconds

    def mount_find(self, system: System, store: str, expect: int) -> tuple[float, int | None]:
        """Caches dropped, then mount + ``find MNT | wc -l`` until it prints: (seconds from
        starting the mounter, daemon peak RSS in KiB after the listing, once it has settled:
        read at once, the 4-key store's figure missed what the daemon still did after it)."""
        procs.drop_caches()
        with self.m.mount(system, store) as mt:
            r = _run_child(["sh", "-c", 'find "$1" | wc -l', "sh", str(mt.path)], self.timeout,
                           mt)
            dt = time.perf_counter() - self.m.last_mount_start
            if r.returncode != 0:
                raise WorkloadError(f"find | wc -l exited {r.returncode}: "
                                    f"{r.stderr.strip()[-300:]}")
            seen = int(r.stdout.split()[0]) - 1  # find prints the mount point itself too
            if seen < expect:
                raise WorkloadError(f"find saw {seen} entries, the store has {expect} keys")
            rss = procs.settled_peak_rss_kib(mt.pid, quiet=self.settle)
        return dt, rss

    def write_copy(self, system: System, s3env, store: str,
                   source: str = "big") -> tuple[float, int, float]:
        """``cp -r`` of the ``source`` store into a writable mount of ``store``'s bucket
        (created fresh and empty here, deleted afterwards). Timed from the start of cp until
        every file is an object of the bucket with its size: the bucket is listed straight
        from moto when cp returns, then every 0.1 s until it is complete (zvfs and s3fs upload
        in close(), so cp's return is the end; rclone's writes mode uploads after it). The
        bytes are then checked against the source (ETag = MD5 for a single PUT).
        Returns (stored MiB/s, S3 requests through the proxy, seconds until cp returned)."""
        import hashlib

        from .s3 import bucket

        src = self.corpus.store(source)
        files = self.corpus.files(source)
        total = sum(size for _, size in files)
        want = {f"{source}/{rel}": size for rel, size in files}
        bucket_name = bucket(store)
        s3env.fresh_bucket(bucket_name)
        client = s3env.client()  # made before the clock starts (boto3 is slow to set up)
        try:
            procs.drop_caches()
            with self.m.mount(system, store) as mt:
                for rel, _size in files:  # the source is read from the page cache by all
                    (src / rel).read_bytes()
                c0 = s3env.counters()[0]
                t0 = time.perf_counter()
                r = _run_child(["cp", "-r", str(src), str(mt.path) + "/"], self.timeout, mt)
                t_cp = time.perf_counter() - t0
                if r.returncode != 0:
                    raise WorkloadError(f"cp exited {r.returncode}: {r.stderr.strip()[-300:]}")
                while True:
                    have = s3env.objects(bucket_name, client)
                    if all(have.get(k, (-1,))[0] == size for k, size in want.items()):
                        break
                    if time.perf_counter() - t0 > self.timeout:
                        missing = [k for k, size in want.items() if have.get(k, (-1,))[0] != size]
                        raise WorkloadError(f"{len(missing)} of {len(want)} files not in the "
                                            f"bucket {self.timeout:.0f}s after cp started, "
                                            f"first: {missing[0]}")
                    time.sleep(0.1)
                dt = time.perf_counter() - t0
                nreq = s3env.counters()[0] - c0
            # after unmounting (which ends rclone's uploads too): the bytes are the source's
            stray = [k for k in have if k not in want and not k.endswith("/")]
            if stray:
                raise WorkloadError(f"{len(stray)} unexpected objects in the bucket, first: "
                                    f"{stray[0]}")
            for key, (_size, etag) in have.items():
                if key in want and "-" not in etag:
                    md5 = hashlib.md5((src / key.split("/", 1)[1]).read_bytes()).hexdigest()
                    if md5 != etag:
                        raise WorkloadError(f"{key}: the object's MD5 {etag} is not the "
                                            f"source's {md5}")
        finally:
            s3env.drop_bucket(bucket_name)
        return total / MiB / dt, nreq, t_cp

    def walk(self, system: System, store: str, cmd: str) -> float:
        """Cold ``find`` or ``ls -lR`` of a fresh mount: seconds."""
        files = [rel for rel, _ in self.corpus.files(store)]
        if cmd == "ls":  # ls without -a leaves out dot files (.zarray, .zgroup, ...)
            files = [f for f in files if not any(part.startswith(".") for part in f.split("/"))]
        expect = len(files)
        procs.drop_caches()  # before mounting: the workload starts as soon as the mount answers
        with self.m.mount(system, store) as mt:
            argv = ["find", str(mt.path)] if cmd == "find" else ["ls", "-lR", str(mt.path)]
            t0 = time.perf_counter()
            r = _run_child(argv, self.timeout, mt)
            dt = time.perf_counter() - t0
            if r.returncode != 0:
                raise WorkloadError(f"{cmd} exited {r.returncode}: {r.stderr.strip()[-300:]}")
            # sanity: every chunk key shows up (find: one line per entry; ls -lR: '-r' lines)
            if cmd == "find":
                seen = r.stdout.count("\n") - 1
            else:
                seen = sum(1 for ln in r.stdout.splitlines() if ln.startswith("-"))
            if seen < expect:
                raise WorkloadError(f"{cmd} saw {seen} entries, the store has {expect} files")
        return dt

    def decoded(self, system: System, store: str = "big") -> tuple[float, float, int | None]:
        """zvfs: cold then warm ``cat .zvfs/arrays/<arr>/data.raw``: (cold MiB/s, warm MiB/s, RSS)."""
        procs.drop_caches()  # before mounting: the workload starts as soon as the mount answers
        with self.m.mount(system, store) as mt:
            raw = find_data_raw(mt.path, BIG_ARRAY)
            size = os.stat(raw).st_size
            if size != self.corpus.big_nbytes:
                raise WorkloadError(f"{raw} is {size} bytes, expected {self.corpus.big_nbytes}")
            cold = self._cat(raw, mt)
            warm = self._cat(raw, mt)
            rss = procs.peak_rss_kib(mt.pid)
        return size / MiB / cold, size / MiB / warm, rss

    def xarray_netcdf(self, system: System) -> float:
        """zvfs: cold ``xarray.open_dataset(MNT/.zvfs/netcdf/root.nc).load()`` of the big array (MiB/s)."""
        procs.drop_caches()
        with self.m.mount(system, "big") as mt:
            path = mt.path / ".zvfs" / "netcdf" / "root.nc"
            res = _reader(["xarray", "netcdf", str(path), BIG_ARRAY, "1"], self.timeout, mt)
        return self._xarray_rate(res)

    def xarray_zarr(self) -> float:
        """The peer: cold ``xarray.open_zarr(store).load()`` of the same array, in-process (MiB/s)."""
        procs.drop_caches()
        res = _reader(["xarray", "zarr", str(self.corpus.store("big")), BIG_ARRAY, "1"], self.timeout)
        return self._xarray_rate(res)

    def _xarray_rate(self, res: dict) -> float:
        if res["bytes"] != self.corpus.big_nbytes:
            raise WorkloadError(f"xarray read {res['bytes']} bytes, expected {self.corpus.big_nbytes}")
        return res["bytes"] / MiB / res["seconds"][0]

    def _cat(self, path: Path, mt: Mounted | None) -> float:
        t0 = time.perf_counter()
        r = _run_child(["cat", str(path)], self.timeout, mt, capture=False)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise WorkloadError(f"cat {path} exited {r.returncode}: {r.stderr.strip()[-300:]}")
        return dt

    def stream_rss(self, system: System, total_bytes: int) -> tuple[int | None, int]:
        """Stream data.raw repeatedly (page cache dropped each pass) until ``total_bytes``:
        (daemon VmHWM KiB, bytes streamed)."""
        with self.m.mount(system, "big") as mt:
            raw = find_data_raw(mt.path, BIG_ARRAY)
            size = os.stat(raw).st_size
            done = 0
            while done < total_bytes:
                procs.drop_caches()
                self._cat(raw, mt)
                done += size
            return procs.peak_rss_kib(mt.pid), done

    def in_process(self, lib: str, backend: str, s3env=None) -> tuple[float, float]:
        """An in-process reader of the whole big array: (cold MiB/s, warm MiB/s), warm being
        a second read in the same process. ``lib``: zarr (zarr-python), zarrs (zarr-python
        with the zarrs codec pipeline) or tensorstore; ``backend``: dir, zip or s3."""
        store = self.corpus.store("big")
        if lib in ("zarr", "zarrs"):
            if backend == "s3":
                raise ValueError("the zarr-python peers read the directory and the zip only")
            src = self.corpus.zip("big") if backend == "zip" else store
            args = [lib, str(src), BIG_ARRAY, "2"]
        else:
            if backend == "dir":
                kv = {"driver": "file", "path": f"{store}/{BIG_ARRAY}/"}
            elif backend == "zip":
                kv = {"driver": "zip", "base": f"file://{self.corpus.zip('big')}",
                      "path": f"{BIG_ARRAY}/"}
            else:
                from .s3 import bucket
                kv = {"driver": "s3", "bucket": bucket("big"), "path": f"{BIG_ARRAY}/",
                      "endpoint": s3env.url, "aws_region": "us-east-1"}
            args = ["tensorstore", json.dumps({"driver": "zarr3", "kvstore": kv}), "2"]
        procs.drop_caches()
        res = _reader(args, self.timeout, None, env=s3env.env() if s3env else None)
        if res["bytes"] != self.corpus.big_nbytes:
            raise WorkloadError(f"{lib} read {res['bytes']} bytes, expected {self.corpus.big_nbytes}")
        cold, warm = res["seconds"][:2]
        return res["bytes"] / MiB / cold, res["bytes"] / MiB / warm


def find_data_raw(mnt: Path, array: str) -> Path:
    """The decoded file of ``array`` under MNT/.zvfs/arrays, whatever the nesting."""
    base = mnt / ".zvfs" / "arrays"
    direct = base / array / "data.raw"
    if direct.exists():
        return direct
    for dirpath, _dirs, files in os.walk(base):
        if "data.raw" in files and Path(dirpath).name == array:
            return Path(dirpath) / "data.raw"
    raise WorkloadError(f"no data.raw for {array} under {base}")

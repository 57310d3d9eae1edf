"""Shared fixtures: real FUSE mounts, a real S3 server (moto), real Zarr stores.

Nothing here is mocked. A test that needs FUSE, moto or a command-line tool
fails when it is missing; it never skips. Everything started here is stopped
by PID, and everything mounted is unmounted, also when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from zvfs.stores.base import KeyInfo, KeyNotFound, Listing, Store

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
for _p in (TESTS, REPO / "scripts"):  # the tests' helpers, and benchlib's (drop_caches)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def _import_the_project() -> None:
    """Import every module of zvfs and of the bench's library before any test runs.

    Hypothesis (6.131 on) draws about one choice in twenty from the literals of the
    project's modules imported so far. A derandomized test then drew other cases after
    tests that had imported more of zvfs than a run of its file alone does: the zip
    mutation test found a bug in a full run that its own file's run did not draw. With
    the whole project imported first, a test draws the same cases in any run."""
    import importlib
    import pkgutil

    for name in ("zvfs", "benchlib"):
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not module.name.endswith(".__main__"):
                importlib.import_module(module.name)


_import_the_project()

MOUNT_TIMEOUT = 90  # seconds a `zvfs mount` may take before the test fails


# --------------------------------------------------------------------------- tools


def tool(name: str) -> str:
    """Absolute path of a command-line tool; fails the test (never skips) when missing.

    Console scripts of this interpreter (zvfs, mount.zvfs, gsutil) come first, so the
    tests drive the zvfs that is installed from this checkout.
    """
    scripts = Path(sysconfig.get_path("scripts"))
    for candidate in (scripts / name, Path(sys.executable).parent / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"required tool {name!r} is not installed; run scripts/setup", pytrace=False)
    return found


def zvfs_cmd() -> list[str]:
    return [tool("zvfs")]


def in_threads(fn, n: int, timeout: float = 120) -> list[BaseException]:
    """Run ``fn(i)`` for i in range(n) in n threads at once; what they raised, for the main
    thread to report (a thread still running after ``timeout`` fails the test as hung)."""
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def run(cmd, *, check: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """subprocess.run with text output captured and a timeout."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    res = subprocess.run([str(c) for c in cmd], timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise AssertionError(
            f"command failed ({res.returncode}): {' '.join(map(str, cmd))}\n"
            f"stdout: {res.stdout}\nstderr: {res.stderr}"
        )
    return res


#: marks a test that runs `zvfs status` with no mountpoint: it opens the stats.json of every
#: mount of the machine (an OPEN and two READs in each), which broke another test's exact
#: count of its own mount's reads (test_s3_small_objects_fetched_ahead_are_pushed_with_their_open),
#: so such a test runs alone, with the exclusive ones
probes_every_mount = pytest.mark.exclusive

#: the test files that take longest, handed out first when the suite runs on parallel workers
#: a file each, so the workers end together rather than one running a long file alone at the
#: end. Ordered by each file's summed test durations in a run of scripts/test on 3 workers
#: (sixty-sixth session, seconds: 386, 245, 186, 184, 132, 131, 131, 117, 111, 100, 99, 92,
#: 80, 74, 69, 69); test_zarr_write_model holds the longest single test (97 s).
LONGEST_FIRST = ("test_writes", "test_mount_decoded", "test_mount_raw", "test_mount_zv",
                 "test_applications", "test_faults", "test_zarr_write_model", "test_stores",
                 "test_netcdf", "test_hostile", "test_write_model", "test_property",
                 "test_hostile_zip", "test_cli_errors", "test_decoded_cache", "test_disk_cache")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker, the longest files first (the order the files are handed out
    in); a plain run keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest as collected


def pytest_sessionstart(session: pytest.Session) -> None:
    """FUSE must be usable; stop the whole run loudly when it is not (never skip)."""
    problems = []
    if not os.path.exists("/dev/fuse"):
        problems.append("/dev/fuse does not exist (load the fuse module / give the container the device)")
    if shutil.which("fusermount3") is None:
        problems.append("fusermount3 is not installed (Debian package fuse3; run scripts/setup)")
    if problems:
        pytest.exit("zvfs tests need a working FUSE:\n  " + "\n  ".join(problems), returncode=3)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The default log files of this session's mounts go: the tests that mount without
    --log-file (as a user would) left one each in /var/log/zvfs per run, hundreds in all.
    Only the names made from this session's temporary directory are removed."""
    from zvfs.cli import default_log_file

    try:
        base = Path(session.config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return
    own = Path(default_log_file(str(base)))
    prefix = own.name.removesuffix(".log") + "-"
    with contextlib.suppress(OSError):
        for f in own.parent.iterdir():
            if f.name.startswith(prefix) and f.name.endswith(".log"):
                f.unlink(missing_ok=True)


# --------------------------------------------------------------------------- mounts


def _unescape_mount_field(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mountinfo() -> Iterator[dict]:
    """Each entry of /proc/self/mountinfo, in order, its fields unescaped. Read from the
    kernel's table, never by a stat: a stat of a hung mountpoint would hang too."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.rstrip("\n").partition(" - ")
            fields = pre.split(" ")
            fstype, source, superopts = (post.split(" ") + ["", "", ""])[:3]
            major, minor = (int(n) for n in fields[2].split(":"))
            yield {
                "mountpoint": _unescape_mount_field(fields[4]),
                "options": fields[5],
                "fstype": fstype,
                "source": _unescape_mount_field(source),
                "super_options": superopts,
                "dev": (major << 20) | minor,  # the kernel's dev_t, as fusectl names it
            }


def mount_entry(path: os.PathLike | str) -> dict | None:
    """The /proc/self/mountinfo entry mounted at ``path`` (the last one), or None."""
    target = os.path.abspath(path)
    found = None
    for entry in mountinfo():
        if entry["mountpoint"] == target:
            found = entry
    return found


def is_mounted(path: os.PathLike | str) -> bool:
    return mount_entry(path) is not None


def deep_levels(base: os.PathLike | str, depth: int = 4040) -> list[str]:
    """Directory names, each within NAME_MAX (255 bytes), that nested below ``base`` make a
    path of ``depth`` bytes: near PATH_MAX (4,096) whatever ``base``'s own length."""
    levels, length = [], len(os.fsencode(base))
    while depth - length - 1 > 255:
        levels.append("d" * 200)
        length += 201
    levels.append("e" * (depth - length - 1))
    return levels


def wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def daemon_pids(mountpoint: os.PathLike | str) -> list[int]:
    """PIDs of zvfs processes whose command line names ``mountpoint``."""
    target = os.path.abspath(mountpoint)
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if not any("zvfs" in a for a in args[:3]):
            continue
        if any(a == target or a == str(mountpoint) or a.rstrip("/") == target for a in args):
            pids.append(int(d.name))
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` has used so far, all its threads. A bound on
    the work a daemon did, unlike wall time, does not move with the machine's load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def force_unmount(mountpoint: os.PathLike | str) -> None:
    """Unmount whatever is at ``mountpoint`` and stop its zvfs daemon (by PID)."""
    mp = os.path.abspath(mountpoint)
    pids = daemon_pids(mp)
    for _ in range(4):  # a buggy double mount stacks two mounts on one path
        if not is_mounted(mp):
            break
        subprocess.run(["fusermount3", "-u", mp], capture_output=True, timeout=30)
        if not wait_until(lambda: not is_mounted(mp), 5):
            subprocess.run(["fusermount3", "-uz", mp], capture_output=True, timeout=30)
        if is_mounted(mp):  # not ours via fusermount (e.g. root mount without helper record)
            subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
    for pid in pids:
        if not wait_until(lambda p=pid: not _pid_alive(p), 10):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                if wait_until(lambda p=pid: not _pid_alive(p), 5):
                    break


def fuse_mounts_under(base: os.PathLike | str) -> list[tuple[str, int]]:
    """(mountpoint, kernel device number) of every FUSE mount below ``base``."""
    prefix = os.path.abspath(base).rstrip("/") + "/"
    return [(e["mountpoint"], e["dev"]) for e in mountinfo()
            if e["mountpoint"].startswith(prefix) and e["fstype"].startswith("fuse")]


def abort_hung_mounts(base: os.PathLike | str, why: str) -> list[str]:
    """Print the stacks of the zvfs daemons behind every FUSE mount below ``base`` (py-spy)
    and the end of each one's log, then abort those mounts' FUSE connections; return their
    mountpoints.

    A test blocked in a read of a mount whose daemon never answers cannot be interrupted by
    pytest-timeout's signal (the kernel waits for the daemon, or for SIGKILL), so one hung
    daemon would hang the whole run. Aborted, every waiting call fails (ECONNABORTED, or
    ENOTCONN for one not yet sent to the daemon): the test fails, with the stacks that say
    where the daemon was stuck, and the run goes on."""
    mounts = fuse_mounts_under(base)
    report = [f"\n== {why}: aborting the FUSE connections of {len(mounts)} mount(s)"]
    spy = shutil.which("py-spy") or str(Path(sysconfig.get_path("scripts")) / "py-spy")
    for mp, _dev in mounts:
        for pid in daemon_pids(mp):
            try:
                out = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)],
                                     capture_output=True, text=True, timeout=30)
                stacks = out.stdout + out.stderr
            except (OSError, subprocess.TimeoutExpired) as exc:
                stacks = f"(no stacks: {exc})"
            report.append(f"-- daemon {pid} of {mp}:\n{stacks}")
        log = Path(mp + ".log")  # where the mount fixture has it write
        if log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-40:]
            report.append(f"-- the end of {log}:\n" + "\n".join(tail))
    for mp, dev in mounts:
        try:
            Path(f"/sys/fs/fuse/connections/{dev}/abort").write_text("1")
            report.append(f"aborted {mp}")
        except OSError as exc:
            report.append(f"could not abort {mp}: {exc}")
    print("\n".join(report), file=sys.stderr, flush=True)
    return [mp for mp, _dev in mounts]


#: seconds before pytest-timeout's limit at which a test's hung mounts are aborted
HANG_MARGIN = 60


@pytest.fixture(autouse=True)
def hung_mount_guard(request, tmp_path_factory) -> Iterator[None]:
    """Every test (with its function-scoped fixtures' set-up and teardown) gets
    pytest-timeout's limit less HANG_MARGIN before the FUSE mounts below the session's
    temporary directory are aborted (see :func:`abort_hung_mounts`)."""
    limit = float(request.config.getini("timeout") or 0)
    if limit <= HANG_MARGIN:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    timer = threading.Timer(limit - HANG_MARGIN, abort_hung_mounts,
                            args=(base, f"{request.node.nodeid} ran for {limit - HANG_MARGIN:.0f} s"))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@dataclass
class Mounted:
    """A live zvfs mount made by the ``mount`` fixture."""

    path: Path
    source: str
    log: Path
    result: subprocess.CompletedProcess

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, other: str) -> Path:
        return self.path / other


@dataclass
class Mounter:
    """Runs `zvfs mount` and remembers every mountpoint so it can always clean up."""

    base: Path
    mountpoints: list[Path] = field(default_factory=list)
    counter: int = 0

    def new_mountpoint(self, name: str = "mnt") -> Path:
        self.counter += 1
        mp = self.base / f"{name}{self.counter}"
        mp.mkdir(parents=True)
        return mp

    def __call__(
        self,
        source: os.PathLike | str,
        *args: str,
        mountpoint: os.PathLike | str | None = None,
        check: bool = True,
        log_level: str | None = "info",
        env: dict | None = None,
        timeout: float = MOUNT_TIMEOUT,
    ) -> Mounted:
        mp = Path(mountpoint) if mountpoint is not None else self.new_mountpoint()
        self.mountpoints.append(mp)
        log = self.base / f"{mp.name}.log"
        cmd = [*zvfs_cmd(), "mount", str(source), str(mp), "--log-file", str(log)]
        if log_level:
            cmd += ["--log-level", log_level]
        cmd += list(args)
        res = run(cmd, timeout=timeout, env=env)
        m = Mounted(path=mp, source=str(source), log=log, result=res)
        if check:
            assert res.returncode == 0, (
                f"zvfs mount failed ({res.returncode}): {' '.join(cmd)}\n"
                f"stderr: {res.stderr}\nlog:\n{m.log_text()[-4000:]}"
            )
            assert is_mounted(mp), f"zvfs mount returned 0 but {mp} is not mounted"
        return m

    def cleanup(self) -> None:
        for mp in reversed(self.mountpoints):
            force_unmount(mp)
        self.mountpoints.clear()


@pytest.fixture
def mount(tmp_path_factory) -> Iterator[Mounter]:
    """Factory: ``m = mount(SOURCE, *options)`` mounts for real; always unmounted at teardown."""
    mounter = Mounter(tmp_path_factory.mktemp("mounts"))
    try:
        yield mounter
    finally:
        mounter.cleanup()


@pytest.fixture(scope="session")
def session_mount(tmp_path_factory) -> Iterator[Mounter]:
    """Like ``mount`` but mounts live for the whole session (read-only checks share them)."""
    mounter = Mounter(tmp_path_factory.mktemp("session-mounts"))
    try:
        yield mounter
    finally:
        mounter.cleanup()


# --------------------------------------------------------------------------- S3 (moto)


@pytest.fixture(scope="session")
def moto():
    """A real moto S3 server on 127.0.0.1 (free port), stopped by PID at session end.

    ``moto.endpoint``, ``moto.env`` (dummy credentials, no ~/.aws), ``moto.pid``.
    """
    from moto_server import MotoServer

    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


def s3_client(endpoint: str):
    from moto_server import s3_client as _client

    return _client(endpoint)


@pytest.fixture(scope="session")
def s3_env(moto) -> dict:
    """Environment for a zvfs daemon talking to moto through the standard credential chain."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(moto.env)
    return env


def upload_tree(client, src: Path, bucket: str, prefix: str) -> list[str]:
    """Upload every file below ``src`` as ``prefix/relative/path``."""
    from moto_server import upload_tree as _upload

    return _upload(client, bucket, prefix.rstrip("/") + "/" if prefix else "", src)


def put_many(client, bucket: str, items: dict[str, bytes]) -> None:
    from moto_server import put_many as _put_many

    _put_many(client, bucket, items)


# --------------------------------------------------------------------------- Zarr stores

SPECIAL_FILES = {
    "notes with spaces.txt": b"a file whose name has spaces\n",
    "dir with space/inner file.txt": b"nested, spaced\n",
    "na\u00efve-\u00fcnicode.txt": "unicode name \u00e9\n".encode(),
    "empty.bin": b"",
    "deep/a/b/c/d/leaf.txt": b"deeply nested key\n",
}


def build_zarr_store(root: Path) -> Path:
    """Write a small Zarr hierarchy with zarr-python 3 into the directory ``root``.

    Groups, v3 arrays (compressed, uncompressed, nested chunk keys), a v2 group, a
    large (>1 MiB) chunk, a partly written array, and plain files with awkward names.
    """
    import zarr

    rng = np.random.default_rng(1234)
    root.mkdir(parents=True, exist_ok=True)
    store = zarr.storage.LocalStore(str(root))
    g = zarr.open_group(store, mode="w", zarr_format=3, attributes={"title": "zvfs sample"})
    t = g.create_array("temperature", shape=(40, 30), chunks=(16, 16), dtype="float32",
                       dimension_names=["y", "x"])
    t[:] = rng.standard_normal((40, 30)).astype("float32")
    sub = g.create_group("sub").create_group("grp")
    c = sub.create_array("counts", shape=(100,), chunks=(30,), dtype="int16", compressors=None)
    c[:] = np.arange(100, dtype="int16")
    big = g.create_array("big", shape=(2, 600_000), chunks=(1, 600_000), dtype="uint8",
                         compressors=None)
    big[:] = rng.integers(0, 255, size=(2, 600_000), dtype="uint8")
    sparse = g.create_array("sparse", shape=(10, 10), chunks=(5, 5), dtype="int32", fill_value=-1)
    sparse[0:5, 0:5] = 7  # only one chunk written
    spaced = g.create_array("array with space", shape=(4,), chunks=(2,), dtype="float64")
    spaced[:] = [1.5, 2.5, 3.5, 4.5]
    legacy = zarr.open_group(zarr.storage.LocalStore(str(root / "legacy")), mode="w", zarr_format=2)
    v2 = legacy.create_array("v2arr", shape=(12, 12), chunks=(5, 5), dtype="<u2",
                             chunk_key_encoding={"name": "v2", "separator": "."})
    v2[:] = np.arange(144, dtype="<u2").reshape(12, 12)
    for rel, data in SPECIAL_FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def mount_stats(mnt: os.PathLike | str) -> dict:
    """A mount's ``.zvfs/stats.json``, parsed."""
    return json.loads((Path(mnt) / ".zvfs" / "stats.json").read_text())


def write_arrays(store, specs: dict[str, dict], sample) -> None:
    """Write each array of ``specs`` with zarr-python into ``store``. A spec holds ``fmt``
    (2 or 3), ``dtype`` (the declared one: a v3 array is created in native order, and a
    BytesCodec says the stored one), ``write`` (regions to write; all of it by default)
    and create_array's other keywords; its data is ``sample(dtype, shape, seed)``, the
    seed being its place in path order."""
    import zarr

    for seed, (path, spec) in enumerate(sorted(specs.items())):
        spec = dict(spec)
        fmt, write = spec.pop("fmt"), spec.pop("write", None)
        declared = np.dtype(spec.pop("dtype"))
        dt = declared if fmt == 2 else declared.newbyteorder("=")
        arr = zarr.create_array(store, name=path, dtype=dt, zarr_format=fmt, **spec)
        data = sample(declared, arr.shape, seed)
        if write is None:
            arr[...] = data
        else:
            for region in write:
                arr[region] = data[region]


def numcodecs_filter_cases() -> dict[str, tuple[str, object, np.ndarray, str]]:
    """v3 ``numcodecs.*`` array→array filters as zarr-python 3 writes them: name ->
    (dtype, filter, values of shape (5, 3), dtype the filter encodes to). Each filter
    gives these values back exactly, so the array written is their reference."""
    import warnings

    import zarr.codecs.numcodecs as znc

    rng = np.random.default_rng(25)
    k = np.arange(15).reshape(5, 3)
    with warnings.catch_warnings():  # "not in the Zarr version 3 specification": known
        warnings.simplefilter("ignore")
        return {
            "delta": ("i4", znc.Delta(dtype="<i4"),
                      rng.integers(-(2**31), 2**31, (5, 3)).astype("i4"), "i4"),
            "delta_astype_i2": ("i4", znc.Delta(dtype="<i4", astype="<i2"), k * 3 - 20, "i2"),
            "fixedscaleoffset_i4": ("f4", znc.FixedScaleOffset(offset=0, scale=10, dtype="<f4",
                                                               astype="<i4"), (k - 5) / 10, "i4"),
            "fixedscaleoffset_u1": ("f8", znc.FixedScaleOffset(offset=0, scale=10, dtype="<f8",
                                                               astype="|u1"), k / 10, "u1"),
            "quantize": ("f8", znc.Quantize(digits=3, dtype="<f8"), k * 0.25 - 1, "f8"),
            "bitround": ("f4", znc.BitRound(keepbits=3), (k - 7) * 0.5, "f4"),
            "astype": ("f8", znc.AsType(encode_dtype="<f4", decode_dtype="<f8"), k / 4, "f4"),
            "packbits": ("bool", znc.PackBits(), rng.integers(0, 2, (5, 3)).astype(bool), "u1"),
        }  # fmt: skip


def write_numcodecs_filter_array(
    root: Path, name: str, endian: str, shards: tuple[int, ...] | None = None
) -> np.ndarray:
    """Write case ``name`` of :func:`numcodecs_filter_cases` with zarr-python 3 at
    ``root/<endian>/<name>`` (chunks (2, 2), so edge chunks too; bytes codec in
    ``endian``, no compressor), or ``root/<endian>-sharded/<name>`` in ``shards`` (the
    filter goes inside the sharding codec); returns the array written, in the dtype
    declared."""
    import zarr
    from zarr.codecs import BytesCodec

    dtype, filt, values, _ = numcodecs_filter_cases()[name]
    path = f"{endian}-sharded/{name}" if shards else f"{endian}/{name}"
    arr = zarr.create_array(str(root), name=path, shape=values.shape, chunks=(2, 2), shards=shards,
                            dtype=dtype, filters=[filt], serializer=BytesCodec(endian=endian),
                            compressors=None, zarr_format=3)  # fmt: skip
    written = values.astype(dtype)
    arr[...] = written
    return written.astype(np.dtype(dtype).newbyteorder("<" if endian == "little" else ">"))


def read_errno(path: os.PathLike | str) -> int | None:
    """The errno reading ``path`` fails with, or None if it reads."""
    try:
        Path(path).read_bytes()
    except OSError as exc:
        return exc.errno
    return None


def store_files(root: Path) -> dict[str, Path]:
    """Relative key -> path for every regular file under ``root``."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[p.relative_to(root).as_posix()] = p
    return out


def zip_with_zarr(src: Path, dest: Path) -> Path:
    """Copy every key of the directory store ``src`` into a zarr-python ZipStore at ``dest``."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import ZipStore

    async def copy() -> None:
        store = ZipStore(str(dest), mode="w")
        await store._open()
        proto = default_buffer_prototype()
        for key, path in sorted(store_files(src).items()):
            await store.set(key, proto.buffer.from_bytes(path.read_bytes()))
        store.close()

    asyncio.run(copy())
    return dest


def zip_with_cmd(src: Path, dest: Path, *flags: str) -> Path:
    """`cd src && zip -r [flags] dest .` (deflated members and directory entries)."""
    run([tool("zip"), "-q", "-r", *flags, str(dest), "."], cwd=src, check=True)
    return dest


@pytest.fixture(scope="session")
def zarr_dir(tmp_path_factory) -> Path:
    """The sample directory store (the reference every backend is compared with)."""
    return build_zarr_store(tmp_path_factory.mktemp("stores") / "sample.zarr")


@pytest.fixture(scope="session")
def zarr_zip_zarrpy(zarr_dir, tmp_path_factory) -> Path:
    p = zip_with_zarr(zarr_dir, tmp_path_factory.mktemp("zips") / "sample-zarrpy.zip")
    # ZipStore writes no file-type bits in the mode field; the fixture must keep that property
    with zipfile.ZipFile(p) as zf:
        assert all((zi.external_attr >> 16) & 0o170000 == 0 for zi in zf.infolist())
    return p


@pytest.fixture(scope="session")
def zarr_zip_cmd(zarr_dir, tmp_path_factory) -> Path:
    return zip_with_cmd(zarr_dir, tmp_path_factory.mktemp("zips") / "sample-cmd.zip")


@pytest.fixture(scope="session")
def zarr_zip64(zarr_dir, tmp_path_factory) -> Path:
    return zip_with_cmd(zarr_dir, tmp_path_factory.mktemp("zips") / "sample-zip64.zip", "-fz")


S3_BUCKET = "zarr-sample"
S3_PREFIX = "stores/sample.zarr"


@pytest.fixture(scope="session")
def zarr_s3(moto, zarr_dir) -> str:
    """The sample store uploaded to moto; returns its s3:// URL."""
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket=S3_BUCKET)
    upload_tree(client, zarr_dir, S3_BUCKET, S3_PREFIX)
    return f"s3://{S3_BUCKET}/{S3_PREFIX}"


@dataclass
class AuthMoto:
    """A moto server whose IAM authentication is on (see ``auth_moto``)."""

    server: object
    #: access key id and secret of an IAM user allowed everything: it makes users, keys
    #: and buckets of a test's own once authentication is on
    admin: tuple[str, str]

    @property
    def endpoint(self) -> str:
        return self.server.endpoint  # type: ignore[attr-defined]

    def client(self, service: str, key: tuple[str, str] | None = None):
        """A boto3 client of ``service`` signed with ``key`` (the admin's by default)."""
        import boto3
        from botocore.config import Config

        key = key or self.admin
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=key[0], aws_secret_access_key=key[1],
                            config=Config(s3={"addressing_style": "path"}))


@pytest.fixture(scope="module")
def auth_moto(zarr_dir) -> Iterator[AuthMoto]:
    """A second moto server whose authentication is on. The sample store is uploaded and
    an IAM user allowed everything is made (``.admin``) while it is still off; then moto's
    ``POST /moto-api/reset-auth`` (body ``0``: no more unauthenticated actions, as
    ``INITIAL_NO_AUTH_ACTION_COUNT=0``) turns it on: from then on moto answers a request
    whose access key it does not know (the dummy ones) with 403 InvalidAccessKeyId, as AWS
    does. (Anonymous requests cannot be tested there: moto's auth mode answers an unsigned
    request with a 500; nor a listing whose Prefix holds a '/', which moto's check of the
    signature refuses, whoever signs it.)"""
    import urllib.request

    from botocore.exceptions import ClientError
    from moto_server import MotoServer

    server = MotoServer().start()
    try:
        client = s3_client(server.endpoint)
        client.create_bucket(Bucket=S3_BUCKET)
        upload_tree(client, zarr_dir, S3_BUCKET, S3_PREFIX)
        iam = AuthMoto(server, ("testing", "testing")).client("iam")
        iam.create_user(UserName="admin")
        iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="admin")["AccessKey"]
        req = urllib.request.Request(server.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        # prove that the server now refuses our dummy credentials
        with pytest.raises(ClientError) as ei:
            client.list_objects_v2(Bucket=S3_BUCKET, Prefix=S3_PREFIX)
        assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        yield AuthMoto(server, (key["AccessKeyId"], key["SecretAccessKey"]))
    finally:
        server.stop()


S3_PUBLIC_BUCKET = "zarr-public"


@pytest.fixture(scope="session")
def zarr_s3_public(moto, zarr_dir) -> str:
    """The sample store in a bucket whose objects are public-read, for --no-sign-request."""
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket=S3_PUBLIC_BUCKET)
    for key, path in sorted(store_files(zarr_dir).items()):
        client.put_object(Bucket=S3_PUBLIC_BUCKET, Key=f"{S3_PREFIX}/{key}",
                          Body=path.read_bytes(), ACL="public-read")
    return f"s3://{S3_PUBLIC_BUCKET}/{S3_PREFIX}"


def drop_page_cache(fd: int, tries: int = 50) -> bool:
    """Have the kernel drop the cached pages of the file behind ``fd`` (fsync, then
    POSIX_FADV_DONTNEED), until mincore finds none of them: True once it does. DONTNEED
    leaves a page that something else holds at that moment (on this VM, DAMON's kdamond
    isolates pages now and then), so it is asked again, up to ``tries`` times."""
    size = os.fstat(fd).st_size
    if size == 0:
        return True
    view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    try:
        for _ in range(tries):
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if not _resident_pages(view, 0, size).any():
                return True
            time.sleep(0.02)
        return False
    finally:
        view.close()


def _resident_pages(view: mmap.mmap, offset: int, length: int) -> np.ndarray:
    """mincore(2)'s answer for each page of ``view[offset:offset + length]``: 1 if cached."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    first, last = offset // page, (offset + length - 1) // page
    pages = np.frombuffer(view, dtype=np.uint8)  # its address (a read-only mapping)
    base = pages.ctypes.data + first * page
    del pages
    vec = ctypes.create_string_buffer(last - first + 1)
    if libc.mincore(ctypes.c_void_p(base), (last - first + 1) * page, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return np.frombuffer(vec.raw, dtype=np.uint8) & 1


def page_cache_holds(view: mmap.mmap, offset: int, length: int) -> bool:
    """Whether every page of ``view[offset:offset + length]`` is in the page cache, asked
    with mincore(2), which (unlike a read, even an RWF_NOWAIT one) starts no read-ahead."""
    return bool(_resident_pages(view, offset, length).all())


class DictStore(Store):
    """A tiny in-memory store (hand-made damage, a store held mid-change)."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data

    def get(self, key: str) -> bytes:
        if key not in self.data:
            raise KeyNotFound(key)
        return self.data[key]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.get(key)[start : start + length]

    def info(self, key: str) -> KeyInfo:
        return KeyInfo(len(self.get(key)), 0)

    def list_dir(self, prefix: str) -> Listing:
        out = Listing()
        for k in self.data:
            if k.startswith(prefix):
                head, sep, _ = k[len(prefix) :].partition("/")
                if sep:
                    out.prefixes.add(head)
                else:
                    out.keys[head] = KeyInfo(len(self.data[k]), 0)
        return out

"""How each system mounts the same data: zvfs and its peers.

Every mounter runs in the foreground (-f), so the process we start *is* the
daemon: its PID is what we read VmHWM from and what we end.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import procs
from .corpus import Corpus
from .s3 import CREDS, S3Env, bucket

REPO = Path(__file__).resolve().parents[2]


def with_repo(env: dict[str, str], repo: Path) -> dict[str, str]:
    """``env`` (changed in place) with ``repo``'s zvfs first on PYTHONPATH: the checkout whose
    code a daemon or a timing pass runs, whatever is installed."""
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    return env


@dataclass
class System:
    name: str  # column header
    backend: str  # "s3", "zip" or "dir"
    kind: str  # "zvfs", "rclone", "s3fs", "ratarmount", "fuse-zip", "floor" (floorfs.py)
    mode: str = ""  # rclone vfs-cache-mode
    extra: list[str] = field(default_factory=list)
    writable: bool = False  # mounted read-write (the write rows); read-only otherwise
    repo: Path = REPO  # the checkout whose zvfs runs (files-floor --vs: another one's)

    @property
    def is_zvfs(self) -> bool:
        return self.kind == "zvfs"


@dataclass
class Mounted:
    path: Path
    proc: object

    @property
    def pid(self) -> int:
        return self.proc.pid


class Mounter:
    def __init__(self, work: Path, corpus: Corpus, s3: S3Env | None, zvfs_args: list[str],
                 mount_timeout: float = 120.0) -> None:
        self.work = work
        self.corpus = corpus
        self.s3 = s3
        self.zvfs_args = zvfs_args
        self.mount_timeout = mount_timeout
        self._n = itertools.count()
        self.profile_dir: Path | None = None  # --profile: py-spy flame graphs of zvfs
        self.profile_format = "flamegraph"
        self.tag = ""  # the workload being measured, names the profile
        self.last_mount_seconds = 0.0  # from starting the mounter to the mount point answering
        self.last_mount_start = 0.0  # time.perf_counter() when the mounter was started
        (work / "mnt").mkdir(parents=True, exist_ok=True)
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.s3fs_passwd = work / "s3fs.passwd"
        self.s3fs_passwd.write_text(f"{CREDS['AWS_ACCESS_KEY_ID']}:{CREDS['AWS_SECRET_ACCESS_KEY']}\n")
        os.chmod(self.s3fs_passwd, 0o600)

    def _env(self, system: System) -> dict[str, str]:
        env = self.s3.env() if self.s3 else dict(os.environ)
        if system.kind in ("zvfs", "floor"):
            with_repo(env, system.repo)
        if system.kind == "rclone" and self.s3:
            env.update({
                "RCLONE_CONFIG_BENCH_TYPE": "s3",
                "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
                "RCLONE_CONFIG_BENCH_ENV_AUTH": "false",
                "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": CREDS["AWS_ACCESS_KEY_ID"],
                "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": CREDS["AWS_SECRET_ACCESS_KEY"],
                "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
                "RCLONE_CONFIG_BENCH_ENDPOINT": self.s3.url,
                "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
            })
        return env

    def argv(self, system: System, store: str, mnt: Path, scratch: Path) -> list[str]:
        c = self.corpus
        if system.kind == "zvfs":
            if system.backend == "s3":
                src = [f"s3://{bucket(store)}", "--endpoint-url", self.s3.url]
            elif system.backend == "zip":
                src = [str(c.zip(store))]
            else:
                src = [str(c.store(store))]
            # a write row mounts a fresh, empty bucket: --allow-empty
            rw = ["--writable", "--allow-empty"] if system.writable else []
            return [sys.executable, "-m", "zvfs", "mount", "-f", src[0], str(mnt), *src[1:],
                    *self.zvfs_args, *rw, *system.extra]
        if system.kind == "rclone":
            remote = str(c.store(store)) if system.backend == "dir" else f"bench:{bucket(store)}"
            return ["rclone", "mount", remote, str(mnt),
                    *([] if system.writable else ["--read-only"]),
                    "--vfs-cache-mode", system.mode, "--cache-dir", str(scratch),
                    "--use-server-modtime", *system.extra]
        if system.kind == "s3fs":
            return ["s3fs", bucket(store), str(mnt), "-f", "-o",
                    f"url={self.s3.url},use_path_request_style,passwd_file={self.s3fs_passwd},"
                    f"{'' if system.writable else 'ro,'}endpoint=us-east-1", *system.extra]
        if system.kind == "ratarmount":
            return ["ratarmount", "-f", "--index-folders", str(scratch), str(c.zip(store)),
                    str(mnt), *system.extra]
        if system.kind == "fuse-zip":
            return ["fuse-zip", "-r", "-f", str(c.zip(store)), str(mnt), *system.extra]
        if system.kind == "floor":
            return [sys.executable, str(Path(__file__).with_name("floorfs.py")), str(c.zip(store)),
                    str(mnt), *system.extra]
        raise ValueError(system.kind)

    @contextlib.contextmanager
    def mount(self, system: System, store: str) -> Iterator[Mounted]:
        """A fresh mount of ``store`` by ``system``; unmounted and ended on exit, also on error."""
        n = next(self._n)
        slug = "".join(ch if ch.isalnum() else "-" for ch in system.name)
        mnt = self.work / "mnt" / f"{n:04d}-{slug}-{store}"
        scratch = self.work / "scratch" / f"{n:04d}-{slug}"
        if procs.is_mounted(mnt):
            raise RuntimeError(f"{mnt} is still mounted by an earlier run: unmount it first")
        # exist_ok: an empty mount point left by a run that was killed (SIGKILL) is reused
        mnt.mkdir(parents=True, exist_ok=True)
        scratch.mkdir(parents=True, exist_ok=True)
        log_path = self.work / "logs" / f"{slug}.log"
        with open(log_path, "a") as f:
            f.write(f"\n=== mount {n} {store}\n")
        argv = self.argv(system, store, mnt, scratch)
        proc = spy = None
        try:
            procs.register_mount(mnt)
            t0 = time.perf_counter()
            proc = procs.start(argv, log_path=log_path, env=self._env(system), cwd=str(self.work))
            procs.wait_mounted(mnt, proc, self.mount_timeout)
            os.stat(mnt)  # the mount point answers: the daemon serves the kernel's first request
            self.last_mount_seconds = time.perf_counter() - t0
            self.last_mount_start = t0
            if self.profile_dir is not None and system.is_zvfs:
                self.profile_dir.mkdir(parents=True, exist_ok=True)
                ext = {"flamegraph": "svg", "raw": "txt", "speedscope": "json"}[self.profile_format]
                out = self.profile_dir / f"{n:04d}-{self.tag or store}-{system.backend}.{ext}"
                spy = procs.start(["py-spy", "record", "--pid", str(proc.pid), "--rate", "200",
                                   "--nonblocking", "--format", self.profile_format,
                                   "--output", str(out)],
                                  log_path=self.work / "logs" / "py-spy.log")
            yield Mounted(mnt, proc)
        finally:
            if spy is not None:  # SIGINT makes py-spy write its flame graph
                with contextlib.suppress(ProcessLookupError):
                    spy.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(30)
                procs.stop(spy)
            procs.unmount(mnt)
            if proc is not None:
                procs.stop(proc)
            with contextlib.suppress(OSError):
                mnt.rmdir()
            shutil.rmtree(scratch, ignore_errors=True)


def kill_mount(m: Mounted) -> None:
    """A workload hung: end the daemon so blocked readers get ENOTCONN, then unmount lazily."""
    with contextlib.suppress(Exception):
        m.proc.kill()
    procs.unmount(m.path, timeout=2)


def all_systems(modes: list[str], have: dict[str, bool]) -> list[System]:
    out = [System("zvfs", "s3", "zvfs"), System("zvfs", "zip", "zvfs"),
           System("zvfs", "dir", "zvfs")]
    if have.get("rclone"):
        out += [System(f"rclone ({m})", "s3", "rclone", mode=m) for m in modes]
        # rclone's local backend: the peer of the directory mount's time and big listing
        out.append(System("rclone (local)", "dir", "rclone", mode="off"))
    if have.get("s3fs"):
        out.append(System("s3fs", "s3", "s3fs"))
    if have.get("ratarmount"):
        out.append(System("ratarmount", "zip", "ratarmount"))
    if have.get("fuse-zip"):
        out.append(System("fuse-zip", "zip", "fuse-zip"))
    return out


def write_systems(have: dict[str, bool]) -> list[System]:
    """The S3 write row: zvfs --writable, rclone --vfs-cache-mode writes (as it comes, and
    with --vfs-write-back 0s: by default rclone waits 5 s after close before uploading),
    and s3fs."""
    out = [System("zvfs", "s3", "zvfs", writable=True)]
    if have.get("rclone"):
        out += [System("rclone (writes)", "s3", "rclone", mode="writes", writable=True),
                System("rclone (writes, write-back 0s)", "s3", "rclone", mode="writes",
                       extra=["--vfs-write-back", "0s"], writable=True)]
    if have.get("s3fs"):
        out.append(System("s3fs", "s3", "s3fs", writable=True))
    return out

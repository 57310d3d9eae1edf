"""Model-based test of writes through a real mount, fsx-style: hypothesis runs random
sequences of opens (``O_EXCL`` too), writes, reads, truncates, fsyncs, fstats, closes,
renames (of files, and of directories with open files below them), links, unlinks,
mkdirs and rmdirs through one writable mount per store kind, and checks every byte read,
every open's size and every listing against a model. The truth of what was stored is
read from outside the mount (the directory, or the bucket with boto3) each time a file
is closed or linked and at the end of every example.

The model follows the README's table of write semantics:

* **directory store**: POSIX. A file is an inode shared by every open of it; a write
  through one open is seen at once by the others; unlink and rename leave open files
  working on their inode; a rename replaces its target atomically, and a directory's
  moves the files below it, open ones too. A link makes a file of its own holding the
  source's bytes (the mount shows no hard links).
* **S3 store**: a file open for writing is staged, one staged copy for every open of it
  (an existing object opened without ``O_TRUNC`` is fetched only when an operation first
  keeps some of its bytes: until then a read, write or truncate through an open whose
  file was unlinked or replaced through the mount may be ``ESTALE``), and stored whole
  at each ``close()`` or ``fsync()`` that follows a change; a reader opened before keeps
  the object it opened (the old bytes, or ``ESTALE`` once the cache let them go); a new
  file is listed as soon as it is created. A file renamed while open for writing, by
  its own rename or its directory's, is stored under its new name, and one unlinked or
  replaced while open is not stored at all. A link stores the source's staged bytes
  first. A fresh open of a name being written reads the stored object, so the model
  reads whole only names that no one writes.

Each example gets a directory of its own below the mount (``exN``), removed after.
``ZVFS_WMODEL_SEED=N`` reruns a run exactly; ``ZVFS_WMODEL_SCALE=K`` runs K times as
many examples; ``ZVFS_WMODEL_REPRODUCE="<hypothesis version> <blob>"`` replays the one
example a failure printed (``@reproduce_failure(...)``) on a fresh mount.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, reproduce_failure, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from test_writes import Mounted, Store, new_store

SEED = int(os.environ.get("ZVFS_WMODEL_SEED") or random.SystemRandom().randrange(2**32))
SCALE = float(os.environ.get("ZVFS_WMODEL_SCALE") or 1)
#: examples per store kind: an S3 example takes about twice a directory's (moto shares the
#: two cores), so S3 runs half as many in the suite; the long runs (ZVFS_WMODEL_SCALE)
#: scale both
EXAMPLES = {"dir": max(1, round(400 * SCALE)), "s3": max(1, round(200 * SCALE))}
STEPS = 30

NAMES = ["a", "b", "d/a", "d/b", "e/f/a"]  # few names: opens, renames and unlinks meet often
DIRS = ["d", "e", "e/f"]
KiB = 1024

offsets = st.one_of(st.integers(0, 300), st.integers(0, 200 * KiB), st.sampled_from([4095, 4096, 131071, 131072]))
lengths = st.one_of(st.integers(1, 300), st.integers(1, 70 * KiB))


def payload(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


@dataclass(eq=False)
class Inode:
    data: bytearray = field(default_factory=bytearray)


@dataclass(eq=False)
class Staged:
    """S3: the staged copy of a file open for writing, shared by its opens."""

    data: bytearray
    dirty: bool  # changed since opened or stored (else a close stores nothing)
    #: an existing object opened without O_TRUNC, none of whose bytes are fetched yet
    lazy: bool = False
    #: unlinked or replaced through the mount while lazy: what needs its bytes may be ESTALE
    gone: bool = False


@dataclass(eq=False)
class Handle:
    fd: int
    name: str
    inode: Inode
    readable: bool
    writable: bool
    append: bool
    staged: Staged | None = None  # S3: the file's staged copy
    pinned: bytes | None = None  # S3 reader: the object it opened
    stale_ok: bool = False  # S3 reader whose object was replaced: ESTALE is allowed


def _resize(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


def _write_at(buf: bytearray, offset: int, data: bytes) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset:offset + len(data)] = data


class MountModel(RuleBasedStateMachine):
    """What the model tests share: each example works in a fresh directory ``exN`` of one
    mount (:func:`run_machine` sets ``store`` and ``mnt``)."""

    store: Store
    mnt: Path
    counter = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).counter += 1
        self.ex = f"ex{type(self).counter}"
        self.root = self.mnt / self.ex


def run_machine(model: type[MountModel], store: Store, m: Mounted, env: str, seed_value: int,
                examples: int, steps: int) -> type[MountModel]:
    """Run ``model``'s examples on the mount ``m`` of ``store``, from ``seed_value`` (printed,
    with its variable ``<env>_SEED``), or only the failure ``<env>_REPRODUCE="<hypothesis
    version> <blob>"`` names; the daemon must have logged no traceback. The class run, whose
    counters the caller checks, is returned."""
    print(f"\n{env}_SEED={seed_value} (the seed of this run)", flush=True)
    machine = type("Machine", (model,), {"store": store, "mnt": m.path})
    seed(seed_value)(machine)
    if os.environ.get(f"{env}_REPRODUCE"):
        version, blob = os.environ[f"{env}_REPRODUCE"].split()
        reproduce_failure(version, blob.encode())(machine)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                HealthCheck.data_too_large]))
    assert "Traceback" not in m.log_text(), m.log_text()[-3000:]
    return machine


class WriteModel(MountModel):
    """One example: random file operations in a fresh directory of the mount."""

    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, Inode] = {}
        self.dirs: set[str] = set()
        self.handles: list[Handle] = []
        self.nonce = 0

    @property
    def s3(self) -> bool:
        return self.store.kind == "s3"

    # -- helpers ------------------------------------------------------------------------

    def p(self, name: str) -> Path:
        return self.root / name

    def parent_exists(self, name: str) -> bool:
        parent = name.rpartition("/")[0]
        return parent == "" or parent in self.dirs

    def inside(self, d: str) -> list[str]:
        """The files and directories below directory ``d``."""
        return [n for n in [*self.files, *self.dirs] if n.startswith(d + "/")]

    def writers_of(self, name: str) -> list[Handle]:
        """The opens writing the file ``name`` shows now (not one unlinked or replaced)."""
        inode = self.files.get(name)
        return [h for h in self.handles if h.writable and inode is not None and h.inode is inode]

    def stored(self, name: str) -> bytes | None:
        return self.store.get(f"{self.ex}/{name}")

    def check_stored(self, name: str) -> None:
        """What the store itself holds for ``name`` (read from outside the mount)."""
        got = self.stored(name)
        want = self.files.get(name)
        if want is None:
            assert got is None, f"{name}: removed, but the store still holds {len(got)} bytes"
            return
        assert got is not None, f"{name}: not in the store"
        assert got == bytes(want.data), (
            f"{name}: the store holds {len(got)} bytes, the model {len(want.data)}"
            + (f"; first difference at {next(i for i, (x, y) in enumerate(zip(got, want.data, strict=False)) if x != y)}"
               if got[:len(want.data)] != bytes(want.data[:len(got)]) else ""))

    def expect_errno(self, code: int, fn, *args) -> None:
        try:
            fn(*args)
        except OSError as exc:
            assert exc.errno == code, f"{fn.__name__}{args}: wanted {errno.errorcode[code]}, got {exc!r}"
        else:
            raise AssertionError(f"{fn.__name__}{args}: wanted {errno.errorcode[code]}, it succeeded")

    # -- rules ----------------------------------------------------------------------------

    @initialize(dirs=st.sets(st.sampled_from(DIRS)))
    def start(self, dirs: set[str]) -> None:
        """The example's directory, with some of DIRS made already: files below them, and
        renames of directories that hold them, are then drawn often enough to matter."""
        os.mkdir(self.root)
        for d in sorted(dirs):  # a parent before its children
            if self.parent_exists(d):
                os.mkdir(self.p(d))
                self.dirs.add(d)

    @rule(d=st.sampled_from(DIRS))
    def mkdir(self, d: str) -> None:
        if not self.parent_exists(d):
            self.expect_errno(errno.ENOENT, os.mkdir, self.p(d))
        elif d in self.dirs:
            self.expect_errno(errno.EEXIST, os.mkdir, self.p(d))
        else:
            os.mkdir(self.p(d))
            self.dirs.add(d)

    @rule(d=st.sampled_from(DIRS))
    def rmdir(self, d: str) -> None:
        if d not in self.dirs:
            self.expect_errno(errno.ENOENT, os.rmdir, self.p(d))
            return
        if self.inside(d):
            self.expect_errno(errno.ENOTEMPTY, os.rmdir, self.p(d))
        else:
            os.rmdir(self.p(d))
            self.dirs.discard(d)

    @rule(name=st.sampled_from(NAMES), trunc=st.booleans(), append=st.booleans(),
          excl=st.sampled_from([False, False, False, True]))
    def open_for_writing(self, name: str, trunc: bool, append: bool, excl: bool) -> None:
        if not self.parent_exists(name):
            self.expect_errno(errno.ENOENT, os.open, self.p(name), os.O_CREAT | os.O_RDWR, 0o644)
            return
        flags = (os.O_CREAT | os.O_RDWR | (os.O_TRUNC if trunc else 0) | (os.O_APPEND if append else 0)
                 | (os.O_EXCL if excl else 0))
        if excl and name in self.files:
            self.expect_errno(errno.EEXIST, os.open, self.p(name), flags, 0o644)
            return
        if len(self.handles) >= 6:
            return
        fd = os.open(self.p(name), flags, 0o644)
        inode = self.files.get(name)
        new = inode is None
        if new:
            inode = self.files[name] = Inode()
        h = Handle(fd, name, inode, readable=True, writable=True, append=append)
        if self.s3:
            others = self.writers_of(name)
            if others:
                h.staged = others[-1].staged
                if trunc:
                    del h.staged.data[:]
                    h.staged.dirty = True
                    h.staged.lazy = False
            else:  # a new or emptied file is stored even unwritten
                h.staged = Staged(bytearray() if trunc else bytearray(inode.data), dirty=trunc or new,
                                  lazy=not (trunc or new) and bool(inode.data))
        elif trunc:
            del inode.data[:]
        self.handles.append(h)

    @rule(name=st.sampled_from(NAMES))
    def open_for_reading(self, name: str) -> None:
        if name not in self.files:
            self.expect_errno(errno.ENOENT, os.open, self.p(name), os.O_RDONLY)
            return
        if self.s3 and (self.writers_of(name) or len(self.handles) >= 6):
            return  # what a reader sees of a file being written is the stored object or nothing yet
        fd = os.open(self.p(name), os.O_RDONLY)
        inode = self.files[name]
        self.handles.append(Handle(fd, name, inode, readable=True, writable=False, append=False,
                                   pinned=bytes(inode.data) if self.s3 else None))

    @staticmethod
    def may_be_stale(h: Handle, exc: OSError) -> bool:
        """ESTALE from an open whose object went (unlinked or replaced through the mount)
        before its bytes were fetched: nothing of it is staged to go on with."""
        return exc.errno == errno.ESTALE and h.staged is not None and h.staged.lazy and h.staged.gone

    def content(self, h: Handle) -> bytes | bytearray:
        if h.staged is not None:
            return h.staged.data
        if h.pinned is not None:
            return h.pinned
        return h.inode.data

    @precondition(lambda self: any(h.writable for h in self.handles))
    @rule(i=st.integers(0, 10**6), offset=offsets, length=lengths, seed=st.integers(0, 2**31))
    def write(self, i: int, offset: int, length: int, seed: int) -> None:
        writers = [h for h in self.handles if h.writable]
        h = writers[i % len(writers)]
        data = payload(seed, length)
        try:
            assert (os.write(h.fd, data) if h.append else os.pwrite(h.fd, data, offset)) == length
        except OSError as exc:
            if self.may_be_stale(h, exc):
                return
            raise
        if h.staged is not None:
            h.staged.dirty = True
            h.staged.lazy = False
        buf = h.staged.data if h.staged is not None else h.inode.data
        _write_at(buf, len(buf) if h.append else offset, data)

    @precondition(lambda self: bool(self.handles))
    @rule(i=st.integers(0, 10**6), offset=offsets, length=st.integers(1, 300 * KiB))
    def read(self, i: int, offset: int, length: int) -> None:
        h = self.handles[i % len(self.handles)]
        want = bytes(self.content(h)[offset:offset + length])
        try:
            got = os.pread(h.fd, length, offset)
        except OSError as exc:
            if exc.errno == errno.ESTALE and h.stale_ok or self.may_be_stale(h, exc):
                return
            raise
        assert got == want, (f"read of {h.name} ({'writer' if h.writable else 'reader'}) at {offset}+{length}: "
                             f"got {len(got)} bytes, wanted {len(want)}")

    @precondition(lambda self: any(h.writable for h in self.handles))
    @rule(i=st.integers(0, 10**6), size=st.one_of(st.integers(0, 300), st.integers(0, 300 * KiB)))
    def ftruncate(self, i: int, size: int) -> None:
        writers = [h for h in self.handles if h.writable]
        h = writers[i % len(writers)]
        try:
            os.ftruncate(h.fd, size)
        except OSError as exc:
            if self.may_be_stale(h, exc):
                return
            raise
        if h.staged is not None:
            h.staged.dirty = True
            h.staged.lazy = h.staged.lazy and size == len(h.staged.data)  # nothing changed
        _resize(h.staged.data if h.staged is not None else h.inode.data, size)

    @rule(name=st.sampled_from(NAMES), size=st.integers(0, 100 * KiB))
    def truncate_by_path(self, name: str, size: int) -> None:
        if name not in self.files:
            self.expect_errno(errno.ENOENT, os.truncate, self.p(name), size)
            return
        writers = self.writers_of(name) if self.s3 else []
        os.truncate(self.p(name), size)
        if writers:  # S3: the staged copy the opens share is cut, and stored at once
            staged = writers[-1].staged
            staged.lazy = staged.lazy and size == len(staged.data)
            _resize(staged.data, size)
            staged.dirty = True
            self.commit(writers[-1])
            return
        self.replaced(name)
        _resize(self.files[name].data, size)

    def replaced(self, name: str) -> None:
        """S3: the object under ``name`` is about to change; its readers keep the old one,
        its writers follow the name."""
        if not self.s3:
            return
        old = self.files.get(name)
        if old is None:
            return
        new = self.files[name] = Inode(bytearray(old.data))
        for h in self.handles:
            if h.inode is old:
                if h.pinned is not None:
                    h.stale_ok = True
                else:
                    h.inode = new

    def went(self, name: str) -> None:
        """S3: the object under ``name`` is unlinked or replaced through the mount: its
        writers that have fetched none of it cannot any more."""
        for h in self.writers_of(name):
            if h.staged is not None and h.staged.lazy:
                h.staged.gone = True

    def commit(self, h: Handle) -> None:
        """S3: a writer's staged copy becomes the stored object, unless its name went away."""
        if h.staged is None or not h.staged.dirty or self.files.get(h.name) is not h.inode:
            return
        h.staged.dirty = False
        self.replaced(h.name)
        self.files[h.name].data[:] = h.staged.data
        h.inode = self.files[h.name]

    @precondition(lambda self: any(h.writable for h in self.handles))
    @rule(i=st.integers(0, 10**6))
    def fsync(self, i: int) -> None:
        writers = [h for h in self.handles if h.writable]
        h = writers[i % len(writers)]
        os.fsync(h.fd)
        self.commit(h)
        if self.files.get(h.name) is h.inode:
            self.check_stored(h.name)

    @precondition(lambda self: bool(self.handles))
    @rule(i=st.integers(0, 10**6))
    def close(self, i: int) -> None:
        h = self.handles.pop(i % len(self.handles))
        os.close(h.fd)
        if h.writable:
            self.commit(h)
            if self.files.get(h.name) is h.inode and not any(o.inode is h.inode and o.writable
                                                                for o in self.handles):
                self.check_stored(h.name)

    @rule(name=st.sampled_from(NAMES))
    def unlink(self, name: str) -> None:
        if name not in self.files:
            self.expect_errno(errno.ENOENT, os.unlink, self.p(name))
            return
        os.unlink(self.p(name))
        self.went(name)
        self.replaced(name)
        del self.files[name]

    @rule(src=st.sampled_from(NAMES), dst=st.sampled_from(NAMES))
    def rename(self, src: str, dst: str) -> None:
        if src not in self.files:
            self.expect_errno(errno.ENOENT, os.rename, self.p(src), self.p(dst))
            return
        if not self.parent_exists(dst):
            self.expect_errno(errno.ENOENT, os.rename, self.p(src), self.p(dst))
            return
        os.rename(self.p(src), self.p(dst))
        if src == dst:
            return
        if self.s3:
            self.went(dst)
            self.replaced(dst)
            self.replaced(src)
        moved = self.files[dst] = self.files.pop(src)
        for h in self.handles:
            if h.inode is moved:
                h.name = dst

    @rule(src=st.sampled_from(DIRS), dst=st.sampled_from(DIRS))
    def rename_dir(self, src: str, dst: str) -> None:
        """A directory renamed with what it holds, open files too (mv of a directory)."""
        if src not in self.dirs or not self.parent_exists(dst):
            self.expect_errno(errno.ENOENT, os.rename, self.p(src), self.p(dst))
            return
        if src == dst:
            os.rename(self.p(src), self.p(dst))
            return
        if dst.startswith(src + "/"):
            self.expect_errno(errno.EINVAL, os.rename, self.p(src), self.p(dst))
            return
        if dst in self.dirs and self.inside(dst):  # e/f onto e too: e holds f
            self.expect_errno(errno.ENOTEMPTY, os.rename, self.p(src), self.p(dst))
            return
        os.rename(self.p(src), self.p(dst))
        self.dirs.discard(dst)

        def moved(n: str) -> str:
            return dst + n[len(src):] if n.startswith(src + "/") else n

        for name in [n for n in self.files if n.startswith(src + "/")]:
            self.replaced(name)  # S3: copied key by key; readers keep (or lose) the old objects
        self.files = {moved(n): inode for n, inode in self.files.items()}
        self.dirs = {moved(d) for d in self.dirs if d != src} | {dst}
        for h in self.handles:
            h.name = moved(h.name)

    @rule(src=st.sampled_from(NAMES), dst=st.sampled_from(NAMES))
    def link(self, src: str, dst: str) -> None:
        """ln: the target gets the source's bytes, as a file of its own."""
        if src not in self.files or not self.parent_exists(dst):
            self.expect_errno(errno.ENOENT, os.link, self.p(src), self.p(dst))
            return
        if dst in self.files:
            self.expect_errno(errno.EEXIST, os.link, self.p(src), self.p(dst))
            return
        os.link(self.p(src), self.p(dst))
        writers = self.writers_of(src) if self.s3 else []
        if writers:  # S3: the source's staged bytes are stored first, as fsync() stores them
            self.commit(writers[-1])
        self.files[dst] = Inode(bytearray(self.files[src].data))
        self.check_stored(dst)
        if writers:
            self.check_stored(src)

    @precondition(lambda self: bool(self.handles))
    @rule(i=st.integers(0, 10**6))
    def fstat(self, i: int) -> None:
        """An open's size: what its reads reach (a directory store's inode; an S3 writer's
        staged copy)."""
        h = self.handles[i % len(self.handles)]
        if self.s3 and (h.staged is None or h.staged.gone):
            return  # a reader: the object it opened, or what a writer stages since
        size = os.fstat(h.fd).st_size
        assert size == len(self.content(h)), (f"fstat of {h.name} ({'writer' if h.writable else 'reader'}): "
                                              f"{size} bytes, the model {len(self.content(h))}")

    @rule(name=st.sampled_from(NAMES))
    def read_whole(self, name: str) -> None:
        """A fresh open, read to the end, closed: what a tool like cp sees."""
        if name not in self.files:
            self.expect_errno(errno.ENOENT, self.p(name).read_bytes)
            return
        if self.s3 and self.writers_of(name):
            return
        got = self.p(name).read_bytes()
        want = bytes(self.files[name].data)
        assert got == want, f"{name}: read {len(got)} bytes, the model holds {len(want)}"
        assert os.stat(self.p(name)).st_size == len(want), name

    @invariant()
    def listings(self) -> None:
        """Every directory lists what the model holds, no more, no less."""
        type(self).steps += 1
        if not self.root.exists():
            return
        for d in ["", *sorted(self.dirs)]:
            want = sorted({n[len(d) + 1 if d else 0:].split("/")[0]
                           for n in [*self.files, *self.dirs]
                           if (n.startswith(d + "/") if d else True) and n != d})
            got = sorted(os.listdir(self.p(d) if d else self.root))
            assert got == want, f"listing of {d or '.'}: {got}, the model {want}"

    def teardown(self) -> None:
        """Close what is open, then the mount and the store must both hold the model."""
        try:
            for h in list(self.handles):
                os.close(h.fd)
                if h.writable:
                    self.commit(h)
            self.handles.clear()
            if self.root.exists():
                for name, inode in self.files.items():
                    assert self.p(name).read_bytes() == bytes(inode.data), f"{name}: the mount differs"
                    self.check_stored(name)
        finally:
            for h in self.handles:
                os.close(h.fd)
            shutil.rmtree(self.root, ignore_errors=True)


def run_model(store: Store, mount, kind: str, *args: str) -> None:
    machine = run_machine(WriteModel, store, store.mount(mount, *args), "ZVFS_WMODEL", SEED,
                          EXAMPLES[kind], STEPS)
    print(f"{machine.counter} examples, {machine.steps} steps", flush=True)
    assert machine.steps >= EXAMPLES[kind] * 5, "the examples ran too few steps to test anything"


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_random_file_operations_match_the_model(kind: str, request, tmp_path, mount) -> None:
    store = new_store(kind, request, tmp_path)
    # S3 through the disk cache too, whose writers wrap the store's
    run_model(store, mount, kind, *(["--cache-dir", str(tmp_path / "cache")] if kind == "s3" else []))

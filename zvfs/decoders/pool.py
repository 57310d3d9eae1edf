"""The daemon's side of the decoder processes (see :mod:`zvfs.decoders`)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

import zvfs
from zvfs.decoders.wire import Unpacker, WireError, pack
from zvfs.stats import Counters
from zvfs.stores.base import Reopen, Store, StoreError
from zvfs.workers import Workers, run_abandonable

if TYPE_CHECKING:  # numpy (and what needs it) loads with the decoded views, after the mount answers
    import numpy as np

    from zvfs.decoders.arena import Arena

log = logging.getLogger("zvfs")

#: chunks smaller than this are decoded in threads, a batch a hop: a message each would cost more
MIN_CHUNK_BYTES = 64 << 10
#: processes that may die and be replaced in one mount before the threads take over for good
MAX_RESTARTS = 8
#: what killed a process because of what it was decoding (not the OOM killer, not a person)
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
#: seconds close() waits for a process to end on its own before it is killed
EXIT_WAIT = 2.0


class NotServed(Exception):
    """The processes cannot serve this chunk (none ready, no room, other metadata, one died
    before it answered): the caller decodes it in a worker thread."""


def default_processes() -> int:
    """One per CPU, and one more: while one waits for the disk, the CPUs still decode."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(cpus, 16) + 1


@dataclass
class _Request:
    slot: np.ndarray  # held until the process answers: the slot is not lent again before
    what: str
    done: trio.Event = field(default_factory=trio.Event)
    answer: tuple[str, str] = ("retry", "")


@dataclass
class _Process:
    proc: subprocess.Popen[bytes]
    to_fd: int
    from_fd: int
    #: requests in the order sent: the process answers them in that order
    pending: OrderedDict[int, _Request] = field(default_factory=OrderedDict)
    ready: bool = False
    write_lock: trio.Lock = field(default_factory=trio.Lock)


class DecoderPool:
    """Up to ``processes`` decoder processes for one mount, started by :meth:`start` (on
    the first use of the decoded views, not at mount) and ended by :meth:`close`."""

    def __init__(self, store: Store, processes: int, arena_bytes: int, counters: Counters,
                 workers: Workers) -> None:
        self.store = store
        self.processes = processes
        self.arena_bytes = arena_bytes
        self.counters = counters
        self.workers = workers
        self._arena: Arena | None = None
        self._spec: Reopen | None = None
        self._procs: list[_Process] = []
        self._rids = itertools.count()
        #: (array path, metadata digest) the processes read other metadata for
        self._stale: set[tuple[str, str]] = set()
        self._started = False
        self._closing = False
        #: why the processes are not used (None while they are, or may be)
        self.disabled: str | None = None
        self.restarts = 0

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the processes in the background (on the trio thread; once)."""
        if self._started or self.processes <= 0:
            return
        self._started = True
        trio.lowlevel.spawn_system_task(self._start)

    async def _start(self) -> None:
        try:
            spec = await self.workers.run(self.store.reopen)  # a zip may still be opening
        except StoreError as exc:
            self.disabled = f"the store could not be opened: {exc}"
            return
        if spec is None:
            self.disabled = "the store is not local"
            return
        self._spec = spec
        from zvfs.decoders.arena import Arena

        try:
            self._arena = Arena(self.arena_bytes)
        except OSError as exc:
            self._disable(f"no shared memory for them ({exc})")
            return
        for _ in range(self.processes):
            await self._spawn()

    async def _spawn(self) -> None:
        """One more process (its start, a fork and exec, in a worker thread)."""
        arena, spec = self._arena, self._spec
        if arena is None or spec is None or self._closing or self.disabled:
            return
        argv = [sys.executable, "-m", "zvfs.decoders.child", str(arena.fd), str(arena.nbytes),
                spec.kind, spec.path, *(str(v) for v in spec.fingerprint)]
        # the package as this daemon imported it, wherever the daemon's working directory is
        home = os.path.dirname(os.path.dirname(os.path.abspath(zvfs.__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (home, os.environ.get("PYTHONPATH")) if p))

        def popen() -> subprocess.Popen[bytes]:
            # a session of its own: a Ctrl-C at the daemon's terminal is the daemon's to handle
            return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                    pass_fds=(arena.fd,), start_new_session=True)

        try:
            proc = await self.workers.run(popen)
        except OSError as exc:
            self._disable(f"none could be started ({exc})")
            return
        assert proc.stdin is not None and proc.stdout is not None
        p = _Process(proc, proc.stdin.fileno(), proc.stdout.fileno())
        os.set_blocking(p.to_fd, False)
        os.set_blocking(p.from_fd, False)
        self._procs.append(p)
        trio.lowlevel.spawn_system_task(self._serve, p)

    def _disable(self, why: str) -> None:
        if self.disabled is None:
            self.disabled = why
            log.warning("decoder processes off (%s): chunks are decoded in the daemon's threads", why)

    def close(self) -> None:
        """End the processes (their input closed, then killed by PID if they linger) and
        free the arena. After the trio run: nothing waits on them any more."""
        self._closing = True
        procs, self._procs = self._procs, []
        for p in procs:
            _close(p.proc.stdin)
        for p in procs:
            try:
                p.proc.wait(timeout=EXIT_WAIT)
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
            _close(p.proc.stdout)
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # -- answers ------------------------------------------------------------------------------

    async def _serve(self, p: _Process) -> None:
        """Hand each answer of process ``p`` to its request, until its output ends."""
        unpacker = Unpacker()
        try:
            while True:
                await trio.lowlevel.wait_readable(p.from_fd)
                try:
                    data = os.read(p.from_fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    break
                for message in unpacker.feed(data):
                    self._answer(p, message)
        except trio.Cancelled:
            raise
        except (OSError, WireError, ValueError) as exc:  # a broken pipe: the process is ended
            log.warning("decoder process %d: %s", p.proc.pid, exc)
            p.proc.kill()
        await self._ended(p)

    def _answer(self, p: _Process, message: tuple[object, ...]) -> None:
        head = message[0]
        if head == "ready":
            p.ready = True
            self.counters.add("decoder_processes")
            return
        if head == "failed":
            self._disable(f"they cannot open the store: {message[1]}")
            return
        rid, status, text, adds, observed = message
        for name, amount in adds.items():  # type: ignore[attr-defined]
            self.counters.add(name, amount)
        for name, seconds in observed:  # type: ignore[attr-defined]
            self.counters.observe(name, seconds)
        req = p.pending.pop(rid)  # type: ignore[arg-type]
        req.answer = (str(status), str(text))
        req.done.set()

    async def _ended(self, p: _Process) -> None:
        """Process ``p`` is gone: its requests go to the threads (but the one it was
        decoding, when a crash signal ended it), and another process takes its place."""
        if p in self._procs:
            self._procs.remove(p)
        if p.ready:
            self.counters.add("decoder_processes", -1)
        code = await run_abandonable(p.proc.wait)
        _close(p.proc.stdin)
        _close(p.proc.stdout)
        pending = list(p.pending.values())
        p.pending.clear()
        crashed = code < 0 and -code in CRASH_SIGNALS
        how = f"was ended by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        for i, req in enumerate(pending):
            if crashed and i == 0:  # it was decoding this one: never again in the daemon
                req.answer = ("data", f"the decoder process {how} decoding it")
            req.done.set()
        if self._closing or self.disabled:
            return
        self.restarts += 1
        self.counters.add("decoder_restarts")
        doing = f" while decoding {pending[0].what}" if pending else ""
        if self.restarts > MAX_RESTARTS:
            self._disable(f"{self.restarts} processes ended early; the last {how}{doing}")
            return
        log.warning("decoder process %d %s%s; starting another", p.proc.pid, how, doing)
        await self._spawn()

    # -- requests --------------------------------------------------------------------------------

    async def decode(self, path: str, digest: str, epoch: int, idx: tuple[int, ...],
                     nbytes: int) -> np.ndarray | None:
        """Chunk ``idx`` of the array at ``path`` (metadata ``digest``, write ``epoch``),
        decoded by a process into a slot of ``nbytes``: the slot (uint8), or None when the
        chunk was never written. Raises FormatError naming the key for bad bytes (caused
        by a StoreError when the failure may pass), NotServed when the caller must decode
        it itself."""
        ready = [p for p in self._procs if p.ready]
        arena = self._arena
        if not ready or arena is None or nbytes < MIN_CHUNK_BYTES or (path, digest) in self._stale:
            raise NotServed
        got = arena.take(nbytes)
        if got is None:
            raise NotServed
        offset, slot = got
        p = min(ready, key=lambda q: len(q.pending))
        rid = next(self._rids)
        message = pack((rid, path, digest, epoch, idx, offset, nbytes))
        async with p.write_lock:
            while True:
                try:
                    os.write(p.to_fd, message)  # under PIPE_BUF: all of it, or none
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(p.to_fd)
                except OSError:  # it has ended: its reader task finds out
                    raise NotServed from None
        # registered in the same step as the write: the answer cannot come before it
        req = p.pending[rid] = _Request(slot, f"{path or '/'} chunk {idx}")
        await req.done.wait()
        status, text = req.answer
        from zvfs.formats.meta import FormatError

        if status == "ok":
            self.counters.add("decoder_chunks")
            return slot
        if status == "fill":
            return None
        if status == "stale":
            self._stale.add((path, digest))
        if status in ("stale", "retry"):
            raise NotServed
        if status == "store":
            raise FormatError(text) from StoreError(text)
        raise FormatError(text)


def _close(f: object) -> None:
    try:
        f.close()  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        pass

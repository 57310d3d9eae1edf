"""The daemon's side of the decoder processes (see :mod:`zvfs.decoders`)."""

from __future__ import annotations

import itertools
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

import zvfs
from zvfs.cpus import usable_cpus
from zvfs.decoders.wire import MAX_MESSAGE, Unpacker, WireError, decode, encode, pack
from zvfs.stats import Counters
from zvfs.stores.base import Reopen, Store, StoreError
from zvfs.workers import Workers

if TYPE_CHECKING:  # numpy (and what needs it) loads with the decoded views, after the mount answers
    import numpy as np

    from zvfs.decoders.arena import Arena

log = logging.getLogger("zvfs")

#: chunks smaller than this are decoded in threads, a batch a hop: a message each would cost more
MIN_CHUNK_BYTES = 64 << 10
#: processes that may die and be replaced in one mount before the threads take over for good
MAX_RESTARTS = 8
#: seconds a process with requests may go without answering one before it is killed (its
#: requests go to the threads): a process stopped or stuck would otherwise hold its reads
#: for ever. A chunk is at most a quarter of the cache; decoding one takes well under 1 s.
ANSWER_TIMEOUT = 60.0
#: what killed a process because of what it was decoding (not the OOM killer, not a person)
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
#: seconds to wait for the zygote's word on how a process ended, and for it to end at close
EXIT_WAIT = 3.0


class NotServed(Exception):
    """The processes cannot serve this chunk (none ready, no room, other metadata, one died
    before it answered): the caller decodes it in a worker thread."""


def default_processes() -> int:
    """One per CPU this process may use (its affinity and its cgroup's quota), and one more:
    while one waits for the disk, the CPUs still decode."""
    return min(max(1, int(usable_cpus())), 16) + 1


@dataclass
class _Request:
    slot: np.ndarray  # held until the process answers: the slot is not lent again before
    what: str
    done: trio.Event = field(default_factory=trio.Event)
    answer: tuple[str, str] = ("retry", "")


@dataclass
class _Process:
    to_fd: int
    from_fd: int
    #: known from its first message ("ready")
    pid: int | None = None
    #: requests in the order sent: the process answers them in that order
    pending: OrderedDict[int, _Request] = field(default_factory=OrderedDict)
    write_lock: trio.Lock = field(default_factory=trio.Lock)
    #: set before its pipes are closed: from then on their numbers may be another process's
    ended: bool = False
    #: trio time of its last answer, or of its first request since it had none
    progress: float = 0.0
    #: the wait for its next answer, whose deadline a first request sets
    waiting: trio.CancelScope | None = None
    #: killed for not answering: its end is awaited without a deadline
    killed: bool = False

    def deadline(self, timeout: float) -> float:
        return self.progress + timeout if self.pending and not self.killed else math.inf

    @property
    def ready(self) -> bool:
        return self.pid is not None


class DecoderPool:
    """Up to ``processes`` decoder processes for one mount.

    :meth:`launch` starts the zygote as the daemon mounts (its imports overlap the mount);
    :meth:`start`, on the first use of the decoded views, has it fork the processes;
    :meth:`close` ends them all."""

    def __init__(self, store: Store, processes: int, arena_bytes: int, counters: Counters,
                 workers: Workers, answer_timeout: float = ANSWER_TIMEOUT) -> None:
        self.store = store
        self.processes = processes
        self.arena_bytes = arena_bytes
        self.counters = counters
        self.workers = workers
        self.answer_timeout = answer_timeout
        self._memfd: int | None = None
        self._zygote: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._arena: Arena | None = None
        self._spec: Reopen | None = None
        self._procs: list[_Process] = []
        self._rids = itertools.count()
        #: pid -> how it ended (Popen's returncode), as the zygote tells; and who waits for it
        self._exits: dict[int, int] = {}
        self._exit_seen = trio.lowlevel.ParkingLot()
        #: (array path, metadata digest) the processes read other metadata for
        self._stale: set[tuple[str, str]] = set()
        self._started = False
        self._closing = False
        #: why the processes are not used (None while they are, or may be)
        self.disabled: str | None = None
        self.restarts = 0

    # -- life -------------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the zygote (blocking, a few ms: before the trio loop, as the mount starts).
        The daemon makes a pool only for a local store and one process or more."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._memfd = os.memfd_create("zvfs-decoded", os.MFD_CLOEXEC)
            os.ftruncate(self._memfd, self.arena_bytes)
            argv = [sys.executable, "-m", "zvfs.decoders.zygote", str(theirs.fileno()),
                    str(self._memfd), str(self.arena_bytes)]
            # the package as this daemon imported it, wherever its working directory is
            home = os.path.dirname(os.path.dirname(os.path.abspath(zvfs.__file__)))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (home, os.environ.get("PYTHONPATH")) if p))
            # a session of its own: a Ctrl-C at the daemon's terminal is the daemon's to handle
            self._zygote = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                            pass_fds=(theirs.fileno(), self._memfd),
                                            start_new_session=True)
        except OSError as exc:
            ours.close()
            self._disable(f"they could not be started: {exc}")
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._ctl = ours

    def listen(self) -> None:
        """Hear the zygote from now on (on the trio thread, as the daemon starts serving)."""
        if self._ctl is not None:
            self._background(self._hear_zygote)

    def start(self) -> None:
        """Fork the processes, in the background (on the trio thread; once)."""
        if self._started or self._ctl is None or self.disabled:
            return
        self._started = True
        self._background(self._start)

    def _background(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run ``fn(*args)`` as a system task that cannot end the daemon: an error of the
        pool's own (a bug, a message it cannot read, no memory for the arena) is logged
        and turns the processes off; the chunks go to the threads."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:  # noqa: BLE001 - logged; a system task must not raise
                log.exception("decoder processes: %s", exc)
                self._disable(f"{type(exc).__name__}: {exc}")
                for p in list(self._procs):  # what waits on them goes to the threads
                    # ended for the daemon: nothing more is written to it, though the task
                    # that failed may have been its reader, so that no _ended() follows
                    p.ended = True
                    for req in p.pending.values():
                        req.done.set()
                    p.pending.clear()
                    if p.pid is not None:
                        _kill(p.pid)

        trio.lowlevel.spawn_system_task(guarded)

    async def _start(self) -> None:
        try:
            spec = await self.workers.run(self.store.reopen)  # a zip may still be opening
        except StoreError as exc:
            self._disable(f"the store could not be opened: {exc}")
            return
        if spec is None or self._memfd is None:
            self._disable("the store cannot be opened by another process")
            return
        from zvfs.decoders.arena import Arena

        self._spec = spec
        self._arena = Arena(self.arena_bytes, self._memfd)
        for _ in range(self.processes):
            await self._spawn()

    async def _spawn(self) -> None:
        """Ask the zygote for one more process, with the two pipes to talk to it."""
        ctl, spec = self._ctl, self._spec
        if ctl is None or spec is None or self._closing or self.disabled:
            return
        to_child, to_us = os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)
        try:
            while True:
                try:
                    socket.send_fds(ctl, [encode(("spawn", tuple(spec)))], [to_child[0], to_us[1]])
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(ctl)
        except OSError as exc:
            for fd in (*to_child, *to_us):
                os.close(fd)
            self._disable(f"their parent is gone ({exc})")
            return
        os.close(to_child[0])
        os.close(to_us[1])
        p = _Process(to_child[1], to_us[0])
        os.set_blocking(p.to_fd, False)
        os.set_blocking(p.from_fd, False)
        self._procs.append(p)
        self._background(self._serve, p)

    def read_ahead(self, chunk_nbytes: int) -> int | None:
        """The read-ahead window for a file whose chunks of ``chunk_nbytes`` the processes
        decode: a chunk for each and one more, at least 4 MiB; None when they will not
        decode them (not started, off, chunks too small or too big).

        The processes take requests in order, each its own queue, so every chunk asked
        ahead of need waits behind the others, and holds a slot: a mount's first cold
        `cat data.raw` of the bench's array took 0.24-0.28 s with the usual 64 MiB window,
        0.20-0.22 s with 4 to 8 MiB. The threads keep the wide window (S3's latency needs it)."""
        if not self._started or self.disabled or not MIN_CHUNK_BYTES <= chunk_nbytes <= self.arena_bytes // 4:
            return None
        return max(4 << 20, chunk_nbytes * (self.processes + 1))

    def _disable(self, why: str) -> None:
        if self.disabled is None:
            self.disabled = why
            log.warning("decoder processes off (%s): chunks are decoded in the daemon's threads", why)

    def close(self) -> None:
        """End the processes (their input closed: each ends, then the zygote) and free the
        arena; the zygote is killed by its PID if it lingers. After the trio run."""
        self._closing = True
        procs, self._procs = self._procs, []
        for p in procs:
            _close_fd(p.to_fd)
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._zygote is not None:
            try:
                self._zygote.wait(timeout=EXIT_WAIT)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()
            self._zygote = None
        for p in procs:
            _close_fd(p.from_fd)
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        elif self._memfd is not None:
            os.close(self._memfd)
        self._memfd = None

    # -- what the processes say ------------------------------------------------------------------

    async def _hear_zygote(self) -> None:
        """Take the zygote's word of each process that ended; its end ends the processes."""
        ctl = self._ctl
        while ctl is not None and not self._closing:
            await trio.lowlevel.wait_readable(ctl)
            try:
                data = ctl.recv(MAX_MESSAGE)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                if not self._closing:
                    self._disable("their parent process ended")
                    self.counters.add("decoder_zygote", -1)
                return
            message = decode(data)
            if message[0] == "ready":  # its imports are done: a fork is ready at once
                self.counters.add("decoder_zygote")
                continue
            _, pid, code = message
            self._exits[pid] = code
            self._exit_seen.unpark_all()

    async def _serve(self, p: _Process) -> None:
        """Hand each answer of process ``p`` to its request, until its output ends."""
        unpacker = Unpacker()
        try:
            while True:
                with trio.CancelScope(deadline=p.deadline(self.answer_timeout)) as p.waiting:
                    await trio.lowlevel.wait_readable(p.from_fd)
                if p.waiting.cancelled_caught:
                    self._unanswered(p)
                    continue
                try:
                    data = os.read(p.from_fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    break
                for message in unpacker.feed(data):
                    self._answer(p, message)
        except (OSError, WireError, ValueError) as exc:  # a broken pipe: the process is ended
            log.warning("decoder process %s: %s", p.pid, exc)
            if p.pid is not None:
                _kill(p.pid)
        await self._ended(p)

    def _unanswered(self, p: _Process) -> None:
        """``p`` has not answered for answer_timeout seconds: kill it. Its end (the pipe's
        EOF) gives its requests to the threads and starts another process."""
        if not p.pending:  # given to the threads meanwhile (the processes were turned off)
            return
        p.killed = True
        head = next(iter(p.pending.values())).what
        log.warning("decoder process %s gave no answer in %.0f s (decoding %s): killing it",
                    p.pid, self.answer_timeout, head)
        if p.pid is not None:
            _kill(p.pid)

    def _answer(self, p: _Process, message: tuple[object, ...]) -> None:
        head = message[0]
        if head == "ready":
            p.pid = int(message[1])  # type: ignore[call-overload]
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
        req = p.pending.pop(rid, None)  # type: ignore[call-overload]
        if req is None:
            if p.ended:  # its requests went to the threads when the processes were turned off
                return
            # a bug of ours: the guard turns the processes off
            raise RuntimeError(f"process {p.pid} answered request {rid}, which it was not sent")
        p.progress = trio.current_time()
        req.answer = (str(status), str(text))
        req.done.set()

    async def _ended(self, p: _Process) -> None:
        """Process ``p`` is gone: its requests go to the threads (but the one it was
        decoding, when a crash signal ended it), and another process takes its place."""
        p.ended = True
        if p in self._procs:
            self._procs.remove(p)
        _close_fd(p.to_fd)
        _close_fd(p.from_fd)
        code = None
        if p.pid is not None:
            self.counters.add("decoder_processes", -1)
            code = await self._exit_code(p.pid)
        pending = list(p.pending.values())
        p.pending.clear()
        crashed = code is not None and code < 0 and -code in CRASH_SIGNALS
        how = _how_ended(code)
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
        log.warning("decoder process %s %s%s; starting another", p.pid, how, doing)
        await self._spawn()

    async def _exit_code(self, pid: int) -> int | None:
        """How process ``pid`` ended, once the zygote says; None if it does not in time."""
        with trio.move_on_after(EXIT_WAIT):
            while pid not in self._exits:
                await self._exit_seen.park()
        return self._exits.pop(pid, None)

    # -- requests --------------------------------------------------------------------------------

    async def decode(self, path: str, digest: str, epoch: int, idx: tuple[int, ...],
                     nbytes: int) -> np.ndarray | None:
        """Chunk ``idx`` of the array at ``path`` (metadata ``digest``, write ``epoch``),
        decoded by a process into a slot of ``nbytes``: the slot (uint8), or None when the
        chunk was never written. Raises FormatError naming the key for bad bytes (caused
        by a StoreError when the failure may pass), NotServed when the caller must decode
        it itself."""
        ready = [p for p in self._procs if p.ready and not p.killed]
        arena = self._arena
        if (not ready or arena is None or self.disabled or nbytes < MIN_CHUNK_BYTES
                or (path, digest) in self._stale):
            raise NotServed
        got = arena.take(nbytes)
        if got is None:
            raise NotServed
        offset, slot = got
        p = min(ready, key=lambda q: len(q.pending))
        rid = next(self._rids)
        message = pack((rid, path, digest, epoch, idx, offset, nbytes))
        if len(message) > select.PIPE_BUF:
            # one write is whole only up to PIPE_BUF: a path of 4 KB, a zip's longer member
            # names, were cut short in a nearly full pipe, and the process waited for the rest
            # until it was killed as stuck (a helper's audit). The threads decode those.
            raise NotServed
        async with p.write_lock:
            while True:
                # Checked after every wait, right before the write: a process that ended
                # meanwhile has had its pipes closed, and their numbers may already be its
                # successor's. Written there, the request would be answered to a process
                # that never sent it, and registered with one that will never answer.
                if p.ended:
                    raise NotServed
                try:
                    os.write(p.to_fd, message)  # at most PIPE_BUF: all of it, or none
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(p.to_fd)
                except OSError:  # it has ended: its reader task finds out
                    raise NotServed from None
        # registered in the same step as the write: the answer cannot come before it
        req = p.pending[rid] = _Request(slot, f"{path or '/'} chunk {idx}")
        if len(p.pending) == 1:  # an answer is awaited from now on
            p.progress = trio.current_time()
            if p.waiting is not None:
                p.waiting.deadline = p.deadline(self.answer_timeout)
        await req.done.wait()
        status, text = req.answer
        if status == "ok":
            self.counters.add("decoder_chunks")
            return slot
        if status == "fill":
            return None
        if status == "stale":
            self._stale.add((path, digest))
        if status in ("stale", "retry"):
            raise NotServed
        from zvfs.formats.meta import FormatError  # numpy's: loaded by now, but not at mount

        if status == "store":
            raise FormatError(text) from StoreError(text)
        raise FormatError(text)


def _how_ended(code: int | None) -> str:
    """How a process ended, from Popen's returncode (None: not known), for the log. Never
    raises: a signal without a name (a real-time one, say) is given by its number; this runs
    between taking a dead process's requests and handing them to the threads."""
    if code is None:
        return "ended"
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"was ended by {signal.Signals(-code).name}"
    except ValueError:
        return f"was ended by signal {-code}"


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # closed already
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:  # gone already
        pass

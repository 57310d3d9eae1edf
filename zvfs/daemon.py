"""Serving one mount in this process: FUSE session, trio loop, signals, readiness.

The CLI's daemon mode forks a child that runs this and waits on a pipe for the
word that the mount is ready; ``-f`` runs it in place (systemd ``Type=notify``
gets ``READY=1`` at the same moment).

Start-up answers the kernel first: nothing on the way to ``pyfuse3.init`` and
the first answer lists the store, and nothing imports what only reads need
(botocore, numpy, the codecs). What the mount still needs from the source (an
S3 store's opening, the metadata scan) runs once the mount answers, and the
mount is announced ready (``OK``, ``READY=1``) after it; a request that needs the
store meanwhile waits for it.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import trio

from zvfs import earlystop, warmup
from zvfs.fs import Ownership, ZvfsOperations
from zvfs.fs import loop as fs_loop
from zvfs.fs.fuse import pyfuse3
from zvfs.fs.push import PagePush
from zvfs.mounts import MOUNT_TABLE_PREFIX, UnmountFailed, fusermount, mount_device, table_source
from zvfs.options import OPTIONS, S3_WRITE_OPTIONS, format_value, parse_processes, parse_ttl
from zvfs.stats import Counters
from zvfs.stores.base import KeyInfo, Store
from zvfs.stores.counting import CountingStore
from zvfs.views.context import MountContext
from zvfs.views.root import CONTROL_NAME, DecodedDir, MountRoot, build_root, load_decoded_views
from zvfs.views.usage import StoreUsage
from zvfs.workers import Workers, run_abandonable

log = logging.getLogger("zvfs")

READ_AHEAD_KB = 4096

#: malloc's mmap threshold in the daemon (see tame_malloc)
MMAP_THRESHOLD = 1 << 20
#: free memory malloc keeps at the top of a heap rather than give back (see tame_malloc)
TRIM_THRESHOLD = 4 << 20
MAX_BACKGROUND = 64
#: never "congested": see tune_kernel
CONGESTION_THRESHOLD = 65535


class Prepared(NamedTuple):
    """What ``prepare`` (the CLI's, run once the mount answers) learnt of the source."""

    #: node path -> newest mtime of its metadata keys (formats.probe)
    mtimes: dict[str, int]
    #: a store listed flat (S3): the scan's listing, resumed from its start, for the raw
    #: tree's index (so the mount lists the bucket once); None otherwise
    listing: Iterator[tuple[str, KeyInfo]] | None = None


#: what the daemon calls once the mount answers, with the mount's (counted) store
Prepare = Callable[[Store], Prepared]


def fuse_options(description: str, allow_other: bool, writable: bool = False,
                 noexec: bool = False) -> set[str]:
    """Mount options. max_read is not among them: pyfuse3's init cannot match it, and the
    kernel's own limit (max_pages, negotiated from libfuse's 1 MiB buffer) already gives
    1 MiB reads once tune_kernel has raised the read-ahead."""
    # libfuse's option syntax: a backslash and a comma escaped
    fsname = MOUNT_TABLE_PREFIX + table_source(description).replace("\\", "\\\\").replace(",", "\\,")
    opts = set(pyfuse3.default_options)
    opts |= {f"fsname={fsname}", "subtype=zvfs", "noatime", "rw" if writable else "ro"}
    if allow_other:
        opts.add("allow_other")
    if noexec:  # libfuse's own mount flag (MS_NOEXEC); nosuid and nodev it always sets
        opts.add("noexec")
    return opts


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    import socket

    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
    except OSError as exc:
        log.warning("could not notify systemd: %s", exc)


def tune_kernel(mountpoint: str) -> None:
    """Raise read-ahead and max_background through sysfs: pyfuse3 cannot pass them as options.

    And keep the connection from ever counting as congested. Once that many reads are
    queued, the kernel drops the rest of a read-ahead window, but the pages it had already
    put in the page cache stay there, not yet read; a later reader of them then fetches
    them one page per request, one request after another. Under 64 random readers one
    536 KB read became 26 requests in a row and took 7 s (12 s for another), against a p99
    of 0.8 s. Without the threshold every window is sent whole and queues like any other
    read (max_background still bounds how many are in flight): the worst read took 1.8 s.
    """
    dev = mount_device(mountpoint)
    if dev is None:
        return
    minor = dev.split(":")[1]
    conn_dir = "/sys/fs/fuse/connections"
    if os.geteuid() == 0 and os.path.isdir(conn_dir) and not os.listdir(conn_dir):
        # fusectl is where max_background lives; systemd mounts it, bare containers may not
        import subprocess

        subprocess.run(["mount", "-t", "fusectl", "fusectl", conn_dir], capture_output=True)
    for path, value in (
        (f"/sys/class/bdi/{dev}/read_ahead_kb", READ_AHEAD_KB),
        (f"/sys/fs/fuse/connections/{minor}/max_background", MAX_BACKGROUND),
        (f"/sys/fs/fuse/connections/{minor}/congestion_threshold", CONGESTION_THRESHOLD),
    ):
        try:
            with open(path, "w") as f:
                f.write(str(value))
        except OSError as exc:
            log.debug("could not set %s: %s", path, exc)


def tame_malloc() -> None:
    """Keep the daemon's memory near its cache bound without paying for it on every chunk.

    glibc raises its mmap threshold after the first large free, so the chunk buffers
    that flow through the cache then come from per-thread heap arenas and are kept after
    they are freed: RSS creeps far past the cache size. A fixed threshold of 1 MiB gives
    each decoded chunk of 1 MiB or more (the cached buffers) its own mapping, returned to
    the kernel when the cache drops it, while what lives only for one decode (the
    compressed bytes read from the store, usually smaller) is reused from the arenas.
    At 256 KiB, those compressed reads were mappings too: each one page-faulted in and
    unmapped (a TLB shootdown on the other core), and a cold decoded read ran about 15%
    slower. Two arenas are plenty for 2-core decoding.

    Fixing the mmap threshold also fixes the trim threshold, at glibc's 128 KiB: every raw
    read (the bytes of one file, up to 1 MiB, read on the trio thread) then grew the heap,
    faulted the pages in, and gave them back once its reply was out, read after read. A
    4 MiB trim threshold keeps them: raw reads of the benchmark's 256 files of 450 KB
    through a fresh mount took 12-25% less time (source in the page cache, 8 pairs), and
    the daemon's peak RSS did not move (49-50 MB).
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD)
    libc.mallopt(m_trim_threshold, TRIM_THRESHOLD)
    libc.mallopt(m_arena_max, 2)


def build_context(store: Store, opts: dict[str, Any], counters: Counters,
                  description: str = "") -> MountContext:
    """Stack the store wrappers: counting sits next to the real store, so stats.json counts
    only real requests; the optional disk tier sits above it. ``counters`` are the mount's
    (the store was opened with them too): the context owns them from here on."""
    layered: Store = CountingStore(store, counters)
    disk = None
    if opts["cache_dir"]:
        from zvfs.cache.disk import DiskCachedStore

        layered = disk = DiskCachedStore(
            layered,
            opts["cache_dir"],
            max_bytes=opts["cache_max_size"],
            min_free_bytes=opts["cache_min_free"],
            # a writable mount changes the store: nothing it cached may outlive it
            persistent=opts["metadata_ttl"] is None and not opts.get("writable"),
            counters=counters,
            # one bucket name on two endpoints is two sources
            identity=f"{opts.get('endpoint_url') or ''}\0{store.description}",
            ttl=opts["metadata_ttl"],
        )
    if opts.get("writable"):
        enable_writes = getattr(store, "enable_writes", None)
        if enable_writes is not None:  # a store that stages (S3)
            from zvfs.stores.staging import Staging

            endpoint = opts.get("endpoint_url")
            staging = Staging(opts["cache_dir"], opts["staging_max_size"], opts["staging_min_free"],
                              source=store.description + (f" at {endpoint}" if endpoint else ""))
            if disk is not None and disk.on_disk_of(staging.base):
                # its cache filled the disk down to --cache-min-free, and then every write
                # was ENOSPC (the floors are alike by default): what is cached makes room
                staging.make_room = disk.make_room
            enable_writes(staging, opts["part_size"], opts["rewrite_max_size"],
                          {name: opts[name] for name in S3_WRITE_OPTIONS if opts.get(name)})
    workers = Workers(opts["threads"])
    decoders = None
    from zvfs.decoders.pool import DecoderPool, default_processes

    processes = default_processes() if opts.get("decoders") is None else opts["decoders"]
    if processes and opts["decoded"] != "off" and store.local:
        # forked on the first use of the decoded views (see zvfs.decoders.zygote)
        decoders = DecoderPool(layered, processes, opts["cache_size"], counters, workers)
    return MountContext(
        counters=counters,
        workers=workers,
        decoders=decoders,
        writable=bool(opts.get("writable")),
        store=layered,
        metadata_ttl=opts["metadata_ttl"],
        cache_size=opts["cache_size"],
        decoded=opts["decoded"],
        source=description or store.description,
        # None is "not set", but for a TTL it is what "indefinite" parses to, and for the
        # decoder processes what "auto" does (status showed no decoders at all then)
        options={o.name: format_value(o, opts[o.name]) if o.parse else opts[o.name]
                 for o in OPTIONS if opts.get(o.name) is not None
                 or o.parse in (parse_ttl, parse_processes) and o.name in opts},
    )


def settle_mtimes(ctx: MountContext, root: MountRoot, mtimes: dict[str, int]) -> None:
    """Give the tree the mtimes the metadata scan found: the context (for every node made from
    now on) and the nodes made before it came, which took the mount time."""
    before = ctx.learn_mtimes(mtimes)
    control = root.control.entries.values() if root.control is not None else ()
    # the raw tree's directories (the root too) read the context's stable time as it is
    for node in (root.control, *(d for d in control if isinstance(d, DecodedDir))):
        if node is not None and node.mtime_ns == before:
            node.mtime_ns = ctx.stable_time_ns


class _ListingHandoff:
    """The flat listing the mount's scan begins (in ``prepare``), handed to the raw tree's
    index: a ``find`` started as soon as the mount answers must not list the bucket a second
    time alongside the scan (on moto that doubled the time of each page), so the index's
    first load waits here for the scan's listing and goes on with it."""

    def __init__(self) -> None:
        self._given = trio.Event()
        self._listing: Iterator[tuple[str, KeyInfo]] | None = None

    def give(self, listing: Iterator[tuple[str, KeyInfo]] | None) -> None:
        self._listing = listing
        self._given.set()

    async def take(self) -> Iterator[tuple[str, KeyInfo]] | None:
        await self._given.wait()
        listing, self._listing = self._listing, None
        return listing


async def _announce_ready(ctx: MountContext, root: MountRoot, mountpoint: str, ready_fd: int | None,
                          prepare: Prepare | None, failed: list[BaseException], stop: SignalStop,
                          handoff: _ListingHandoff | None = None) -> None:
    # stat goes through FUSE, so it proves the loop answers; it must leave the trio thread.
    # The thread is abandoned if a signal stops the loop first: its stat would then wait
    # for an answer that never comes, until the unmount fails it.
    await run_abandonable(os.stat, mountpoint)
    log.debug("answering at %s", mountpoint)
    # what this start imported to answer: the next start reads it ahead (zvfs.warmup)
    imported = warmup.imported_files()
    if not warmup.unchanged(imported):
        ctx.background(ctx.workers.run, warmup.record, imported)
    # not in a worker thread: requests that came before the source is open hold those,
    # waiting for it, and the open comes after this
    await run_abandonable(tune_kernel, mountpoint)
    if prepare is not None:
        try:
            mtimes, listing = await run_abandonable(prepare, ctx.store)
        except Exception as exc:  # noqa: BLE001 - the caller of serve reports it, after unmounting
            failed.append(exc)
            if handoff is not None:
                handoff.give(None)
            pyfuse3.terminate()
            return
        if handoff is not None:
            handoff.give(listing)
        if mtimes:
            settle_mtimes(ctx, root, mtimes)
            # our own stat above had the kernel keep the root's attributes: not those any more
            await run_abandonable(_forget_root_attributes)
    if ctx.store.opens_readers:  # a store keeping descriptors (a directory's); others: nothing to close
        ctx.background(close_idle_handles, ctx)
    if ctx.store.flat_listing:
        # like rclone's --vfs-refresh: list the store (S3) while the user types the first
        # command (going on with the listing the scan began)
        ctx.background(root.raw.warm)
    log.info("mounted %s", mountpoint)
    stop.ready = True
    ctx.counters.ready = True
    if ready_fd is not None:
        try:
            os.write(ready_fd, b"OK\n")
        except BrokenPipeError:  # killed (it stops its daemon when it can): no one has the mount
            log.warning("the zvfs mount command that started this mount is gone: unmounting")
            pyfuse3.terminate()
            return
        finally:
            os.close(ready_fd)
    sd_notify("READY=1\nSTATUS=mounted")
    # what the first decoded reads need, imported while the user types the first command
    # (not before: it would hold the interpreter while the source is being opened), and
    # only once the mount is quiet: a `cp -r` started at once shares the two cores with it
    if root.control is not None:
        ctx.background(when_quiet, ctx, load_decoded_views, ctx)


#: how long the mount must have had no request for ``when_quiet`` to go on: longer than a
#: script takes to start its first reader after the mount returns (a fresh Python with a
#: cold page cache, 0.1-0.3 s), shorter than a person takes to type the first command
QUIET_SECONDS = 1.0


async def when_quiet(ctx: MountContext, fn: Callable[..., Awaitable[object]], *args: object) -> None:
    """``await fn(*args)`` once the kernel has sent the mount no request for QUIET_SECONDS.

    Background work at start-up (the decoded views' import: about 0.13 s of CPU) took
    that CPU from a reader that began as soon as the mount answered: reading the 111 MiB
    of a zip at once went at 349 MiB/s, and at 385 after a pause. With 0.1 s of quiet, a
    reader started 0.2 s after the mount (as the bench's is, a fresh process) met the
    import once it had begun: 203-235 MiB/s against 403-426, the daemon 48 MiB against 31.
    What is deferred here is also done on demand (a first decoded read imports what it
    needs itself)."""
    def requests() -> float:
        return sum(v for k, v in ctx.counters.snapshot().items() if k.startswith("fuse_ops_"))

    seen = requests()
    while True:
        await trio.sleep(QUIET_SECONDS)
        now = requests()
        if now == seen:
            break
        seen = now
    await fn(*args)


#: how often the store is asked to close the handles it has not used for a while
IDLE_CHECK_SECONDS = 5.0


async def close_idle_handles(ctx: MountContext) -> None:
    """For the mount's life: the store closes the descriptors it kept but has not used for a
    while (one of a file deleted outside the mount would keep its disk space taken, and the
    file system under the store busy, until the next read evicted it, perhaps never)."""
    while True:
        await trio.sleep(IDLE_CHECK_SECONDS)
        await ctx.workers.run(ctx.store.close_idle)


def _forget_root_attributes() -> None:
    try:
        pyfuse3.invalidate_inode(pyfuse3.ROOT_INODE, attr_only=True)
    except OSError:
        pass  # nothing cached


class SessionAborted(Exception):
    """The kernel ended the FUSE connection under a running mount (its ``abort`` file in
    /sys/fs/fuse/connections, or ``umount -f``): not a stop anyone asked the daemon for, so
    it exits with a failure (systemd's Restart=on-failure mounts it again)."""


def clear_aborted(mountpoint: str, device: str | None, crashed: bool = False) -> bool:
    """Unmount our mount if it outlived its session, and say whether it did.

    After an aborted connection libfuse leaves the unmount undone (it takes the error on
    /dev/fuse for an unmount from outside), so the daemon exited and left a dead mount that
    failed every access with ENOTCONN until someone ran ``zvfs unmount``. ``device`` is the
    mount's as found once mounted: a mount made over it since is someone else's."""
    if device is None or mount_device(mountpoint) != device:
        return False
    # ``crashed``: the loop ended with an error, not the kernel: say so, not "aborted"
    what = "the mount of %s outlived the daemon's loop" if crashed else "the FUSE connection of %s was aborted"
    try:
        fusermount(mountpoint, lazy=True)
    except UnmountFailed as exc:
        log.error(what + ", and its dead mount stays: %s", mountpoint, exc)
    else:
        log.warning(what + ": its dead mount was unmounted", mountpoint)
    return True


class MountRefused(Exception):
    """The kernel or fusermount3 refused the mount (no access to /dev/fuse or to the
    mountpoint, allow_other not allowed): a matter of configuration, not to be retried."""


def init_fuse(ops: ZvfsOperations, mountpoint: str, options: set[str]) -> None:
    """``pyfuse3.init``, saying why when the mount is refused.

    libfuse and fusermount3 write the reason to stderr and pyfuse3 raises only
    "fuse_session_mount failed"; a daemonized mount's stderr is /dev/null, so the user was
    told nothing more. stderr goes to a file for the call, and its text becomes the error."""
    import tempfile

    with tempfile.TemporaryFile() as said:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(said.fileno(), 2)
        try:
            pyfuse3.init(ops, mountpoint, options)
        except Exception as exc:  # noqa: BLE001 - pyfuse3 raises RuntimeError; anything is the same
            said.seek(0)
            why = " ".join(said.read().decode(errors="replace").split())
            raise MountRefused(why or str(exc)) from exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class SignalStop:
    """SIGTERM, SIGINT, SIGHUP and SIGQUIT unmount cleanly, whenever they come.

    The handlers go in before ``pyfuse3.init`` mounts, and stay until the mount
    is gone: a signal that arrives before the trio loop runs is remembered and
    acted on as soon as it does, and one that arrives while unmounting is
    ignored. (trio's signal receiver exists only inside the loop, so a signal
    just after init used to kill the daemon and leave a dead mount.) Python runs
    the handler on the main thread, which is the trio thread; ``run_sync_soon``
    is the call trio allows from a signal handler.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    #: signals whose default action ends a process, which a daemon is sent by habit (USR1 to
    #: reopen logs) or by mistake: each killed it and left a dead mount with no line said.
    #: Logged and ignored (the log file is reopened when renamed, without being asked)
    IGNORED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
    #: seconds the requests under way at a stop get to be answered; then they are cancelled
    #: (a lookup waiting on a store that never answers held the unmount for its timeout)
    GRACE = 2.0

    def __init__(self) -> None:
        self.received: int | None = None
        #: set once the mount is announced ready: a stop before it is said at the default
        #: level (the log of a start that ended so was empty, and ``zvfs mount`` pointed at it)
        self.ready = False
        self._token: trio.lowlevel.TrioToken | None = None
        #: what the session loop runs in (set by _serve)
        self.requests: trio.CancelScope | None = None
        earlystop.forget()  # restored after the unmount, it would say nothing was mounted
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        self._previous.update({s: signal.signal(s, self._ignore) for s in self.IGNORED})

    @staticmethod
    def _ignore(signum: int, _frame: object) -> None:
        log.warning("got %s: ignored (TERM, INT, HUP and QUIT unmount)", signal.Signals(signum).name)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is not None:
            return  # already stopping
        self.received = signum
        if self._token is not None:
            try:
                self._token.run_sync_soon(self._stop)
            except trio.RunFinishedError:
                pass  # the loop is over: the mount is being closed anyway

    def attach(self) -> None:
        """Called first thing inside the trio loop."""
        self._token = trio.lowlevel.current_trio_token()
        if self.received is not None:
            self._stop()

    def _stop(self) -> None:
        name = signal.Signals(self.received or signal.SIGTERM).name
        if self.ready:
            log.info("got %s, unmounting", name)
        else:
            log.warning("got %s before the mount was ready: stopping, nothing stays mounted", name)
        sd_notify("STOPPING=1")
        pyfuse3.terminate()  # the session loop checks this flag first: safe before main() runs
        if self.requests is not None:
            self.requests.deadline = min(self.requests.deadline, trio.current_time() + self.GRACE)

    def restore(self) -> None:
        """Give the signals back, all closed. After a stop, a stop that comes as the process
        ends (a third Ctrl-C) is ignored: it ended a clean stop with 130, or by the signal."""
        self._token = None
        for signum, handler in self._previous.items():
            stopped = self.received is not None and signum in self.SIGNALS
            signal.signal(signum, signal.SIG_IGN if stopped else handler)


async def _serve(ctx: MountContext, root: MountRoot, ops: ZvfsOperations, mountpoint: str,
                 ready_fd: int | None, stop: SignalStop, prepare: Prepare | None,
                 failed: list[BaseException]) -> None:
    stop.attach()
    async with trio.open_nursery() as nursery:
        ctx.nursery = nursery
        if ctx.decoders is not None:
            ctx.decoders.listen()
        handoff = None
        if prepare is not None and ctx.store.flat_listing:
            # before any request is served: the first listing of the tree must find it
            handoff = _ListingHandoff()
            ctx.listing_under_way = handoff.take
        nursery.start_soon(_announce_ready, ctx, root, mountpoint, ready_fd, prepare, failed, stop, handoff)
        # terminate() stops the loop taking requests, but main() returns only once those
        # under way are answered; at a stop they get GRACE seconds (SignalStop), then are
        # cancelled, their threads abandoned: the unmount (lazy) and the closing of
        # /dev/fuse fail them, as a dead daemon's would be
        with trio.CancelScope() as stop.requests:
            if stop.received is not None:
                stop.requests.deadline = trio.current_time() + stop.GRACE
            await pyfuse3.main(min_tasks=SESSION_TASKS, max_tasks=MAX_SESSION_TASKS)
        if stop.requests.cancelled_caught:
            log.warning("stopped with requests still unanswered after %.0f s: they fail", stop.GRACE)
        # files still open for writing are released, as GRACE bounds requests: an upload or an
        # abort waiting on a store that does not answer held a SIGTERM for their deadlines
        with trio.move_on_after(stop.GRACE if stop.received is not None else math.inf):
            await ops.release_all()
        nursery.cancel_scope.cancel()


#: pyfuse3 session tasks kept while idle: as many as the kernel's background requests.
#: pyfuse3 starts a task whenever none is waiting for a request, and ends one whenever more
#: than ``min_tasks`` wait; each task has its own receive buffer from libfuse (1 MiB + 4 KiB,
#: malloc'd at its first request, freed when it ends). With 8 kept, the stress test's 64
#: readers made and ended tasks all the time: at its high-water mark 77 of the 131 MB the
#: daemon had allocated were the session loop's (memray), and it peaked at 139-152 MiB RSS;
#: with 64 kept, 106-114 MiB, and 10-15% more reads in the same 15 s.
SESSION_TASKS = MAX_BACKGROUND
#: session tasks at most (requests beyond them wait in the kernel's queue)
MAX_SESSION_TASKS = 256

#: seconds a thread holds the GIL before another that waits for it gets it (see serve)
SWITCH_INTERVAL = 0.0005
#: the cyclic garbage collector's generation thresholds (Python's are 700, 10, 10). After
#: a find, the daemon holds a node and an inode entry for every key: at a million keys the
#: collections that every 700 new objects set off, and that go on to the older
#: generations, walked those millions again and again. With 20,000, a find over the
#: bench's 1,000,000-key directory took 13.2-13.7 s against 14.3-15.4 (alternated), and
#: 7.0 s against 8.4 with the listings cached. What waits longer to be collected is cyclic
#: garbage alone (a reference count frees the rest at once): the stress test's 64 readers
#: peaked at 106-111 MiB against 110-119 (directory) and 126-127 against 122 (S3).
GC_THRESHOLDS = (20000, 10, 10)


def tune_process() -> None:
    """The process as the daemon runs: its allocator, GIL hand-over and garbage collector
    (also what scripts/benchlib/handlers.py sets before it times the handlers)."""
    tame_malloc()
    # The trio thread holds the GIL between its awaits; a worker coming back from a decode
    # or a read waits up to one switch interval for it, at every return from C. The default
    # 5 ms made a 1 ms chunk decode take 10-20 ms under load: hand the GIL over sooner.
    sys.setswitchinterval(SWITCH_INTERVAL)
    # Cyclic garbage collection: see GC_THRESHOLDS
    gc.set_threshold(*GC_THRESHOLDS)


def serve(store: Store, mountpoint: str, description: str, opts: dict[str, Any], counters: Counters,
          ready_fd: int | None = None,
          prepare: Prepare | None = None) -> None:
    """Mount and serve until unmounted or signalled; ``counters`` are the mount's (the store
    was opened with them). Raises OSError if the mount fails.

    ``prepare`` (blocking) runs in a thread once the mount answers, given the mount's store:
    it finishes what the mount needs of the source (opening it, the metadata scan) and
    returns a :class:`Prepared`. The mount is announced ready after it; if it raises, the
    mount is undone and serve raises that."""
    tune_process()
    ctx = build_context(store, opts, counters, description)
    if ctx.decoders is not None:  # their zygote imports while this process mounts
        ctx.decoders.launch()
    root = build_root(ctx)
    # a directory store: df shows its disk's free space; S3: the tree's index has the sizes
    usage = StoreUsage(ctx, getattr(store, "root", None), tree=root.raw.tree_index)
    # an id not given is the daemon's own (Ownership's default)
    ids = {name: opts[name] for name in ("uid", "gid") if opts[name] is not None}
    owner = Ownership(file_mode=opts["file_mode"], dir_mode=opts["dir_mode"], **ids)
    ops = ZvfsOperations(root, ctx, usage=usage, derived=[f"/{CONTROL_NAME}/"], owner=owner)
    ctx.on_change.append(ops.changed)
    metrics = None
    stop = SignalStop()
    unmounted = False
    failed: list[BaseException] = []
    try:
        # in the try: a metrics address in use failed the mount before it, and the store was
        # never closed (a --cache-dir's mount-* directory stayed; a helper's audit)
        if opts.get("metrics_addr"):
            from zvfs.metrics import serve_metrics

            metrics = serve_metrics(opts["metrics_addr"], ctx, opts.get("metrics_label") or description)
            # the option in effect is the address bound: port 0 asked shows, in stats.json and
            # zvfs status, the port an operator scrapes
            ctx.options["metrics_addr"] = metrics.addr
        init_fuse(ops, mountpoint, fuse_options(description, opts["allow_other"], ctx.writable,
                                                opts["noexec"]))
        ours = mount_device(mountpoint)
        device = fs_loop.fuse_device_fd()
        undo_loop = fs_loop.install(counters, fd=device, busy_poll=opts["busy_poll"] / 1e6,
                                    idle_for=ctx.workers.idle_for)
        if device is not None:
            ops.pages = PagePush(device)
        try:
            trio.run(_serve, ctx, root, ops, mountpoint, ready_fd, stop, prepare, failed)
            unmounted = True
        finally:
            # after a clean terminate() we unmount; after a crash too, so no dead mount stays behind
            pyfuse3.close(unmount=True)
            if undo_loop is not None:
                undo_loop()
            aborted = clear_aborted(mountpoint, ours, crashed=not unmounted)
    finally:
        # the stop signals stay ours until all is closed: given back before, a second Ctrl-C
        # (or SIGTERM) raised KeyboardInterrupt (or ended the process) half way through, and
        # a decoder zygote that had to be killed stayed, the private disk cache too
        try:
            if metrics is not None:
                metrics.shutdown()
            if ctx.decoders is not None:
                ctx.decoders.close()
            ctx.store.close()  # the store, through its wrappers (the disk tier removes its own files)
            warmup.finish()
        finally:
            stop.restore()
    if failed and stop.received is None:  # stopped on purpose: no failure to report
        log.info("unmounted %s: the source could not be opened", mountpoint)
        raise failed[0]
    log.info("unmounted %s%s", mountpoint, "" if unmounted else " after an error")
    if aborted and unmounted and stop.received is None:
        raise SessionAborted(f"the FUSE connection of {mountpoint} was aborted")

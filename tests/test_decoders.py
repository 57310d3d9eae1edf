"""Decoder processes (zvfs.decoders): chunks of a local store decoded outside the daemon.

The unit tests drive the shared-memory arena and the pipe protocol directly. Everything
else mounts for real: a directory store and two zips of it (zarr-python's ZipStore, the
``zip`` command), written by zarr-python (v2 and v3, blosc and zstd, big-endian, a
sharded array, missing chunks, edge chunks), whose decoded files must equal what
zarr-python reads, byte for byte. stats.json tells which chunks the processes decoded
(``decoder_chunks``) and which the daemon's threads did (``chunks_decoded`` counts both).
The processes are found in /proc as the children of the daemon's zygote (its one child
process, which forks them), and only those PIDs are stopped or killed. A process killed with SIGKILL, a corrupt chunk, metadata rewritten
under the mount, an unmount and a killed daemon each end the way the design says.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import math
import mmap
import os
import shutil
import signal
import struct
import termios
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    Mounted,
    _pid_alive,
    daemon_pids,
    is_mounted,
    mount_stats,
    read_errno,
    run,
    tool,
    wait_until,
    write_arrays,
    zip_with_cmd,
    zip_with_zarr,
)
from stress_lib import children, cmdline, decoder_children, proc_stat, zygote

from zvfs.decoders import wire
from zvfs.decoders.arena import Arena
from zvfs.decoders.pool import MIN_CHUNK_BYTES, DecoderPool, NotServed, default_processes

PAGE = mmap.PAGESIZE
#: seconds the processes get to start (the zygote imports numpy and numcodecs first)
START_TIMEOUT = 30


# --------------------------------------------------------------------------- 1. the arena


def test_arena_reuses_a_slot_only_when_nothing_refers_to_it() -> None:
    n = 64 << 10
    arena = Arena(8 * n)
    off1, slot = arena.take(n)
    view = slot[10:20]  # a numpy view of the slot (what the cache holds) keeps it taken
    del slot
    off2, other = arena.take(n)
    assert off2 != off1
    assert arena.reused == 0
    del other, view  # now nothing refers to either slot
    again, slot = arena.take(n)
    assert again == off1 and arena.reused == 1
    mv = memoryview(slot)  # a memoryview (a reply going out) holds it too
    del slot
    off3, third = arena.take(n)
    assert off3 == off2 and arena.reused == 2  # the other free slot, not the one replied from
    del mv, third
    arena.close()


def test_arena_reuses_by_exact_size() -> None:
    n = 64 << 10
    arena = Arena(16 * n)
    off, slot = arena.take(n)
    del slot
    bigger_off, bigger = arena.take(n + 1)  # a free slot one byte too small is not lent
    smaller_off, smaller = arena.take(n - PAGE)  # nor one too big
    assert off not in (bigger_off, smaller_off) and arena.reused == 0
    # a slot starts a page: the one after an odd size starts at the next page boundary
    assert bigger_off % PAGE == 0 and smaller_off % PAGE == 0
    assert smaller_off == bigger_off + n + PAGE
    same_off, same = arena.take(n)
    assert same_off == off and arena.reused == 1
    del bigger, smaller, same
    arena.close()


def test_arena_returns_none_when_full() -> None:
    n = 64 << 10
    arena = Arena(2 * n)
    assert arena.take(0) is None
    assert arena.take(2 * n + 1) is None  # bigger than the arena
    off1, s1 = arena.take(n)
    off2, s2 = arena.take(n)
    assert arena.take(n) is None  # both slots held, no room above them
    assert arena.take(PAGE) is None
    assert arena.used == 2 * n
    del s2
    got, s3 = arena.take(n)  # room again once one is let go
    assert got == off2 and got != off1
    del s1, s3
    arena.close()


def test_arena_trims_free_slots_at_the_top() -> None:
    n = 64 << 10
    arena = Arena(4 * n)
    taken = [arena.take(n) for _ in range(4)]
    offsets = [off for off, _ in taken]
    assert offsets == [0, n, 2 * n, 3 * n]
    s0, s1, s2, s3 = (slot for _, slot in taken)
    del taken
    s0[:] = 1
    s1[:] = 2
    s2[:] = 0xFF
    s3[:] = 0xFF
    del s2
    # the top slot is still held: trimming gives nothing back, so no room for 2n
    assert arena.take(2 * n) is None
    del s3
    # the two free slots at the top are forgotten, their pages punched out of the memfd
    off, big = arena.take(2 * n)
    assert off == 2 * n and big.nbytes == 2 * n
    assert not big.any(), "the trimmed pages still hold the old bytes"
    assert arena.used == 4 * n
    assert (s0 == 1).all() and (s1 == 2).all(), "trimming touched slots still held"
    del s0, s1, big
    arena.close()


def test_arena_slots_are_independent_shared_memory() -> None:
    n = 64 << 10
    arena = Arena(4 * n)
    off1, s1 = arena.take(n)
    off2, s2 = arena.take(n)
    s1[:] = 0xAB
    assert not s2.any()
    s2[:] = 0x11
    assert (s1 == 0xAB).all()
    # another mapping of the memfd (what a decoder process maps) sees the same memory
    mapped = mmap.mmap(arena.fd, arena.nbytes)
    theirs = np.frombuffer(mapped, np.uint8)
    assert (theirs[off1:off1 + n] == 0xAB).all() and (theirs[off2:off2 + n] == 0x11).all()
    theirs[off2:off2 + n] = 0x5A  # a process decoding into slot 2
    assert (s2 == 0x5A).all() and (s1 == 0xAB).all()
    del theirs
    mapped.close()
    assert os.pread(arena.fd, 4, off1) == b"\xab" * 4
    del s1, s2
    arena.close()


# --------------------------------------------------------------------------- 2. the wire

MESSAGES = [
    (0, "v3/zstd_f8", "0123456789abcdef01234567", 0, (1, 2), 3 * PAGE, 128 << 10),
    ("ready", 4242),
    (7, "ok", "", {"store_requests": 1, "store_bytes": 12345.0},
     [("store_seconds_get", 0.0015)]),
    (8, "data", "a/c/0/1: decode failed: \u00e9", {}, []),
]


def test_wire_round_trip_byte_by_byte_and_whole() -> None:
    for message in MESSAGES:
        packed = wire.pack(message)
        assert wire.HEADER.unpack_from(packed)[0] == len(packed) - wire.HEADER.size
        unpacker = wire.Unpacker()
        got = []
        for i in range(len(packed)):
            out = unpacker.feed(packed[i:i + 1])
            if i < len(packed) - 1:
                assert out == [], (message, i)
            got += out
        assert got == [message]
        assert wire.Unpacker().feed(packed) == [message]


def test_wire_several_messages_in_one_feed() -> None:
    stream = b"".join(wire.pack(m) for m in MESSAGES)
    assert wire.Unpacker().feed(stream) == MESSAGES
    # cut anywhere: whole messages come out in order, the rest waits for its bytes
    for cut in (1, wire.HEADER.size, len(wire.pack(MESSAGES[0])) + 2, len(stream) - 1):
        unpacker = wire.Unpacker()
        assert unpacker.feed(stream[:cut]) + unpacker.feed(stream[cut:]) == MESSAGES, cut


def test_wire_oversized_length_is_refused() -> None:
    head = wire.HEADER.pack(wire.MAX_MESSAGE + 1)
    with pytest.raises(wire.WireError):
        wire.Unpacker().feed(head + b"x" * 16)
    unpacker = wire.Unpacker()  # also after a good message in the same feed
    with pytest.raises(wire.WireError):
        unpacker.feed(wire.pack(MESSAGES[1]) + head)
    r, w = os.pipe()
    try:
        wire.write_all(w, head)
        with pytest.raises(wire.WireError):
            wire.read_message(r)
    finally:
        os.close(r)
        os.close(w)


def test_wire_read_message_over_a_pipe_until_eof() -> None:
    r, w = os.pipe()
    try:
        big = (9, "ok", "x" * 100_000, {}, [])  # more than a pipe holds: written by a thread
        stream = b"".join(wire.pack(m) for m in [*MESSAGES, big])
        writer = threading.Thread(target=lambda: (wire.write_all(w, stream), os.close(w)))
        writer.start()
        got = []
        while (message := wire.read_message(r)) is not None:
            got.append(message)
        writer.join(timeout=30)
        assert not writer.is_alive()
        assert got == [*MESSAGES, big]
        assert wire.read_message(r) is None  # and again: still the end
    finally:
        os.close(r)
    # a message cut short by the end of the pipe is no message
    r, w = os.pipe()
    try:
        wire.write_all(w, wire.pack(MESSAGES[0])[:-3])
        os.close(w)
        assert wire.read_message(r) is None
    finally:
        os.close(r)


# --------------------------------------------------------------------------- the store

def _specs() -> dict[str, dict]:
    """Array path -> how zarr-python writes it. Every chunk is >= MIN_CHUNK_BYTES but
    ``v3/small_i4``'s, 512 bytes short of it; no shape is a multiple of its chunks."""
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec

    blosc = BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")
    fresh = dict(fmt=3, shape=(256, 300), chunks=(128, 128), dtype="<f8",
                 compressors=[ZstdCodec(level=1)])
    return {
        "v2/blosc_be_f8": dict(fmt=2, shape=(300, 200), chunks=(128, 128), dtype=">f8",
                               compressors=numcodecs.Blosc(cname="zstd", clevel=3,
                                                           shuffle=numcodecs.Blosc.SHUFFLE)),
        # Fortran order: decoded into the slot as F, copied within it to C (overlapping)
        "v2/order_f_f8": dict(fmt=2, shape=(300, 200), chunks=(128, 128), dtype="<f8", order="F",
                              compressors=numcodecs.Blosc(cname="lz4", clevel=5,
                                                          shuffle=numcodecs.Blosc.SHUFFLE)),
        # 128 x 128 int32 is 64 KiB: exactly MIN_CHUNK_BYTES, so the processes serve it
        "v2/zstd_missing_i4": dict(fmt=2, shape=(260, 300), chunks=(128, 128), dtype="<i4",
                                   compressors=numcodecs.Zstd(level=1), fill_value=-7,
                                   write=[(slice(0, 128), slice(0, 128)),
                                          (slice(200, 260), slice(130, 300))]),
        "v3/zstd_f8": dict(fmt=3, shape=(300, 260), chunks=(128, 128), dtype="<f8",
                           compressors=[ZstdCodec(level=3)]),
        "v3/blosc_be_f8": dict(fmt=3, shape=(200, 300), chunks=(128, 128), dtype=">f8",
                               serializer=BytesCodec(endian="big"), compressors=[blosc]),
        "v3/shard_f8": dict(fmt=3, shape=(300, 300), chunks=(128, 128), shards=(256, 256),
                            dtype="<f8", compressors=[blosc]),
        # 127 x 128 int32: 65,024 bytes, under MIN_CHUNK_BYTES: decoded in the daemon's threads
        "v3/small_i4": dict(fmt=3, shape=(300, 260), chunks=(127, 128), dtype="<i4",
                            compressors=[ZstdCodec(level=1)]),
        # arrays no test reads before the one step it is there for (cold, whatever came before)
        **{f"fresh/{name}": fresh for name in "abcd"},
        "fresh/big": dict(fresh, shape=(1024, 1024)),
    }


SPECS = _specs()
#: the one array whose chunks are under MIN_CHUNK_BYTES (the threads decode them)
SMALL = "v3/small_i4"


def _chunk_nbytes(spec: dict) -> int:
    return math.prod(spec["chunks"]) * np.dtype(spec["dtype"]).itemsize


def written_chunks(spec: dict) -> set[tuple[int, ...]]:
    """The chunk indices zarr-python wrote (the grid, or the chunks its regions touch)."""
    grid = [range(-(-s // c)) for s, c in zip(spec["shape"], spec["chunks"], strict=True)]
    if "write" not in spec:
        return set(itertools.product(*grid))
    out = set()
    for region in spec["write"]:
        out |= set(itertools.product(*(range(sl.start // c, -(-sl.stop // c))
                                       for sl, c in zip(region, spec["chunks"], strict=True))))
    return out


def chunk_count(spec: dict) -> int:
    return math.prod(-(-s // c) for s, c in zip(spec["shape"], spec["chunks"], strict=True))


def build_store(root: Path) -> dict[str, np.ndarray]:
    """Write SPECS with zarr-python; return path -> zarr-python's read of it, in the
    declared dtype and byte order (what data.raw serves)."""
    import zarr

    store = zarr.storage.LocalStore(str(root))
    zarr.open_group(store, mode="w", zarr_format=3, attributes={"title": "zvfs decoders"})
    for group, fmt in (("v2", 2), ("v3", 3), ("fresh", 3)):
        zarr.open_group(store, path=group, mode="a", zarr_format=fmt)

    def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if dtype.kind == "f":
            return (rng.standard_normal(shape) * 100).astype(dtype)
        return rng.integers(0, 1 << 30, shape).astype(dtype)  # never the fill value

    write_arrays(store, SPECS, sample)
    refs = {}
    for path, spec in SPECS.items():
        ref = np.asarray(zarr.open_array(store, path=path, mode="r")[...])
        refs[path] = ref.astype(np.dtype(spec["dtype"]))
    missing = SPECS["v2/zstd_missing_i4"]
    assert len(written_chunks(missing)) < chunk_count(missing)
    assert (refs["v2/zstd_missing_i4"] == missing["fill_value"]).any()  # the fill shows
    return refs


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """The directory store (never changed: tests that change one copy it) and its references."""
    root = tmp_path_factory.mktemp("decoders") / "store.zarr"
    return root, build_store(root)


def copy_store(store: tuple[Path, dict[str, np.ndarray]], dest: Path) -> Path:
    shutil.copytree(store[0], dest)
    return dest


# --------------------------------------------------------------------------- helpers


def daemon_pid(m: Mounted) -> int:
    pids = daemon_pids(m.path)
    assert len(pids) == 1, pids
    return pids[0]


def open_files(pid: int) -> set[str]:
    """What process ``pid`` has open, as /proc/PID/fd names it."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def gone(pid: int, started: int) -> bool:
    """True once process ``pid`` (started at ``started``) has no /proc entry: not even a
    zombie (its parent reaped it). A new process with the PID has another start time."""
    st = proc_stat(pid)
    return st is None or st[2] != started


def dead(pid: int, started: int) -> bool:
    """True once ``pid`` runs no more (a zombie counts: reparented to an init that may not reap)."""
    st = proc_stat(pid)
    return st is None or st[2] != started or st[0] in "ZX"


def start_decoders(m: Mounted, n: int) -> list[int]:
    """List .zvfs/arrays (the first use of the decoded views starts the processes), wait
    until stats.json counts ``n`` ready, and return their PIDs."""
    assert os.listdir(m.path / ".zvfs" / "arrays")
    ok = wait_until(lambda: mount_stats(m)["decoder_processes"] == n, START_TIMEOUT)
    assert ok, (mount_stats(m), m.log_text()[-3000:])
    kids = decoder_children(daemon_pid(m))
    assert len(kids) == n, [(k, cmdline(k)) for k in kids]
    return kids


def raw(m: Mounted, path: str) -> Path:
    return m.path / ".zvfs" / "arrays" / path / "data.raw"


def assert_reads(m: Mounted, refs: dict[str, np.ndarray], path: str) -> None:
    """data.raw of ``path`` is zarr-python's array: C order, the declared dtype and byte order."""
    meta = json.loads((m.path / ".zvfs" / "arrays" / path / "meta.json").read_text())
    ref = refs[path]
    assert meta["dtype"] == ref.dtype.str and meta["shape"] == list(ref.shape), meta
    got = raw(m, path).read_bytes()
    assert len(got) == ref.nbytes, path
    assert got == ref.tobytes(), path


def alive_and_mounted(m: Mounted, pid: int) -> None:
    st = proc_stat(pid)
    assert st is not None and st[0] not in "ZX", (pid, st)
    assert is_mounted(m.path)
    assert mount_stats(m)["uptime_seconds"] >= 0


# --------------------------------------------------------------------------- 3/4. backends


@pytest.mark.parametrize("backend", ["dir", "zip-zarrpy", "zip-cmd"])
def test_processes_decode_every_big_chunk(store, tmp_path: Path, mount, backend: str) -> None:
    """With --decoders 2 every array reads as zarr-python reads it, and every chunk of at
    least MIN_CHUNK_BYTES that exists was decoded by a process, once; the others (those of
    the small-chunk array) by the daemon's threads. A missing chunk is the fill value."""
    root, refs = store
    if backend == "dir":
        source = root
    elif backend == "zip-zarrpy":
        source = zip_with_zarr(root, tmp_path / "store-zarrpy.zip")
    else:
        source = zip_with_cmd(root, tmp_path / "store-cmd.zip")
    m = mount(source, "--decoders", "2")
    pid = daemon_pid(m)
    kids = start_decoders(m, 2)
    zips = {f for k in kids for f in open_files(k) if f.endswith(".zip")}
    assert zips == ({str(source)} if backend != "dir" else set()), zips  # each opened the store itself
    assert mount_stats(m)["chunks_decoded"] == 0  # nothing decoded before the reads
    for path in sorted(SPECS):
        assert_reads(m, refs, path)
    big = {p: s for p, s in SPECS.items() if _chunk_nbytes(s) >= MIN_CHUNK_BYTES}
    assert set(SPECS) - set(big) == {SMALL} and _chunk_nbytes(SPECS[SMALL]) < MIN_CHUNK_BYTES
    by_processes = sum(len(written_chunks(s)) for s in big.values())
    by_threads = chunk_count(SPECS[SMALL])
    stats = mount_stats(m)
    assert stats["decoder_chunks"] == by_processes, stats
    assert stats["chunks_decoded"] == by_processes + by_threads, stats
    assert stats["decoder_processes"] == 2 and stats["decoder_restarts"] == 0, stats
    alive_and_mounted(m, pid)
    assert sorted(decoder_children(pid)) == sorted(kids)  # the same two served everything


def test_a_zip_mounted_over_its_own_directory(store, tmp_path: Path, mount) -> None:
    """The archive is opened before the mount covers its path (its central directory is read
    after the mount answers), and the processes open it by the daemon's descriptor: every
    array reads as zarr-python reads it, decoded by the processes. The open once came after
    the mount, went through the mount itself, and the mount hung."""
    root, refs = store
    over = tmp_path / "over"
    over.mkdir()
    source = zip_with_zarr(root, over / "store.zip")
    m = mount(source, "--decoders", "2", "--allow-non-empty", mountpoint=over)
    kids = start_decoders(m, 2)
    assert {f for k in kids for f in open_files(k) if f.endswith(".zip")} == {str(source)}
    assert not (over / "store.zip").exists()  # covered: the mount shows the archive's keys
    for path in sorted(SPECS):
        assert_reads(m, refs, path)
    stats = mount_stats(m)
    assert stats["decoder_chunks"] > 0 and stats["decoder_restarts"] == 0, stats


# --------------------------------------------------------------------------- 5. --decoders 0


def test_no_processes_with_decoders_0(store, mount) -> None:
    root, refs = store
    m = mount(root, "--decoders", "0")
    pid = daemon_pid(m)
    assert os.listdir(m.path / ".zvfs" / "arrays")
    for path in ("v2/zstd_missing_i4", "v3/shard_f8", "v3/blosc_be_f8"):
        assert_reads(m, refs, path)
    stats = mount_stats(m)
    assert stats["decoder_chunks"] == 0 and stats["decoder_processes"] == 0, stats
    every = sum(chunk_count(SPECS[p]) for p in ("v2/zstd_missing_i4", "v3/shard_f8", "v3/blosc_be_f8"))
    assert stats["chunks_decoded"] >= every, stats  # all of them, in the daemon's threads
    kids = children(pid)
    assert kids == [], [(k, cmdline(k)) for k in kids]


def test_auto_starts_a_process_per_cpu_and_one_more(store, mount) -> None:
    """``--decoders auto``: default_processes() of them (CPUs + 1), and the reads are right."""
    root, refs = store
    m = mount(root, "--decoders", "auto")
    kids = start_decoders(m, default_processes())
    assert_reads(m, refs, "fresh/a")
    assert mount_stats(m)["decoder_chunks"] == len(written_chunks(SPECS["fresh/a"]))
    alive_and_mounted(m, daemon_pid(m))
    assert len(kids) == default_processes()


# --------------------------------------------------------------------------- 6. SIGKILL


def test_sigkill_while_idle_is_replaced(store, mount) -> None:
    """A process killed between reads: the next read is right (whoever decodes it), another
    process takes its place (one restart), and the two then serve every chunk again."""
    root, refs = store
    m = mount(root, "--decoders", "2")
    pid = daemon_pid(m)
    kids = start_decoders(m, 2)
    victim, survivor = kids
    started = proc_stat(victim)[2]
    os.kill(victim, signal.SIGKILL)
    assert_reads(m, refs, "fresh/a")  # at once, cold: the pool may not know yet
    assert wait_until(lambda: mount_stats(m)["decoder_restarts"] == 1
                      and mount_stats(m)["decoder_processes"] == 2, START_TIMEOUT), mount_stats(m)
    assert wait_until(lambda: gone(victim, started), 10), proc_stat(victim)  # reaped, no zombie
    now = decoder_children(pid)
    assert len(now) == 2 and survivor in now and victim not in now, now
    lines = [ln for ln in m.log_text().splitlines()
             if f"decoder process {victim} was ended by SIGKILL" in ln]
    assert len(lines) == 1, m.log_text()[-3000:]
    before = mount_stats(m)["decoder_chunks"]
    assert_reads(m, refs, "fresh/b")
    assert mount_stats(m)["decoder_chunks"] - before == len(written_chunks(SPECS["fresh/b"]))
    assert mount_stats(m)["decoder_restarts"] == 1
    alive_and_mounted(m, pid)


def test_descriptors_of_files_deleted_outside_are_let_go_once_idle(store, tmp_path: Path, mount) -> None:
    """The daemon and its decoder processes keep chunk files open between reads; once the
    store's files are deleted outside the mount, and no read comes, both close them within
    the idle time (IDLE_SECONDS, checked every IDLE_CHECK_SECONDS), so the disk space comes
    back. Before, the descriptors stayed until evicted by other reads: perhaps never."""
    from zvfs.daemon import IDLE_CHECK_SECONDS
    from zvfs.stores.open_files import IDLE_SECONDS

    root, refs = store
    source = copy_store(store, tmp_path / "copy")
    m = mount(source, "--decoders", "1")
    pid = daemon_pid(m)
    kids = start_decoders(m, 1)
    for path in sorted(SPECS):
        assert_reads(m, refs, path)
    stats = mount_stats(m)
    assert stats["decoder_chunks"] > 0 and stats["chunks_decoded"] > stats["decoder_chunks"], stats

    def kept(p: int) -> set[str]:
        return {f for f in open_files(p) if f.startswith(str(source) + "/")}

    assert kept(pid) and kept(kids[0])  # both read through kept descriptors
    shutil.rmtree(source)
    deleted = {p: {f for f in kept(p) if f.endswith(" (deleted)")} for p in (pid, kids[0])}
    assert all(deleted.values()), deleted  # still held: the space is not back yet
    limit = IDLE_SECONDS + IDLE_CHECK_SECONDS + 10
    assert wait_until(lambda: not kept(pid) and not kept(kids[0]), limit), (kept(pid), kept(kids[0]))
    alive_and_mounted(m, pid)
    assert decoder_children(pid) == kids


def run_pool(root: Path, main, **kw) -> DecoderPool:
    """A DecoderPool of one process on the directory store ``root``, in the test's own trio
    run: ``main(pool)`` once the process is ready. The pool is closed after the run."""
    import trio

    from zvfs.stats import Counters
    from zvfs.stores.directory import DirectoryStore
    from zvfs.workers import Workers

    pool = DecoderPool(DirectoryStore(root), 1, 64 << 20, Counters(), Workers(4), **kw)

    async def run() -> None:
        pool.listen()
        pool.start()
        await ready_process(pool)
        await main(pool)

    pool.launch()
    try:
        trio.run(run)
    finally:
        pool.close()
    return pool


async def ready_process(pool: DecoderPool, restarts: int = 0):
    """The pool's one process once it is ready, after ``restarts`` restarts."""
    import trio

    with trio.fail_after(START_TIMEOUT):
        while pool.restarts < restarts or not (pool._procs and pool._procs[0].ready):
            await trio.sleep(0.01)
    return pool._procs[0]


async def ask(pool: DecoderPool, digest: str) -> object:
    """Chunk 0 of fresh/a, asked with metadata ``digest``: the slot, or "not served"."""
    try:
        return await pool.decode("fresh/a", digest, 0, (0,), MIN_CHUNK_BYTES)
    except NotServed:
        return "not served"


async def ask_into(got: list[object], pool: DecoderPool, digest: str) -> None:
    """:func:`ask`, its answer appended to ``got`` (for a task started in a nursery)."""
    got.append(await ask(pool, digest))


async def answered_by_processes(pool: DecoderPool, digest: str) -> bool:
    """A request with metadata the processes do not read: they answer "stale" (not served),
    and the pool remembers it. True once it has."""
    return await ask(pool, digest) == "not served" and ("fresh/a", digest) in pool._stale


def test_a_process_that_ends_while_a_request_waits_to_be_sent_is_not_sent_it(store) -> None:
    """A decode chose a process, and waited for its turn to write; meanwhile the process was
    killed and replaced, and its successor's pipes took the freed descriptor numbers. The
    request must not go down them: the successor would answer a request it was never sent
    (an error that turned the processes off), and the daemon would wait for the answer from
    the dead process for ever. A CI run hung on exactly that, in the mount test above. Now
    the decode is not served by the processes (its caller decodes in a thread), and the
    successor goes on serving."""
    import trio
    import trio.testing

    got: list[object] = []

    async def main(pool: DecoderPool) -> None:
        victim = pool._procs[0]
        numbers = (victim.to_fd, victim.from_fd)
        with trio.fail_after(START_TIMEOUT):
            async with trio.open_nursery() as nursery:
                await victim.write_lock.acquire()
                nursery.start_soon(ask_into, got, pool, "metadata-a")
                await trio.testing.wait_all_tasks_blocked()  # it waits for the lock
                os.kill(victim.pid, signal.SIGKILL)
                successor = await ready_process(pool, restarts=1)
                assert successor is not victim
                # the hazard is there: the same numbers, now the successor's pipes
                assert (successor.to_fd, successor.from_fd) == numbers
                victim.write_lock.release()
        assert got == ["not served"]
        assert pool.disabled is None
        with trio.fail_after(START_TIMEOUT):
            assert await answered_by_processes(pool, "metadata-b")

    pool = run_pool(store[0], main)
    assert pool.disabled is None and pool.restarts == 1


def test_a_request_longer_than_pipe_buf_is_not_sent_to_a_process(store) -> None:
    """A request carries its array's path. One write to a pipe is whole only up to
    PIPE_BUF: a request of a 4 KB path was cut short in a nearly full pipe, the process
    waited for the rest until it was killed as stuck, and the requests behind it broke
    its stream (a helper's audit). Such a request is not sent now: its caller decodes it
    in a thread, at once, with the process stopped and nothing queued to it; the process
    serves the others."""
    import select

    import trio

    long_path = "/".join(["d" * 250] * 17)
    assert len(long_path) > select.PIPE_BUF

    async def main(pool: DecoderPool) -> None:
        p = pool._procs[0]
        os.kill(p.pid, signal.SIGSTOP)
        try:
            with trio.fail_after(5):  # far under answer_timeout: it was never sent
                with pytest.raises(NotServed):
                    await pool.decode(long_path, "metadata-a", 0, (0,), MIN_CHUNK_BYTES)
            assert queued_bytes(p.pid) == 0 and not p.pending
        finally:
            os.kill(p.pid, signal.SIGCONT)
        with trio.fail_after(START_TIMEOUT):
            assert await answered_by_processes(pool, "metadata-b")

    pool = run_pool(store[0], main)
    assert pool.disabled is None and pool.restarts == 0


def test_a_process_that_stops_answering_is_killed_and_its_request_goes_to_the_threads(
        store, caplog) -> None:
    """A process that takes a request and never answers (here: stopped) would hold its
    reads for ever. After answer_timeout seconds without an answer it is killed, its
    request is not served (the caller decodes it in a thread), a warning names the chunk,
    and another process takes its place. An idle process is never killed for being idle."""
    import trio

    async def main(pool: DecoderPool) -> None:
        first = pool._procs[0]
        await trio.sleep(2.5)  # idle for longer than the timeout: left alone
        assert pool.restarts == 0 and pool._procs == [first]
        with trio.fail_after(START_TIMEOUT):
            assert await answered_by_processes(pool, "metadata-a")  # and answering
        os.kill(first.pid, signal.SIGSTOP)
        started = trio.current_time()
        with trio.fail_after(START_TIMEOUT):
            assert await ask(pool, "metadata-b") == "not served"
        waited = trio.current_time() - started
        assert 1.0 <= waited < 10, waited
        assert ("fresh/a", "metadata-b") not in pool._stale  # the process never answered it
        assert not _pid_alive(first.pid)
        await ready_process(pool, restarts=1)
        with trio.fail_after(START_TIMEOUT):
            assert await answered_by_processes(pool, "metadata-c")

    pool = run_pool(store[0], main, answer_timeout=1.0)
    assert pool.disabled is None and pool.restarts == 1
    warned = [r.getMessage() for r in caplog.records if "gave no answer" in r.getMessage()]
    assert len(warned) == 1 and "(decoding fresh/a chunk (0,))" in warned[0], warned


def test_a_process_ended_by_a_signal_without_a_name_gives_its_requests_to_the_threads(
        store, caplog) -> None:
    """A process that holds a request and is ended by a real-time signal (one Python's
    signal.Signals has no name for): its request goes to the threads, as for any other end,
    and another process starts. Naming the signal for the log used to raise between taking
    the dead process's requests and handing them over, so the read waited for ever."""
    import trio

    realtime = signal.SIGRTMIN + 1
    assert realtime not in {s.value for s in signal.Signals}

    async def main(pool: DecoderPool) -> None:
        first = pool._procs[0]
        os.kill(first.pid, signal.SIGSTOP)  # it holds the request it is sent
        async with trio.open_nursery() as nursery:
            got: list[object] = []
            nursery.start_soon(ask_into, got, pool, "metadata-a")
            with trio.fail_after(START_TIMEOUT):
                while not first.pending:
                    await trio.sleep(0.01)
            os.kill(first.pid, realtime)  # delivered once it runs again
            os.kill(first.pid, signal.SIGCONT)
            with trio.fail_after(START_TIMEOUT):
                while not got:
                    await trio.sleep(0.01)
        assert got == ["not served"]
        await ready_process(pool, restarts=1)
        with trio.fail_after(START_TIMEOUT):
            assert await answered_by_processes(pool, "metadata-b")

    pool = run_pool(store[0], main)
    assert pool.disabled is None and pool.restarts == 1
    warned = [r.getMessage() for r in caplog.records if "starting another" in r.getMessage()]
    assert len(warned) == 1 and f"was ended by signal {int(realtime)}" in warned[0], warned


def test_when_the_processes_are_turned_off_a_request_waiting_to_be_sent_is_not_sent(
        store) -> None:
    """Bytes on a process's answer pipe that are no message turn the processes off (the
    pool's reader of that pipe fails). Every process is then ended for the daemon, the one
    whose reader failed included, though no end-of-pipe will tell of it: a decode that was
    waiting for its turn to write is not served, instead of writing to a process being
    killed and waiting for an answer that no task reads."""
    import trio
    import trio.testing

    got: list[object] = []

    async def main(pool: DecoderPool) -> None:
        victim = pool._procs[0]
        with trio.fail_after(START_TIMEOUT):
            async with trio.open_nursery() as nursery:
                await victim.write_lock.acquire()
                nursery.start_soon(ask_into, got, pool, "metadata-a")
                await trio.testing.wait_all_tasks_blocked()  # it waits for the lock
                with open(pipe_end(victim.pid, os.O_WRONLY), "wb", buffering=0) as pipe:
                    pipe.write(struct.pack("<I", 5) + b"\xffjunk")
                while pool.disabled is None:
                    await trio.sleep(0.01)
                assert victim.ended  # before the waiting decode goes on
                victim.write_lock.release()
        assert got == ["not served"]

    pool = run_pool(store[0], main)
    assert pool.disabled is not None


def pipe_end(pid: int, access: int) -> str:
    """/proc path of the one pipe decoder ``pid`` holds open with ``access`` (O_RDONLY: its
    requests; O_WRONLY: its answers)."""
    ends = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = int(next(ln for ln in f if ln.startswith("flags:")).split()[1], 8)
        except OSError:
            continue
        if flags & os.O_ACCMODE == access:
            ends.append(f"/proc/{pid}/fd/{fd}")
    assert len(ends) == 1, ends
    return ends[0]


def queued_bytes(pid: int) -> int:
    """Bytes waiting in the input pipe of process ``pid`` (its requests not yet read)."""
    fd = os.open(pipe_end(pid, os.O_RDONLY), os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]
    finally:
        os.close(fd)  # never held: a reader of ours would keep the pipe open after a kill


def stopped_decoder(mount, root: Path) -> tuple[Mounted, int, int, int]:
    """A mount with one decoder process, stopped (SIGSTOP) once ready: (the mount, the
    daemon's PID, the process's PID and start time)."""
    m = mount(root, "--decoders", "1")
    pid = daemon_pid(m)
    (victim,) = start_decoders(m, 1)
    started = proc_stat(victim)[2]
    os.kill(victim, signal.SIGSTOP)
    assert wait_until(lambda: proc_stat(victim)[0] == "T", 10), proc_stat(victim)
    return m, pid, victim, started


def test_sigkill_during_a_read_gives_its_chunks_to_threads(store, mount) -> None:
    """A process killed with requests of a read waiting on it: the read still returns
    zarr-python's bytes (the pending chunks go back to the daemon's threads).

    Deterministic: with one process, stopped (SIGSTOP) before the read, every chunk the
    read needs is sent to it and none is answered; the kill comes once its input pipe
    holds requests, and the read cannot have finished before (it needs those chunks)."""
    root, refs = store
    m, pid, victim, started = stopped_decoder(mount, root)
    try:
        result: dict[str, object] = {}

        def read() -> None:
            try:
                result["bytes"] = raw(m, "fresh/big").read_bytes()
            except BaseException as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        reader = threading.Thread(target=read)
        reader.start()
        assert wait_until(lambda: queued_bytes(victim) > 0, 30), "no request reached the process"
        assert reader.is_alive() and not result, result
        assert mount_stats(m)["decoder_chunks"] == 0
    finally:
        os.kill(victim, signal.SIGKILL)
    reader.join(timeout=60)
    assert not reader.is_alive(), "the read hangs after its process was killed"
    assert "error" not in result, result
    assert result["bytes"] == refs["fresh/big"].tobytes()
    assert wait_until(lambda: mount_stats(m)["decoder_restarts"] == 1
                      and mount_stats(m)["decoder_processes"] == 1, START_TIMEOUT), mount_stats(m)
    assert wait_until(lambda: gone(victim, started), 10), proc_stat(victim)
    stats = mount_stats(m)
    # the chunks the killed process had were decoded in threads (once each, at least)
    assert stats["chunks_decoded"] - stats["decoder_chunks"] >= 1, stats
    assert stats["chunks_decoded"] >= chunk_count(SPECS["fresh/big"]), stats
    lines = [ln for ln in m.log_text().splitlines()
             if f"decoder process {victim} was ended by SIGKILL while decoding fresh/big chunk" in ln]
    assert len(lines) == 1, m.log_text()[-3000:]
    (replacement,) = decoder_children(pid)
    assert replacement != victim
    before = stats["decoder_chunks"]
    assert_reads(m, refs, "fresh/c")  # the replacement serves
    assert mount_stats(m)["decoder_chunks"] - before == len(written_chunks(SPECS["fresh/c"]))
    alive_and_mounted(m, pid)


def test_crash_while_decoding_fails_that_chunk_only(store, mount) -> None:
    """A process ended by a crash signal (SIGSEGV: what a C decoder fed hostile bytes would
    die of) while a read's requests wait on it. The chunk it was decoding fails with EIO and
    stays failed: it is never handed to the daemon's threads, where the same bytes could
    take the daemon down. The read's other chunks come from the threads, another process
    takes its place, and one log line names the chunk.

    Deterministic as the SIGKILL case: the process is stopped before the read, and the
    signal is sent once its input holds requests (it dies as it is continued)."""
    root, refs = store
    m, pid, victim, started = stopped_decoder(mount, root)
    result: dict[str, object] = {}
    try:

        def read() -> None:
            try:
                result["bytes"] = raw(m, "fresh/big").read_bytes()
            except OSError as exc:
                result["errno"] = exc.errno

        reader = threading.Thread(target=read)
        reader.start()
        assert wait_until(lambda: queued_bytes(victim) > 0, 30), "no request reached the process"
        assert reader.is_alive() and not result, result
        os.kill(victim, signal.SIGSEGV)  # pending while stopped: delivered as it continues
    finally:
        os.kill(victim, signal.SIGCONT)
    reader.join(timeout=60)
    assert not reader.is_alive(), "the read hangs after its process crashed"
    assert result == {"errno": errno.EIO}, result
    assert wait_until(lambda: gone(victim, started), 10), proc_stat(victim)
    assert wait_until(lambda: mount_stats(m)["decoder_restarts"] == 1
                      and mount_stats(m)["decoder_processes"] == 1, START_TIMEOUT), mount_stats(m)
    prefix = f"decoder process {victim} was ended by SIGSEGV while decoding fresh/big chunk ("
    lines = [ln for ln in m.log_text().splitlines() if prefix in ln]
    assert len(lines) == 1, m.log_text()[-3000:]
    culprit = tuple(int(v) for v in lines[0].split(prefix)[1].split(")")[0].split(","))
    chunks = m.path / ".zvfs" / "arrays" / "fresh/big" / "chunks"
    ref = refs["fresh/big"]
    for idx in sorted(written_chunks(SPECS["fresh/big"])):
        path = chunks / ".".join(map(str, idx))
        if idx == culprit:
            assert read_errno(path) == errno.EIO and read_errno(path) == errno.EIO  # remembered
        else:
            region = tuple(slice(i * 128, (i + 1) * 128) for i in idx)
            assert path.read_bytes() == ref[region].tobytes(), idx
    stats = mount_stats(m)
    assert stats["decoder_restarts"] == 1 and stats["decoder_processes"] == 1, stats
    alive_and_mounted(m, pid)


def test_garbage_from_a_process_turns_them_off_not_the_daemon(store, mount) -> None:
    """Bytes on a process's answer pipe that are no message (a length, then no pickle):
    the daemon logs it, turns the processes off and decodes in its threads; every read
    stays right and the daemon stays up."""
    root, refs = store
    m = mount(root, "--decoders", "2")
    pid = daemon_pid(m)
    kids = start_decoders(m, 2)
    with open(pipe_end(kids[0], os.O_WRONLY), "wb", buffering=0) as pipe:
        pipe.write(struct.pack("<I", 5) + b"\xffjunk")
    assert wait_until(lambda: "decoder processes off" in m.log_text(), 15), m.log_text()[-3000:]
    before = mount_stats(m)["decoder_chunks"]
    for path in ("fresh/a", "v3/shard_f8"):
        assert_reads(m, refs, path)
    stats = mount_stats(m)
    assert stats["decoder_chunks"] == before, stats  # all of it in the threads
    alive_and_mounted(m, pid)


# --------------------------------------------------------------------------- 7. corrupt chunk


def test_corrupt_chunk_through_processes(store, tmp_path: Path, mount) -> None:
    """A chunk of garbage (same length) decoded by a process: EIO for it and data.raw,
    again and again (remembered), one log line naming its key; the other chunks read."""
    import zarr

    _, refs = store
    root = copy_store(store, tmp_path / "corrupt.zarr")
    path, key = "v3/zstd_f8", "v3/zstd_f8/c/1/1"
    chunk = root / key
    chunk.write_bytes(np.random.default_rng(99).bytes(chunk.stat().st_size))
    with pytest.raises(Exception):  # noqa: B017 - the reference refuses it too
        zarr.open_array(zarr.storage.LocalStore(str(root)), path=path, mode="r")[...]
    m = mount(root, "--decoders", "2")
    pid = daemon_pid(m)
    start_decoders(m, 2)
    base = m.path / ".zvfs" / "arrays" / path
    for _ in range(2):
        assert read_errno(base / "data.raw") == errno.EIO
        assert read_errno(base / "chunks" / "1.1") == errno.EIO
    ref = refs[path]
    spec = SPECS[path]
    cy, cx = spec["chunks"]
    good = sorted(written_chunks(spec) - {(1, 1)})
    for i, j in good:
        want = np.ascontiguousarray(ref[i * cy:(i + 1) * cy, j * cx:(j + 1) * cx]).tobytes()
        assert (base / "chunks" / f"{i}.{j}").read_bytes() == want, (i, j)
    stats = mount_stats(m)
    # the good chunks came from the processes, none from the threads (a chunk that a
    # sequential read of data.raw passed leaves the cache: a later read decodes it again)
    assert stats["decoder_chunks"] == stats["chunks_decoded"] >= len(good), stats
    lines = [ln for ln in m.log_text().splitlines() if key in ln]
    assert len(lines) == 1, (lines, m.log_text()[-3000:])
    assert_reads(m, refs, "v3/blosc_be_f8")  # the rest of the store reads
    alive_and_mounted(m, pid)
    assert mount_stats(m)["decoder_processes"] == 2  # a bad chunk ends no process


# --------------------------------------------------------------------------- 8. ending


def test_unmount_ends_the_processes(store, mount) -> None:
    root, refs = store
    m = mount(root, "--decoders", "2")
    pid = daemon_pid(m)
    kids = start_decoders(m, 2)
    assert_reads(m, refs, "v3/zstd_f8")
    assert mount_stats(m)["decoder_chunks"] > 0
    started = {k: proc_stat(k)[2] for k in [*kids, zygote(pid)]}
    daemon_started = proc_stat(pid)[2]
    res = run([tool("zvfs"), "unmount", m.path])
    assert res.returncode == 0, res.stderr
    assert not is_mounted(m.path)
    # the daemon waited for each: no process left, not even a zombie
    assert wait_until(lambda: all(gone(k, s) for k, s in started.items()), 15), \
        [(k, proc_stat(k)) for k in kids]
    assert wait_until(lambda: dead(pid, daemon_started), 15), proc_stat(pid)


def test_killed_daemon_ends_the_processes(store, mount) -> None:
    """The daemon killed with SIGKILL closes nothing: the processes end anyway (they asked
    the kernel for a signal when their parent dies). The mount fixture clears the dead mount."""
    root, _refs = store
    m = mount(root, "--decoders", "2")
    pid = daemon_pid(m)
    kids = start_decoders(m, 2)
    started = {k: proc_stat(k)[2] for k in [*kids, zygote(pid)]}
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: all(dead(k, s) for k, s in started.items()), 15), \
        [(k, proc_stat(k)) for k in kids]


# --------------------------------------------------------------------------- 9. stale metadata


def test_metadata_changed_under_the_mount_is_decoded_in_threads(store, tmp_path: Path, mount) -> None:
    """Metadata rewritten on disk after the daemon read it, before any chunk read.

    The daemon keeps the metadata it discovered (--metadata-ttl 600); each process reads
    the metadata itself and must serve a chunk only when its digest is the daemon's.
    ``v2/blosc_be_f8``'s .zarray now says order "F": a process decoding with it would
    transpose every chunk, so its bytes would differ from zarr-python's (written in C
    order). ``fresh/d``'s zarr.json gets another attribute (the digest covers them): its
    bytes would be right either way, so only decoder_chunks shows who decoded it. An
    unchanged array in the same mount shows the processes serve what they may."""
    _, refs = store
    root = copy_store(store, tmp_path / "stale.zarr")
    m = mount(root, "--decoders", "2", "--metadata-ttl", "600")
    pid = daemon_pid(m)
    start_decoders(m, 2)
    zarray = root / "v2/blosc_be_f8/.zarray"
    doc = json.loads(zarray.read_text())
    assert doc["order"] == "C"
    zarray.write_text(json.dumps(dict(doc, order="F"), indent=4))
    zjson = root / "fresh/d/zarr.json"
    doc = json.loads(zjson.read_text())
    doc["attributes"] = {**doc.get("attributes", {}), "rewritten": True}
    zjson.write_text(json.dumps(doc, indent=4))
    assert_reads(m, refs, "v2/blosc_be_f8")
    assert_reads(m, refs, "fresh/d")
    stats = mount_stats(m)
    stale = chunk_count(SPECS["v2/blosc_be_f8"]) + chunk_count(SPECS["fresh/d"])
    assert stats["decoder_chunks"] == 0, stats
    assert stats["chunks_decoded"] == stale, stats
    assert_reads(m, refs, "v3/zstd_f8")  # unchanged: the processes serve it
    stats = mount_stats(m)
    assert stats["decoder_chunks"] == chunk_count(SPECS["v3/zstd_f8"]), stats
    assert stats["decoder_processes"] == 2 and stats["decoder_restarts"] == 0, stats
    alive_and_mounted(m, pid)

"""The optional disk tier (--cache-dir) through real mounts of a moto bucket."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import (
    DictStore,
    daemon_pids,
    in_threads,
    put_many,
    run,
    s3_client,
    store_files,
    tool,
    upload_tree,
    wait_until,
)
from conftest import mount_stats as _stats

from zvfs.stores.base import KeyInfo, KeyNotFound


def _read_all(mnt: Path, ref: Path) -> None:
    for key, path in sorted(store_files(ref).items()):
        assert (mnt / key).read_bytes() == path.read_bytes(), key


def _cache_files(cache: Path) -> list[Path]:
    """The entry files under ``cache``, read while unmounting daemons remove their
    directories: one removed during the walk is skipped (``rglob`` raised FileNotFoundError
    when a directory it had listed was gone before it went in)."""
    return [path for top, _, names in os.walk(cache) for name in names
            if name != ".lock" and (path := Path(top, name)).is_file()]


def _entry_sizes(cache: Path) -> dict[Path, int]:
    """The size of each regular entry file (not a symlink) under ``cache``, less those a
    live mount evicts while they are read."""
    sizes = {}
    for path in _cache_files(cache):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            sizes[path] = st.st_size
    return sizes


def _cache_bytes(cache_dir: Path) -> int:
    return sum(_entry_sizes(cache_dir).values())


def test_persistent_disk_cache_serves_a_second_mount(mount, moto, s3_env, zarr_s3, zarr_dir, tmp_path):
    cache = tmp_path / "cache"
    opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(cache), "--metadata-ttl", "indefinite")
    first = mount(zarr_s3, *opts, env=s3_env)
    _read_all(first.path, zarr_dir)
    s1 = _stats(first.path)
    assert s1["disk_cache_misses"] > 0 and s1.get("disk_cache_hits", 0) == 0
    assert _cache_bytes(cache) > 0
    mount.cleanup()

    second = mount(zarr_s3, *opts, env=s3_env)
    _read_all(second.path, zarr_dir)
    s2 = _stats(second.path)
    # every object came from disk: the only store traffic left is the listing
    assert s2["disk_cache_hits"] >= len(store_files(zarr_dir)) - 1
    assert s2.get("store_requests", 0) == 0, s2


def test_disk_cache_is_per_mount_unless_immutable(mount, moto, s3_env, zarr_s3, zarr_dir, tmp_path):
    cache = tmp_path / "cache"
    opts = ("--endpoint-url", moto.endpoint, "-o", f"cache_dir={cache}")
    first = mount(zarr_s3, *opts, env=s3_env)
    _read_all(first.path, zarr_dir)
    mount.cleanup()
    second = mount(zarr_s3, *opts, env=s3_env)
    _read_all(second.path, zarr_dir)
    s2 = _stats(second.path)
    assert s2.get("disk_cache_hits", 0) == 0  # data may have changed: nothing reused
    assert s2["store_requests"] > 0


def test_disk_cache_stays_within_its_bound(mount, moto, s3_env, zarr_s3, zarr_dir, tmp_path):
    cache = tmp_path / "cache"
    bound = 700 * 1024
    total = sum(p.stat().st_size for p in store_files(zarr_dir).values())
    assert total > bound  # the sample holds two 600 kB chunks, so the bound must bite
    m = mount(zarr_s3, "--endpoint-url", moto.endpoint, "--cache-dir", str(cache),
              "--cache-max-size", str(bound), env=s3_env)
    _read_all(m.path, zarr_dir)
    assert 0 < _cache_bytes(cache) <= bound
    assert _stats(m.path).get("disk_cache_evictions", 0) > 0
    assert not [p for p in cache.rglob("*.tmp")], os.listdir(cache)


def test_the_disk_caches_writer_passes_every_writer_call_on() -> None:
    """The disk cache wraps each S3 writer; a call it did not pass on fell to KeyWriter's
    default: with --cache-dir, an unlink S3 refused left its writers storing nothing
    (undiscard), an append went through write, and a SIGTERM's abandon said nothing of the
    kept bytes."""
    from zvfs.cache.disk import _ForgetOnCommit
    from zvfs.stores.base import KeyWriter

    calls = [n for n, v in vars(KeyWriter).items()
             if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert {"commit", "close", "undiscard", "abandon", "append"} <= set(calls)
    assert [n for n in calls if n not in vars(_ForgetOnCommit)] == []


# -- what a cache directory holds is checked, never trusted --------------------------------

HEADROOM = 256  # an entry file holds its value and at most this much more (its header)


def _values(n: int, base: int = 100_000) -> dict[str, bytes]:
    """``n`` keys of distinct sizes (under a raw block: each is kept as one entry), so an
    entry file tells whose it is by its size."""
    return {f"v/k{i}": os.urandom(base + 1000 * i) for i in range(n)}


def _entries_by_key(cache: Path, values: dict[str, bytes]) -> dict[str, Path]:
    found = {}
    for p, size in _entry_sizes(cache).items():
        for key, value in values.items():
            if 0 <= size - len(value) < HEADROOM:
                found[key] = p
    return found


@pytest.fixture
def bucket(moto):
    """A fresh bucket of its own on the session's moto; ``(name, client)``."""
    client = s3_client(moto.endpoint)
    name = f"dc-{os.urandom(4).hex()}"
    client.create_bucket(Bucket=name)
    return name, client


def _immutable_mount(mount, moto, s3_env, bucket, cache: Path, n: int):  # type: ignore[no-untyped-def]
    """``n`` values put in ``bucket``, mounted with ``cache`` kept for later mounts, and
    read once: (bucket name, values, the mount's options, the mount)."""
    name, client = bucket
    values = _values(n)
    put_many(client, name, values)
    opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(cache), "--metadata-ttl", "indefinite")
    m = mount(f"s3://{name}", *opts, env=s3_env)
    for key, value in values.items():
        assert (m / key).read_bytes() == value
    return name, values, opts, m


def test_a_corrupt_cache_file_is_dropped_and_read_from_the_store(mount, moto, s3_env, bucket, tmp_path):
    """Entry files truncated, bit-flipped, swapped for another key's, emptied, made a
    directory or a symlink out of the cache: each key still reads its own bytes (the
    entry is dropped and read again), the log names each key once, and a good entry is
    still a hit. Before, all but the directory were served as they were: wrong bytes."""
    cache = tmp_path / "cache"
    name, values, opts, _ = _immutable_mount(mount, moto, s3_env, bucket, cache, 8)
    mount.cleanup()
    files = _entries_by_key(cache, values)
    assert sorted(files) == sorted(values)
    outside = tmp_path / "outside"
    outside.write_bytes(b"x" * files["v/k6"].stat().st_size)
    os.truncate(files["v/k0"], files["v/k0"].stat().st_size // 2)
    flipped = bytearray(files["v/k1"].read_bytes())
    flipped[-1000] ^= 1
    files["v/k1"].write_bytes(bytes(flipped))
    shutil.copyfile(files["v/k3"], files["v/k2"])  # another key's entry, whole
    files["v/k4"].write_bytes(b"")
    files["v/k5"].unlink()
    files["v/k5"].mkdir()
    files["v/k6"].unlink()
    files["v/k6"].symlink_to(outside)

    second = mount(f"s3://{name}", *opts, env=s3_env)
    for key, value in values.items():
        assert (second / key).read_bytes() == value, key
    stats = _stats(second.path)
    assert stats["disk_cache_hits"] >= 2  # k3 and k7 were good
    log = second.log_text()
    for key in ("v/k0", "v/k1", "v/k2", "v/k4"):
        assert len(re.findall(rf"disk cache: dropped the cached copy of {key} ", log)) == 1, log
    assert "no mount wrote there" in log  # the directory and the symlink, removed at mount
    assert not files["v/k5"].is_dir() and outside.read_bytes() == b"x" * outside.stat().st_size
    # what was read again is kept again, good this time
    mount.cleanup()
    third = mount(f"s3://{name}", *opts, env=s3_env)
    for key, value in values.items():
        assert (third / key).read_bytes() == value, key
    assert _stats(third.path).get("store_requests", 0) == 0
    assert "dropped the cached copy" not in third.log_text()


def _sharded(root: Path, value: int) -> bytes:
    """A sharded v3 array (its index read as a suffix, its chunks as ranges) and a plain
    compressed one (chunks read whole), all ``value``; returns the sharded one's bytes."""
    import numpy as np
    import zarr

    shutil.rmtree(root, ignore_errors=True)
    g = zarr.open_group(zarr.storage.LocalStore(str(root)), mode="w", zarr_format=3)
    a = g.create_array("sharded", shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="int32",
                       compressors=None)
    a[:] = value
    g.create_array("plain", shape=(40, 40), chunks=(20, 20), dtype="int16")[:] = value
    return np.full((64, 64), value, "int32").tobytes()


def _plain(value: int) -> bytes:
    import numpy as np

    return np.full((40, 40), value, "int16").tobytes()


def test_an_object_rewritten_between_mounts_is_read_anew(mount, moto, s3_env, bucket, tmp_path):
    """An immutable mount keeps its cache for the next one; the store rewrites the array
    (same keys, new bytes, new ETags) before that next mount, whose listing shows it: the
    decoded views serve the new values. Before, the entries were named by key and range
    only, and the old values came back from disk."""
    name, client = bucket
    src = tmp_path / "src"
    old = _sharded(src, 1)
    upload_tree(client, src, name, "")
    cache = tmp_path / "cache"
    opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(cache), "--metadata-ttl", "indefinite")
    first = mount(f"s3://{name}", *opts, env=s3_env)
    assert (first / ".zvfs/arrays/sharded/data.raw").read_bytes() == old
    mount.cleanup()
    new = _sharded(src, 2)
    upload_tree(client, src, name, "")
    second = mount(f"s3://{name}", *opts, env=s3_env)
    assert (second / ".zvfs/arrays/sharded/data.raw").read_bytes() == new
    assert (second / ".zvfs/arrays/plain/data.raw").read_bytes() == _plain(2)


def test_a_second_mount_reads_decoded_chunks_from_disk(mount, moto, s3_env, bucket, tmp_path):
    """Decoded chunks of known size are read with get_at_most, which the disk tier passed
    by: an immutable mount's successor fetched every chunk of a plain v3 array again."""
    name, client = bucket
    src = tmp_path / "src"
    old = _sharded(src, 1)
    upload_tree(client, src, name, "")
    opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(tmp_path / "cache"),
            "--metadata-ttl", "indefinite")
    first = mount(f"s3://{name}", *opts, env=s3_env)
    assert (first / ".zvfs/arrays/sharded/data.raw").read_bytes() == old
    assert (first / ".zvfs/arrays/plain/data.raw").read_bytes() == _plain(1)
    mount.cleanup()
    again = mount(f"s3://{name}", *opts, env=s3_env)
    assert (again / ".zvfs/arrays/sharded/meta.json").read_bytes()
    assert (again / ".zvfs/arrays/plain/meta.json").read_bytes()
    before = _stats(again.path).get("store_requests", 0)
    assert (again / ".zvfs/arrays/sharded/data.raw").read_bytes() == old
    assert (again / ".zvfs/arrays/plain/data.raw").read_bytes() == _plain(1)
    assert _stats(again.path).get("store_requests", 0) == before


def test_an_object_rewritten_behind_a_live_mount_is_read_anew_after_the_ttl(mount, moto, s3_env, bucket,
                                                                             tmp_path):
    """With a finite TTL the disk tier trusts what a listing said for the TTL only: after
    it, a rewritten shard is read anew, as without the disk tier. Before, the entry of
    the old bytes was served for the mount's life."""
    name, client = bucket
    src = tmp_path / "src"
    old = _sharded(src, 1)
    upload_tree(client, src, name, "")
    m = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(tmp_path / "cache"),
              "--metadata-ttl", "1", env=s3_env)
    data = m / ".zvfs/arrays/sharded/data.raw"
    assert data.read_bytes() == old
    new = _sharded(src, 2)
    upload_tree(client, src, name, "")
    time.sleep(2.5)
    assert data.read_bytes() == new


def test_one_bucket_name_on_two_endpoints_is_two_caches(mount, moto, s3_env, tmp_path):
    """The shared directory was named by the source's URL alone: a mount of bucket "b" on
    another endpoint was served the first endpoint's bytes from disk."""
    from moto_server import MotoServer

    src = tmp_path / "src"
    other = MotoServer().start()
    try:
        for server, value in ((moto, 1), (other, 2)):
            client = s3_client(server.endpoint)
            client.create_bucket(Bucket="dc-two-endpoints")
            _sharded(src, value)
            upload_tree(client, src, "dc-two-endpoints", "")
        cache = ("--cache-dir", str(tmp_path / "cache"), "--metadata-ttl", "indefinite")
        first = mount("s3://dc-two-endpoints", "--endpoint-url", moto.endpoint, *cache, env=s3_env)
        assert (first / ".zvfs/arrays/sharded/data.raw").read_bytes() == _sharded(src, 1)
        mount.cleanup()
        second = mount("s3://dc-two-endpoints", "--endpoint-url", other.endpoint, *cache, env=s3_env)
        assert (second / ".zvfs/arrays/sharded/data.raw").read_bytes() == _sharded(src, 2)
    finally:
        mount.cleanup()
        other.stop()


def test_mounts_sharing_a_cache_dir(mount, moto, s3_env, bucket, tmp_path):
    """An immutable mount's cache is its own while it runs: a second mount of the same
    source, with or without a TTL, caches apart (the one without used to delete the
    first's files as it started), each reads right, and what a mount that may not keep its
    cache wrote is gone at its unmount (it stayed, and a cache dir used by many sources
    grew by a whole --cache-max-size each)."""
    cache = tmp_path / "cache"
    name, values, keep, first = _immutable_mount(mount, moto, s3_env, bucket, cache, 6)
    kept = sorted(_cache_files(cache))
    assert len(kept) == len(values)
    plain = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(cache), env=s3_env)
    twin = mount(f"s3://{name}", *keep, env=s3_env)
    assert "in use by another mount of the same source" in twin.log_text()
    assert all(p.exists() for p in kept)
    for m in (plain, twin, first):
        for key, value in values.items():
            assert (m / key).read_bytes() == value, (m.path, key)
    assert all(p.exists() for p in kept)
    for m in (plain, twin):
        subprocess.run(["fusermount3", "-u", str(m.path)], check=True)
    assert wait_until(lambda: sorted(_cache_files(cache)) == kept, 10), _cache_files(cache)
    mount.cleanup()
    assert sorted(_cache_files(cache)) == kept


def test_a_killed_mounts_cache_is_removed_by_the_next_mount(mount, moto, s3_env, bucket, tmp_path):
    """kill -9 while a mount fills its cache: the next mount with that cache dir, of any
    source, removes what the dead one may not keep (before, it stayed until a mount of the
    same source came), and one of the same immutable source reads right and leaves no
    half-written file."""
    name, client = bucket
    values = {f"big/k{i}": os.urandom(3_000_000) for i in range(8)}
    put_many(client, name, values)
    cache = tmp_path / "cache"
    for keep in ((), ("--metadata-ttl", "indefinite")):
        opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(cache), *keep)
        m = mount(f"s3://{name}", *opts, env=s3_env)
        [pid] = daemon_pids(m.path)
        readers = [threading.Thread(target=_read_quietly, args=(m.path, list(values)[i::2]), daemon=True)
                   for i in range(2)]
        for t in readers:
            t.start()
        assert wait_until(lambda: _cache_files(cache), 30, interval=0.005)  # it is filling
        os.kill(pid, signal.SIGKILL)
        for t in readers:
            t.join(30)
        mount.cleanup()
        assert _cache_files(cache)  # the dead mount's files
        if not keep:
            other = f"{name}-other"
            client.create_bucket(Bucket=other)
            put_many(client, other, {"x": b"x"})
            mount(f"s3://{other}", "--endpoint-url", moto.endpoint, "--cache-dir", str(cache), env=s3_env)
            assert _cache_files(cache) == [], _cache_files(cache)
        else:
            again = mount(f"s3://{name}", *opts, env=s3_env)
            assert not [p for p in cache.rglob("*.tmp")]
            for key, value in values.items():
                assert (again / key).read_bytes() == value, key
        mount.cleanup()


def _read_quietly(root: Path, keys: list[str]) -> None:
    for key in keys:
        try:
            (root / key).read_bytes()
        except OSError:
            pass  # the daemon was killed


@pytest.fixture
def small_disk(tmp_path, mount) -> Iterator[Callable[[str], Path]]:
    """``small_disk("size=2m")``: a tmpfs of its own with those options, for a cache dir;
    unmounted after the test's zvfs mounts are."""
    made: list[Path] = []

    def make(options: str) -> Path:
        root = tmp_path / f"disk{len(made)}"
        root.mkdir()
        run(["mount", "-t", "tmpfs", "-o", options, "zvfs-test-cache", root], check=True)
        made.append(root)
        return root

    try:
        yield make
    finally:
        mount.cleanup()
        for root in made:
            run(["umount", root], check=True)


def test_an_entry_being_written_is_counted_once_against_the_floor(tmp_path, small_disk, monkeypatch):
    """While one entry was being written, the next one's room was reckoned with its bytes
    twice: once as the disk's free space had already fallen by them, once more as still
    to come. So a cache at its floor evicted an entry it had room for (the makes-room test
    below failed so, one run in six, with a megabyte too many free). Here the first entry
    is held after its bytes are written; the second must fit without an eviction."""
    from zvfs.cache import disk as disk_cache
    from zvfs.stats import Counters
    from zvfs.stores.directory import DirectoryStore

    size = 1 << 20
    source = tmp_path / "source"
    source.mkdir()
    for name in ("old", "a", "b"):
        (source / name).write_bytes(os.urandom(size))
    counters = Counters()
    store = disk_cache.DiskCachedStore(DirectoryStore(source), small_disk("size=8m"), max_bytes=1 << 30,
                                       min_free_bytes=0, persistent=False, counters=counters)
    try:
        store.get("old")
        entry = size + disk_cache._HEAD.size
        # room for two more entries, with a quarter of one to spare
        store.min_free = shutil.disk_usage(store.dir).free - 2 * entry - entry // 4
        held, go = threading.Event(), threading.Event()
        replace = os.replace

        def hold_first(src, dst):  # type: ignore[no-untyped-def]
            if not held.is_set():
                held.set()
                assert go.wait(10)
            replace(src, dst)

        monkeypatch.setattr(disk_cache.os, "replace", hold_first)
        first = threading.Thread(target=store.get, args=("a",))
        first.start()
        try:
            assert held.wait(10)
            assert store.get("b") == (source / "b").read_bytes()
        finally:
            go.set()
            first.join(10)
        assert counters.snapshot().get("disk_cache_evictions", 0) == 0
        assert store.get("old") == (source / "old").read_bytes()
        assert counters.snapshot()["disk_cache_hits"] == 1  # "old" was kept
    finally:
        store.close()


def _read_in_threads(root: Path, values: dict[str, bytes], threads: int) -> list:
    bad: list = []

    def read(keys: list[str]) -> None:
        for key in keys:
            try:
                if (root / key).read_bytes() != values[key]:
                    bad.append(key)
            except OSError as exc:
                bad.append((key, exc))

    errors = in_threads(lambda i: read(list(values)[i::threads]), threads)
    return bad + errors


def test_a_full_cache_disk_fails_no_read(mount, moto, s3_env, bucket, small_disk):
    """A cache disk that refuses new files (ENOSPC: here, out of inodes): every read is
    served from the store, one log line says so (before: one per read), and no
    half-written file stays."""
    name, client = bucket
    values = _values(12)
    put_many(client, name, values)
    disk = small_disk("size=8m,nr_inodes=6")
    m = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(disk),
              "--cache-min-free", "0", env=s3_env)
    assert _read_in_threads(m.path, values, 3) == []
    log = m.log_text()
    assert log.count("disk cache: cannot write") == 1, log
    assert "No space left on device" in log
    assert not [p for p in disk.rglob("*.tmp")]


def test_a_cache_that_filled_its_disk_makes_room_for_writes_staged_there(mount, moto, s3_env, bucket,
                                                                          small_disk):
    """A writable S3 mount stages under --cache-dir too: once its reads had filled the disk
    down to --cache-min-free, every write failed with ENOSPC for --staging-min-free (the two
    floors are alike by default), while the disk was full of evictable cache entries. The
    cache now gives up entries, least recently used first, for a write to stage."""
    name, client = bucket
    values = _values(26, base=1_000_000)  # about 26 MB of entries on a 28 MiB disk
    put_many(client, name, values)
    disk = small_disk("size=28m")
    m = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(disk), "--writable",
              "--cache-min-free", "6M", "--staging-min-free", "6M", env=s3_env)
    assert _read_in_threads(m.path, values, 2) == []
    data = os.urandom(3 * 2**20)
    # the cache took the disk down near its floor: the write cannot stage above its own
    free, stats = shutil.disk_usage(disk).free, _stats(m.path)
    assert free - len(data) < 6 * 2**20, (free, {k: v for k, v in stats.items() if "cache" in k},
                                          sorted(p.stat().st_size for p in _cache_files(disk)),
                                          m.log_text())
    evicted = stats["disk_cache_evictions"]
    (m.path / "new.bin").write_bytes(data)
    assert client.get_object(Bucket=name, Key="new.bin")["Body"].read() == data
    assert _stats(m.path)["disk_cache_evictions"] > evicted
    assert "ERROR" not in m.log_text(), m.log_text()
    assert _read_in_threads(m.path, values, 2) == []  # and everything still reads


@pytest.mark.parametrize("ttl", ["60", "indefinite"])
def test_another_mounts_cache_on_a_shared_cache_dir_makes_room_for_writes_staged_there(
        mount, moto, s3_env, bucket, small_disk, ttl):
    """One --cache-dir for every mount of a machine (fstab lines alike): a read-only mount's
    cache took the disk down to --cache-min-free, and then every write of a writable mount
    staging there failed with ENOSPC for --staging-min-free (the floors are alike by
    default), the disk full of entries another mount could evict. Entries of other mounts'
    caches (zvfs's own directories only) now give way too, least recently used first; the
    mount that lost them reads them from the store again."""
    name, client = bucket
    values = _values(26, base=1_000_000)
    put_many(client, name, values)
    disk = small_disk("size=28m")
    user_file = disk / "mine.txt"
    user_file.write_bytes(b"the user's own")
    reader = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(disk),
                   "--cache-min-free", "6M", "--metadata-ttl", ttl, env=s3_env)
    assert _read_in_threads(reader.path, values, 2) == []
    writer = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(disk),
                   "--writable", "--staging-min-free", "6M", env=s3_env)
    data = os.urandom(3 * 2**20)
    assert shutil.disk_usage(disk).free - len(data) < 6 * 2**20
    (writer.path / "new.bin").write_bytes(data)
    assert client.get_object(Bucket=name, Key="new.bin")["Body"].read() == data
    assert user_file.read_bytes() == b"the user's own"
    assert _read_in_threads(reader.path, values, 2) == []  # what it lost is read again
    assert "ERROR" not in reader.log_text() + writer.log_text(), reader.log_text() + writer.log_text()


def test_a_kept_cache_of_a_source_no_longer_mounted_gives_way_to_another_source(
        mount, moto, s3_env, bucket, small_disk):
    """Each mount evicts only its own directory's entries: the cache a source mounted once
    with metadata_ttl=indefinite kept for later mounts held the disk at --cache-min-free for
    ever, and a mount of any other source with the same --cache-dir cached nothing (one
    warning, every read from the store). Entries of kept caches no mount uses now give way
    to a mount's entries, least recently used first; those of a cache in use do not."""
    name, client = bucket
    first, second = _values(13, base=1_000_000), _values(13, base=1_000_000)
    put_many(client, name, {f"a/{k}": v for k, v in first.items()})
    put_many(client, name, {f"b/{k}": v for k, v in second.items()})
    disk = small_disk("size=18m")
    opts = ["--endpoint-url", moto.endpoint, "--cache-dir", str(disk), "--cache-min-free", "6M",
            "--metadata-ttl", "indefinite"]
    old = mount(f"s3://{name}/a", *opts, env=s3_env)
    assert _read_in_threads(old.path, first, 2) == []
    run([tool("zvfs"), "unmount", old.path], check=True)
    (kept,) = {p.parent for p in _cache_files(disk)}
    # the kept cache holds the disk near its floor: room for about 2 MB more
    assert shutil.disk_usage(disk).free < 9 * 2**20
    new = mount(f"s3://{name}/b", *opts, env=s3_env)
    assert _read_in_threads(new.path, second, 2) == []
    assert "keeps no more" not in new.log_text(), new.log_text()
    cached = sum(p.stat().st_size for p in _cache_files(disk) if p.parent != kept)
    assert cached > 6 * 2**20, cached
    # a kept cache in use gives nothing: the mount of b reads on, and caches no more than fits
    again = mount(f"s3://{name}/a", *opts, env=s3_env)
    assert _read_in_threads(again.path, first, 2) == []
    # (had they given way, the mount of a would have taken them all: it wants 13 MB)
    assert sum(p.stat().st_size for p in _cache_files(disk) if p.parent != kept) > 6 * 2**20


def test_the_free_space_floor_holds_under_concurrent_reads(mount, moto, s3_env, bucket, small_disk):
    """Several readers filling a 2 MiB cache disk at once: the floor counts the entries
    being written (the disk's free space shows them only once written), so none fails
    with ENOSPC (before: each of several readers wrote into the same last free bytes,
    and each failure logged a line); a floor the disk can never leave says so once."""
    name, client = bucket
    values = _values(24, base=250_000)
    put_many(client, name, values)
    disk = small_disk("size=2m")
    m = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(disk),
              "--cache-min-free", "0", env=s3_env)
    assert _read_in_threads(m.path, values, 8) == []
    assert "disk cache: cannot write" not in m.log_text(), m.log_text()
    assert _stats(m.path)["disk_cache_evictions"] > 0
    mount.cleanup()
    floor = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(disk), env=s3_env)
    assert _read_in_threads(floor.path, values, 2) == []
    assert floor.log_text().count("below --cache-min-free") == 1, floor.log_text()
    assert _cache_files(disk) == []


@pytest.mark.parametrize("spoil", ["lock", "directory"])
def test_a_spoilt_shared_cache_directory_fails_no_mount(mount, moto, s3_env, bucket, tmp_path, spoil):
    """The directory an immutable mount keeps for the next one replaced by a file, or its
    lock file by a directory: the next mount failed (exit 1, an errno); it now mounts,
    caches in a directory of its own and says why once."""
    cache = tmp_path / "cache"
    name, values, opts, _ = _immutable_mount(mount, moto, s3_env, bucket, cache, 2)
    mount.cleanup()
    [shared] = [p for p in cache.iterdir() if p.is_dir()]
    if spoil == "lock":
        (shared / ".lock").unlink(missing_ok=True)
        (shared / ".lock").mkdir()
    else:
        shutil.rmtree(shared)
        shared.write_bytes(b"not a directory")
    m = mount(f"s3://{name}", *opts, env=s3_env)
    for key, value in values.items():
        assert (m / key).read_bytes() == value
    assert m.log_text().count(f"cannot keep this mount's cache in {shared}") == 1, m.log_text()


def test_a_symlink_in_place_of_a_kept_cache_is_not_followed(mount, moto, s3_env, bucket, tmp_path):
    """The directory kept for a source's later mounts has a name anyone can compute. A
    symlink planted in its place was followed (mkdir's exist_ok), taken as that cache, and
    every file of its target removed as "no entry" (a helper's audit). The mount now caches
    in a directory of its own and says why once; the target keeps its files."""
    cache = tmp_path / "cache"
    name, values, opts, _ = _immutable_mount(mount, moto, s3_env, bucket, cache, 2)
    mount.cleanup()
    [shared] = [p for p in cache.iterdir() if p.is_dir()]
    shutil.rmtree(shared)
    victim = tmp_path / "thesis"
    victim.mkdir()
    (victim / "thesis.tex").write_text("mine")
    (victim / "src").mkdir()
    (victim / "src" / "main.c").write_text("mine too")
    shared.symlink_to(victim)
    mine = sorted(victim.rglob("*"))
    m = mount(f"s3://{name}", *opts, env=s3_env)
    for key, value in values.items():
        assert (m / key).read_bytes() == value
    assert m.log_text().count(f"cannot keep this mount's cache in {shared}") == 1, m.log_text()
    mount.cleanup()
    assert sorted(victim.rglob("*")) == mine
    assert (victim / "thesis.tex").read_text() == "mine"


def test_the_users_own_files_in_the_cache_dir_are_never_removed(mount, moto, s3_env, bucket, tmp_path):
    """--cache-dir may name a directory that holds the user's own files. A mount removed
    every "mount-*" directory in it that had a ".lock" file, or that was an hour old,
    as the leftover of a killed mount (a user's "mount-scripts/" went with its files);
    now only a directory zvfs made is. A killed mount's directory still goes."""
    name, client = bucket
    put_many(client, name, {"k": b"k" * 1000})
    cache = tmp_path / "mine"
    (cache / "mount-scripts").mkdir(parents=True)
    (cache / "mount-scripts" / "backup.sh").write_text("mine")
    an_hour_ago = time.time() - 7200
    os.utime(cache / "mount-scripts", (an_hour_ago, an_hour_ago))
    (cache / "mount-points").mkdir()
    (cache / "mount-points" / ".lock").write_text("")
    (cache / "mount-points" / "list").write_text("mine too")
    (cache / "notes.txt").write_text("mine")
    mine = sorted(p for p in cache.rglob("*"))
    opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(cache))
    m = mount(f"s3://{name}", *opts, env=s3_env)
    [pid] = daemon_pids(m.path)
    assert (m / "k").read_bytes() == b"k" * 1000
    os.kill(pid, signal.SIGKILL)  # leaves its directory behind
    mount.cleanup()
    assert len(sorted(p for p in cache.iterdir() if p.is_dir())) == 3
    again = mount(f"s3://{name}", *opts, env=s3_env)
    assert (again / "k").read_bytes() == b"k" * 1000
    mount.cleanup()
    assert sorted(p for p in cache.rglob("*")) == mine
    assert (cache / "mount-scripts" / "backup.sh").read_text() == "mine"


@pytest.mark.parametrize("keep", [(), ("--metadata-ttl", "indefinite")])
def test_a_cache_dir_removed_under_a_live_mount_fails_no_read(mount, moto, s3_env, bucket, tmp_path, keep):
    """The cache directory removed while the mount runs (a tmp cleaner, an rm -rf of
    ~/.cache): every read that missed the cache failed with EIO (the free space of a
    directory that is gone could not be asked); now it is read from the store, and the
    log says once that nothing more is kept."""
    name, client = bucket
    values = _values(5)
    put_many(client, name, values)
    cache = tmp_path / "cache"
    m = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(cache), *keep, env=s3_env)
    assert (m / "v/k0").read_bytes() == values["v/k0"]
    shutil.rmtree(cache)
    for key, value in values.items():
        assert (m / key).read_bytes() == value, key
    assert m.log_text().count("disk cache: cannot write") == 1, m.log_text()
    assert " ERROR " not in m.log_text()


def test_a_cold_read_past_the_ttl_asks_no_version_first(mount, moto, s3_env, bucket, tmp_path):
    """Past the TTL of the listing that named a chunk, a read of a chunk the disk does not
    hold asked its version (a HEAD) before the GET, which is pinned to the version and
    so checks it anyway: a cold read of data.raw a TTL into the mount took twice the
    requests. Only an entry the disk holds is asked about (it is served unread); a
    rewritten chunk still reads new."""
    import numpy as np
    import zarr

    name, client = bucket
    src = tmp_path / "src"
    g = zarr.open_group(zarr.storage.LocalStore(str(src)), mode="w", zarr_format=3)
    g.create_array("a", shape=(64, 64), chunks=(16, 16), dtype="int32")[:] = 1
    upload_tree(client, src, name, "")
    m = mount(f"s3://{name}", "--endpoint-url", moto.endpoint, "--cache-dir", str(tmp_path / "cache"),
              "--metadata-ttl", "1", env=s3_env)
    data = m / ".zvfs/arrays/a/data.raw"
    assert (m / ".zvfs/arrays/a/meta.json").read_bytes()
    time.sleep(1.5)
    before = _stats(m.path)
    assert data.read_bytes() == np.full((64, 64), 1, "int32").tobytes()
    after = _stats(m.path)
    gets = after["store_requests_get"] - before["store_requests_get"]
    heads = after["store_requests_info"] - before["store_requests_info"]
    assert gets >= 16 and heads <= 2, (gets, heads)  # 16 chunks; the metadata may be asked
    g["a"][:] = 2
    upload_tree(client, src, name, "")
    time.sleep(1.5)
    assert data.read_bytes() == np.full((64, 64), 2, "int32").tobytes()
    time.sleep(1.5)
    assert data.read_bytes() == np.full((64, 64), 2, "int32").tobytes()


def test_an_entry_replaced_by_a_fifo_holds_no_read(mount, moto, s3_env, bucket, tmp_path):
    """An entry file replaced by a FIFO while the mount runs: its open blocked until a
    writer came (the read hung, and a worker thread with it); now the entry is dropped
    and the key read from the store. The directory kept for later mounts is the
    mounting user's alone (it was 0755 with 0644 files: a private bucket's bytes for
    any local user to read)."""
    cache = tmp_path / "cache"
    name, values, opts, m = _immutable_mount(mount, moto, s3_env, bucket, cache, 1)
    mount.cleanup()
    [shared] = [p for p in cache.iterdir() if p.is_dir()]
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700
    others = {f"w/k{i}": os.urandom(200_000) for i in range(3)}
    put_many(bucket[1], name, others)
    m = mount(f"s3://{name}", *opts, "--cache-size", "300K", env=s3_env)
    [entry] = _entries_by_key(cache, values).values()
    entry.unlink()
    os.mkfifo(entry)
    for key, value in others.items():  # out of the memory cache
        assert (m / key).read_bytes() == value
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((m / "v/k0").read_bytes()), daemon=True)
    reader.start()
    reader.join(10)
    hung = reader.is_alive()
    if hung:
        os.close(os.open(entry, os.O_WRONLY | os.O_NONBLOCK))  # let the daemon go on
        reader.join(10)
    assert not hung
    assert got == [values["v/k0"]]
    assert "disk cache: dropped the cached copy of v/k0 " in m.log_text()


# -- the cache beside changes the mount makes (in process, over a store held mid-change) ---


class _HeldStore(DictStore):
    """A store of a dict whose rename and delete wait for ``go`` once they have begun
    (``begun``): a read can then come while S3 would be copying or deleting."""

    description = "held"
    can_write = True

    def __init__(self, values: dict[str, bytes]) -> None:
        super().__init__(dict(values))
        self.begun, self.go = threading.Event(), threading.Event()

    def info(self, key: str) -> KeyInfo:
        return KeyInfo(len(self.get(key)), 0, str(hash(self.get(key))))

    def _held(self) -> None:
        self.begun.set()
        assert self.go.wait(10)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        self._held()
        self.data[dst] = self.data.pop(src)

    def delete(self, key: str) -> None:
        self._held()
        del self.data[key]


@pytest.mark.parametrize("change", ["rename over it", "delete"])
def test_a_read_while_the_store_changes_a_key_keeps_no_old_bytes(tmp_path, change: str) -> None:
    """zarr-python writes a chunk as chunk.<id>.partial and renames it over the chunk. A read
    of the chunk while S3 copied it (a decoded reader beside the writer) cached the old bytes
    under no version, after the cache had let go of the key, and they were served after the
    rename: the old chunk until the TTL passed, for ever with metadata_ttl=indefinite; a
    deleted chunk's bytes in place of its fill value (a helper's audit). The key is let go
    again once the change is made."""
    from zvfs.cache.disk import DiskCachedStore
    from zvfs.stats import Counters

    inner = _HeldStore({"c/0": b"OLD" * 10, "c/0.partial": b"NEW" * 10})
    ds = DiskCachedStore(inner, tmp_path / "cache", 1 << 30, 0, persistent=False, counters=Counters(),
                         ttl=None)
    try:
        assert ds.get("c/0") == b"OLD" * 10
        call = (lambda: ds.rename("c/0.partial", "c/0")) if change != "delete" else (lambda: ds.delete("c/0"))
        changer = threading.Thread(target=call)
        changer.start()
        assert inner.begun.wait(10)
        assert ds.get("c/0") == b"OLD" * 10  # the store holds them still
        inner.go.set()
        changer.join(10)
        if change == "delete":
            with pytest.raises(KeyNotFound):
                ds.get("c/0")
        else:
            assert ds.get("c/0") == b"NEW" * 10
    finally:
        inner.go.set()
        ds.close()


def test_an_idle_kept_cache_mounted_again_keeps_its_entries(tmp_path, monkeypatch) -> None:
    """A mount at --cache-min-free evicts the entries of kept caches no mount uses, from a
    list it made once and used until it was empty. A source mounted again meanwhile lost
    the rest of its entries under its live mount, which then read them from the store
    again and counted bytes no longer on disk (a helper's audit). An entry is unlinked
    only while its directory is idle now."""
    from collections import namedtuple

    from zvfs.cache import disk
    from zvfs.stats import Counters

    top = tmp_path / "cache"
    cap = 40 << 20
    usage = namedtuple("usage", "total used free")

    def on_disk(path):  # type: ignore[no-untyped-def]
        os.stat(path)
        used = sum(p.stat().st_size for p in top.rglob("*") if p.is_file())
        return usage(cap, used, cap - used)

    monkeypatch.setattr(disk.shutil, "disk_usage", on_disk)

    def fill(ds, inner, prefix: str, n: int) -> None:  # type: ignore[no-untyped-def]
        for i in range(n):
            key = f"{prefix}{i}"
            inner.data[key] = bytes([i]) * (1 << 20)
            ds.info(key)
            assert ds.get(key) == inner.data[key]

    y_store, x_store = _HeldStore({}), _HeldStore({})
    y = disk.DiskCachedStore(y_store, top, 1 << 40, 0, True, Counters(), identity="Y", ttl=None)
    fill(y, y_store, "y", 20)
    kept = y.dir
    y.close()
    a = disk.DiskCachedStore(x_store, top, 1 << 40, 10 << 20, False, Counters(), identity="X", ttl=60.0)
    try:
        fill(a, x_store, "x", 12)  # past the floor: Y's idle entries go first

        def entries() -> int:
            return sum(1 for p in kept.iterdir() if disk._is_entry(p.name))

        left = entries()
        assert 0 < left < 20 and a._idle  # some went, more are listed to go
        y = disk.DiskCachedStore(y_store, top, 1 << 40, 0, True, Counters(), identity="Y", ttl=None)
        try:
            assert y.dir == kept
            fill(a, x_store, "z", 5)  # room wanted again
            assert entries() == left
        finally:
            y.close()
    finally:
        a.close()

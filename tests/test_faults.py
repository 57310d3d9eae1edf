"""S3 under injected faults: the fault proxy (tests/faultproxy.py) sits between zvfs and moto.

Every read is compared with what zarr-python wrote (decoded views) or with the
uploaded bytes (raw tree). Faults are injected on purpose, by rule, never left
to chance: transient kinds at 20% must be invisible to readers, permanent
ones (or transient ones that never stop) fail one read with EIO within the
documented bound, log one line naming the key, and leave the daemon serving.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    daemon_pids,
    is_mounted,
    read_errno,
    run,
    s3_client,
    store_files,
    tool,
    upload_tree,
    wait_until,
)
from faultproxy import FaultProxy

BUCKET = "faults"
TRANSIENT = ["503", "500", "429", "reset", "truncate"]
# short budgets so a test of a dead endpoint takes seconds: documented bound
# s3_deadline + s3_timeout + 2 s of backoff
FAST = ["--s3-timeout", "1", "--s3-deadline", "4"]
#: the README's bound for a read that cannot be served, under FAST, plus 3 s of slack: the
#: kernel asks twice (its read-ahead, then the page; 2 READs seen), and each request gives
#: up within deadline + timeout + the backoff cap (2 s)
EIO_WITHIN = 2 * (4 + 1 + 2) + 3


def build_store(root: Path) -> dict[str, np.ndarray]:
    """A store with plain, compressed, sharded and v2 arrays; returns path -> reference
    (zarr-python reading back what it wrote, in the declared dtype)."""
    import zarr

    rng = np.random.default_rng(8)
    store = zarr.storage.LocalStore(str(root))
    g = zarr.open_group(store, mode="w", zarr_format=3)
    a = g.create_array("plain", shape=(64, 64), chunks=(16, 16), dtype="<f4", compressors=None)
    a[:] = rng.standard_normal((64, 64)).astype("<f4")
    b = g.create_array("zstd", shape=(200, 50), chunks=(50, 25), dtype="<i8")
    b[:] = rng.integers(-(10**12), 10**12, size=(200, 50))
    c = g.create_array("sharded", shape=(64, 64), chunks=(64, 32), shards=(64, 64), dtype="<u2")
    c[:] = rng.integers(0, 60000, size=(64, 64), dtype="<u2")
    s = g.create_array("sparse", shape=(40, 40), chunks=(10, 10), dtype="<i4", fill_value=-7)
    s[0:10, 0:10] = 3
    v2 = zarr.open_group(store, path="old", mode="w", zarr_format=2)
    d = v2.create_array("v2arr", shape=(30, 30), chunks=(7, 7), dtype=">i2")
    d[:] = rng.integers(-3000, 3000, size=(30, 30)).astype(">i2")
    (root / "blob.bin").write_bytes(rng.bytes(5 << 20))  # two raw blocks, ranged GETs
    (root / "notes.txt").write_bytes(b"plain file\n" * 100)
    refs = {}
    for path in ("plain", "zstd", "sharded", "sparse", "old/v2arr"):
        arr = zarr.open_array(store, path=path, mode="r")
        refs[path] = np.ascontiguousarray(arr[...]).astype(arr.dtype)
    refs["old/v2arr"] = refs["old/v2arr"].astype(">i2")
    return refs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, moto):
    root = tmp_path_factory.mktemp("faults") / "store.zarr"
    refs = build_store(root)
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket=BUCKET)
    upload_tree(client, root, BUCKET, "s")
    return root, refs


@pytest.fixture
def proxy(moto):
    with FaultProxy(moto.port, seed=int.from_bytes(os.urandom(2), "big")) as p:
        print(f"fault proxy seed {p.seed}")
        yield p


def mount_s3(mount, proxy, s3_env, *opts: str, check: bool = True):
    return mount(f"s3://{BUCKET}/s", "--endpoint-url", proxy.endpoint, "--cache-size", "4M",
                 *opts, env=s3_env, check=check)


def mount_tree(root: Path, bucket: str, moto, proxy, mount, s3_env, *opts: str):
    """``root`` uploaded to a bucket of its own, and mounted through the proxy."""
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket=bucket)
    upload_tree(client, root, bucket, "t")
    return mount(f"s3://{bucket}/t", "--endpoint-url", proxy.endpoint, *opts, env=s3_env)


def read_all(path: Path, bs: int = 1 << 16) -> bytes:
    with open(path, "rb", buffering=0) as f:
        out = bytearray()
        while chunk := f.read(bs):
            out += chunk
        return bytes(out)


def expected_files(corpus) -> dict[str, bytes]:
    root, refs = corpus
    out = {f"raw:{k}": p.read_bytes() for k, p in store_files(root).items()}
    for path, ref in refs.items():
        out[f"dec:{path}"] = ref.tobytes()
    return out


def target(mnt, name: str) -> Path:
    kind, _, key = name.partition(":")
    return mnt.path / key if kind == "raw" else mnt.path / ".zvfs/arrays" / key / "data.raw"


def stats(mnt) -> dict:
    return json.loads((mnt.path / ".zvfs/stats.json").read_bytes())


@pytest.mark.parametrize("readers", [1, 8])
def test_transient_faults_are_invisible(readers, corpus, proxy, mount, s3_env) -> None:
    """20% of GET/HEAD/LIST fail (503, 500, 429, reset, truncated body) and 5% of the GETs
    that carry S3's CRC come back with a flipped byte: every file reads back identical."""
    mnt = mount_s3(mount, proxy, s3_env)
    want = expected_files(corpus)
    proxy.set({"kinds": TRANSIENT, "rate": 0.2, "ops": ["get", "head", "list"]},
              {"kinds": ["flip"], "rate": 0.05, "ops": ["get"]})
    names = sorted(want)
    errors: list[str] = []

    def reader(n: int) -> None:
        order = names[n % len(names):] + names[: n % len(names)]
        for name in order:
            try:
                got = read_all(target(mnt, name), bs=(1 << 16) + n * 4096)
            except OSError as exc:
                errors.append(f"{name}: {exc}")
                continue
            if got != want[name]:
                errors.append(f"{name}: wrong bytes ({len(got)} of {len(want[name])})")

    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(reader, range(readers)))
    st = proxy.stats()
    proxy.clear()
    assert errors == [], f"{errors}\nproxy: {st}\nlog:\n{mnt.log_text()[-3000:]}"
    assert st["faults"] >= 10, st  # the faults really happened
    counters = stats(mnt)
    # read-ahead may still be retrying a faulted request in the background: at least
    # every fault some reader waited for was retried
    assert counters["store_retries"] >= 1, (counters, st)
    # each injected kind shows in its counter (a read-ahead request that met it may
    # still be on its way back: wait for it, the counter is bumped as the fault is seen)
    for fault, counter in (("fault_flip", "store_errors_checksum"),
                           ("fault_truncate", "store_errors_truncated")):
        if st.get(fault):
            assert wait_until(lambda c=counter: stats(mnt)[c] >= 1, 10), (stats(mnt), st)


def test_truncated_body_resumes_from_its_offset(corpus, proxy, mount, s3_env) -> None:
    # a cache that holds the object's 4 MiB blocks: each block is fetched once
    mnt = mount_s3(mount, proxy, s3_env, "--cache-size", "64M")
    root, _ = corpus
    os.listdir(mnt.path)
    size = (root / "blob.bin").stat().st_size
    time.sleep(0.5)  # the mount's background metadata reads are done
    proxy.reset_stats()
    proxy.set({"kind": "truncate", "count": 1, "ops": ["get"], "key": "blob.bin"})
    assert read_all(mnt.path / "blob.bin") == (root / "blob.bin").read_bytes()
    st = proxy.stats()
    assert st["fault_truncate"] == 1
    assert stats(mnt)["store_errors_truncated"] == 1
    # the resumed request asked only for what was missing: the body bytes sent come to one
    # copy of the object (a restart would send the cut half of a 1 or 4 MiB block again)
    assert size <= st["body_bytes_get"] < size + (256 << 10), (size, st)


@pytest.mark.parametrize("kind", ["whole", "short"])
def test_a_range_answered_whole_or_short_reads_right(kind, corpus, proxy, mount, s3_env) -> None:
    """A ranged GET answered with the whole object (a 200: the Range ignored, as RFC 9110
    lets a server or proxy do) or with half the range (a 206 whose Content-Range says so):
    zvfs took either body as the range, and served wrong bytes, with nothing logged. Now
    the whole answer is cut to the range, and the short one is resumed where it stopped."""
    mnt = mount_s3(mount, proxy, s3_env, "--cache-size", "64M")
    root, refs = corpus
    want = (root / "blob.bin").read_bytes()
    os.listdir(mnt.path)
    time.sleep(0.5)  # the mount's background metadata reads are done
    proxy.reset_stats()
    # the short answers stop after 3 (each resume is a try of the request's 10); the
    # sharded array's shard index is read with a suffix range (bytes=-N)
    count = {"count": 3} if kind == "short" else {}
    proxy.set({"kind": kind, "ops": ["get"], "key": "blob.bin", **count},
              {"kind": kind, "ops": ["get"], "key": "sharded/c", **count})
    with open(mnt.path / "blob.bin", "rb", buffering=0) as f:  # the second block first
        f.seek(4 << 20)
        assert f.read(1 << 20) == want[4 << 20:]
    assert read_all(mnt.path / "blob.bin") == want
    assert read_all(target(mnt, "dec:sharded")) == refs["sharded"].tobytes()
    assert proxy.stats()[f"fault_{kind}"] >= 1
    if kind == "short":
        assert stats(mnt)["store_errors_truncated"] >= 1


@pytest.mark.parametrize("key", ["notes.txt", "blob.bin", "sparse/zarr.json"])
def test_a_body_that_never_ends_fails_that_read_in_bounded_memory(key, corpus, proxy, mount, s3_env) -> None:
    """A GET answered with a Content-Length of 2**40 and a body that never ends: a whole
    GET (a small file), a ranged one (a block of a big file) and a metadata document.
    zvfs read until the server stopped: 9 GB of RSS in 25 s (the audit). Now it reads no
    more than it asked for, or than a metadata document may hold: each read fails (EIO) or
    gives what the server sent cut to the listed size (a server that lies about an
    object's bytes cannot be caught without a checksum), in bounded time and memory, and
    the rest serves."""
    from stress_lib import proc_status

    root, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env, *FAST, "--metadata-ttl", "0")
    os.listdir(mnt.path)
    pid, = daemon_pids(mnt.path)
    proxy.set({"kind": "endless", "ops": ["get"], "key": key})
    path = mnt.path / key if not key.endswith("zarr.json") else mnt.path / ".zvfs/arrays/sparse/data.raw"
    t0 = time.monotonic()
    try:
        got = read_all(path)
    except OSError as exc:
        assert exc.errno in (errno.EIO, errno.ENOENT), exc
    else:  # cut at the listed size: the bytes of the server's body
        assert not key.endswith("zarr.json") and len(got) == (root / key).stat().st_size, len(got)
    assert time.monotonic() - t0 < EIO_WITHIN
    assert proc_status(pid)["VmHWM"] < 400 << 20, proc_status(pid)
    proxy.clear()
    assert read_all(target(mnt, "dec:plain")) == refs["plain"].tobytes()
    assert is_mounted(mnt.path)


def test_a_body_trickling_in_fails_at_the_deadline(corpus, proxy, mount, s3_env) -> None:
    """A body sent a byte at a time never trips the timeout between bytes: the read waited
    for the whole body, 230 s and more in the audit, past the README's bound. Now the body
    counts against the request's deadline, and the read fails within the bound."""
    root, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env, *FAST)
    os.listdir(mnt.path)
    proxy.set({"kind": "trickle", "ops": ["get"], "key": "notes.txt"})
    t0 = time.monotonic()
    with pytest.raises(OSError) as exc:
        read_all(mnt.path / "notes.txt")
    assert exc.value.errno == errno.EIO
    assert time.monotonic() - t0 < EIO_WITHIN
    assert "notes.txt" in mnt.log_text() and "deadline" in mnt.log_text(), mnt.log_text()[-2000:]
    proxy.clear()
    assert read_all(mnt.path / "notes.txt") == (root / "notes.txt").read_bytes()


def test_flipped_byte_is_caught_by_the_checksum(corpus, proxy, mount, s3_env) -> None:
    """A whole-object GET whose body has one flipped byte (S3 sent its CRC): retried, never served."""
    mnt = mount_s3(mount, proxy, s3_env)
    root, _ = corpus
    os.listdir(mnt.path)
    proxy.set({"kind": "flip", "count": 1, "ops": ["get"], "key": "notes.txt"})
    assert read_all(mnt.path / "notes.txt") == (root / "notes.txt").read_bytes()
    st = proxy.stats()
    assert st["fault_flip"] == 1 and not st.get("flip_not_checkable"), st
    assert stats(mnt)["store_errors_checksum"] == 1
    assert stats(mnt)["store_retries"] >= 1


def test_listed_key_that_answers_404(corpus, proxy, mount, s3_env) -> None:
    """A key the listing showed, whose GET says NoSuchKey: that read fails (ENOENT, the key
    vanished), nothing else does, the daemon keeps serving, and the 404 is not remembered."""
    root, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env)
    assert "notes.txt" in os.listdir(mnt.path)
    proxy.set({"kind": "404", "ops": ["get"], "key": "notes.txt"})
    with pytest.raises(OSError) as exc:
        read_all(mnt.path / "notes.txt")
    assert exc.value.errno == errno.ENOENT, (exc.value, mnt.log_text()[-2000:])
    assert proxy.stats()["fault_404"] >= 1
    assert read_all(target(mnt, "dec:plain")) == refs["plain"].tobytes()
    assert is_mounted(mnt.path) and daemon_pids(mnt.path)
    proxy.clear()
    assert read_all(mnt.path / "notes.txt") == (root / "notes.txt").read_bytes()


def test_persistent_failure_is_eio_logged_and_not_remembered(corpus, proxy, mount, s3_env) -> None:
    root, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env, *FAST)
    os.listdir(mnt.path)
    (mnt.path / ".zvfs/arrays/plain/data.raw").stat()
    proxy.set({"kind": "503", "ops": ["get", "head"]})
    for name in ("raw:notes.txt", "dec:plain"):
        t0 = time.monotonic()
        with pytest.raises(OSError) as exc:
            read_all(target(mnt, name))
        took = time.monotonic() - t0
        assert exc.value.errno == errno.EIO
        assert took < EIO_WITHIN, f"{name}: EIO after {took:.1f} s"
    log = mnt.log_text()
    lines = [ln for ln in log.splitlines() if "SlowDown" in ln]
    # one line with the key and S3's error code (per key: data.raw met several chunks)
    assert len([ln for ln in lines if "notes.txt" in ln]) == 1, log
    chunk_lines = [ln for ln in lines if "plain/c/" in ln]
    assert chunk_lines, log
    chunk_keys = [re.search(r"plain/c/[0-9/]+", ln).group(0) for ln in chunk_lines]
    assert len(chunk_keys) == len(set(chunk_keys)), chunk_lines
    assert is_mounted(mnt.path) and daemon_pids(mnt.path)
    proxy.clear()
    # the first read after the faults stop succeeds: a transient failure is never remembered
    assert read_all(mnt.path / "notes.txt") == (root / "notes.txt").read_bytes()
    assert read_all(target(mnt, "dec:plain")) == refs["plain"].tobytes()


@pytest.mark.parametrize("view", ["netcdf", "arrays/labels"])
def test_a_store_failure_measuring_text_is_eio_and_not_remembered(
        corpus, proxy, mount, s3_env, moto, tmp_path, view: str) -> None:
    """The netCDF view, and data.npy, read a variable-length string array whole, when their
    directory is listed, for its width. A store failure then fails that listing with EIO
    (the array is not left out for it, as it would be for a corrupt chunk), and the next
    listing, the faults gone, serves the strings as zarr-python reads them."""
    import netCDF4
    import zarr

    root = tmp_path / "text.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    labels = g.create_array("labels", shape=(5,), chunks=(2,), dtype=str, dimension_names=["n"])
    labels[:] = np.array(["α", "beta", "", "gämma", "d"], dtype=object)
    want = zarr.open_array(str(root), path="labels", mode="r")[:].tolist()
    mnt = mount_tree(root, "zvfs-text", moto, proxy, mount, s3_env, *FAST)
    os.listdir(mnt.path / ".zvfs/arrays")  # the metadata read: what fails below is the chunks
    proxy.set({"kind": "503", "ops": ["get", "head"], "key": "labels/c/"})
    t0 = time.monotonic()
    with pytest.raises(OSError) as exc:
        os.listdir(mnt.path / ".zvfs" / view)
    assert exc.value.errno == errno.EIO
    assert time.monotonic() - t0 < EIO_WITHIN
    assert any("labels/c/" in ln for ln in mnt.log_text().splitlines()), mnt.log_text()[-2000:]
    proxy.clear()
    if view == "netcdf":
        assert os.listdir(mnt.path / ".zvfs/netcdf") == ["root.nc"]
        with netCDF4.Dataset(mnt.path / ".zvfs/netcdf/root.nc") as nc:
            assert nc["labels"][:].tolist() == want
            assert "zvfs_left_out" not in nc.ncattrs()
    else:
        assert sorted(os.listdir(mnt.path / ".zvfs" / view)) == ["data.npy", "data.raw", "meta.json"]
        assert np.load(mnt.path / ".zvfs" / view / "data.npy").tolist() == want


def test_a_read_of_more_chunks_than_its_file_may_hold_threads_fails_within_one_bound(
        corpus, proxy, mount, s3_env) -> None:
    """A decoded read over more chunks than one file's reads may hold threads for (14 of
    the 16 by default; 1 of 2 here) waited for every chunk, each wave of them up to the
    deadline: past the README's bound for a read that cannot be served (a persistent 503
    here: 16 chunks took 16 deadlines a try). The read fails with its first chunk; the
    chunks still waiting for a thread never start."""
    deadline, timeout = 1, 1
    mnt = mount_s3(mount, proxy, s3_env, "--s3-timeout", str(timeout), "--s3-deadline", str(deadline),
                   "--threads", "2")
    (mnt.path / ".zvfs/arrays/plain/data.raw").stat()  # 16 chunks of 16 x 16
    proxy.set({"kind": "503", "ops": ["get", "head"]})
    t0 = time.monotonic()
    with pytest.raises(OSError) as exc:
        read_all(target(mnt, "dec:plain"))
    took = time.monotonic() - t0
    assert exc.value.errno == errno.EIO
    # the README's bound (the kernel asks twice), and the slack EIO_WITHIN gives
    assert took < 2 * (deadline + timeout + 2) + 3, f"EIO after {took:.1f} s"
    assert is_mounted(mnt.path)
    proxy.clear()
    assert read_all(target(mnt, "dec:plain")) == corpus[1]["plain"].tobytes()


def test_access_denied_names_the_credentials(corpus, proxy, mount, s3_env) -> None:
    mnt = mount_s3(mount, proxy, s3_env)
    os.listdir(mnt.path)
    proxy.set({"kind": "403", "ops": ["get"]})
    with pytest.raises(OSError) as exc:
        read_all(mnt.path / "notes.txt")
    assert exc.value.errno == errno.EIO
    lines = [ln for ln in mnt.log_text().splitlines() if "AccessDenied" in ln]
    assert len(lines) == 1 and "credentials" in lines[0] and "notes.txt" in lines[0], lines
    proxy.clear()
    assert read_all(mnt.path / "notes.txt") == (corpus[0] / "notes.txt").read_bytes()


def test_failed_listing_is_not_cached(corpus, proxy, mount, s3_env) -> None:
    """403 on LIST while .zvfs/ is first listed, with an indefinite TTL: the arrays appear
    once the listing works again. The faults stop when that first listing has returned (a
    window of 2, then 5 s from the proxy's set stood for that, and the first listing may
    first import the decoded views: on a busy machine its first request could come after)."""
    _, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env, "--metadata-ttl", "indefinite")
    proxy.set({"kinds": ["403"], "ops": ["list", "get", "head"]})
    arrays = mnt.path / ".zvfs/arrays"
    try:
        first = sorted(os.listdir(arrays))
    except OSError as exc:
        first = [f"error {exc.errno}"]
    proxy.clear()
    assert "plain" not in first, "the faults did not hit the first listing"
    assert wait_until(lambda: "plain" in os.listdir(arrays), 10), os.listdir(arrays)
    assert sorted(os.listdir(arrays)) == ["old", "plain", "sharded", "sparse", "zstd"], first
    assert read_all(arrays / "sharded/data.raw") == refs["sharded"].tobytes()


def test_an_array_looked_up_while_the_store_fails_is_eio_not_enoent(corpus, proxy, mount, s3_env) -> None:
    """While the store failed, the decoded views were discovered without the arrays it hid,
    and a path below .zvfs/ was ENOENT, "no such file", which the kernel may also cache
    (a helper's audit). It is EIO, and the array reads once the store answers again."""
    _, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env, *FAST)
    proxy.set({"kinds": ["403"], "ops": ["list", "get", "head"]})
    raw = mnt.path / ".zvfs/arrays/plain/data.raw"
    with pytest.raises(OSError) as ei:
        raw.stat()
    assert ei.value.errno == errno.EIO, ei.value
    proxy.clear()

    def back() -> bool:
        try:
            return raw.stat().st_size > 0
        except OSError as exc:
            assert exc.errno == errno.EIO, exc
            return False

    assert wait_until(back, 10), mnt.log_text()[-3000:]
    assert read_all(raw) == refs["plain"].tobytes()


def test_silent_endpoint_gives_up_and_sigterm_unmounts(corpus, proxy, mount, s3_env) -> None:
    mnt = mount_s3(mount, proxy, s3_env, *FAST)
    os.listdir(mnt.path)
    proxy.set({"kind": "silent", "ops": ["get"]})
    t0 = time.monotonic()
    with pytest.raises(OSError) as exc:
        read_all(mnt.path / "notes.txt")
    assert exc.value.errno == errno.EIO
    assert time.monotonic() - t0 < EIO_WITHIN
    assert "notes.txt" in mnt.log_text()
    # a read hangs on the silent endpoint again; SIGTERM must still unmount at once
    pids = daemon_pids(mnt.path)
    assert len(pids) == 1
    hung = threading.Thread(target=lambda: _swallow(read_all, mnt.path / "blob.bin"), daemon=True)
    hung.start()
    time.sleep(0.5)
    os.kill(pids[0], signal.SIGTERM)
    assert wait_until(lambda: not is_mounted(mnt.path), 10), "SIGTERM did not unmount"
    assert wait_until(lambda: not Path(f"/proc/{pids[0]}").exists(), 10)


def test_a_file_whose_reads_stall_leaves_threads_for_the_other_files(corpus, proxy, mount, s3_env) -> None:
    """The server answers nothing for one array's chunks: its reads took every worker
    thread (each up to the deadline, 60 s by default), and a read of any other file of the
    mount waited behind them (178 s for a read of another array while 40 readers of the
    stalled one ran on 16 threads). The reads of one file now hold at most all threads but
    an eighth, one at least (3 of 4 here): another array reads, right, while the stall lasts."""
    root, refs = corpus
    mnt = mount_s3(mount, proxy, s3_env, "--threads", "4", "--s3-deadline", "120")
    views = mnt.path / ".zvfs" / "arrays"
    assert (views / "plain" / "data.raw").stat().st_size == refs["plain"].nbytes  # metadata read
    assert (views / "zstd" / "data.raw").stat().st_size == refs["zstd"].nbytes
    proxy.set({"kind": "silent", "ops": ["get"], "key": "/plain/c/"})
    stalled = threading.Thread(target=lambda: _swallow(read_all, views / "plain" / "data.raw"), daemon=True)
    other: list[bytes] = []
    reader = threading.Thread(target=lambda: other.append(read_all(views / "zstd" / "data.raw")), daemon=True)
    try:
        stalled.start()  # its 16 chunks at once: as many threads as it may take
        assert wait_until(lambda: proxy.stats().get("fault_silent", 0) >= 3, 30), proxy.stats()
        reader.start()
        reader.join(30)  # without the bound, until the stall ends: here, not before the rules change
        assert other == [refs["zstd"].tobytes()], "a read of another array waited on the stalled one"
    finally:
        proxy.set()  # the stalled requests are reset, and tried again unhindered
        stalled.join(60)
        reader.join(60)
    assert read_all(views / "plain" / "data.raw") == refs["plain"].tobytes()


def test_uploads_the_server_stalls_leave_threads_for_reads(corpus, moto, proxy, mount, s3_env) -> None:
    """The server answers no PUT: the closes of 40 files written at once held all 16 worker
    threads (each upload up to the 60 s deadline), and a read of any other file waited 117 s
    behind them. Every write's store calls now count as one flow of the threads (see
    workers.current_flow): they hold all but an eighth, and a read goes on while the
    uploads wait."""
    client = s3_client(moto.endpoint)  # the corpus's bucket, another prefix
    other = os.urandom(100_000)
    client.put_object(Bucket=BUCKET, Key="wstall/other.bin", Body=other)
    try:
        mnt = mount(f"s3://{BUCKET}/wstall", "--endpoint-url", proxy.endpoint, "--writable",
                    "--threads", "4", "--s3-deadline", "120", env=s3_env)
        assert os.listdir(mnt.path) == ["other.bin"]
        proxy.set({"kind": "silent", "ops": ["put"]})

        def write(i: int) -> None:
            (mnt.path / f"new{i}.bin").write_bytes(b"%d" % i)

        writers = [threading.Thread(target=_swallow, args=(write, i), daemon=True) for i in range(6)]
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(read_all(mnt.path / "other.bin")), daemon=True)
        try:
            for t in writers:
                t.start()
            assert wait_until(lambda: proxy.stats().get("fault_silent", 0) >= 3, 30), proxy.stats()
            reader.start()
            reader.join(30)  # without the bound, until the stall ends: here, not before the rules change
            assert got == [other], "a read waited on the stalled uploads"
        finally:
            proxy.set()  # the stalled uploads are reset, and tried again unhindered
            for t in [*writers, reader]:
                t.join(60)
        for i in range(6):
            assert client.get_object(Bucket=BUCKET, Key=f"wstall/new{i}.bin")["Body"].read() == b"%d" % i
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="wstall/"):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def _swallow(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def test_status_of_a_mount_whose_probe_sleeps_in_the_kernel_says_hung_in_its_timeout(
        corpus, moto, proxy, mount, s3_env) -> None:
    """A lookup of a name waits, uninterruptibly, for another lookup of the same name in
    flight: here a stat of ``.zvfs/stats.json`` (the store's: decoded=off) whose listing the
    server never answers. status's probe looks that name up, and is killed at its timeout,
    but cannot end until the other lookup does: subprocess.run's wait after the kill held
    `zvfs status` that long (a helper found it behind a writable mount's stuck request).
    The probe is not waited for now: status says hung within its timeout."""
    client = s3_client(moto.endpoint)
    client.put_object(Bucket=BUCKET, Key="stuck/.zvfs/stats.json", Body=b"{}")
    client.put_object(Bucket=BUCKET, Key="stuck/a", Body=b"hi")
    mnt = mount(f"s3://{BUCKET}/stuck", "--endpoint-url", proxy.endpoint, "-o", "decoded=off",
                "--s3-deadline", "120", "--metadata-ttl", "0", env=s3_env)
    assert sorted(os.listdir(mnt.path)) == [".zvfs", "a"]
    proxy.set({"kind": "silent", "ops": ["list", "head"]})  # a lookup relists (metadata_ttl 0)
    stuck = threading.Thread(target=_swallow, args=(os.stat, mnt.path / ".zvfs" / "stats.json"), daemon=True)
    try:
        stuck.start()
        assert wait_until(lambda: proxy.stats().get("fault_silent", 0) >= 1, 30), proxy.stats()
        t0 = time.monotonic()
        res = run([tool("zvfs"), "status", str(mnt.path), "--json", "--timeout", "2"], timeout=60)
        took = time.monotonic() - t0
        assert res.returncode == 1, res
        assert json.loads(res.stdout)[0]["health"] == "hung", res.stdout
        assert took < 10, took
    finally:
        proxy.set()  # the silent requests are reset and tried again: the stat ends
        stuck.join(60)
    assert (mnt.path / "a").read_text() == "hi"


def test_stall_longer_than_timeout_is_retried(corpus, proxy, mount, s3_env) -> None:
    mnt = mount_s3(mount, proxy, s3_env, *FAST)
    os.listdir(mnt.path)
    proxy.set({"kind": "stall", "stall": 3, "count": 1, "ops": ["get"]})
    assert read_all(mnt.path / "notes.txt") == (corpus[0] / "notes.txt").read_bytes()
    assert stats(mnt)["store_errors_timeout"] >= 1


def _credential_process_profile(tmp_path: Path, s3_env: dict, profile: str, helper: Path) -> dict:
    """The environment of a mount whose credentials come from the Python script ``helper`` as
    the credential_process of ``profile`` (the keys of the environment taken away)."""
    config = tmp_path / "config"
    config.write_text(f"[profile {profile}]\ncredential_process = {sys.executable} {helper}\n"
                      "region = us-east-1\n")
    env = {k: v for k, v in s3_env.items() if k not in
           ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")}
    env["AWS_CONFIG_FILE"] = str(config)
    return env


def test_rotated_credentials_are_picked_up(corpus, proxy, mount, s3_env, tmp_path) -> None:
    """A credential_process profile whose key the server starts refusing (ExpiredToken):
    the next read reloads the credential chain, without a remount."""
    keyfile = tmp_path / "key"
    keyfile.write_text("ROTATEDKEY1")
    helper = tmp_path / "creds.py"
    helper.write_text(
        "import json, pathlib\n"
        f"k = pathlib.Path({str(keyfile)!r}).read_text().strip()\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': k, 'SecretAccessKey': 's'}))\n"
    )
    env = _credential_process_profile(tmp_path, s3_env, "rot", helper)
    mnt = mount_s3(mount, proxy, env, "--profile", "rot")
    assert read_all(mnt.path / "notes.txt") == (corpus[0] / "notes.txt").read_bytes()
    keyfile.write_text("ROTATEDKEY2")
    proxy.set(reject_keys=["ROTATEDKEY1"])
    assert read_all(mnt.path / "blob.bin") == (corpus[0] / "blob.bin").read_bytes()
    assert proxy.stats()["fault_expired"] >= 1
    assert "reloading" in mnt.log_text()


def test_a_revoked_key_replaced_in_the_credentials_file_is_picked_up(auth_moto, mount, s3_env,
                                                                      tmp_path) -> None:
    """A key deleted from IAM (S3 answers 403 InvalidAccessKeyId) fails the read with EIO and
    a line asking to fix the credentials, "zvfs picks up new ones without a remount"; once
    the credentials file holds a new key, the next read uses it. Only an ExpiredToken made
    the daemon read the chain again: a revoked key stayed in use, every read failing with
    EIO until a remount (moto in auth mode, real IAM keys)."""
    iam = auth_moto.client("iam")
    iam.create_user(UserName="rotating")
    iam.put_user_policy(UserName="rotating", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    old, new = ((k["AccessKeyId"], k["SecretAccessKey"]) for k in
                (iam.create_access_key(UserName="rotating")["AccessKey"] for _ in range(2)))
    admin = auth_moto.client("s3")
    admin.create_bucket(Bucket="revoked-key")
    for name in ("a.txt", "b.txt"):  # at the bucket's root: see auth_moto on moto's Prefix
        admin.put_object(Bucket="revoked-key", Key=name, Body=f"body of {name}\n".encode())
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {old[0]}\naws_secret_access_key = {old[1]}\n")
    env = {k: v for k, v in s3_env.items() if k not in
           ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")}
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    mnt = mount("s3://revoked-key", "--endpoint-url", auth_moto.endpoint, env=env)
    assert (mnt.path / "a.txt").read_bytes() == b"body of a.txt\n"

    iam.delete_access_key(UserName="rotating", AccessKeyId=old[0])
    assert read_errno(mnt.path / "b.txt") == errno.EIO
    lines = [ln for ln in mnt.log_text().splitlines() if "InvalidAccessKeyId" in ln]
    assert len(lines) == 1 and "without a remount" in lines[0], lines

    creds.write_text(f"[default]\naws_access_key_id = {new[0]}\naws_secret_access_key = {new[1]}\n")
    assert (mnt.path / "b.txt").read_bytes() == b"body of b.txt\n"
    assert is_mounted(mnt.path)


def _denied_one_key(auth_moto, s3_env, user: str, bucket: str, names: tuple[str, ...],
                    denied: str, actions: tuple[str, ...] = ("s3:GetObject",)) -> dict:
    """An IAM user allowed everything but ``actions`` on ``bucket/denied``, a bucket holding
    ``names`` (at its root: see auth_moto on moto's Prefix), and the environment of a mount
    with the user's key."""
    iam = auth_moto.client("iam")
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Effect": "Deny", "Action": list(actions), "Resource": f"arn:aws:s3:::{bucket}/{denied}"}]}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    admin = auth_moto.client("s3")
    admin.create_bucket(Bucket=bucket)
    for name in names:
        admin.put_object(Bucket=bucket, Key=name, Body=f"body of {name}\n".encode())
    env = {k: v for k, v in s3_env.items() if k not in ("AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")}
    return env | {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def test_a_key_a_policy_denies_fails_alone_with_a_line_naming_the_policy(auth_moto, mount, s3_env,
                                                                           tmp_path) -> None:
    """An IAM policy that denies GetObject of one key (moto in auth mode): that file fails
    with EIO, the others read, and the line says a policy refuses it. It said "The
    credentials were rejected ... fix them ... zvfs picks up new ones without a remount",
    which sent the user to credentials that were fine (and an AccessDenied looks for no new
    ones)."""
    env = _denied_one_key(auth_moto, s3_env, "partial", "denied-key", ("a.txt", "secret.txt", "z.txt"),
                          "secret.txt")
    mnt = mount("s3://denied-key", "--endpoint-url", auth_moto.endpoint, env=env)
    assert read_errno(mnt.path / "secret.txt") == errno.EIO
    for name in ("a.txt", "z.txt"):
        assert (mnt.path / name).read_bytes() == f"body of {name}\n".encode()
    lines = [ln for ln in mnt.log_text().splitlines() if "AccessDenied" in ln]
    assert len(lines) == 1 and "secret.txt" in lines[0] and "policy" in lines[0], lines
    assert "rejected" not in lines[0] and "without a remount" not in lines[0], lines


def test_a_refused_head_does_not_blame_the_credentials_alone(auth_moto, mount, s3_env) -> None:
    """S3 answers a HEAD it refuses with a bare 403, no reason: a rename on a writable mount
    of a key a policy denies (its HeadObject) failed with EIO and "The credentials were
    rejected ... fix them", though they were fine. The line now says it may be either."""
    # AWS checks a HEAD against s3:GetObject; moto from 5.2.6 against "s3:HeadObject", an
    # action AWS does not have (and so a deny of it changes nothing there): deny both
    env = _denied_one_key(auth_moto, s3_env, "nohead", "head-denied", ("a.txt", "secret.txt"), "secret.txt",
                          ("s3:GetObject", "s3:HeadObject"))
    mnt = mount("s3://head-denied", "--endpoint-url", auth_moto.endpoint, "--writable", env=env)
    with pytest.raises(OSError) as err:
        os.rename(mnt.path / "secret.txt", mnt.path / "moved.txt")
    assert err.value.errno == errno.EIO
    lines = [ln for ln in mnt.log_text().splitlines() if "HeadObject refused" in ln]
    assert len(lines) == 1 and "secret.txt" in lines[0] and "policy" in lines[0], lines
    assert "fix them" not in lines[0], lines
    os.rename(mnt.path / "a.txt", mnt.path / "b.txt")  # the rest works
    assert (mnt.path / "b.txt").read_bytes() == b"body of a.txt\n"


def test_an_archived_object_says_it_must_be_restored(moto, mount, s3_env) -> None:
    """A GET of an object in the GLACIER storage class is a 403 InvalidObjectState: that
    file fails with EIO, the others read, and the line says to restore it. It said "The
    credentials were rejected ... fix them", and counted a refused credential."""
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket="archived")
    client.put_object(Bucket="archived", Key="s/cold.bin", Body=b"frozen", StorageClass="GLACIER")
    client.put_object(Bucket="archived", Key="s/warm.txt", Body=b"warm\n")
    mnt = mount("s3://archived/s", "--endpoint-url", moto.endpoint, env=s3_env)
    assert os.stat(mnt.path / "cold.bin").st_size == 6
    assert read_errno(mnt.path / "cold.bin") == errno.EIO
    assert (mnt.path / "warm.txt").read_bytes() == b"warm\n"
    lines = [ln for ln in mnt.log_text().splitlines() if "InvalidObjectState" in ln]
    assert len(lines) == 1 and "cold.bin" in lines[0] and "GLACIER" in lines[0], lines
    assert "restore" in lines[0] and "credentials" not in lines[0], lines
    assert stats(mnt)["store_errors_denied"] == 0


def test_corrupt_chunk_is_remembered_but_fault_free_data_is_fine(corpus, proxy, mount, s3_env,
                                                                   moto) -> None:
    """A chunk whose stored bytes are corrupt fails with EIO (one log line), and other
    arrays keep working; the failure is a property of the bytes, not of the network."""
    client = s3_client(moto.endpoint)
    client.put_object(Bucket=BUCKET, Key="bad/zarr.json",
                      Body=(corpus[0] / "zstd/zarr.json").read_bytes())
    client.put_object(Bucket=BUCKET, Key="bad/c/0/0", Body=b"\x28\xb5\x2f\xfdgarbage")
    mnt = mount(f"s3://{BUCKET}", "--endpoint-url", proxy.endpoint, env=s3_env)
    bad = mnt.path / ".zvfs/arrays/bad/data.raw"
    for _ in range(2):
        with pytest.raises(OSError) as exc:
            read_all(bad)
        assert exc.value.errno == errno.EIO
    lines = [ln for ln in mnt.log_text().splitlines() if "bad/c/0/0" in ln]
    assert len(lines) == 1, lines
    good = mnt.path / ".zvfs/arrays/s/plain/data.raw"
    assert read_all(good) == corpus[1]["plain"].tobytes()
    assert stat.S_ISREG(os.stat(good).st_mode)


def test_a_listing_dripping_in_at_mount_fails_the_mount_soon(corpus, proxy, mount, s3_env) -> None:
    """The check of the source at mount (the first listing page), answered a byte every
    0.25 s, headers too: each byte came well within --s3-timeout, so neither of its two tries
    ever timed out, and the mount waited for the whole answer, as long as the server liked
    (`zvfs mount` gave up at 120 s saying only that the mount was not ready; under systemd
    the daemon waited on). The check now has a deadline of its two tries' timeouts and
    2 s: the mount fails within it, naming the endpoint and what it did."""
    proxy.set({"kind": "drip", "ops": ["list"]})
    t0 = time.monotonic()
    m = mount_s3(mount, proxy, s3_env, "--s3-timeout", "2", check=False)
    took = time.monotonic() - t0
    assert m.result.returncode != 0
    assert took < 15, took
    assert "still coming in after 6 s" in m.result.stderr and proxy.endpoint in m.result.stderr, \
        m.result.stderr


def test_a_credential_helper_giving_expired_credentials_is_named(corpus, proxy, mount, s3_env, tmp_path) -> None:
    """A credential_process that goes on answering credentials already expired (a broken
    SSO cache, a helper whose clock is off): botocore refuses them before any request, with
    a RuntimeError, which reached the log bare ("Credentials were refreshed, but the
    refreshed credentials are still expired.") naming neither the key nor what to fix. The
    read still fails (EIO), with a line saying so; the helper mended, reads work again."""
    import datetime

    answer = tmp_path / "answer"

    def expiring(minutes: float) -> None:
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=minutes)
        answer.write_text(json.dumps({"Version": 1, "AccessKeyId": "HELPERKEY", "SecretAccessKey": "s",
                                      "SessionToken": "t", "Expiration": when.isoformat()}))

    expiring(9)  # within botocore's 10 minutes: the helper is asked again at every request
    helper = tmp_path / "creds.py"
    helper.write_text(f"import pathlib\nprint(pathlib.Path({str(answer)!r}).read_text())\n")
    env = _credential_process_profile(tmp_path, s3_env, "helper", helper)
    mnt = mount_s3(mount, proxy, env, "--profile", "helper")
    assert read_all(mnt.path / "notes.txt") == (corpus[0] / "notes.txt").read_bytes()
    expiring(-60)
    with pytest.raises(OSError) as err:
        read_all(mnt.path / "blob.bin")
    assert err.value.errno == errno.EIO
    lines = [ln for ln in mnt.log_text().splitlines() if "still expired" in ln or " ERROR " in ln]
    assert lines and all("blob.bin" in ln and "already expired" in ln and "--profile" in ln
                         for ln in lines), lines
    assert "Traceback" not in mnt.log_text() and "RuntimeError" not in mnt.log_text()
    expiring(60)
    assert read_all(mnt.path / "blob.bin") == (corpus[0] / "blob.bin").read_bytes()


def test_a_batch_of_tiny_chunks_is_fetched_in_parallel_from_s3(tmp_path, corpus, moto, proxy, mount,
                                                                s3_env) -> None:
    """A read over hundreds of chunks of a few bytes decodes them in batches; from S3, a
    batch's gets went one after another in one worker (a 1 MiB read of 1 KiB chunks over
    20 ms of latency took 23 s). They now go on as many workers: the proxy sees several
    at once, and the bytes are zarr-python's."""
    import zarr

    root = tmp_path / "tiny.zarr"
    a = zarr.create_array(zarr.storage.LocalStore(str(root)), name="t", shape=(16384,), chunks=(64,),
                          dtype="u1", fill_value=3, compressors=None)  # one batch: 256 chunks
    a[:] = np.arange(16384) % 251  # every chunk written: each one a get
    want = np.asarray(zarr.open_array(str(root), path="t", mode="r")[...]).tobytes()
    upload_tree(s3_client(moto.endpoint), root, BUCKET, "tiny")
    mnt = mount(f"s3://{BUCKET}/tiny", "--endpoint-url", proxy.endpoint, env=s3_env)
    os.listdir(mnt.path / ".zvfs/arrays")
    proxy.reset_stats()
    with open(mnt.path / ".zvfs/arrays/t/data.raw", "rb", buffering=0) as f:
        assert f.read(1 << 20) == want
    got = proxy.stats()
    assert got["requests_get"] >= 256, got  # one get a chunk
    assert got["most_at_once_get"] >= 4, got


def test_chunks_the_listing_shows_never_written_cost_no_request_on_s3(tmp_path, moto, proxy, mount,
                                                                    s3_env) -> None:
    """zarr-python writes no object for a chunk of fill (and none for a chunk never
    written): on S3 every such chunk a decoded read covered cost a GET answered 404, 20 ms
    and more each. Once the mount holds the store's listing (its raw tree was listed), a
    chunk the listing does not hold is its fill with no request, in a batch of tiny chunks
    and one chunk at a time alike; a chunk written through the mount since is read. The
    bytes are zarr-python's."""
    import zarr

    root = tmp_path / "sparse.zarr"
    store = zarr.storage.LocalStore(str(root))
    tiny = zarr.create_array(store, name="tiny", shape=(16384,), chunks=(64,), dtype="u1",
                             fill_value=3, compressors=None)  # its reads go in batches of 256
    tiny[:1024] = np.arange(1024) % 251  # 16 of 256 chunks
    big = zarr.create_array(store, name="big", shape=(8, 65536), chunks=(1, 65536), dtype="<u2",
                            fill_value=7)  # 128 KiB chunks: read one at a time
    big[2] = np.arange(65536) % 1000
    big[5] = 1
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket="zvfs-sparse")
    upload_tree(client, root, "zvfs-sparse", "s")
    mnt = mount("s3://zvfs-sparse/s", "--endpoint-url", proxy.endpoint, "--writable", env=s3_env)
    os.listdir(mnt.path)  # the raw tree: the whole store's listing, held for the TTL
    views = mnt.path / ".zvfs/arrays"
    os.listdir(views)
    for name, written in (("tiny", 16), ("big", 2)):
        want = np.asarray(zarr.open_array(str(root), path=name, mode="r")[...]).tobytes()
        proxy.reset_stats()
        assert read_all(views / name / "data.raw") == want, name
        got = proxy.stats()
        assert got.get("requests_get", 0) == written, (name, got)  # 256 and 8 before
    # a chunk written through the mount (a copy of the one zarr-python writes) is read, not
    # taken for a never-written one; so is it in the netCDF view (big-endian: converted)
    big[6] = 9
    (mnt.path / "big/c/6").mkdir()  # as a writer on a file system does
    (mnt.path / "big/c/6/0").write_bytes((root / "big/c/6/0").read_bytes())
    want = np.asarray(zarr.open_array(str(root), path="big", mode="r")[...])
    assert read_all(views / "big/data.raw") == want.tobytes()
    import netCDF4

    with netCDF4.Dataset(mnt.path / ".zvfs/netcdf/root.nc") as nc:
        nc.set_auto_mask(False)
        assert np.array_equal(nc["big"][:], want)


def test_the_groups_of_a_hierarchy_on_s3_are_listed_several_at_once(tmp_path, moto, proxy, mount, s3_env) -> None:
    """Discovery lists each group's directory to find its members. On S3 those LISTs went
    one after the other, whatever the probes of the members did at once: 300 groups of
    two arrays each, behind 20 ms, took 17 s for the first `ls .zvfs/arrays`, most of it
    303 LISTs in a row. A probe that finds a group now lists it in the same hop: the
    proxy (each LIST answered 50 ms late) sees several at once, and every group and array
    is found, reading as zarr-python wrote it. So with the netCDF view's files: each
    group's string array is read for its width, several groups at once (300 one after
    another took 10 s)."""
    import netCDF4
    import zarr

    root = tmp_path / "groups.zarr"
    top = zarr.open_group(str(root), mode="w")
    for i in range(20):
        g = top.create_group(f"g{i:02d}")
        g.create_array("a", shape=(2,), dtype="<i2")[:] = [i, -i]
        g.create_array("names", shape=(2,), dtype=str)[:] = np.array(["x", f"y{i}"], dtype=object)
        g.create_group("inner").create_array("b", shape=(1,), dtype="<u1")[:] = [i]
    mnt = mount_tree(root, "zvfs-groups", moto, proxy, mount, s3_env)
    proxy.set({"kind": "late", "stall": 0.05, "ops": ["list"]})
    proxy.reset_stats()
    arrays = mnt.path / ".zvfs/arrays"
    assert sorted(os.listdir(arrays)) == [f"g{i:02d}" for i in range(20)]
    got = proxy.stats()
    assert got["most_at_once_list"] >= 4, got
    proxy.clear()
    for i in (0, 13, 19):
        assert sorted(os.listdir(arrays / f"g{i:02d}")) == ["a", "inner", "names"]
        assert (arrays / f"g{i:02d}/a/data.raw").read_bytes() == np.array([i, -i], "<i2").tobytes()
        assert (arrays / f"g{i:02d}/inner/b/data.raw").read_bytes() == bytes([i])
    proxy.set({"kind": "late", "stall": 0.05, "ops": ["get"]})
    proxy.reset_stats()
    netcdf = mnt.path / ".zvfs/netcdf"
    assert sorted(os.listdir(netcdf)) == sorted([f"g{i:02d}" for i in range(20)] + [f"g{i:02d}.nc" for i in range(20)]
                                                + ["root.nc"])
    got = proxy.stats()
    assert got["most_at_once_get"] >= 4, got
    proxy.clear()
    with netCDF4.Dataset(netcdf / "g07.nc") as nc:
        assert nc["names"][:].tolist() == ["x", "y7"] and nc["a"][:].tolist() == [7, -7]
    assert "ERROR" not in mnt.log_text()


def test_the_arrays_of_a_group_on_s3_are_discovered_with_their_gets_in_parallel(
        tmp_path, moto, proxy, mount, s3_env) -> None:
    """Discovery identifies each member of a group by getting its metadata keys; on S3 they
    went one after the other in one worker: a group of 10,000 arrays took 33-40 s for the
    first `ls .zvfs/arrays` against moto on 127.0.0.1 (and again at every rediscovery), and
    would take minutes at S3's latency. They now go several at once: the proxy (each get
    answered 50 ms late, as a far server would) sees them together; every array is found,
    and reads as zarr-python wrote it."""
    import zarr

    root = tmp_path / "members.zarr"
    group = zarr.open_group(str(root), mode="w")
    for i in range(24):
        group.create_array(f"a{i:02d}", shape=(3,), dtype="<i4")[:] = [i, i + 1, i + 2]
    sub = group.create_group("g")
    for i in range(4):
        sub.create_array(f"b{i}", shape=(2,), dtype="<u1")[:] = [i, 7]
    mnt = mount_tree(root, "zvfs-members", moto, proxy, mount, s3_env)
    proxy.set({"kind": "late", "stall": 0.05, "ops": ["get"]})
    proxy.reset_stats()
    assert sorted(os.listdir(mnt.path / ".zvfs/arrays")) == [f"a{i:02d}" for i in range(24)] + ["g"]
    got = proxy.stats()
    assert got["most_at_once_get"] >= 4, got
    proxy.clear()
    assert sorted(os.listdir(mnt.path / ".zvfs/arrays/g")) == [f"b{i}" for i in range(4)]
    assert (mnt.path / ".zvfs/arrays/a17/data.raw").read_bytes() == np.array([17, 18, 19], "<i4").tobytes()
    assert (mnt.path / ".zvfs/arrays/g/b3/data.raw").read_bytes() == bytes([3, 7])
    assert "ERROR" not in mnt.log_text()


#: the proxy's classes of request (faultproxy._operation), by S3 operation
_PROXY_CLASS = {"GetObject": "get", "HeadObject": "head", "HeadBucket": "head",
                "ListObjectsV2": "list", "ListObjects": "list", "ListMultipartUploads": "list",
                "PutObject": "put", "UploadPart": "put", "CopyObject": "put", "UploadPartCopy": "put"}


def _by_class(counters: dict) -> dict[str, int]:
    out = {op: 0 for op in ("get", "head", "list", "put", "other")}
    for name, n in counters.items():
        if name.startswith("s3_requests_"):
            out[_PROXY_CLASS.get(name[len("s3_requests_"):], "other")] += int(n)
    return out


def test_every_request_sent_to_s3_is_counted_by_operation_as_the_server_sees_it(
        corpus, moto, proxy, mount, s3_env) -> None:
    """stats.json counted the store's operations (a rename is one, however many requests it
    takes) and missed what a writer asks below the counting wrapper: the HEAD of an open
    for writing, its fetch, the multipart calls. Each HTTP request sent to S3, each try
    included, is now counted by S3 operation (``s3_requests_GetObject``...): as many of each
    kind as the proxy in front of the server saw, with injected faults making tries."""
    root, _ = corpus
    proxy.reset_stats()
    mnt = mount_tree(root, "counted", moto, proxy, mount, s3_env, "--writable", "--part-size", "5M")
    proxy.set({"kinds": ["503", "reset"], "count": 8, "ops": ["get", "head", "put", "other"]})
    files = sorted(store_files(root))
    for key in files:
        assert read_all(mnt.path / key) == (root / key).read_bytes(), key
    big = os.urandom(12 << 20)
    (mnt.path / "big.bin").write_bytes(big)  # a multipart upload: create, 3 parts, complete
    with open(mnt.path / files[0], "r+b") as f:  # a HEAD at the open, a fetch at the write
        f.seek(3)
        f.write(b"zz")
    os.rename(mnt.path / "big.bin", mnt.path / "moved.bin")  # CopyObject + DeleteObject
    os.unlink(mnt.path / "moved.bin")
    st = proxy.stats()
    assert st["faults"] >= 8, st  # the faults really happened, and were tried again
    seen = {op: st.get(f"requests_{op}", 0) for op in ("get", "head", "list", "put", "other")}
    assert wait_until(lambda: _by_class(stats(mnt)) == seen, 10), (_by_class(stats(mnt)), seen, st)
    counted = stats(mnt)
    assert counted["s3_requests_CreateMultipartUpload"] >= 1 and counted["s3_requests_UploadPart"] >= 3
    assert counted["s3_requests_CompleteMultipartUpload"] >= 1 and counted["s3_requests_CopyObject"] >= 1
    assert counted["s3_requests_HeadObject"] >= 1 and counted["s3_requests_DeleteObject"] >= 2

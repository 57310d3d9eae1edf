"""Model-based property test: random Zarr arrays, read back through long-lived real mounts.

Hypothesis draws an array (tests/zarr_model.py: dtype incl. bool and big-endian,
F order for v2, fill values incl. NaN, partial edge chunks, chunks never written
or deleted, sharding with random inner chunks, the codecs zarr-python writes),
zarr-python 3 or 2.18 writes it, and random byte ranges of ``data.raw``,
``data.npy`` and ``chunks/<i.j.k>`` read through the mount (plain and O_DIRECT
opens; O_DIRECT hands the daemon the exact unaligned range) must equal the bytes
of what zarr-python reads back (never zvfs's own decoder):

* ``data.raw``: the reference in the declared dtype and byte order, C order;
* ``chunks/<i.j.k>``: the (inner) chunk's region of it, clipped at the edge;
* ``data.npy``: an NPY header that numpy's own parser reads as (shape, declared
  dtype, C order), 64-byte aligned, then exactly ``data.raw``; and
  ``np.load(mmap_mode="r")`` gives the reference. The header is not compared
  with ``np.save``'s byte for byte: np.save pads it with spaces for in-place
  growth, which the NPY format leaves optional (the README promises np.load).

One mount per store kind, made once per module:

* directory and S3 are mounted with ``--metadata-ttl 0``: discovery (which walks
  the whole store) then runs again on each lookup below ``.zvfs/arrays``, so
  the array an example just wrote under a new path ``exN`` is seen. Each example
  gets its own path and removes it afterwards, so discovery stays small and no
  example can see an earlier one's cached pages or nodes.
* a zip archive cannot change under a mount (its central directory is read
  once), so the zip kind is a corpus: the module first draws ``ZIP_CORPUS``
  arrays from the same strategy with the same seed, zarr-python writes them
  into one zip (zarr-python's ZipStore), and that zip is mounted once. Its
  examples then draw an array of the corpus (sorted simplest first, so a
  failure shrinks to the simplest failing array) and random reads of it.

The seed is printed at the start (``ZVFS_PROP_SEED=N`` reruns it exactly) and a
failure prints hypothesis' reproduce blob too. ``ZVFS_PROP_SCALE=K`` runs K times
as many examples (a longer hunt; the suite runs 520).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr_model as zm
from conftest import Mounter, s3_client, zip_with_zarr
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st
from moto_server import put_many

SEED = int(os.environ.get("ZVFS_PROP_SEED") or random.SystemRandom().randrange(2**32))

#: examples per store kind; together at least 500 per run (ZVFS_PROP_SCALE=10: ten times as many)
SCALE = float(os.environ.get("ZVFS_PROP_SCALE") or 1)
EXAMPLES = {k: max(1, round(v * SCALE)) for k, v in {"directory": 220, "s3": 120, "zip": 180}.items()}
ZIP_CORPUS = max(8, round(72 * SCALE))
BUCKET = "zvfs-property"
S3_PREFIX = "prop/store.zarr"

SETTINGS = settings(
    max_examples=1,  # replaced per test
    deadline=None,
    derandomize=False,
    database=None,  # a run is reproduced by its printed seed, not by local state
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],  # each example writes a store and mounts reads
)


def _print_always(config: pytest.Config, text: str) -> None:
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(text, flush=True)
        return
    with capman.global_and_fixture_disabled():
        print(text, flush=True)


@pytest.fixture(scope="module", autouse=True)
def announce_seed(request) -> Iterator[dict[str, int]]:
    counts: dict[str, int] = {}
    _print_always(request.config, f"\n[zvfs property] hypothesis seed {SEED} "
                                  f"(rerun exactly with ZVFS_PROP_SEED={SEED})")  # fmt: skip
    yield counts
    if counts:
        _print_always(request.config, f"[zvfs property] seed {SEED}: examples run {counts}, "
                                      f"total {sum(counts.values())}")  # fmt: skip


@pytest.fixture(scope="module")
def zarr2(tmp_path_factory) -> Iterator[zm.Zarr2Writer]:
    """zarr-python 2.18 (in /tmp/zarr2-venv, made if missing) as a long-lived writer process."""
    writer = zm.Zarr2Writer(zm.ensure_zarr2_python(), tmp_path_factory.mktemp("zarr2-scratch"))
    try:
        yield writer
    finally:
        writer.stop()


@pytest.fixture(scope="module")
def mounter(tmp_path_factory) -> Iterator[Mounter]:
    m = Mounter(tmp_path_factory.mktemp("property-mounts"))
    try:
        yield m
    finally:
        m.cleanup()


def write(spec: dict[str, Any], root: Path, path: str, zarr2: zm.Zarr2Writer) -> np.ndarray:
    if spec["writer"] == "zarr2":
        return zarr2.write(spec, root, path)
    return zm.write_zarr3(spec, root, path)


def root_group(root: Path) -> None:
    """A root group, so that the store is a Zarr store before any example lands in it."""
    import zarr

    zarr.open_group(zarr.storage.LocalStore(str(root)), mode="w", zarr_format=3,
                    attributes={"about": "zvfs property test"})  # fmt: skip


@st.composite
def examples(draw: st.DrawFn, writers: tuple[str, ...] = ("zarr3", "zarr2")) -> tuple[dict, list]:
    spec = draw(zm.array_specs(writers))
    header = zm.npy_header_of(zm.declared_dtype(spec), tuple(spec["shape"]))
    return spec, draw(zm.reads_for(spec, len(header)))


# --------------------------------------------------------------------------- checking


class ArrayFiles:
    """The files of one ``arrays/<path>/`` opened relative to that directory.

    The directory is looked up once (one discovery with --metadata-ttl 0); every
    file below it is then opened with ``openat``, so the kernel asks the daemon
    only for names inside the directory it holds.
    """

    def __init__(self, array_dir: Path) -> None:
        self.dir = array_dir
        self.dfd = os.open(array_dir, os.O_RDONLY | os.O_DIRECTORY)
        self.fds: dict[tuple[str, bool], int] = {}

    def size(self, name: str) -> int:
        return os.stat(name, dir_fd=self.dfd).st_size

    def pread(self, name: str, offset: int, length: int, direct: bool = False) -> bytes:
        fd = self.fds.get((name, direct))
        if fd is None:
            fd = os.open(name, os.O_RDONLY | (os.O_DIRECT if direct else 0), dir_fd=self.dfd)
            self.fds[(name, direct)] = fd
        out = b""
        while len(out) < length:  # a short read is legal only at EOF
            part = os.pread(fd, length - len(out), offset + len(out))
            if not part:
                break
            out += part
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        os.close(self.dfd)


def _mismatch(what: str, got: bytes, want: bytes) -> str:
    if len(got) != len(want):
        return f"{what}: got {len(got)} bytes, expected {len(want)}"
    first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
    return (f"{what}: {len(got)} bytes, first difference at +{first}: "
            f"got {got[first:first + 16].hex()} expected {want[first:first + 16].hex()}")  # fmt: skip


def check_array(array_dir: Path, spec: dict[str, Any], ref: np.ndarray, reads: list[tuple]) -> None:
    """Every file size and every drawn read of the array's views against the reference."""
    note(f"spec: {zm.describe(spec)}")
    note(f"reads: {reads}")
    files = ArrayFiles(array_dir)
    try:
        _check_files(files, spec, ref, reads)
    finally:
        files.close()


def _check_files(files: ArrayFiles, spec: dict[str, Any], ref: np.ndarray, reads: list[tuple]) -> None:
    raw = zm.expected_raw(spec, ref)
    npy = files.pread("data.npy", 0, files.size("data.npy") + 1)
    hlen, shape, fortran, dtype = zm.parse_npy_header(npy)
    assert (shape, fortran, dtype) == (tuple(spec["shape"]), False, zm.declared_dtype(spec)), (
        f"data.npy header {npy[:hlen]!r}")
    assert hlen % 64 == 0, f"data.npy header of {hlen} bytes is not 64-byte aligned"
    assert npy[hlen:] == raw, _mismatch("data.npy after its header", npy[hlen:], raw)
    # as a user would: np.load memory-maps data.npy (through the directory already held)
    mapped = np.load(f"/proc/self/fd/{files.dfd}/data.npy", mmap_mode="r")
    assert (mapped.shape, mapped.dtype) == (tuple(spec["shape"]), zm.declared_dtype(spec))
    assert mapped.tobytes(order="C") == raw, "np.load(data.npy, mmap_mode='r') differs"
    del mapped
    assert files.size("data.raw") == len(raw), "data.raw size"
    whole = files.pread("data.raw", 0, len(raw) + 1)
    assert whole == raw, _mismatch("data.raw (whole file)", whole, raw)
    for name, offset, length, direct in reads:
        if name == "data.raw":
            want = raw
        elif name == "data.npy":
            want = npy
        else:
            idx = tuple(int(i) for i in name.split("/")[1].split(".")) if spec["shape"] else ()
            want = zm.expected_chunk(spec, ref, idx)
            assert files.size(name) == len(want), f"{name} size"
        got = files.pread(name, offset, length, direct)
        expect = want[offset : offset + length]
        assert got == expect, _mismatch(
            f"{name} [{offset}:{offset + length}]{' O_DIRECT' if direct else ''}", got, expect
        )


# --------------------------------------------------------------------------- directory


@pytest.fixture(scope="module")
def dir_store(mounter, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("property-dir") / "store.zarr"
    root_group(root)
    m = mounter(root, "--metadata-ttl", "0")
    return root, m.path / ".zvfs" / "arrays"


def test_property_directory_store(dir_store, zarr2, announce_seed) -> None:
    root, arrays = dir_store
    counter = iter(range(1, 1 << 30))

    @settings(SETTINGS, max_examples=EXAMPLES["directory"])
    @seed(SEED)
    @given(examples())
    def one(example: tuple[dict, list]) -> None:
        spec, reads = example
        name = f"ex{next(counter)}"
        announce_seed["directory"] = announce_seed.get("directory", 0) + 1
        try:
            ref = write(spec, root, name, zarr2)
            check_array(arrays / name, spec, ref, reads)
        finally:
            shutil.rmtree(root / name, ignore_errors=True)

    one()
    assert announce_seed["directory"] >= EXAMPLES["directory"]


# --------------------------------------------------------------------------- S3


@pytest.fixture(scope="module")
def s3_store(moto, s3_env, mounter, tmp_path_factory) -> tuple[Any, Path, Path]:
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket=BUCKET)
    scratch = tmp_path_factory.mktemp("property-s3")
    root_group(scratch / "root")
    client.put_object(Bucket=BUCKET, Key=f"{S3_PREFIX}/zarr.json",
                      Body=(scratch / "root" / "zarr.json").read_bytes())  # fmt: skip
    m = mounter(f"s3://{BUCKET}/{S3_PREFIX}", "--metadata-ttl", "0",
                "--endpoint-url", moto.endpoint, env=s3_env)  # fmt: skip
    return client, scratch, m.path / ".zvfs" / "arrays"


def _upload(client: Any, local: Path, prefix: str) -> list[str]:
    items = {f"{prefix}/{p.relative_to(local).as_posix()}": p.read_bytes()
             for p in sorted(local.rglob("*")) if p.is_file()}  # fmt: skip
    put_many(client, BUCKET, items)
    return list(items)


def test_property_s3_store(s3_store, zarr2, announce_seed) -> None:
    client, scratch, arrays = s3_store
    counter = iter(range(1, 1 << 30))

    @settings(SETTINGS, max_examples=EXAMPLES["s3"])
    @seed(SEED)
    @given(examples())
    def one(example: tuple[dict, list]) -> None:
        spec, reads = example
        name = f"ex{next(counter)}"
        announce_seed["s3"] = announce_seed.get("s3", 0) + 1
        local = scratch / name
        keys: list[str] = []
        try:
            ref = write(spec, scratch, name, zarr2)
            keys = _upload(client, local, f"{S3_PREFIX}/{name}")
            check_array(arrays / name, spec, ref, reads)
        finally:
            shutil.rmtree(local, ignore_errors=True)
            if keys:
                client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})

    one()
    assert announce_seed["s3"] >= EXAMPLES["s3"]


# --------------------------------------------------------------------------- zip


def _complexity(spec: dict[str, Any]) -> tuple[int, int]:
    return (math.prod(spec["shape"]) * np.dtype(spec["dtype"]).itemsize, len(zm.describe(spec)))


@pytest.fixture(scope="module")
def zip_corpus(zarr2, mounter, tmp_path_factory) -> tuple[list[dict], list[np.ndarray], Path]:
    """ZIP_CORPUS arrays drawn with the run's seed, written by zarr-python, zipped, mounted once."""
    specs: list[dict] = []

    @settings(max_examples=ZIP_CORPUS, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @seed(SEED)
    @given(zm.array_specs())
    def collect(spec: dict) -> None:
        specs.append(json.loads(json.dumps(spec)))

    collect()
    specs.sort(key=_complexity)
    stage = tmp_path_factory.mktemp("property-zip") / "stage.zarr"
    root_group(stage)
    refs = [write(spec, stage, f"c{i}", zarr2) for i, spec in enumerate(specs)]
    archive = zip_with_zarr(stage, stage.parent / "corpus.zip")
    m = mounter(archive)
    return specs, refs, m.path / ".zvfs" / "arrays"


def test_property_zip_store(zip_corpus, announce_seed) -> None:
    specs, refs, arrays = zip_corpus
    assert len(specs) >= ZIP_CORPUS // 2, f"only {len(specs)} distinct corpus arrays drawn"

    def with_reads(i: int) -> st.SearchStrategy:
        spec = specs[i]
        header = zm.npy_header_of(zm.declared_dtype(spec), tuple(spec["shape"]))
        return st.tuples(st.just(i), zm.reads_for(spec, len(header)))

    @settings(SETTINGS, max_examples=EXAMPLES["zip"])
    @seed(SEED)
    @given(st.integers(0, len(specs) - 1).flatmap(with_reads))
    def one(example: tuple[int, list]) -> None:
        i, reads = example
        announce_seed["zip"] = announce_seed.get("zip", 0) + 1
        note(f"corpus array c{i}")
        check_array(arrays / f"c{i}", specs[i], refs[i], reads)

    one()
    assert announce_seed["zip"] >= EXAMPLES["zip"]

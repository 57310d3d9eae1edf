"""Hostile zip archives drawn by hypothesis: the structure of a real archive mutated field
by field (end of central directory, central entries, local headers, data descriptors),
cut short or grown, then read by ZipStore and by zipfile, the reference reader.

What must hold, whatever the mutation:
- opening the archive either works or fails with the store's SourceError (one message
  naming the archive), never another exception;
- every member ZipStore lists reads as zipfile reads that member of the same bytes, or
  fails with StoreError: no member zipfile refuses is served, and one zipfile reads is
  refused only when its entry's sizes contradict the archive (STRICTER);
- a range of a member ZipStore serves is that range of some member as written (a moved
  offset never serves another member's bytes under this name);
- nothing reads more than the bound a caller gives (a size mutated to 4 GiB is TooLarge).

The base archives are written here by zipfile (every method it has; one streamed through
a pipe, so sizes and CRCs follow the data) and by the ``zip`` command.
"""

from __future__ import annotations

import io
import os
import random
import struct
import subprocess
import time
import tracemalloc
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zvfs.stores.base import SourceError, StoreError
from zvfs.stores.zip import ZipStore
from zvfs.stores.zip_directory import Directory, read_directory

LIMIT = 1 << 20  # what a caller lets a member hold (the decoded views pass their own)

#: where ZipStore refuses a member zipfile reads: its directory entry's sizes contradict
#: the archive. A file's size is the entry's, and a file that ends before its size (or
#: whose data runs past it) is not served, where zipfile returns what it inflated (a
#: prefix, when the entry says fewer bytes than the stream holds). A member declaring
#: more than the caller's bound is refused from the entry alone.
STRICTER = ("extends past the end of the zip file", "stored zip member has inconsistent sizes",
            "fewer bytes than declared", "ends before the deflate stream does",
            "holds more bytes than declared", f"more than the {LIMIT} it may hold")

_rng = random.Random(8)
CONTENTS: dict[str, bytes] = {
    "zarr.json": b'{"zarr_format": 3, "node_type": "group"}',
    "a/c/0": bytes(range(256)) * 80,                       # compressible
    "a/c/1": _rng.randbytes(5000),                         # not
    "b/x": b"bzip2 " * 300,
    "b/y": b"lzma " * 300,
    "e": b"",
}
STAMP = (2024, 5, 6, 7, 8, 10, 0, 0, -1)  # the members' time (a struct_time's fields)
METHODS = {"a/c/1": zipfile.ZIP_STORED, "b/x": zipfile.ZIP_BZIP2, "b/y": zipfile.ZIP_LZMA}


class _Pipe:
    """A sink without seek or tell: zipfile streams each member, its CRC and sizes in a
    data descriptor after the data (flag 0x8), as it does on a pipe."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: bytes) -> int:
        self.data += b
        return len(b)

    def flush(self) -> None:
        pass


def _info(name: str) -> zipfile.ZipInfo:
    """A member stamped with a fixed time: the archives, and so the cases drawn from
    them, are the same every run."""
    return zipfile.ZipInfo(name, date_time=STAMP[:6])


def _zipfile_archive() -> bytes:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"zvfs-hostile-zip-{os.getpid()}.zip"
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(_info("d/"), b"")
            for name, data in CONTENTS.items():
                zf.writestr(_info(name), data, compress_type=METHODS.get(name, zipfile.ZIP_DEFLATED))
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def _streamed_archive() -> bytes:
    sink = _Pipe()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as zf:  # type: ignore[arg-type]
        for name, data in CONTENTS.items():
            if name not in METHODS:
                with zf.open(_info(name), "w") as f:
                    f.write(data)
    return bytes(sink.data)


def _zip64_self_extractor() -> bytes:
    """An archive after a stub, as a self-extracting archive is, with a comment, and
    written as zipfile writes one past its zip64 limits (shrunk here, so the archive
    stays small): every member's sizes and offset in a zip64 extra field, and a zip64
    end record and locator before the end record. Its offsets are the archive's own,
    so every one is off by the stub's length."""
    sink = io.BytesIO()
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 40, 3
    try:
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in CONTENTS.items():
                zf.writestr(_info(name), data, compress_type=METHODS.get(name, zipfile.ZIP_DEFLATED))
            zf.comment = b"made by the hostile-zip tests"
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits
    data = sink.getvalue()
    assert b"PK\x06\x06" in data and b"PK\x06\x07" in data  # the zip64 records were written
    return b"#!/bin/sh\necho a stub before the archive\nexit 0\n" + data


def _zip_command_archive(tmp: Path) -> bytes:
    tree = tmp / "tree"
    for name, data in CONTENTS.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    stamp = time.mktime(STAMP)
    for path in tree.rglob("*"):
        os.utime(path, (stamp, stamp))
    out = tmp / "cmd.zip"
    subprocess.run([tool("zip"), "-q", "-r", "-X", str(out), "."], cwd=tree, check=True)
    return out.read_bytes()


@dataclass(frozen=True)
class Field:
    offset: int
    width: int  # 1, 2, 4 or 8 bytes, little-endian


def _directory_fields(data: bytes) -> list[Field]:
    """The fields of the end record, the zip64 locator and record where there are, and
    every central directory entry (its name and extra field byte by byte). The directory
    is found where it is (the end record's offset is the archive's, not the file's)."""
    out: list[Field] = []
    eocd = data.rfind(b"PK\x05\x06")
    assert eocd >= 0
    out += [Field(eocd + o, w) for o, w in ((4, 2), (6, 2), (8, 2), (10, 2), (12, 4), (16, 4), (20, 2))]
    (cd_size,) = struct.unpack_from("<I", data, eocd + 12)
    end = eocd
    if data[eocd - 20:eocd - 16] == b"PK\x06\x07":
        out += [Field(eocd - 20 + o, w) for o, w in ((0, 4), (4, 4), (8, 8), (16, 4))]
        rec = eocd - 20 - 56
        out += [Field(rec + o, w) for o, w in ((0, 4), (4, 8), (12, 2), (14, 2), (16, 4), (20, 4),
                                               (24, 8), (32, 8), (40, 8), (48, 8))]
        (cd_size,) = struct.unpack_from("<Q", data, rec + 40)
        end = rec
    p = end - cd_size
    while p < end and data[p:p + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack_from("<HHH", data, p + 28)
        out += [Field(p + o, w) for o, w in ((6, 2), (8, 2), (10, 2), (16, 4), (20, 4), (24, 4),
                                             (28, 2), (30, 2), (32, 2), (34, 2), (42, 4))]
        out += [Field(p + 46 + i, 1) for i in range(nlen + xlen)]
        p += 46 + nlen + xlen + clen
    return out


def _fields(data: bytes) -> list[Field]:
    """Every header field of the archive as written: the mutation targets. The local
    headers are found where zipfile finds them."""
    out = _directory_fields(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        locals_ = [zi.header_offset for zi in zf.infolist()]
    for h in locals_:
        nlen, xlen = struct.unpack_from("<HH", data, h + 26)
        out += [Field(h + o, w) for o, w in ((0, 4), (6, 2), (8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2))]
        out += [Field(h + 30 + i, 1) for i in range(nlen + xlen)]
    i = data.find(b"PK\x07\x08")  # data descriptors (streamed members)
    while 0 <= i < len(data) - 16:
        out += [Field(i + 4, 4), Field(i + 8, 4), Field(i + 12, 4)]
        i = data.find(b"PK\x07\x08", i + 1)
    return out


@st.composite
def _mutated(draw: st.DrawFn, bases: list[tuple[bytes, list[Field]]]) -> bytes:
    """One of ``bases`` (an archive and its fields) with 1 to 3 fields changed, then as is,
    cut or grown."""
    base, fields = draw(st.sampled_from(bases))
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 3))):
        f = draw(st.sampled_from(fields))
        top = (1 << (8 * f.width)) - 1
        old = int.from_bytes(data[f.offset:f.offset + f.width], "little")
        new = draw(st.sampled_from([0, 1, top, top - 1, (old + 1) & top, (old - 1) & top,
                                    (old * 2) & top, len(data) & top, 1 << 31 & top])
                   | st.integers(0, top))
        data[f.offset:f.offset + f.width] = new.to_bytes(f.width, "little")
    how = draw(st.sampled_from(["as is", "as is", "cut", "grown"]))
    if how == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif how == "grown":
        data += draw(st.binary(min_size=1, max_size=64))
    return bytes(data)


def _zipfile_reads(path: Path) -> dict[str, bytes | None] | None:
    """What the reference reads of each member name (None: it refuses that member), or
    None when it refuses the archive. Bounded as the store's reads are."""
    try:
        zf = zipfile.ZipFile(path)
    except Exception:
        return None
    out: dict[str, bytes | None] = {}
    with zf:
        for name in zf.namelist():
            try:
                with zf.open(name) as f:
                    data = f.read(LIMIT + 1)
                out[name] = data if len(data) <= LIMIT else None
            except Exception:
                out[name] = None
    return out


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    made = [_zipfile_archive(), _streamed_archive(), _zip_command_archive(tmp_path_factory.mktemp("zip")),
            _zip64_self_extractor()]
    for data in made:  # the unmutated archives read as written, by both readers
        path = tmp_path_factory.mktemp("base") / "a.zip"
        path.write_bytes(data)
        store = ZipStore(path)
        try:
            served = {name: store.get(name) for name in store.list_prefix("")}
        finally:
            store.close()
        assert len(served) >= 3 and served == {k: CONTENTS[k] for k in served}
        reference = _zipfile_reads(path) or {}
        assert {k: v for k, v in reference.items() if not k.endswith("/")} == served
    return made


def test_mutated_zip_archives_read_as_zipfile_reads_them_or_fail_cleanly(bases: list[bytes],
                                                                          tmp_path: Path) -> None:
    originals = set(CONTENTS.values())

    @settings(max_examples=2000, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_mutated([(b, _fields(b)) for b in bases]), st.randoms(use_true_random=False))
    def one(data: bytes, rnd: random.Random) -> None:
        path = tmp_path / "m.zip"
        path.write_bytes(data)
        try:
            store = ZipStore(path)
        except SourceError:
            return
        reference = _zipfile_reads(path)
        try:
            for name in store.list_prefix(""):
                why = ""
                try:
                    got: bytes | None = store.get_at_most(name, LIMIT)
                except StoreError as exc:  # TooLarge among them
                    got, why = None, str(exc)
                want = None if reference is None else reference.get(name)
                if got is None and want is not None and any(r in why for r in STRICTER):
                    continue
                assert got == want, (name, why or "served", "zipfile refuses" if want is None else "zipfile reads")
                info = store.info(name)
                for _ in range(3):
                    start = rnd.randrange(0, info.size + 2)
                    length = rnd.randrange(0, 4096)
                    try:
                        piece = store.get_range(name, start, length)
                    except StoreError:
                        continue
                    assert any(o[start:start + length] == piece for o in originals), (name, start, length)
        finally:
            store.close()

    one()


def _directory_as_zipfile_reads_it(path: Path) -> tuple[str, str] | list[tuple]:
    """zipfile's members (the fields a store reads of each), or the type and words of
    the exception it refuses the archive with."""
    try:
        with zipfile.ZipFile(path) as zf:
            return [(zi.orig_filename, zi.header_offset, zi.compress_size, zi.file_size, zi.CRC,
                     zi.compress_type, zi.flag_bits, len(zi.extra)) for zi in zf.infolist()]
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _read_directory(path: Path) -> tuple[Directory, list[str]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_directory(fd, 0)
    finally:
        os.close(fd)


def _directory_as_parsed(path: Path) -> tuple[str, str] | list[tuple]:
    try:
        d, names = _read_directory(path)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    assert len(d) == len(names)
    return [tuple(d.entry(i, name)[1:]) for i, name in enumerate(names)]


def test_mutated_central_directories_read_as_zipfile_reads_them(bases: list[bytes],
                                                                 tmp_path: Path) -> None:
    """The directory parser keeps what zipfile keeps of each member, and refuses what it
    refuses with the same exception and words, on directories mutated field by field
    (end record, zip64 locator and record, entries, names and extra fields byte by byte),
    cut or grown. Some two in five cases are refused: both sides are exercised."""
    refused = 0
    examples = 3000

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_mutated([(b, _directory_fields(b)) for b in bases]))
    def one(data: bytes) -> None:
        nonlocal refused
        path = tmp_path / "m.zip"
        path.write_bytes(data)
        want = _directory_as_zipfile_reads_it(path)
        assert _directory_as_parsed(path) == want
        refused += isinstance(want, tuple)

    one()
    assert examples * 0.1 < refused < examples * 0.9, refused


def test_a_central_directory_costs_its_members_little_memory(tmp_path: Path) -> None:
    """A mount of an archive of a million chunks holds its directory for as long as it is
    mounted: the store built on zipfile kept ~670 bytes a member of this archive (a ZipInfo
    of twenty attributes and a dict entry) and peaked at ~700 while opening. The parser keeps a dozen numbers in arrays
    and the name; the store adds its listings."""
    n = 20_000
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i in range(n):
            zf.writestr(f"arr/c/{i // 100}/{i % 100}", b"x")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        d, names = _read_directory(path)
        kept = tracemalloc.get_traced_memory()[0] - before
        assert len(d) == len(names) == n
        del d, names
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        store = ZipStore(path)
        try:
            kept_by_store, peak = (m - before for m in tracemalloc.get_traced_memory())
            assert store.get(f"arr/c/{(n - 1) // 100}/{(n - 1) % 100}") == b"x"
        finally:
            store.close()
    finally:
        tracemalloc.stop()
    assert kept / n < 160, f"the parser keeps {kept / n:.0f} bytes a member"
    assert kept_by_store / n < 200, f"the store keeps {kept_by_store / n:.0f} bytes a member"
    assert peak / n < 400, f"opening the store peaks at {peak / n:.0f} bytes a member"

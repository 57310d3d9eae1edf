"""Hostile metadata and chunk bytes, drawn by hypothesis, checked through a real mount.

Shared by tests/test_hostile.py (a fixed, derandomized handful of cases) and
scripts/fuzz-hostile (as many as you like). A *case* is plain JSON data drawn by
:func:`cases`: a base array that zarr-python writes (v2 or v3, compressed, sharded,
F order, big-endian, bool, complex, scalar) inside a group of its own, then mutations of
its metadata documents (a value replaced by a hostile one at a drawn place, a member
dropped or duplicated, numbers JSON cannot hold such as ``1e400``, a BOM, invalid UTF-8,
deep nesting, a cut document) and of its chunk bytes (cut, bit-flipped, emptied,
extended, replaced, or a tiny frame that claims gigabytes). Many cases go into one
directory store, mounted once.

:func:`check` then holds every file of the case's views to the property:

* each read answers bytes or fails alone with EIO or ENOENT, within a timeout;
* where zarr-python (the reference, reading the same store) refuses the array, zvfs
  serves no data for it (data.raw and data.npy fail);
* where it reads, every byte zvfs serves equals it: data.npy (shape, dtype, values),
  data.raw, each chunk file, the v2 mirror read back by zarr-python, and the group's
  netCDF file read by netCDF4;
* a metadata document zvfs refuses is named by a line of the daemon's log.
"""

from __future__ import annotations

import copy
import errno
import io
import json
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

MiB = 1 << 20

#: seconds one read() (of at most 1 MiB) may go unanswered before it counts as a hang, or
#: twice zarr-python's read of the whole array when that took longer (a document changed to
#: a shape of 1.25 million never-written chunks: zarr-python read it in 475 s, zvfs its
#: data.raw in 60)
READ_TIMEOUT = 20.0
#: bytes read of each file of an array too big for the reference (zarr-python's read is
#: skipped past 64 MiB)
BIG_READ = 16 * MiB
#: errnos a read of a bad case may fail with
ALLOWED = (errno.EIO, errno.ENOENT)

#: stores copied from tests/fixtures (their writers, ncgen and zarr-vectors, are not in the
#: test's environment): kind -> (fixture, the array of it that is checked)
FIXTURES = {
    "nczarr": ("cf/nczarr.file", "temp"),
    # every ZV geometry, whose writers (PLY, TrackVis, SWC) read its links, fragments and
    # indexes; its level 0's vertices are the array checked
    **{f"zv{layout}_{name}": (f"zv/v{layout}/{name}.zarr", "0/vertices") for layout, name in (
        ("07", "points"), ("09", "points"), ("07", "mesh"), ("09", "mesh"), ("09", "mesh_draco"),
        ("07", "streamlines"), ("09", "streamlines"), ("09", "polylines"), ("07", "skeleton"),
        ("09", "graph"))},
    # Zarr v1, both layouts (zarr-python 3 reads neither: held to the errnos)
    "v1_old": ("zarr/v1.zarr", "int16_be"),
    "v1_spec": ("zarr/v1spec.zarr", "blosc_F_3d_u1"),
}
KINDS = ("v2_zlib", "v2_blosc", "v2_raw_f", "v2_filters", "v3_zstd", "v3_shard", "v3_gzip_be",
         "v3_bool", "v3_complex", "v3_scalar", "v3_string_attrs", "v3_numcodecs", "v2_vlen_utf8",
         "v3_string", *FIXTURES)
#: the kinds of variable-length text (served as fixed-width once their width is measured)
TEXT_KINDS = ("v2_vlen_utf8", "v3_string")
#: their values: non-ASCII, empty and long ones (the fill, never written, is "–")
TEXT = np.array([f"{'é' * (i % 4)}v{i}{'x' * (i % 7)}" for i in range(30)], dtype=object).reshape(5, 6)
FIXTURE_DIR = Path(__file__).parent / "fixtures"
#: metadata documents a fixture's mutations may pick: v2's and v3's, and v1's two layouts'
METADATA_NAMES = (".zarray", ".zattrs", ".zgroup", "zarr.json", "meta", "attrs", "__zmeta__", "__zattr__")

#: values put in place of a member's: wrong types, sizes no store holds, text no decoder expects
HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 3, 2**31, 2**63, 2**64, -(2**63), 10**30, 1.5, -0.0, 1e300,
    "NaN", "Infinity", "-Infinity", "", "x" * 5000, "\ud800", "<f8", "|S0", "|b1", "c/0", "/",
    "..", "AAAA", "0x7fc00000", [], {}, [[]], [0], [-1], [2**40], [1, 2, 3], [1.0, 2.0],
    {"name": "x"}, {"name": "bytes"}, {"id": "zlib"}, {"must_understand": True},
]
#: number tokens Python's json reads but no float holds, or that no JSON parser should take
RAW_NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" * 400, "1.0e-400", "-0"]
#: members the specs define (v2, v3, their codecs and grids, xarray's and NCZarr's attributes)
MEMBERS = ["zarr_format", "node_type", "shape", "chunks", "dtype", "data_type", "order", "fill_value",
           "compressor", "filters", "dimension_separator", "codecs", "chunk_grid", "chunk_key_encoding",
           "dimension_names", "storage_transformers", "attributes", "_ARRAY_DIMENSIONS", "configuration",
           "level", "checksum", "endian", "chunk_shape", "index_codecs", "index_location", "separator",
           "name", "id", "cname", "shuffle", "blocksize", "typesize"]
#: members an extension or a writer might add
ADDED = ["must_understand", "storage_transformers", "dimension_names", "attributes", "extra",
         "dimension_separator", "order", "_ARRAY_DIMENSIONS", "_nczarr_array", "zarr_format"]


def json_values() -> st.SearchStrategy:
    scalars = st.one_of(st.sampled_from(HOSTILE), st.integers(-(2**70), 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=5), inner, max_size=4)),
                        max_leaves=8)


@st.composite
def doc_mutations(draw: st.DrawFn) -> dict[str, Any]:
    """One change to a metadata document; ``at`` picks a place among its values (modulo)."""
    how = draw(st.sampled_from(["member", "member", "value", "value", "delete", "add", "raw_number",
                                "nest", "duplicate", "bom", "bad_utf8", "cut"]))
    out: dict[str, Any] = {"how": how, "at": draw(st.integers(0, 1 << 16))}
    if how in ("value", "add", "duplicate", "member"):
        out["value"] = draw(json_values())
    if how == "member":  # a member the spec defines, set to a hostile value or dropped
        out["name"] = draw(st.sampled_from(MEMBERS))
        out["drop"] = draw(st.booleans())
    if how == "add":
        out["name"] = draw(st.sampled_from(ADDED))
    if how == "raw_number":
        out["token"] = draw(st.sampled_from(RAW_NUMBERS))
    if how == "nest":
        out["depth"] = draw(st.sampled_from([50, 99, 100, 101, 5000]))
    return out


BOMBS = ("zstd_claims_4gib", "blosc_claims_2gib", "gzip_of_64mib")
#: a little-endian integer of 4 or 8 bytes written over a chunk's bytes: in an uncompressed
#: blob (a ZV fragment index, manifest or links cell; a vlen cell's framing) it is a count,
#: length, offset or index that a parser must not trust. A flipped bit seldom lands on one.
INT_CHANGES = ("int4", "int8")
HOSTILE_INTS = (0, 1, -1, 2, 7, 255, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                2**53, 2**62, 2**63 - 1, -(2**63))
CHUNK_CHANGES = ("cut", "flip", "empty", "extend", "replace", *INT_CHANGES, *BOMBS)


@st.composite
def cases(draw: st.DrawFn, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """A base array (one of ``kinds``) and what is done to its metadata (array's and
    group's) and chunks."""
    case: dict[str, Any] = {"kind": draw(st.sampled_from(kinds)), "docs": [], "chunks": []}
    for _ in range(draw(st.integers(0, 2))):
        target = draw(st.sampled_from(["array", "array", "array", "attrs", "group"]))
        case["docs"].append({"target": target, **draw(doc_mutations())})
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(CHUNK_CHANGES))
        change = {"how": how, "which": draw(st.integers(0, 1 << 16))}
        if how in INT_CHANGES:  # most often in a blob's header, where its counts are
            change["at"] = draw(st.integers(0, 40) | st.integers(0, 1 << 16))
            change["value"] = draw(st.sampled_from(HOSTILE_INTS) | st.integers(-(2**63), 2**64 - 1))
        else:
            change["at"] = draw(st.integers(0, 1 << 16))
        case["chunks"].append(change)
    if not case["docs"] and not case["chunks"]:
        case["docs"].append({"target": "array", "how": "value", "at": draw(st.integers(0, 1 << 16)),
                             "value": draw(json_values())})
    return case


# --------------------------------------------------------------------------- writing


def write_base(root: Path, group: str, kind: str) -> str:
    """zarr-python writes the case's group and its array ``a``, some chunks left unwritten;
    returns the array's path."""
    import numcodecs
    import zarr
    from zarr.codecs import BytesCodec, GzipCodec

    if kind in FIXTURES:
        src, array = FIXTURES[kind]
        shutil.copytree(FIXTURE_DIR / src, root / group)
        return f"{group}/{array}"
    store = zarr.storage.LocalStore(str(root))
    fmt = 2 if kind.startswith("v2") else 3
    g = zarr.open_group(store, path=group, mode="w", zarr_format=fmt,
                        attributes={"title": kind, "scale_factor": 2.0, "valid_range": [0, 9]})
    data = np.arange(30, dtype="f8").reshape(5, 6) / 3
    kw: dict[str, Any] = {"shape": (5, 6), "chunks": (2, 4)}
    if kind == "v2_zlib":
        kw.update(dtype="<f8", compressors=numcodecs.Zlib(1), fill_value=1.5)
    elif kind == "v2_blosc":
        kw.update(dtype=">i4", compressors=numcodecs.Blosc("lz4"), fill_value=7)
    elif kind == "v2_raw_f":
        kw.update(dtype="<u2", compressors=None, fill_value=3, order="F")
    elif kind == "v2_filters":
        kw.update(dtype="<i4", filters=[numcodecs.Delta(dtype="<i4"),
                                        numcodecs.FixedScaleOffset(offset=1, scale=10, dtype="<i4")],
                  compressors=numcodecs.Zlib(1), fill_value=-1)
    elif kind == "v3_numcodecs":
        from zarr.codecs.numcodecs import BitRound, Delta

        with warnings.catch_warnings():  # "not in the Zarr version 3 specification": known
            warnings.simplefilter("ignore")
            kw.update(dtype="float32", filters=[Delta(dtype="<f4"), BitRound(keepbits=10)], fill_value=0.5)
    elif kind == "v3_zstd":
        kw.update(dtype="float32", fill_value=float("nan"), dimension_names=["y", "x"])
    elif kind == "v3_shard":
        kw.update(dtype="int16", chunks=(1, 2), shards=(2, 4), fill_value=-3)
    elif kind == "v3_gzip_be":
        kw.update(dtype="uint32", serializer=BytesCodec(endian="big"), compressors=GzipCodec(),
                  fill_value=9)
    elif kind == "v3_bool":
        kw.update(dtype="bool", fill_value=True)
        data = data.astype(int) % 2
    elif kind == "v3_complex":
        kw.update(dtype="complex64", fill_value=1 + 2j)
    elif kind == "v3_scalar":
        kw.update(shape=(), chunks=(), dtype="int64", fill_value=4)
    elif kind == "v3_string_attrs":
        kw.update(dtype="int8", fill_value=0, attributes={"units": "m", "flags": [1, 2], "long": "é" * 40})
    elif kind in TEXT_KINDS:
        kw.update(dtype=str, fill_value="–")
        data = TEXT
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = g.create_array("a", **kw)
        if kind == "v3_scalar":
            a[...] = 5
        elif kind in TEXT_KINDS:
            a[:3, :4] = data[:3, :4]
            a[4:, 4:] = data[4:, 4:]
        else:
            data = data.astype(a.dtype)
            a[:3, :4] = data[:3, :4]
            a[4:, 4:] = data[4:, 4:]
    return f"{group}/a"


def _places(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _places(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _places(v, (*prefix, i))
    return out


def _set(doc: Any, place: tuple, value: Any) -> Any:
    if not place:
        return value
    cur = doc
    for p in place[:-1]:
        cur = cur[p]
    cur[place[-1]] = value
    return doc


def _set_member(doc: Any, name: str, value: Any, drop: bool, at: int) -> Any:
    """``name`` set (or dropped) in one of the objects of ``doc`` that hold it (the
    ``at``-th), else at the top."""
    holders = [p for p in _places(doc) if p and p[-1] == name]
    place = holders[at % len(holders)] if holders else (name,)
    if not isinstance(doc, dict):
        return doc
    parent = doc
    for p in place[:-1]:
        parent = parent[p]
    if drop:
        parent.pop(name, None) if isinstance(parent, dict) else None
    else:
        parent[place[-1]] = value
    return doc


def _dumps(doc: Any) -> str:
    return json.dumps(doc, allow_nan=True)


def mutate_doc(raw: bytes, m: dict[str, Any]) -> bytes:
    """The document ``raw`` with the change ``m`` made."""
    how = m["how"]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "cut":
        return raw[: m["at"] % max(1, len(raw))]
    if how == "bad_utf8":
        cut = m["at"] % max(1, len(raw))
        quote = raw.find(b'"', cut)
        cut = quote + 1 if quote >= 0 else len(raw)
        return raw[:cut] + b"\xc3\x28\xff" + raw[cut:]
    doc = json.loads(raw)
    if how == "member":
        return _dumps(_set_member(doc, m["name"], None if m["drop"] else copy.deepcopy(m["value"]),
                                  m["drop"], m["at"])).encode()
    places = _places(doc)
    place = places[m["at"] % len(places)]
    if how == "value":
        return _dumps(_set(doc, place, copy.deepcopy(m["value"]))).encode()
    if how == "delete":
        if not place:
            return b"{}"
        parent = doc
        for p in place[:-1]:
            parent = parent[p]
        del parent[place[-1]]
        return _dumps(doc).encode()
    if how == "add":
        target = doc
        for p in place:
            target = target[p]
        if isinstance(target, dict):
            target[m["name"]] = copy.deepcopy(m["value"])
        elif isinstance(target, list):
            target.append(copy.deepcopy(m["value"]))
        else:
            return _dumps(_set(doc, place, {m["name"]: copy.deepcopy(m["value"])})).encode()
        return _dumps(doc).encode()
    if how in ("raw_number", "nest"):
        token = "@@zvfs-token@@"
        text = _dumps(_set(doc, place, token))
        new = m["token"] if how == "raw_number" else "[" * m["depth"] + "]" * m["depth"]
        return text.replace(f'"{token}"', new, 1).encode()
    if how == "duplicate":
        if not isinstance(doc, dict) or not doc:
            return raw
        name = sorted(doc)[m["at"] % len(doc)]
        text = _dumps(doc)
        return (text[:-1] + f", {json.dumps(name)}: {_dumps(m['value'])}}}").encode()
    raise AssertionError(how)


@cache
def _bomb(how: str) -> bytes:
    """A frame of at most a few KiB that says it holds gigabytes (or, for gzip, does)."""
    if how == "zstd_claims_4gib":
        # magic, frame header descriptor (8-byte content size, single segment), the size,
        # then one raw block of 4 bytes, marked last
        block = struct.pack("<I", (4 << 3) | 1)[:3]
        return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 4 << 30) + block + bytes(4)
    if how == "blosc_claims_2gib":
        # c-blosc 1 header: version, versionlz, flags (memcpyed), typesize, nbytes, blocksize, cbytes
        body = bytes(64)
        return struct.pack("<BBBBIII", 2, 1, 0x02 | 0x01, 1, (2 << 30) - 1, 1 << 16, 16 + len(body)) + body
    if how == "gzip_of_64mib":
        import gzip

        return gzip.compress(bytes(64 * MiB), compresslevel=1)
    raise AssertionError(how)


def mutate_chunk(raw: bytes, m: dict[str, Any]) -> bytes:
    how, at = m["how"], m["at"]
    if how == "cut":
        return raw[: at % max(1, len(raw))]
    if how == "flip":
        if not raw:
            return b"\x01"
        i = at % len(raw)
        return raw[:i] + bytes([raw[i] ^ (1 << (at % 8))]) + raw[i + 1:]
    if how == "empty":
        return b""
    if how == "extend":
        return raw + bytes(1 + at % 9)
    if how == "replace":
        return np.random.default_rng(at).bytes(len(raw))
    if how in INT_CHANGES:
        width = 4 if how == "int4" else 8
        value = (m["value"] % (1 << (8 * width))).to_bytes(width, "little")
        i = at % max(1, len(raw) - width + 1)
        return raw[:i] + value + raw[i + width:]
    return _bomb(how)


def _metadata_key(root: Path, array: str, target: str, at: int = 0) -> Path:
    a, g = root / array, (root / array).parent
    top = root / array.split("/", 1)[0]
    if not (top / ".zgroup").exists() and not (top / "zarr.json").exists():
        top = g
    docs = sorted(p for p in top.rglob("*") if p.name in METADATA_NAMES)
    if target == "any" and docs:  # a copied fixture: any of its documents
        return docs[at % len(docs)]
    if target == "group":
        return g / ("zarr.json" if (g / "zarr.json").exists() else ".zgroup")
    if (a / "zarr.json").exists():
        return a / "zarr.json"
    key = a / (".zattrs" if target == "attrs" else ".zarray")
    if not key.exists():
        key.write_text(json.dumps({"units": "m"}))
    return key


def build(root: Path, group: str, case: dict[str, Any]) -> dict[str, Any]:
    """Writes the case under ``root/group``; returns what was done (keys, for the log)."""
    array = write_base(root, group, case["kind"])
    changed: dict[str, list[str]] = {"docs": [], "chunks": [], "chunk_hows": []}
    for m in case["docs"]:
        key = _metadata_key(root, array, "any" if case["kind"] in FIXTURES else m["target"], m["at"])
        try:
            key.write_bytes(mutate_doc(key.read_bytes(), m))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            continue  # an earlier change left it no JSON to change: already hostile
        changed["docs"].append(key.relative_to(root).as_posix())
    top = root / group if case["kind"] in FIXTURES else root / array
    chunk_files = sorted(p for p in top.rglob("*")
                         if p.is_file() and not p.name.startswith(".") and p.name not in METADATA_NAMES)
    for m in case["chunks"]:
        if chunk_files:
            p = chunk_files[m["which"] % len(chunk_files)]
            p.write_bytes(mutate_chunk(p.read_bytes(), m))
            changed["chunks"].append(p.relative_to(root).as_posix())
            changed["chunk_hows"].append(m["how"])
    return {"array": array, "kind": case["kind"], **changed}


# --------------------------------------------------------------------------- reading


def reference(root: Path, array: str) -> np.ndarray | Exception | None:
    """What zarr-python reads from the store (None: a case with a bomb, not read in-process)."""
    import zarr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = zarr.open_array(zarr.storage.LocalStore(str(root)), path=array, mode="r")
            if not isinstance(a.shape, tuple) or a.nbytes > 64 * MiB:
                return None
            return np.asarray(a[...])  # a 0-d read is a numpy scalar: native order whatever astype says
    except Exception as exc:  # noqa: BLE001 - any refusal is the reference's answer
        return exc


def timed_read(path: Path, limit: int = 256 * MiB, timeout: float = READ_TIMEOUT) -> bytes | int | str:
    """The file's first ``limit`` bytes, its errno, or "hang" when one read() of at most
    1 MiB (or the open) gives no answer within ``timeout``. A file that keeps answering
    is no hang, however slowly it comes: a shape mutated to 2**31 rows of never-written
    64-byte chunks is 16,384 fills a MiB, about a second each, as slow for any reader."""
    out: dict[str, Any] = {}
    last = [time.monotonic()]

    def go() -> None:
        parts: list[bytes] = []
        try:
            with open(path, "rb", buffering=0) as f:
                got = 0
                while got < limit:
                    piece = f.read(min(MiB, limit - got))
                    last[0] = time.monotonic()
                    if not piece:
                        break
                    parts.append(piece)
                    got += len(piece)
            out["v"] = b"".join(parts)
        except OSError as exc:
            out["v"] = exc.errno

    t = threading.Thread(target=go, daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.1)
        if t.is_alive() and time.monotonic() - last[0] > timeout:
            return "hang"
    return out["v"]


def _listdir(path: Path) -> list[str] | int:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return exc.errno


def _clean(got: bytes | int | str, what: str, problems: list[str]) -> bytes | None:
    if isinstance(got, bytes):
        return got
    if got == "hang" or got not in ALLOWED:
        problems.append(f"{what}: {got if got == 'hang' else errno.errorcode.get(got, got)}")
    return None


def check(mnt: Path, root: Path, array: str, changed: dict[str, Any], log: Callable[[], str]) -> list[str]:
    """Every view of one case against zarr-python; the problems found (none: it holds).
    ``log`` gives the daemon's log so far."""
    problems: list[str] = []
    bombed = any(c in BOMBS for c in changed["chunk_hows"])
    # NCZarr's reference is netCDF-C and ZV's zarr-vectors, neither here (and netCDF-C
    # crashes on some hostile stores): their cases are held to the errnos, not to bytes
    fixture = changed.get("kind") in FIXTURES
    t0 = time.monotonic()
    ref = None if bombed or fixture else reference(root, array)
    wait = max(READ_TIMEOUT, 2 * (time.monotonic() - t0))
    # an array too big for the reference has no bytes to compare: the start of its files
    # shows whether they read or fail alone
    limit = BIG_READ if ref is None and not (bombed or fixture) else 256 * MiB
    base = mnt / ".zvfs/arrays" / array
    for family in ("arrays", "v2", "netcdf", "vectors"):
        # each is built from the whole store: one that fails to list is every case's views
        # failed, which the errnos allowed below would not show
        listed = _listdir(mnt / ".zvfs" / family)
        if not isinstance(listed, list):
            problems.append(f".zvfs/{family} does not list: {errno.errorcode.get(listed, listed)}")
    got_meta = timed_read(base / "meta.json")
    if got_meta == errno.EIO:
        # meta.json is made from what the discovery found, the error inside it: one that
        # fails is the discovery failed, every case of the store with it (a v1 order of
        # 1e400 did, and nothing said so: every file read EIO, which a case may)
        problems.append("meta.json: EIO")
    meta_raw = _clean(got_meta, "meta.json", problems)
    meta = json.loads(meta_raw) if meta_raw is not None else None
    files: dict[str, bytes | None] = {}
    for name in ("data.raw", "data.npy", "data.hdr"):
        files[name] = _clean(timed_read(base / name, limit, timeout=wait), name, problems)
    chunks = _listdir(base / "chunks")
    chunk_bytes = {}
    if isinstance(chunks, list):
        for c in chunks:
            chunk_bytes[c] = _clean(timed_read(base / "chunks" / c), f"chunks/{c}", problems)
    v2 = mnt / ".zvfs/v2" / array
    for name in _listdir(v2) if isinstance(_listdir(v2), list) else []:
        if not (v2 / name).is_dir():  # a ZV 0.7 array holds arrays of its own
            _clean(timed_read(v2 / name), f"v2/{name}", problems)
    if meta_raw is not None:
        problems += _strict_json(meta_raw, "meta.json")
    group = array.split("/", 1)[0]
    if fixture:
        problems += walk(mnt / ".zvfs/vectors" / group) + walk(mnt / ".zvfs/arrays" / group)
    nc = mnt / ".zvfs/netcdf" / f"{group}.nc"
    nc_bytes = _clean(timed_read(nc, limit, timeout=wait), "netcdf", problems)
    problems += _check_mirror_group(mnt / ".zvfs/v2", group)
    if meta is not None and meta.get("error"):
        text = log()
        if not any(k in text for k in changed["docs"] + [f"{array}/zarr.json", f"{array}/.zarray"]):
            problems.append(f"meta.json error {meta['error'][:120]!r} but no log line names the key")
    if isinstance(ref, Exception):
        for name in ("data.raw", "data.npy"):
            if files[name] is not None:
                problems.append(f"zarr-python refuses ({type(ref).__name__}: {str(ref)[:100]}) but {name} reads")
        return problems
    if ref is None:
        if bombed and not fixture and files["data.raw"] is not None:
            problems.append("a chunk claiming gigabytes, yet data.raw reads")
        return problems
    npy = files["data.npy"]
    if npy is None:
        return problems  # zvfs refuses what zarr-python reads: allowed (EIO/ENOENT)
    try:
        got = np.load(io.BytesIO(npy))
    except Exception as exc:  # noqa: BLE001
        return [*problems, f"data.npy does not load: {exc!r}"]
    if ref.dtype.kind not in "OT" and (got.shape != ref.shape or got.dtype.newbyteorder("=") != ref.dtype.newbyteorder("=")):
        return [*problems, f"data.npy is {got.shape} {got.dtype}, zarr-python reads {ref.shape} {ref.dtype}"]
    if ref.dtype.kind in "OT":  # text: served as U<n>, as wide as the longest value
        return [*problems, *_check_text(got, ref, files["data.raw"], nc_bytes)]
    want = ref.astype(got.dtype)
    if got.tobytes() != want.tobytes():
        problems.append(f"data.npy values differ: {got.ravel()[:6]} vs {ref.ravel()[:6]}")
    if files["data.raw"] is not None and files["data.raw"] != want.tobytes():
        problems.append("data.raw differs from zarr-python")
    if isinstance(meta, dict) and ref.ndim and isinstance(meta.get("chunks"), list):
        cs = meta["chunks"]
        for c, b in chunk_bytes.items():
            if b is None:
                continue
            idx = [int(i) for i in c.split(".")]
            region = want[tuple(slice(i * n, (i + 1) * n) for i, n in zip(idx, cs, strict=True))]
            if b != np.ascontiguousarray(region).tobytes():
                problems.append(f"chunks/{c} differs from zarr-python")
    problems += _check_mirror(mnt / ".zvfs/v2", array, ref)
    if nc_bytes is not None:
        problems += _check_netcdf(nc_bytes, ref)
    return problems


def _check_text(got: np.ndarray, ref: np.ndarray, raw: bytes | None, nc_bytes: bytes | None) -> list[str]:
    """Variable-length text as zarr-python reads it: data.npy fixed-width Unicode as wide as
    the longest value, data.raw its bytes, the netCDF variable's strings the same."""
    values = ref.tolist()
    width = max(1, max((len(v) for v in ref.reshape(-1).tolist()), default=0))
    if got.dtype != np.dtype(f"<U{width}") or got.shape != ref.shape:
        return [f"data.npy of text is {got.shape} {got.dtype}, zarr-python reads {ref.shape} of width {width}"]
    out = []
    if got.tolist() != values:
        out.append(f"data.npy strings differ: {got.ravel()[:4]} vs {ref.ravel()[:4]}")
    if raw is not None and raw != got.tobytes():
        out.append("data.raw of text differs from data.npy")
    if nc_bytes is not None:
        served = _netcdf_values(nc_bytes, text=True)
        if isinstance(served, str):
            out.append(served)
        elif served is not None and served.tolist() != values:
            out.append(f"netCDF strings differ: {str(served.tolist())[:80]} vs {str(values)[:80]}")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON")


def _strict_json(raw: bytes, what: str) -> list[str]:
    """[] if ``raw`` is JSON as RFC 8259 has it (no NaN, no Infinity), else the problem."""
    try:
        json.loads(raw, parse_constant=_no_constant)
    except ValueError as exc:
        return [f"{what} is not strict JSON: {exc}"]
    return []


#: files :func:`walk` reads below one case's tree, at most (scripts/fuzz-hostile reads all)
WALK_FILES = 16
#: bytes of a JSON file :func:`walk` reads, to check it whole
JSON_LIMIT = 64 * MiB


def walk(top: Path, limit: int = 1 << 16) -> list[str]:
    """Every directory below ``top`` lists and every file reads (its first ``limit`` bytes)
    or fails with EIO or ENOENT (the first WALK_FILES files, breadth first: the level's
    whole files before the chunks'); each JSON file is strict JSON."""
    problems: list[str] = []
    stack = [top]
    budget = WALK_FILES
    while stack and budget > 0:
        d = stack.pop()
        names = _listdir(d)
        if isinstance(names, int):
            if names not in ALLOWED:
                problems.append(f"listing {d.relative_to(top.parent)}: {errno.errorcode.get(names, names)}")
            continue
        for name in names:
            p = d / name
            if p.is_dir():
                stack.insert(0, p)
                continue
            budget -= 1
            if budget < 0:
                break
            # a JSON file whole (its first 64 KiB are no JSON document when it is longer)
            got = _clean(timed_read(p, JSON_LIMIT if name.endswith(".json") else limit),
                         str(p.relative_to(top.parent)), problems)
            if got is not None and name.endswith(".json"):
                problems += _strict_json(got, str(p.relative_to(top.parent)))
    return problems


def _check_mirror_group(v2: Path, group: str) -> list[str]:
    """The mirror's group (whatever its source said) is one zarr-python opens, and its
    documents JSON (with NaN and Infinity as literals: zarr-python, netCDF-C and GDAL read
    them as numbers, v2mirror.py)."""
    import zarr

    try:
        if not stat.S_ISDIR(os.stat(v2 / group).st_mode):
            return []
    except OSError as exc:  # a failure of the mirror's (asked again below): the case's problem
        return [] if exc.errno in ALLOWED else [f"v2 mirror group: {exc!r}"]
    out = []
    for name in (".zgroup", ".zattrs"):
        raw = timed_read(v2 / group / name)
        if isinstance(raw, bytes):
            try:
                json.loads(raw)
            except ValueError as exc:
                out.append(f"v2 mirror {name} of the group is not JSON: {exc}")
        elif raw == "hang" or raw not in ALLOWED:
            out.append(f"v2 mirror {name}: {raw}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dict(zarr.open_group(zarr.storage.LocalStore(str(v2)), path=group, mode="r").attrs)
    except OSError as exc:
        if exc.errno not in ALLOWED:
            out.append(f"v2 mirror group: {exc!r}")
    except Exception as exc:  # noqa: BLE001
        out.append(f"zarr-python cannot open the v2 mirror's group: {exc!r}"[:300])
    return out


def _check_mirror(v2: Path, array: str, ref: np.ndarray) -> list[str]:
    import zarr

    if not (v2 / array / ".zarray").exists():
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = zarr.open_array(zarr.storage.LocalStore(str(v2)), path=array, mode="r")[...]
    except OSError as exc:
        return [] if exc.errno in ALLOWED else [f"v2 mirror: {exc!r}"]
    except Exception as exc:  # noqa: BLE001
        return [f"zarr-python cannot read the v2 mirror: {exc!r}"[:300]]
    if ref.ndim == 0 and got.shape == (1,):
        got = got.reshape(())  # the mirror's 0-d array is netCDF-C's shape [1] (v2mirror.py)
    if got.shape != ref.shape or got.astype(ref.dtype).tobytes() != ref.tobytes():
        return [f"v2 mirror reads {got.ravel()[:6]}, zarr-python {ref.ravel()[:6]}"]
    return []


def _netcdf_values(data: bytes, text: bool = False) -> np.ndarray | str | None:
    """Variable ``a`` of the group's netCDF file ``data`` as netCDF4 reads it (strings decoded
    when ``text``, else the raw values), None when the file has none, or the problem."""
    import netCDF4

    # from a file: netCDF-C refuses (EPERM) some valid files held in memory, one with no
    # variable among them
    with tempfile.NamedTemporaryFile(suffix=".nc") as f:
        f.write(data)
        f.flush()
        try:
            with netCDF4.Dataset(f.name) as ds:
                if "a" not in ds.variables:
                    return None
                v = ds["a"]
                if not text:
                    v.set_auto_maskandscale(False)
                return np.asarray(v[...])
        except Exception as exc:  # noqa: BLE001
            return f"netCDF4 cannot read the group's file: {exc!r}"[:300]


def _check_netcdf(data: bytes, ref: np.ndarray) -> list[str]:
    got = _netcdf_values(data)
    if got is None:
        return []
    if isinstance(got, str):
        return [got]
    if ref.dtype.kind == "c" or got.shape != ref.shape:
        return []  # no netCDF type for it: served some other way
    if ref.dtype.kind == "b":
        # served as bytes of 0 and 1: zarr-python keeps a stored byte of 2 as it is (a True
        # numpy shows, whose byte is not 1), so the truth of each is compared
        if not np.array_equal(got != 0, ref.view(np.uint8) != 0):
            return [f"netCDF variable reads {got.ravel()[:6]}, zarr-python {ref.ravel()[:6]}"]
        return []
    if got.astype(ref.dtype).tobytes() != ref.tobytes():
        return [f"netCDF variable reads {got.ravel()[:6]}, zarr-python {ref.ravel()[:6]}"]
    return []

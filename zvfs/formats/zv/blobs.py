"""Pure parsers for the ZV blobs: fragment indexes, manifests, link cells, ragged blobs.

Each function takes the bytes of one decoded cell and the key it came from, and
either returns numpy arrays or raises :class:`ZVError` naming that key. Nothing
here does I/O, so the byte layouts (see docs: zv-format.md) are tested in isolation.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import ZVError

FRAGMENT_MAGIC = 0x5A564647
#: rows a chunk's fragment index may name, and fragments a manifest block may count: a
#: few bytes of index or manifest claiming 2**27 rows made the daemon build arrays of them
#: (GBs, then the kernel's OOM killer, in a helper's audit); stored bytes back no more
MAX_CHUNK_ROWS = 1 << 24
#: the most a level-wide table (whole tables read from the store, the manifests' fragment
#: numbers, the vertex rows and edges built from them) may take: its size is the metadata's
#: or the indexes' word, and a few bytes of either declared 2**28 rows
MAX_TABLE_BYTES = 256 << 20
#: fragment numbers a level's manifests may name together: the rows its objects are built from
MAX_NAMED_FRAGMENTS = MAX_TABLE_BYTES // 8
_FRAG_HEADER = struct.Struct("<IHHII")


@dataclass(frozen=True, slots=True)
class FragmentIndex:
    """One chunk's fragments: each is a row range or an explicit list of rows.

    ``rows(f)`` gives the row numbers of fragment ``f``; ``extent`` is one past the
    highest row any fragment names, i.e. the chunk's row count when fragments tile it.
    """

    key: str
    count: int
    is_range: np.ndarray  # bool (F,)
    ranges: np.ndarray  # int64 (R, 2) start, count
    offsets: np.ndarray  # uint32 (E+1,) into explicit
    explicit: np.ndarray  # int64 rows of the explicit fragments
    slot: np.ndarray  # int64 (F,) index into ranges (range fragment) or explicit fragments

    def rows(self, f: int, within: int | None = None) -> np.ndarray:
        """The rows of fragment ``f``. ``within``: the chunk's row count, checked before a
        range is expanded (a flipped index claimed 4 million rows of a chunk of one, and the
        rows were made, 32 MB a time, before they were found past its end)."""
        if not 0 <= f < self.count:
            raise ZVError(self.key, f"fragment {f} out of range (chunk has {self.count})")
        if within is not None:
            self.check(f, within)
        s = self._slot(f)
        if self.is_range[f]:
            start, n = (int(v) for v in self.ranges[s])
            return np.arange(start, start + n, dtype=np.int64)
        return self.explicit[int(self.offsets[s]) : int(self.offsets[s + 1])]

    def _slot(self, f: int) -> int:
        """Fragment ``f``'s index into ``ranges`` or the explicit fragments (ZVError for a
        fragment the chunk does not have)."""
        if not 0 <= f < self.count:
            raise ZVError(self.key, f"fragment {f} out of range (chunk has {self.count})")
        return int(self.slot[f])

    def check(self, f: int, within: int) -> None:
        """ZVError unless every row fragment ``f`` names is one of a chunk of ``within``
        rows, found without expanding a range."""
        s = self._slot(f)
        if self.is_range[f]:
            start, n = (int(v) for v in self.ranges[s])
            if start < 0 or n < 0 or start + n > within:
                raise ZVError(self.key, f"fragment {f} names rows {start} to {start + n - 1}, "
                              f"past the chunk's {within}")
            return
        rows = self.explicit[int(self.offsets[s]) : int(self.offsets[s + 1])]
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= within):
            raise ZVError(self.key, f"fragment {f} names a row past the chunk's {within}")

    def first(self, f: int) -> int | None:
        """The first row of fragment ``f`` (None when it has none), without expanding it."""
        s = self._slot(f)
        if self.is_range[f]:
            start, n = (int(v) for v in self.ranges[s])
            return start if n > 0 else None
        lo, hi = int(self.offsets[s]), int(self.offsets[s + 1])
        return int(self.explicit[lo]) if hi > lo else None

    def sizes(self) -> np.ndarray:
        """Row count of every fragment, without expanding them."""
        out = np.empty(self.count, dtype=np.int64)
        rng = self.is_range
        out[rng] = self.ranges[self.slot[rng], 1] if rng.any() else 0
        exp = ~rng
        if exp.any():
            s = self.slot[exp]
            out[exp] = self.offsets[s + 1].astype(np.int64) - self.offsets[s].astype(np.int64)
        return out

    def count_rows(self, frags: np.ndarray | range) -> int:
        """Rows the fragments ``frags`` name together, without expanding them (ZVError for
        a fragment the chunk does not have)."""
        if len(frags):  # a range's ends first: its numbers are made only once they are the chunk's
            lo, hi = (frags[0], frags[-1]) if isinstance(frags, range) else (int(np.min(frags)), int(np.max(frags)))
            if lo < 0 or hi >= self.count:
                raise ZVError(self.key, f"fragment {lo if lo < 0 else hi} out of range (chunk has {self.count})")
        frags = np.asarray(frags, np.int64)
        s = self.slot[frags]
        rng = self.is_range[frags]
        total = int(self.ranges[s[rng], 1].sum()) if rng.any() else 0
        e = s[~rng]
        if len(e):
            total += int((self.offsets[e + 1] - self.offsets[e]).sum())
        return total

    @property
    def extent(self) -> int:
        top = 0
        if len(self.ranges):
            top = int((self.ranges[:, 0] + self.ranges[:, 1]).max())
        if len(self.explicit):
            top = max(top, int(self.explicit.max()) + 1)
        return top


def parse_fragment_index(raw: bytes | memoryview, key: str) -> FragmentIndex:
    """Decode a ``fragment_index_v1`` blob (header, range bitmap, ranges, explicit rows)."""
    buf = memoryview(raw)
    if len(buf) < _FRAG_HEADER.size:
        raise ZVError(key, f"fragment index of {len(buf)} bytes is shorter than its header")
    magic, version, _flags, nfrag, nrange = _FRAG_HEADER.unpack_from(buf, 0)
    if magic != FRAGMENT_MAGIC:
        raise ZVError(
            key, f"wrong fragment index magic 0x{magic:08X} (expected 0x{FRAGMENT_MAGIC:08X})"
        )
    if version != 1:
        raise ZVError(key, f"unsupported fragment index version {version}")
    if nrange > nfrag:
        raise ZVError(key, f"fragment index claims {nrange} ranges among {nfrag} fragments")
    pos = _FRAG_HEADER.size
    nbitmap = (nfrag + 7) // 8
    nbitmap_padded = (nbitmap + 7) // 8 * 8
    need = pos + nbitmap_padded + 16 * nrange + 4 * (nfrag - nrange + 1)
    if len(buf) < need:
        raise ZVError(key, f"fragment index truncated ({len(buf)} bytes, need at least {need})")
    bits = np.unpackbits(np.frombuffer(buf, np.uint8, nbitmap, pos), bitorder="little")[:nfrag]
    is_range = bits.astype(bool)
    if int(is_range.sum()) != nrange:
        raise ZVError(
            key, f"fragment index bitmap marks {int(is_range.sum())} ranges, header says {nrange}"
        )
    pos += nbitmap_padded
    ranges = np.frombuffer(buf, "<i8", 2 * nrange, pos).reshape(nrange, 2).astype(np.int64)
    pos += 16 * nrange
    nexp = nfrag - nrange
    offsets = np.frombuffer(buf, "<u4", nexp + 1, pos).astype(np.int64)
    pos += 4 * (nexp + 1)
    total = int(offsets[-1]) if nexp >= 0 else 0
    if np.any(np.diff(offsets) < 0) or (len(offsets) and offsets[0] != 0):
        raise ZVError(key, "fragment index explicit offsets are not increasing from 0")
    if len(buf) < pos + 8 * total:
        raise ZVError(key, f"fragment index truncated in explicit rows ({total} expected)")
    explicit = np.frombuffer(buf, "<i8", total, pos).astype(np.int64)
    if len(ranges) and (ranges.min() < 0):
        raise ZVError(key, "fragment index has a negative range")
    # each part first: their int64 sum wraps (2**62 + 2**62 is -2**63), and ranges that
    # wrapped passed this bound, so listing the chunk expanded every range before them
    if len(ranges) and (int(ranges.max()) > MAX_CHUNK_ROWS
                        or int((ranges[:, 0] + ranges[:, 1]).max()) > MAX_CHUNK_ROWS):
        raise ZVError(key, f"fragment index names rows past {MAX_CHUNK_ROWS:,}; no chunk has so many")
    if len(explicit) and (int(explicit.min()) < 0 or int(explicit.max()) >= MAX_CHUNK_ROWS):
        raise ZVError(key, f"fragment index names row {int(explicit.min()) if explicit.min() < 0 else int(explicit.max())}"
                           f", outside 0..{MAX_CHUNK_ROWS:,}")
    slot = np.where(is_range, np.cumsum(is_range) - 1, np.cumsum(~is_range) - 1).astype(np.int64)
    return FragmentIndex(key, nfrag, is_range, ranges, offsets, explicit, slot)


# --- object manifests --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ManifestBlock:
    """A run of one object's fragments in one chunk."""

    chunk: tuple[int, ...]
    #: fragment numbers within that chunk, in order: a mode-1 block's run stays a range, made
    #: into numbers only once its chunk's fragment index has them (FragmentIndex.count_rows)
    fragments: np.ndarray | range


def parse_manifest(raw: bytes | memoryview, ndim: int, key: str, named: int = 0) -> list[ManifestBlock]:
    """Decode one object manifest: u32 B, then B blocks (coords, mode, payload).

    A mode-1 block is a count, kept as a range: 40 blocks of 2**24 in 1,644 bytes had the
    daemon build 5 GiB of fragment numbers as the level was listed, before any was checked
    against its chunk (a helper's audit). ``named``: the fragments the level's manifests
    before this one name; all together name at most MAX_NAMED_FRAGMENTS."""
    buf = memoryview(raw)
    if len(buf) < 4:
        raise ZVError(key, f"manifest of {len(buf)} bytes is shorter than its header")
    (nblocks,) = struct.unpack_from("<I", buf, 0)
    pos = 4
    out: list[ManifestBlock] = []
    for b in range(nblocks):
        if pos + 8 * ndim + 1 > len(buf):
            raise ZVError(key, f"manifest truncated in block {b} of {nblocks}")
        coords = tuple(int(c) for c in np.frombuffer(buf, "<i8", ndim, pos))
        pos += 8 * ndim
        mode = buf[pos]
        pos += 1
        if mode == 0:
            if pos + 8 > len(buf):
                raise ZVError(key, f"manifest truncated in block {b}")
            frags = np.frombuffer(buf, "<i8", 1, pos).astype(np.int64)
            pos += 8
        elif mode == 1:
            if pos + 16 > len(buf):
                raise ZVError(key, f"manifest truncated in block {b}")
            start, count = struct.unpack_from("<qq", buf, pos)
            pos += 16
            if count < 0 or count > MAX_CHUNK_ROWS:
                raise ZVError(key, f"manifest block {b} counts {count} fragments")
            frags = range(start, start + count)
        elif mode == 2:
            if pos + 4 > len(buf):
                raise ZVError(key, f"manifest truncated in block {b}")
            (n,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            if pos + 8 * n > len(buf):
                raise ZVError(key, f"manifest truncated in block {b}")
            frags = np.frombuffer(buf, "<i8", n, pos).astype(np.int64)
            pos += 8 * n
        else:
            raise ZVError(key, f"manifest block {b} has unknown mode {mode}")
        named += len(frags)  # a range's length, its numbers not made
        if named > MAX_NAMED_FRAGMENTS:
            raise ZVError(key, f"the level's manifests name more than {MAX_NAMED_FRAGMENTS:,} fragments; "
                               f"zvfs builds level-wide tables of at most {MAX_TABLE_BYTES >> 20} MiB")
        out.append(ManifestBlock(coords, frags))
    if pos != len(buf):
        raise ZVError(key, f"manifest has {len(buf) - pos} trailing bytes")
    return out


# --- links ---------------------------------------------------------------------------------


def parse_ragged(raw: bytes | memoryview, ncols: int, dtype: np.dtype, key: str) -> np.ndarray:
    """Rows of an inline ragged blob (int64 K, K int64 byte offsets, then rows), concatenated."""
    buf = memoryview(raw)
    if len(buf) == 0:
        return np.empty((0, ncols), dtype)
    if len(buf) < 8:
        raise ZVError(key, "ragged blob shorter than its header")
    (k,) = struct.unpack_from("<q", buf, 0)
    head = 8 * (1 + k)
    if k < 0 or head > len(buf):
        raise ZVError(
            key, f"ragged blob header claims {k} groups but the blob has {len(buf)} bytes"
        )
    if k == 0:
        return np.empty((0, ncols), dtype)
    offsets = np.frombuffer(buf, "<i8", k, 8)
    body = len(buf) - head
    if np.any(offsets < 0) or np.any(offsets > body) or np.any(np.diff(offsets) < 0):
        raise ZVError(key, "ragged blob offsets point past the end of the blob")
    return rows_of(buf[head:], ncols, dtype, key)


def rows_of(raw: bytes | memoryview, ncols: int, dtype: np.dtype, key: str) -> np.ndarray:
    """Reshape a flat little-endian buffer into (n, ncols) rows; error if it does not divide."""
    dtype = np.dtype(dtype).newbyteorder("<")
    row = dtype.itemsize * max(ncols, 1)
    if len(raw) % row:
        raise ZVError(
            key, f"blob of {len(raw)} bytes is not a whole number of {row}-byte rows (truncated?)"
        )
    return np.frombuffer(raw, dtype).reshape(-1, ncols)


def lehmer_decode(code: int, width: int) -> list[int]:
    """The permutation of range(width) whose Lehmer code is ``code``."""
    available = list(range(width))
    perm = []
    fact = math.factorial(width)
    for i in range(width):
        fact //= width - i
        idx, code = divmod(code, fact)
        perm.append(available.pop(idx))
    return perm


@lru_cache(maxsize=16)
def unpermute_table(width: int) -> np.ndarray:
    """For every perm code, the gather that puts stored endpoints back in written order."""
    return np.array(
        [np.argsort(lehmer_decode(c, width)) for c in range(math.factorial(width))], dtype=np.int64
    ).reshape(-1, width)


#: widest link whose endpoint permutations are undone: the table holds width! rows (8:
#: 40,320); links are pairs, triangles, quads and the like, and metadata declaring a width
#: of 20 would have the daemon build 20! of them
MAX_PERM_WIDTH = 8


def unpermute_gather(perm: np.ndarray, width: int, key: str) -> np.ndarray:
    """(M, width) gathers: ``written[:, j] = stored[:, gather[:, j]]`` for each perm_idx."""
    if width > MAX_PERM_WIDTH:
        raise ZVError(key, f"links of {width} endpoints with permutations: at most {MAX_PERM_WIDTH} are supported")
    table = unpermute_table(width)
    perm = np.asarray(perm, np.int64)
    if perm.size and (perm.min() < 0 or perm.max() >= len(table)):
        raise ZVError(key, f"perm_idx out of range [0, {len(table)})")
    return table[perm]


def parse_offsets_segment(seg: str) -> list[tuple[int, ...]]:
    """'+1.-1.0_+1.0.+1' -> [(1, -1, 0), (1, 0, 1)]; '0.0.0' -> [(0, 0, 0)]."""
    try:
        return [tuple(int(c) for c in part.split(".")) for part in seg.split("_")]
    except ValueError as exc:
        raise ZVError(seg, f"bad link offsets segment {seg!r}") from exc


def parse_chunk_name(name: str) -> tuple[int, ...]:
    """'-1.0.2' -> (-1, 0, 2); ValueError if it is not a chunk name."""
    return tuple(int(c) for c in name.split("."))


def chunk_name(coords: tuple[int, ...]) -> str:
    """(-1, 0, 2) -> '-1.0.2': the sign is kept, as in the store's own keys."""
    return ".".join(str(int(c)) for c in coords)

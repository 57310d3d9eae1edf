"""bzip2 and LZMA zip members, read forward with every step's output bounded.

Python's zipfile inflates a deflated member in bounded steps, but hands each read's
compressed bytes (4 KiB at least) to a bzip2 or LZMA decompressor whole, with no bound on
what comes out: 4 KiB of bzip2 holding zeros is gigabytes. A zip of 212 bytes, one bzip2
member of 128 MiB of zeros, took 397 MiB (tracemalloc's peak) to read 4 KiB at each end,
and 269 MiB to read one MiB of it with its size declared as 10 bytes (found by a helper's
audit); 2 MiB and none now. Here each
decompress call is told the most it may return, as zvfs's own inflater is (zvfs.stores.zip),
so a bomb streams like any other member, and a member that holds more than its directory
entry declares is corrupt, as a deflated one is.

Checked as zipfile checks (and so zarr-python's ZipStore): the CRC-32 once the declared
size is reached, and data that ends before it.
"""

from __future__ import annotations

import bz2
import lzma
import os
import threading
import zipfile
import zlib

#: compressed bytes read a step, and the most output one decompress call may return
IN_STEP = 16 << 10
OUT_STEP = 1 << 20
#: the smallest LZMA dictionary liblzma makes (a smaller size is raised to it)
_LZMA_MIN_DICT = 4096

METHODS = (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


class Corrupt(Exception):
    """The member's bytes are no stream of its method, or contradict its directory entry."""


def _lzma_decompressor(props: bytes, size: int) -> lzma.LZMADecompressor:
    """A raw LZMA1 decompressor from a zip LZMA member's properties (APPNOTE 5.8.8: one
    byte holding lc, lp and pb, then the dictionary size, 4 bytes little-endian).

    The dictionary is what liblzma allocates at once, whatever the member holds: a member
    declaring 4 GiB made it try 4 GiB. No reference reaches further back than the output
    before it, so a dictionary the size of the declared output (a longer output is corrupt
    anyway) decodes every honest member."""
    if len(props) != 5:
        raise Corrupt(f"LZMA properties of {len(props)} bytes, not 5")
    d = props[0]
    lc, d = d % 9, d // 9
    lp, pb = d % 5, d // 5
    if pb > 4:
        raise Corrupt("invalid LZMA properties")
    dict_size = min(int.from_bytes(props[1:5], "little"), max(size, _LZMA_MIN_DICT))
    try:
        return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[
            {"id": lzma.FILTER_LZMA1, "dict_size": dict_size, "lc": lc, "lp": lp, "pb": pb}])
    except (lzma.LZMAError, ValueError) as e:
        raise Corrupt(f"invalid LZMA properties: {e}") from None


class Unpacker:
    """One bzip2 or LZMA member's bytes from its start: :meth:`read` gives the next ones.

    ``offset`` is where its compressed data begins in the archive open as ``fd``. An
    OSError of the archive's own reads goes to the caller as it is (nothing is known of
    the member then); what the member's bytes get wrong is :class:`Corrupt`."""

    def __init__(self, fd: int, offset: int, compress_size: int, method: int, size: int, crc: int) -> None:
        if method not in METHODS:
            raise ValueError(f"not a bzip2 or LZMA member: method {method}")
        self._fd = fd
        self._at, self._end = offset, offset + compress_size
        self._lzma = method == zipfile.ZIP_LZMA
        self._dec: bz2.BZ2Decompressor | lzma.LZMADecompressor | None = (
            None if self._lzma else bz2.BZ2Decompressor())
        self._size, self._crc_wanted = size, crc
        self._crc = 0
        #: output bytes given so far
        self.pos = 0

    def tell(self) -> int:
        return self.pos

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the declared end). Reaching that end checks the
        CRC-32 and that the stream holds no more."""
        n = min(n, self._size - self.pos)
        pieces, got = [], 0
        while got < n:
            piece = self._step(min(n - got, OUT_STEP))
            if not piece:
                raise Corrupt(f"decompressed to fewer bytes than declared ({self.pos + got} of "
                              f"{self._size})")
            pieces.append(piece)
            got += len(piece)
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._crc = zlib.crc32(data, self._crc)
        self.pos += len(data)
        if self.pos == self._size and n > 0:
            self._finish()
        return data

    def _input(self) -> bytes:
        n = min(IN_STEP, self._end - self._at)
        if n <= 0:
            return b""
        data = os.pread(self._fd, n, self._at)
        if not data:
            raise Corrupt("zip member data is truncated")
        self._at += len(data)
        return data

    def _step(self, most: int) -> bytes:
        """Up to ``most`` bytes of output; b"" once the stream or its data has ended."""
        while True:
            dec = self._dec
            if dec is None:
                dec = self._dec = self._start_lzma()
            if dec.eof:
                return b""
            feed = self._input() if dec.needs_input else b""
            if dec.needs_input and not feed:
                return b""
            try:
                out = dec.decompress(feed, most)
            except (OSError, EOFError, ValueError, lzma.LZMAError) as e:  # bz2 says OSError
                raise Corrupt(str(e) or type(e).__name__) from None
            if out:
                return out
            if not feed and not dec.needs_input and not dec.eof:
                raise Corrupt("the decompressor made no progress")  # never loop on it

    def _start_lzma(self) -> lzma.LZMADecompressor:
        header = os.pread(self._fd, min(9, self._end - self._at), self._at)
        if len(header) < 4:
            raise Corrupt("LZMA member too short for its header")
        psize = int.from_bytes(header[2:4], "little")
        if len(header) < 4 + psize:  # the properties are 5 bytes: anything else is refused
            raise Corrupt(f"LZMA properties of {psize} bytes, not 5")
        dec = _lzma_decompressor(header[4:4 + psize], self._size)
        self._at += 4 + psize
        return dec

    def _finish(self) -> None:
        if self._crc != self._crc_wanted:
            raise Corrupt(f"CRC-32 mismatch (computed {self._crc:08x}, zip directory says "
                          f"{self._crc_wanted:08x})")
        if self._step(1):
            raise Corrupt("its stream holds more bytes than declared")


class StreamPool:
    """A few idle readers, parked where their last read ended.

    Sequential reads of a big compressed member (cp, the raw view's read-ahead)
    continue from the nearest parked reader at or before the wanted offset
    instead of decompressing from the start each time. Each reader holds only
    a decompressor state (a bzip2 one up to about 4 MiB; an LZMA one its
    dictionary, at most the member's size) and a small buffer.
    """

    def __init__(self, limit: int = 8) -> None:
        self._limit = limit
        self._idle: list[tuple[str, Unpacker]] = []  # oldest first
        self._lock = threading.Lock()

    def take(self, key: str, start: int) -> Unpacker | None:
        with self._lock:
            best = -1
            for i, (k, r) in enumerate(self._idle):
                if k == key and r.tell() <= start and (best < 0 or r.tell() > self._idle[best][1].tell()):
                    best = i
            return self._idle.pop(best)[1] if best >= 0 else None

    def give(self, key: str, reader: Unpacker) -> None:
        with self._lock:
            self._idle.append((key, reader))
            if len(self._idle) > self._limit:
                del self._idle[0]

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()

"""A store backed by one zip file (zarr-python's ZipStore, ``zip -r``, ``zip -0 -r``).

The central directory is read once at open and kept as an in-memory tree, so
listings never touch the file. Every read is a ``pread`` on one shared file
descriptor, which is thread safe without locks or a shared file position.
Stored members are sliced straight out of the archive; compressed members are
decompressed on the fly (nothing big is cached).

zarr-python writes members without file-type bits in ``external_attr``, so the
mode bits are never trusted: a directory entry is a name ending in '/'.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import struct
import threading
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from zvfs.stores._util import check_key, check_prefix
from zvfs.stores.base import KeyInfo, KeyNotFound, Listing, SourceError, Store, StoreError
from zvfs.stores.keys import bad_segment

log = logging.getLogger(__name__)

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_LOCAL_MAGIC = b"PK\x03\x04"
# compressed members at least this big keep parked decompressors for sequential reads
_POOL_MIN_SIZE = 4 << 20
#: block size the raw view uses when the archive has compressed members (decoded blocks
#: are cached, so re-reads do not decompress again); 0 for all-stored archives: pread is cheap
COMPRESSED_BLOCK_SIZE = 1 << 20


@dataclass(slots=True)
class _Member:
    info: zipfile.ZipInfo
    mtime: float
    data_offset: int = -1  # filled lazily from the local header


class ZipStore(Store):
    """Read-only store over the members of a zip archive (zip64 included)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        shown = os.path.abspath(os.fspath(path))
        self.path = shown
        self.description = shown
        try:
            fd = os.open(shown, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SourceError(f"source zip file {shown} does not exist") from None
        except OSError as e:
            raise SourceError(f"cannot open zip file {shown}: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SourceError(f"source {shown} is not a regular file, so not a zip archive")
            self._fd = fd
            self._size = st.st_size
            self._members: dict[str, _Member] = {}
            self._dirs: dict[str, Listing] = {"": Listing()}
            self._read_central_directory(st.st_mtime)
        except BaseException:
            os.close(fd)
            raise
        self._closed = False
        self._lock = threading.Lock()
        self._streams = _StreamPool()
        if any(m.info.compress_type != zipfile.ZIP_STORED for m in self._members.values()):
            self.block_size = COMPRESSED_BLOCK_SIZE

    def _read_central_directory(self, fallback_mtime: float) -> None:
        """Parse the central directory once (through a private file object) and build the tree."""
        try:
            with open(self._fd, "rb", closefd=False) as fh, zipfile.ZipFile(fh) as zf:
                infos = zf.infolist()
        except zipfile.BadZipFile as e:
            raise SourceError(
                f"{self.path} is not a valid zip archive (truncated or corrupt: {e})"
            ) from e
        except (OSError, EOFError, ValueError, struct.error) as e:
            raise SourceError(f"cannot read the zip directory of {self.path}: {e}") from e
        skipped: list[str] = []
        for zi in infos:
            name = _member_name(zi)
            if name.endswith("/"):  # directory entry: an (empty) prefix
                d = name.rstrip("/")
                if d and bad_segment(d) is None:
                    self._add_prefixes(d + "/")
                elif d:
                    skipped.append(name)
                continue
            if bad_segment(name) is not None:
                skipped.append(name)
                continue
            # the last of duplicate names wins, as in zipfile and zarr-python
            self._members[name] = _Member(zi, _zip_mtime(zi.date_time, fallback_mtime))
            parent, _, base = name.rpartition("/")
            pre = parent + "/" if parent else ""
            self._add_prefixes(pre)
            self._dirs[pre].keys[base] = KeyInfo(zi.file_size, self._members[name].mtime)
        for name in skipped[:20]:
            log.warning("%s: member %r is not a safe path; ignored", self.path, name)
        if len(skipped) > 20:
            log.warning("%s: %d more unsafe member names ignored", self.path, len(skipped) - 20)

    def _add_prefixes(self, prefix: str) -> None:
        """Make sure ``prefix`` ('' or 'a/b/') and all its ancestors are listed directories."""
        child: str | None = None
        while True:
            listing = self._dirs.get(prefix)
            created = listing is None
            if listing is None:
                listing = self._dirs[prefix] = Listing()
            if child is not None:
                listing.prefixes.add(child)
            if not created or prefix == "":
                return
            parent, _, child = prefix[:-1].rpartition("/")
            prefix = parent + "/" if parent else ""

    # -- Store API ---------------------------------------------------------------------------

    def info(self, key: str) -> KeyInfo:
        m = self._member(key)
        return KeyInfo(m.info.file_size, m.mtime)

    def list_dir(self, prefix: str) -> Listing:
        check_prefix(prefix)
        listing = self._dirs.get(prefix)
        if listing is None:
            return Listing()
        return Listing(dict(listing.keys), set(listing.prefixes))

    def list_prefix(self, prefix: str) -> Iterator[str]:
        if prefix:
            check_prefix(prefix)
        yield from sorted(k for k in self._members if k.startswith(prefix))

    def get(self, key: str) -> bytes:
        m = self._member(key)
        return self._read(key, m, 0, m.info.file_size)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"{key}: bad range start={start} length={length}")
        m = self._member(key)
        size = m.info.file_size
        if start >= size or length == 0:
            return b""
        return self._read(key, m, start, min(length, size - start))

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._streams.clear()
                os.close(self._fd)

    # -- internals ---------------------------------------------------------------------------

    def _member(self, key: str) -> _Member:
        check_key(key)
        m = self._members.get(key)
        if m is None:
            raise KeyNotFound(key)
        return m

    def _data_offset(self, key: str, m: _Member) -> int:
        """Where the member's data starts: after its local header (read once, then kept)."""
        if m.data_offset >= 0:
            return m.data_offset
        zi = m.info
        try:
            raw = os.pread(self._fd, _LOCAL_HEADER.size, zi.header_offset)
        except OSError as e:
            raise StoreError(f"{key}: cannot read zip local header: {e.strerror}") from e
        if len(raw) != _LOCAL_HEADER.size:
            raise StoreError(f"{key}: zip local header is truncated")
        magic, name_len, extra_len = _LOCAL_HEADER.unpack(raw)
        if magic != _LOCAL_MAGIC:
            raise StoreError(f"{key}: bad zip local header at offset {zi.header_offset}")
        off = zi.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        if off + zi.compress_size > self._size:
            raise StoreError(f"{key}: member data extends past the end of the zip file")
        m.data_offset = off  # benign race: every thread computes the same value
        return off

    def _read(self, key: str, m: _Member, start: int, length: int) -> bytes:
        zi = m.info
        if zi.flag_bits & 0x1:
            raise StoreError(f"{key}: zip member is encrypted")
        off = self._data_offset(key, m)
        if zi.compress_type == zipfile.ZIP_STORED:
            if zi.compress_size != zi.file_size:
                raise StoreError(f"{key}: stored zip member has inconsistent sizes")
            try:
                data = os.pread(self._fd, length, off + start)
            except OSError as e:
                raise StoreError(f"{key}: read failed: {e.strerror}") from e
            if len(data) != length:
                raise StoreError(f"{key}: zip member data is truncated")
            return data
        pooled = zi.file_size >= _POOL_MIN_SIZE and start + length < zi.file_size
        reader = self._streams.take(key, start) if pooled else None
        try:
            if reader is None:
                reader = zipfile.ZipExtFile(_RegionFile(self._fd, off, zi.compress_size), "rb", zi)
            skip = start - reader.tell()
            while skip > 0:  # read forward in bounded steps (seek would buffer up to 16 MiB)
                n = len(reader.read(min(skip, 1 << 20)))
                if n == 0:
                    break
                skip -= n
            data = reader.read(length)
        except NotImplementedError as e:
            raise StoreError(f"{key}: unsupported zip compression: {e}") from e
        except Exception as e:  # zlib.error, BadZipFile (CRC), EOFError, lzma/bz2 errors, OSError
            raise StoreError(f"{key}: corrupt zip member: {e}") from e
        if len(data) != length:
            raise StoreError(f"{key}: zip member decompressed to fewer bytes than declared")
        if pooled:
            self._streams.give(key, reader)
        return data


class _StreamPool:
    """A few idle decompressing readers, parked where their last read ended.

    Sequential reads of a big compressed member (cp, the raw view's read-ahead)
    continue from the nearest parked reader at or before the wanted offset
    instead of decompressing from the start each time. Each reader holds only
    a decompressor state and a small buffer.
    """

    def __init__(self, limit: int = 8) -> None:
        self._limit = limit
        self._idle: list[tuple[str, zipfile.ZipExtFile]] = []  # oldest first
        self._lock = threading.Lock()

    def take(self, key: str, start: int) -> zipfile.ZipExtFile | None:
        with self._lock:
            best = -1
            for i, (k, r) in enumerate(self._idle):
                if k == key and r.tell() <= start and (best < 0 or r.tell() > self._idle[best][1].tell()):
                    best = i
            return self._idle.pop(best)[1] if best >= 0 else None

    def give(self, key: str, reader: zipfile.ZipExtFile) -> None:
        with self._lock:
            self._idle.append((key, reader))
            if len(self._idle) > self._limit:
                self._idle.pop(0)[1].close()

    def clear(self) -> None:
        with self._lock:
            for _, r in self._idle:
                r.close()
            self._idle.clear()


class _RegionFile(io.RawIOBase):
    """A private, seekable view of ``length`` bytes at ``offset`` of a shared fd, via pread."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__()
        self._fd, self._off, self._len, self._pos = fd, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        left = self._len - self._pos
        if n is None or n < 0 or n > left:
            n = left
        if n <= 0:
            return b""
        data = os.pread(self._fd, n, self._off + self._pos)
        self._pos += len(data)
        return data

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _member_name(zi: zipfile.ZipInfo) -> str:
    """The member's name as UTF-8 text.

    Info-ZIP's ``zip`` on Linux stores UTF-8 names without setting the UTF-8 flag,
    so zipfile decodes them as cp437; undo that when the bytes are valid UTF-8.
    An Info-ZIP Unicode Path extra field (0x7075), when present and current, wins.
    """
    name = zi.filename
    if zi.flag_bits & 0x800:
        return name
    extra = zi.extra
    i = 0
    while i + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4:i + 4 + size]
        if tag == 0x7075 and len(body) > 5 and body[0] == 1:
            (crc,) = struct.unpack_from("<I", body, 1)
            try:
                raw = zi.orig_filename.encode("cp437")
                if zlib.crc32(raw) == crc:
                    return body[5:].decode("utf-8")
            except (UnicodeError, ValueError):
                pass
        i += 4 + size
    try:
        return name.encode("cp437").decode("utf-8")
    except UnicodeError:
        return name


def _zip_mtime(date_time: tuple[int, int, int, int, int, int], fallback: float) -> float:
    """Member time as zipfile gives it (local time, no zone); the archive's mtime if invalid."""
    try:
        return time.mktime((*date_time, 0, 0, -1))
    except (OverflowError, ValueError):
        return fallback

"""A zip archive's central directory, read as Python's zipfile reads it, into arrays.

zipfile makes a ZipInfo of some twenty attributes per member and reads the whole
central directory into memory at once: opening an archive of 200,000 members took
2.6 s and kept ~700 bytes a member, and one of a million took most of half a minute
before the mount answered. A zip store needs a dozen numbers and a name per member,
so this parser keeps them in parallel arrays (about 50 bytes a member, the names
kept by the store's listings) and reads the directory in windows of 1 MiB.

It accepts and refuses exactly what zipfile does (Python 3.11's ``_EndRecData``,
``_EndRecData64``, ``_RealGetContents`` and ``ZipInfo._decodeExtra``), with the
same exception types and messages, so an archive zarr-python opens is one the
mount serves, and one it refuses is refused with the words zipfile uses: a test
compares both on thousands of mutated directories. It reads with ``pread`` only.
"""

from __future__ import annotations

import functools
import os
import struct
import time
import zipfile
import zlib
from array import array
from typing import NamedTuple

#: signature, disk, disk of the directory, entries here, entries, size, offset, comment length
_END = struct.Struct("<4s4H2LH")
_END_MAGIC = b"PK\x05\x06"
#: signature, disk of the zip64 record, its offset, disks
_LOCATOR = struct.Struct("<4sLQL")
_LOCATOR_MAGIC = b"PK\x06\x07"
#: signature, record size, versions, disk, disk of the directory, entries here, entries,
#: directory size, directory offset
_END64 = struct.Struct("<4sQ2H2L4Q")
_END64_MAGIC = b"PK\x06\x06"
#: one central directory header (zipfile's structCentralDir)
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_CENTRAL_MAGIC = b"PK\x01\x02"
#: the newest "version needed to extract" zipfile reads (its MAX_EXTRACT_VERSION)
_MAX_VERSION = 63
#: bytes of the directory read at once
_WINDOW = 1 << 20
_U32 = 0xFFFF_FFFF
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

#: extra fields that hold a member's time in UTC: Info-ZIP's extended timestamp ("UT",
#: which the ``zip`` command writes) and NTFS times (7-Zip, Windows)
_ZIP64_TAG, _UT_TAG, _NTFS_TAG, _UPATH_TAG = 0x0001, 0x5455, 0x000A, 0x7075
#: 100 ns intervals from 1601-01-01 (NTFS) to 1970-01-01
_NTFS_EPOCH = 116444736000000000


class Entry(NamedTuple):
    """One member as zipfile's ZipInfo gives it (the fields a store reads)."""

    index: int
    orig_filename: str
    header_offset: int
    compress_size: int
    file_size: int
    CRC: int
    compress_type: int
    flag_bits: int
    extra_len: int


class Directory:
    """The members of one archive, in directory order, as parallel arrays.

    ``data_offsets``, ``checked`` and ``bad`` are the store's to fill as it reads
    (where each member's data starts, the archive generation that was checked at,
    why a member is known to be corrupt)."""

    def __init__(self) -> None:
        self.offsets = array("q")  # local header offsets; those past int64 are in ``far``
        self.far: dict[int, int] = {}
        self.compressed = array("Q")
        self.sizes = array("Q")
        self.crcs = array("I")
        self.methods = array("H")
        self.flags = array("H")
        self.extra_lens = array("H")
        self.mtimes = array("q")
        self.data_offsets = array("q")
        self.checked = array("Q")
        self.bad: dict[int, str] = {}
        #: zipfile's orig_filename where it is not the name served (a NUL, cp437, Unicode Path)
        self.orig: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.offsets)

    def header_offset(self, i: int) -> int:
        return self.far.get(i, self.offsets[i]) if self.far else self.offsets[i]

    def entry(self, i: int, served: str) -> Entry:
        """Member ``i``, whose served name is ``served``, as zipfile sees it."""
        return Entry(i, self.orig.get(i, served), self.header_offset(i), self.compressed[i],
                     self.sizes[i], self.crcs[i], self.methods[i], self.flags[i], self.extra_lens[i])


class _Window:
    """The directory's bytes [start, end) of the file, read by pread in windows."""

    __slots__ = ("fd", "end", "buf", "lo")

    def __init__(self, fd: int, start: int, end: int) -> None:
        self.fd, self.end = fd, end
        self.buf, self.lo = b"", start

    def at(self, pos: int, n: int) -> int:
        """The index in ``buf`` of file offset ``pos``, with ``buf`` holding the bytes
        [pos, pos + n) or as many of them as the directory has."""
        want = min(pos + n, self.end)
        if pos < self.lo or want > self.lo + len(self.buf):
            size = max(_WINDOW, want - pos)
            self.buf = _pread_all(self.fd, min(size, self.end - pos), pos)
            self.lo = pos
        return pos - self.lo


def _pread_all(fd: int, n: int, pos: int) -> bytes:
    """``n`` bytes at ``pos``, fewer only at the end of the file (pread may return less)."""
    parts = []
    while n > 0:
        got = os.pread(fd, n, pos)
        if not got:
            break
        parts.append(got)
        n -= len(got)
        pos += len(got)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _end_record(fd: int, size: int) -> tuple[int, int, int, bool] | None:
    """(directory size, directory offset, end record offset, zip64) as zipfile's
    ``_EndRecData`` finds them, or None where it finds none."""
    if size < _END.size:
        return None
    tail = _pread_all(fd, _END.size, size - _END.size)
    if tail[:4] == _END_MAGIC and tail[-2:] == b"\0\0":
        at, rec = size - _END.size, tail
    else:  # a comment follows: the last signature in the last 64 KiB
        lo = max(size - (1 << 16) - _END.size, 0)
        data = _pread_all(fd, size - lo, lo)
        found = data.rfind(_END_MAGIC)
        if found < 0:
            return None
        rec = data[found:found + _END.size]
        if len(rec) != _END.size:
            return None
        at = lo + found
    fields = _END.unpack(rec)
    cd_size, cd_offset = fields[5], fields[6]
    zip64 = _end64(fd, size, at)
    if zip64 is not None:
        cd_size, cd_offset = zip64
    return cd_size, cd_offset, at, zip64 is not None


def _end64(fd: int, size: int, at: int) -> tuple[int, int] | None:
    """The zip64 record's (directory size, offset) for the end record at ``at``, as
    zipfile's ``_EndRecData64`` reads it (None where it takes the plain record)."""
    loc_at = at - _LOCATOR.size
    if loc_at < 0:  # zipfile's seek fails: no room for a locator
        return None
    data = _pread_all(fd, _LOCATOR.size, loc_at)
    if len(data) != _LOCATOR.size:
        return None
    magic, disk, _, disks = _LOCATOR.unpack(data)
    if magic != _LOCATOR_MAGIC:
        return None
    if disk != 0 or disks > 1:
        raise zipfile.BadZipFile("zipfiles that span multiple disks are not supported")
    rec_at = loc_at - _END64.size
    if rec_at < 0:  # zipfile's seek raises here, which it reports as not a zip file
        raise zipfile.BadZipFile("File is not a zip file")
    data = _pread_all(fd, _END64.size, rec_at)
    if len(data) != _END64.size:
        return None
    fields = _END64.unpack(data)
    if fields[0] != _END64_MAGIC:
        return None
    return fields[8], fields[9]


def read_directory(fd: int, fallback_ns: int) -> tuple[Directory, list[str]]:
    """The archive's members and the name each is served as (zipfile's name, as UTF-8:
    see :func:`served_name`), in directory order. Raises what zipfile raises for the
    same bytes: BadZipFile, NotImplementedError (a version past 6.3), UnicodeDecodeError
    (a name flagged UTF-8 that is not); OSError when the file cannot be read.
    ``fallback_ns``: the mtime of members whose DOS time is invalid (the archive's)."""
    size = os.fstat(fd).st_size
    end = _end_record(fd, size)
    if end is None:
        raise zipfile.BadZipFile("File is not a zip file")
    cd_size, cd_offset, at, zip64 = end
    concat = at - cd_size - cd_offset  # bytes before the archive (a self-extractor's stub)
    if zip64:
        concat -= _END64.size + _LOCATOR.size
    start = cd_offset + concat
    if start < 0:
        raise zipfile.BadZipFile("Bad offset for central directory")
    held = max(0, min(cd_size, size - start))  # zipfile reads cd_size bytes: as many as there are
    win = _Window(fd, start, start + held)
    d = Directory()
    names: list[str] = []
    unpack = _CENTRAL.unpack_from
    total = 0
    while total < cd_size:
        if total + _CENTRAL.size > held:
            raise zipfile.BadZipFile("Truncated central directory")
        p = win.at(start + total, _CENTRAL.size)
        (magic, _, _, version, _, flags, method, t, day, crc, csize, usize, nlen, elen, clen,
         _, _, _, offset) = unpack(win.buf, p)
        if magic != _CENTRAL_MAGIC:
            raise zipfile.BadZipFile("Bad magic number for central directory")
        if p + _CENTRAL.size + nlen + elen > len(win.buf):  # name or extra past the window
            p = win.at(start + total, _CENTRAL.size + nlen + elen)
        buf = win.buf
        p += _CENTRAL.size
        raw = buf[p:p + nlen]
        if flags & 0x800:
            orig = raw.decode("utf-8")
        else:
            try:
                orig = raw.decode("ascii")  # what cp437 makes of ASCII, only faster
            except UnicodeDecodeError:
                orig = raw.decode("cp437")
        extra = buf[p + nlen:p + nlen + elen] if elen else b""
        if version > _MAX_VERSION:
            raise NotImplementedError(f"zip file version {version / 10:.1f}")
        mtime = None
        upath = False
        if extra:
            usize, csize, offset, mtime, upath = _decode_extra(extra, usize, csize, offset)
        if mtime is None:
            mtime = _dos_mtime_ns(day, t, fallback_ns)
        i = len(names)
        name = orig
        cut = orig.find("\0")
        if cut >= 0:
            name = orig[:cut]
        if not flags & 0x800 and (upath or not name.isascii()):
            name = served_name(name, orig, extra)
        if name != orig:
            d.orig[i] = orig
        names.append(name)
        offset += concat
        if _I64_MIN <= offset <= _I64_MAX:
            d.offsets.append(offset)
        else:
            d.offsets.append(-1)
            d.far[i] = offset
        d.compressed.append(csize)
        d.sizes.append(usize)
        d.crcs.append(crc)
        d.methods.append(method)
        d.flags.append(flags)
        d.extra_lens.append(len(extra))  # as zipfile: what the directory holds of it
        d.mtimes.append(mtime)
        total += _CENTRAL.size + nlen + elen + clen
    n = len(names)
    d.data_offsets = array("q", [-1]) * n
    d.checked = array("Q", bytes(8 * n))
    return d, names


def _decode_extra(extra: bytes, usize: int, csize: int, offset: int
                  ) -> tuple[int, int, int, int | None, bool]:
    """What a member's extra field says: its zip64 sizes and offset (as zipfile's
    ``_decodeExtra`` reads them, refusing what it refuses), its UTC mtime in ns (None
    without one) and whether it has an Info-ZIP Unicode Path field."""
    mtime = None
    upath = False
    i, n = 0, len(extra)
    while n - i >= 4:
        tag, ln = struct.unpack_from("<HH", extra, i)
        if ln + 4 > n - i:
            raise zipfile.BadZipFile(f"Corrupt extra field {tag:04x} (size={ln})")
        body = extra[i + 4:i + 4 + ln]
        i += 4 + ln
        if tag == _ZIP64_TAG:
            at, field = 0, ""
            try:
                if usize in (0xFFFF_FFFF_FFFF_FFFF, _U32):
                    field = "File size"
                    (usize,) = struct.unpack("<Q", body[at:at + 8])
                    at += 8
                if csize == _U32:
                    field = "Compress size"
                    (csize,) = struct.unpack("<Q", body[at:at + 8])
                    at += 8
                if offset == _U32:
                    field = "Header offset"
                    (offset,) = struct.unpack("<Q", body[at:at + 8])
            except struct.error:
                raise zipfile.BadZipFile(f"Corrupt zip64 extra field. {field} not found.") from None
        elif mtime is not None:
            pass
        elif tag == _UT_TAG and len(body) >= 5 and body[0] & 1:  # flag bit 0: mtime present
            mtime = struct.unpack_from("<i", body, 1)[0] * 1_000_000_000
        elif tag == _NTFS_TAG and len(body) >= 32:
            # 4 reserved bytes, then attributes; tag 1 (24 bytes) holds mtime, atime, ctime
            tag1, size1 = struct.unpack_from("<HH", body, 4)
            if tag1 == 1 and size1 >= 24:
                ns = (struct.unpack_from("<Q", body, 8)[0] - _NTFS_EPOCH) * 100
                if _I64_MIN <= ns <= _I64_MAX:  # else past what a file's time can hold
                    mtime = ns
        if tag == _UPATH_TAG:
            upath = True
    return usize, csize, offset, mtime, upath


def served_name(name: str, orig: str, extra: bytes) -> str:
    """A member's name as UTF-8 text, where zipfile decoded it as cp437 (``name``: that,
    cut at a NUL as zipfile cuts it; ``orig``: uncut).

    Info-ZIP's ``zip`` on Linux stores UTF-8 names without setting the UTF-8 flag, so
    they are undone when the bytes are valid UTF-8. An Info-ZIP Unicode Path extra field
    (0x7075) that is current (its CRC is the stored name's) wins."""
    i = 0
    while i + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4:i + 4 + size]
        i += 4 + size
        if tag == _UPATH_TAG and len(body) > 5 and body[0] == 1:
            (crc,) = struct.unpack_from("<I", body, 1)
            try:
                if zlib.crc32(orig.encode("cp437")) == crc:
                    return body[5:].decode("utf-8")
            except (UnicodeError, ValueError):
                pass
    try:
        return name.encode("cp437").decode("utf-8")
    except UnicodeError:
        return name


@functools.lru_cache(maxsize=1024)
def _dos_mtime_ns(day: int, t: int, fallback_ns: int) -> int:
    """A DOS date and time (local time, no zone, as zipfile gives it) in ns; the
    archive's mtime if invalid. Remembered: an archive's members mostly share a handful
    of times, and mktime (a time-zone lookup) was a fifth of opening 20,000 members."""
    date_time = ((day >> 9) + 1980, (day >> 5) & 0xF, day & 0x1F, t >> 11, (t >> 5) & 0x3F, (t & 0x1F) * 2)
    try:
        return int(time.mktime((*date_time, 0, 0, -1))) * 1_000_000_000
    except (OverflowError, ValueError):
        return fallback_ns

"""A store backed by one zip file (zarr-python's ZipStore, ``zip -r``, ``zip -0 -r``).

The central directory is read once at open and kept as an in-memory tree, so
listings never touch the file. Every read is a ``pread`` on one shared file
descriptor, which is thread safe without locks or a shared file position.
Stored members are sliced straight out of the archive; compressed members are
decompressed on the fly (nothing big is cached), in bounded steps, so a zip
bomb (gigabytes of zeros in a few megabytes) streams like any other member.

Integrity: a member's CRC-32 is verified whenever its bytes have been
produced from the start to the end, which is every whole-member ``get`` (what
the decoded views use for chunks and metadata), every read of a deflated
member that reaches its end (its stream always starts at 0), and every
in-order read of a stored member (cp, cat; pieces the kernel's read-ahead
delivers out of order are joined, CRC-32 being affine). A mismatch fails that
read with a StoreError naming the key, and every later read of the member
fails at once. Random reads of a stored member cannot be verified without
reading the whole member each time, so they are served unverified, as by
ratarmount (Python's zipfile drops the CRC check once a stored member is
seeked) and by any pread-based reader.

Deflated members keep decompression checkpoints (a copy of the zlib state
every ``max(1 MiB, size/64)`` of output, at most :data:`_CHECKPOINTS` in all)
and a few parked streams, so reading backwards or jumping around costs at most
one checkpoint interval of decompression per read instead of a restart from
the beginning of the member.

zarr-python writes members without file-type bits in ``external_attr``, so the
mode bits are never trusted: a directory entry is a name ending in '/'.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import threading
import zipfile
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zvfs.stats import Counters
from zvfs.stores import zip_unpack
from zvfs.stores._util import check_key, check_prefix, pread_at_once
from zvfs.stores.base import (
    KeyInfo,
    KeyNotFound,
    Listing,
    Reopen,
    SourceError,
    SourceUnavailable,
    Store,
    StoreError,
    TooLarge,
)
from zvfs.stores.keys import bad_segment, is_safe_key, safe_name
from zvfs.stores.listing import MAX_FILE_SIZE
from zvfs.stores.zip_directory import Directory, read_directory

log = logging.getLogger(__name__)

#: signature, version, flags, method, time, date, CRC, sizes, name length, extra length
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
#: general-purpose flags of data zipfile refuses to read: encrypted (bit 0), compressed
#: patched data (bit 5), strong encryption (bit 6)
_UNREADABLE_FLAGS = 0x1 | 0x20 | 0x40
# compressed members at least this big keep parked decompressors for sequential reads
_POOL_MIN_SIZE = 4 << 20
#: compressed bytes read per step, and decompressed bytes produced per step: a bomb never
#: gets to expand more than this at once
_IN_STEP = 16 << 10
_OUT_STEP = 1 << 20
#: deflate checkpoints kept per member and in all (each ~50 KiB: zlib state and window)
_CHECKPOINTS_PER_MEMBER = 64
_CHECKPOINTS = 192
_CHECKPOINT_MIN_SPACING = 1 << 20
#: parked (live) deflate streams kept in all
_PARKED = 16
#: pieces of output that a read decompressed only to pass them, kept for a read of them that
#: comes later (read-ahead tasks may start out of order: the one past a block can run before
#: the block's own read, which would then decompress it again); about 1 MiB each
_SKIPPED = 8
#: block size the raw view uses when the archive has compressed members (decoded blocks
#: are cached, so re-reads do not decompress again); 0 for all-stored archives: pread is cheap
COMPRESSED_BLOCK_SIZE = 1 << 20


class _Member:
    """One member, as a read sees it: a view of its row in the directory's arrays, made
    for the read and dropped after it (a million members kept as objects cost ~700 MB)."""

    __slots__ = ("_d", "i", "key")

    def __init__(self, d: Directory, i: int, key: str) -> None:
        self._d, self.i, self.key = d, i, key

    @property
    def file_size(self) -> int:
        return self._d.sizes[self.i]

    @property
    def compress_size(self) -> int:
        return self._d.compressed[self.i]

    @property
    def CRC(self) -> int:  # noqa: N802 -- zipfile's spelling, which the readers share
        return self._d.crcs[self.i]

    @property
    def compress_type(self) -> int:
        return self._d.methods[self.i]

    @property
    def flag_bits(self) -> int:
        return self._d.flags[self.i]

    @property
    def header_offset(self) -> int:
        return self._d.header_offset(self.i)

    @property
    def orig_filename(self) -> str:
        """The name as the archive spells it (the local header must spell it so too)."""
        return self._d.orig.get(self.i, self.key)

    @property
    def extra_len(self) -> int:
        return self._d.extra_lens[self.i]

    @property
    def mtime_ns(self) -> int:
        return self._d.mtimes[self.i]

    @property
    def data_offset(self) -> int:
        """Where the data starts, from the local header; -1 until that was read."""
        return self._d.data_offsets[self.i]

    @data_offset.setter
    def data_offset(self, value: int) -> None:
        self._d.data_offsets[self.i] = value

    @property
    def checked(self) -> int:
        """The archive's generation (see ZipStore._now) when the local header was read."""
        return self._d.checked[self.i]

    @checked.setter
    def checked(self, value: int) -> None:
        self._d.checked[self.i] = value

    @property
    def bad(self) -> str | None:
        """Why the member is known to be corrupt (CRC mismatch, bad stream); later reads
        fail at once."""
        return self._d.bad.get(self.i)

    @bad.setter
    def bad(self, why: str) -> None:
        self._d.bad[self.i] = why


def open_fd(path: str) -> int:
    """The zip file at ``path`` (absolute), opened for reading; SourceError if it cannot be."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SourceError(f"source zip file {path} does not exist") from None
    except OSError as e:
        raise SourceError(f"cannot open zip file {path}: {e.strerror}") from e


def _unreadable(path: str, exc: OSError) -> SourceUnavailable:
    """An I/O error reading the archive (a failing disk, NFS): it may pass, so it is not
    the configuration error a corrupt archive is (exit 1, not 78: systemd retries it)."""
    return SourceUnavailable(f"cannot read the zip archive {path}: {exc.strerror or exc}")



def _tell_some(level: int, lines: list[str], more: str, most: int = 20) -> None:
    """Log the first ``most`` of ``lines``, and how many more there were (``more`` % count):
    an archive of a million odd members costs twenty lines, not a million."""
    for line in lines[:most]:
        log.log(level, "%s", line)
    if len(lines) > most:
        log.log(level, more, len(lines) - most)

class ZipStore(Store):
    """Read-only store over the members of a zip archive (zip64 included)."""

    #: every listing is the central directory's, parsed and sorted in __init__
    lists_in_memory = True
    local = True

    def __init__(self, path: str | os.PathLike[str], counters: Counters | None = None, *,
                 fd: int | None = None) -> None:
        """``counters``: the mount's, which inflated bytes count into (a private set by default).
        ``fd``: the archive, already open at ``path`` (the store takes it over, and closes it
        if it fails): a mount opens it before the mount covers the path (see open_fd)."""
        shown = os.path.abspath(os.fspath(path))
        self.path = shown
        self.description = shown
        if fd is None:
            fd = open_fd(shown)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SourceError(f"source {shown} is not a regular file, so not a zip archive")
            self._fd = fd
            self._size = st.st_size
            self._stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            self._dirs: dict[str, Listing] = {"": Listing()}
            #: the mtime of each directory that has an entry of its own ('a/' made by `zip -r`;
            #: zarr-python's ZipStore writes none)
            self._dir_mtimes: dict[str, int] = {}
            #: per directory, the member index of each key, in the order of its KeyTable
            self._slots: dict[str, array[int]] = {}
            self._read_central_directory(st.st_mtime_ns)
        except BaseException:
            os.close(fd)
            raise
        self._closed = False
        self._lock = threading.Lock()
        #: bumped each time the archive is found changed since the mount (size or mtime)
        self._generation = 0
        self._seen = (self._size, self._stamp[3])
        self._streams = zip_unpack.StreamPool()
        self.counters = counters if counters is not None else Counters()
        self._inflate = _Inflater(self._fd, self.counters)
        self._stored_crc = _SequentialCrc()
        if any(self._d.methods[i] != zipfile.ZIP_STORED for slots in self._slots.values() for i in slots):
            self.block_size = COMPRESSED_BLOCK_SIZE

    def _read_central_directory(self, fallback_mtime_ns: int) -> None:
        """Parse the central directory once (see zip_directory) and build the tree."""
        try:
            d, names = read_directory(self._fd, fallback_mtime_ns)
        except zipfile.BadZipFile as e:
            raise SourceError(
                f"{self.path} is not a valid zip archive (truncated or corrupt: {e})"
            ) from e
        except OSError as e:
            raise _unreadable(self.path, e) from e
        except UnicodeDecodeError as e:  # a name flagged UTF-8 that is not: zipfile stops there
            raise SourceError(f"{self.path}: a member's name is flagged UTF-8 but is not ({e}); "
                              "zipfile, zarr-python and fuse-zip refuse such an archive too") from e
        except NotImplementedError as e:  # a member's "version needed" past what zipfile reads
            raise SourceError(f"{self.path}: {e} is past what Python's zipfile (and so "
                              "zarr-python) reads") from e
        self._d = d
        self._fill_listings(d, names)

    def _fill_listings(self, d: Directory, names: list[str]) -> None:
        """One listing per directory, each sorted once here (so a listing costs nothing
        later), and beside it the member index of each of its keys."""
        skipped: list[str] = []
        cut: list[str] = []  # names zipfile cut at a NUL byte
        too_big: list[str] = []
        by_dir: dict[str, list[tuple[str, int]]] = {}
        checked: set[str] = set()  # parents whose every segment is safe
        for i, name in enumerate(names):
            if name.endswith("/"):  # directory entry: an (empty) prefix
                dir_name = name.rstrip("/")
                if dir_name and bad_segment(dir_name) is None:
                    self._add_prefixes(dir_name + "/")
                    self._dir_mtimes[dir_name + "/"] = d.mtimes[i]  # the last entry of a name wins
                    if d.sizes[i]:  # a directory it is, as zipfile and unzip take it
                        log.warning("%s: member %r is a directory entry holding %d bytes; "
                                    "the bytes are ignored", self.path, name, d.sizes[i])
                else:  # '/', '//' and the like, or an unsafe directory name
                    skipped.append(name)
                continue
            parent, sep, base = name.rpartition("/")
            if not sep:
                safe = safe_name(name)
            elif parent in checked:  # only the last segment is new
                safe = safe_name(base)
            else:
                safe = bad_segment(name) is None
                if safe:
                    checked.add(parent)
            if not safe:
                skipped.append(name)
                continue
            orig = d.orig.get(i)
            if orig is not None and "\0" in orig and name == orig[:orig.index("\0")]:
                cut.append(f"{self.path}: member {orig!r} holds a NUL byte; served as "
                           f"{name!r}, cut there as zipfile and zarr-python read it")
            if d.sizes[i] == 0 and d.crcs[i] != 0:  # no read of no bytes would check it
                d.bad[i] = "zip member is empty, but its CRC is not that of no bytes"
            by_dir.setdefault(parent + sep, []).append((base, i))
        repeated: dict[str, int] = {}  # name -> members of that name
        sizes, mtimes = d.sizes, d.mtimes
        for pre, members in by_dir.items():
            self._add_prefixes(pre)
            members.sort()  # by name, then in directory order
            keys = self._dirs[pre].keys
            slots = self._slots[pre] = array("I")
            last = len(members) - 1
            for k, (base, i) in enumerate(members):
                if k < last and members[k + 1][0] == base:
                    # the last of duplicate names wins, as in zipfile and zarr-python; told below
                    repeated[pre + base] = repeated.get(pre + base, 1) + 1
                    continue
                if sizes[i] > MAX_FILE_SIZE:  # a zip64 size no file can have (st_size is signed)
                    too_big.append(f"{self.path}: member {pre + base!r} says it holds {sizes[i]} "
                                   "bytes, more than a file can; ignored")
                    continue  # the name is not served: zipfile would read this member for it
                keys.add(base, sizes[i], mtimes[i])
                slots.append(i)
        for listing in self._dirs.values():
            listing.keys.seal()
        # zarr-python's ZipStore leaves such pairs whenever a key is set twice (it warns as it
        # writes them): a fact about the archive, not a fault
        _tell_some(logging.INFO, [f"{self.path}: member {name!r} appears {times} times; the last one "
                                  "is served, as zipfile and zarr-python read it" for name, times in repeated.items()],
                   f"{self.path}: %d more member names appear more than once")
        _tell_some(logging.WARNING, cut, f"{self.path}: %d more member names cut at a NUL byte")
        _tell_some(logging.WARNING, too_big, f"{self.path}: %d more members too large for a file ignored")
        _tell_some(logging.WARNING, [f"{self.path}: member {name!r} is not a safe path; ignored" for name in skipped],
                   f"{self.path}: %d more unsafe member names ignored")

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
        return KeyInfo(m.file_size, m.mtime_ns)

    def dir_mtime_ns(self, prefix: str) -> int | None:
        return self._dir_mtimes.get(prefix)

    def list_dir(self, prefix: str) -> Listing:
        check_prefix(prefix)
        listing = self._dirs.get(prefix)
        if listing is None:
            return Listing()
        return Listing(listing.keys.copy(), set(listing.prefixes))

    def listings(self) -> Mapping[str, Listing]:
        return self._dirs

    def absent(self, keys: Iterable[str]) -> set[str]:
        """Every key the central directory does not name: the index is the whole archive."""
        return {key for key in keys if self._find(key) is None and is_safe_key(key)}

    def will_need(self, keys: Sequence[str]) -> None:
        """Have the kernel read these members ahead, local headers included: a stored
        member read cold otherwise waits on the disk twice (its header, then its data),
        and the kernel's own read-ahead does not reach past one ``pread`` to the next.

        One hint for each run of members that lie end to end (a walk's, in the archive's
        order): a system call a member was a tenth of four readers' profile (seventy-first
        session, docs/benchmarks.md)."""
        spans: list[tuple[int, int]] = []
        for key in keys:
            m = self._find(key)
            if m is None or not 0 <= m.header_offset < self._size:
                continue
            # the local header's name and extra field can differ from the central ones:
            # a page of slack covers them. Never past the archive's end: a ZIP64 entry may
            # declare 2**64 - 1 compressed bytes, which fadvise refused with OverflowError,
            # and that failed the read of another, good member the hint was given for
            length = _LOCAL_HEADER.size + len(m.orig_filename.encode()) + m.extra_len + m.compress_size
            spans.append((m.header_offset, min(m.header_offset + length + 4096, self._size)))
        spans.sort()
        merged: list[list[int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            try:
                os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_WILLNEED)
            except OSError:
                return  # only a hint

    def list_prefix(self, prefix: str) -> Iterator[str]:
        if prefix:
            check_prefix(prefix)
        found = []
        for pre, listing in self._dirs.items():
            if pre.startswith(prefix):
                found.extend(pre + name for name in listing.keys)
            elif prefix.startswith(pre):
                found.extend(key for name in listing.keys if (key := pre + name).startswith(prefix))
        yield from sorted(found)

    def get(self, key: str) -> bytes:
        m = self._member(key)
        return self._read(key, m, 0, m.file_size)

    def get_at_most(self, key: str, limit: int) -> bytes:
        m = self._member(key)
        if m.file_size > limit:  # a bomb is refused from the central directory alone
            raise TooLarge(
                f"{key}: zip member declares {m.file_size} bytes, more than the {limit} it may hold"
            )
        return self._read(key, m, 0, m.file_size)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"{key}: bad range start={start} length={length}")
        m = self._member(key)
        size = m.file_size
        if start >= size or length == 0:
            return b""
        return self._read(key, m, start, min(length, size - start))

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        if length < 0:
            raise StoreError(f"{key}: bad suffix length {length}")
        m = self._member(key)
        size = m.file_size  # from the central directory: no request for it
        start = max(0, size - length)
        return (self._read(key, m, start, size - start) if size > start else b""), size

    def reopen(self) -> Reopen:
        """The archive as opened: the other process refuses it once it was replaced. It is
        named by the daemon's descriptor, which leads to the same file even where the mount
        now covers ``path`` (an archive mounted over its own directory)."""
        by_fd = f"/proc/{os.getpid()}/fd/{self._fd}"
        return Reopen("zip", by_fd if os.path.exists(by_fd) else self.path, self._stamp)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._streams.clear()
                self._inflate.clear()
                os.close(self._fd)

    # -- internals ---------------------------------------------------------------------------

    def _member(self, key: str) -> _Member:
        check_key(key)
        m = self._find(key)
        if m is None:
            raise KeyNotFound(key)
        return m

    def _find(self, key: str) -> _Member | None:
        """The member served as ``key``, found by its directory's listing."""
        parent, sep, base = key.rpartition("/")
        slots = self._slots.get(parent + sep)
        if slots is None:
            return None
        pos = self._dirs[parent + sep].keys.position(base)
        return None if pos < 0 else _Member(self._d, slots[pos], key)

    def _now(self) -> int:
        """The archive's generation: 0 while it is as mounted, one more each time its size or
        mtime is found changed. An archive written over in place (``cp new.zip old.zip``
        keeps the inode the mount holds open) put other bytes at the members' offsets, and
        random reads served them silently; from a change on, each member's local header is
        read again and must still be its own before the member is read (``zip -g``, which
        appends, keeps the old members valid)."""
        try:
            st = os.fstat(self._fd)
        except OSError:
            return self._generation
        if (st.st_size, st.st_mtime_ns) != self._seen:
            with self._lock:
                if (st.st_size, st.st_mtime_ns) != self._seen:
                    self._seen = (st.st_size, st.st_mtime_ns)
                    self._size = st.st_size
                    self._generation += 1
                    # once: a cp under way changes it at every read
                    log.log(logging.WARNING if self._generation == 1 else logging.DEBUG,
                            "%s changed since it was mounted: each member is checked against its "
                            "local header before it is read again (remount to see what it holds "
                            "now)", self.path)
        return self._generation

    def _data_offset(self, key: str, m: _Member) -> int:
        """Where the member's data starts: after its local header (read once, then kept
        while the archive is unchanged)."""
        now = self._now()
        if m.data_offset >= 0 and m.checked == now:
            return m.data_offset
        at = m.header_offset
        if not 0 <= at < self._size:  # pread would say EINVAL (negative) or read nothing
            raise StoreError(f"{key}: the zip directory puts its local header at offset {at}, "
                             "outside the archive")
        try:
            raw = os.pread(self._fd, _header_length(m), at)
        except OSError as e:
            raise StoreError(f"{key}: cannot read zip local header: {e.strerror}") from e
        return self._local_header(key, m, raw, now)

    def _local_header(self, key: str, m: _Member, raw: bytes | memoryview, now: int = 0) -> int:
        """The data offset a member's local header gives (kept on the member). The header
        must name the member, as zipfile demands: a directory entry whose offset leads to
        another member's header would serve that member's bytes under this name, and a
        range of a stored member is not covered by its CRC. ``now``: the archive's
        generation; past 0, the header must also, unless its sizes come after the data,
        give the central directory's CRC and sizes."""
        if len(raw) < _LOCAL_HEADER.size:
            raise StoreError(f"{key}: zip local header is truncated")
        fields = _LOCAL_HEADER.unpack_from(raw)
        magic, name_len, extra_len = fields[0], fields[9], fields[10]
        # past generation 0 a failed check is not remembered (m.bad): the archive may be
        # as mounted again (a copy back), or was caught halfway through a cp; the next
        # read checks again, at the cost of a header read while the archive is changed
        if magic != _LOCAL_MAGIC:
            raise StoreError(f"{key}: bad zip local header at offset {m.header_offset}"
                             + (f" ({_MOVED})" if now else ""))
        if not _names_member(m, fields, raw):
            raise StoreError(f"{key}: " + (_MOVED if now else
                             f"the zip local header at offset {m.header_offset} names another "
                             "member (the archive is corrupt)"))
        off = m.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        if now and not (_still_the_member(m, fields) and self._descriptor_agrees(m, off, fields[2])):
            raise StoreError(f"{key}: {_MOVED}")
        if off + m.compress_size > self._size:
            raise StoreError(f"{key}: member data extends past the end of the zip file")
        m.data_offset = off  # benign race: every thread computes the same value
        m.checked = now
        return off

    def _descriptor_agrees(self, m: _Member, off: int, local_flags: int) -> bool:
        """For a member whose CRC and sizes follow its data (flag 0x8: streamed, as zipfile
        on a pipe, Go and Java write every member), whether the data descriptor where the
        directory says the data ends holds them: the local header has only zeros to
        compare, and a shorter member in its place was served with the next one's bytes.
        The local header's flag counts as much as the directory's: an archive rewritten in
        place by a streaming writer put such a header where a member without one was, and
        the new bytes (then the next member's) were served under the old size."""
        if not (m.flag_bits | local_flags) & 0x8:
            return True
        try:
            raw = os.pread(self._fd, 24, off + m.compress_size)
        except OSError:
            return False
        if raw[:4] == b"PK\x07\x08":  # the signature is optional
            raw = raw[4:]
        if len(raw) < 12:
            return False
        crc, csize, usize = struct.unpack_from("<III", raw)
        if crc == m.CRC and (csize, usize) == (m.compress_size, m.file_size):
            return True
        if crc == m.CRC and len(raw) >= 20:  # zip64: 8-byte sizes
            return struct.unpack_from("<QQ", raw, 4) == (m.compress_size, m.file_size)
        return False

    def get_range_at_once(self, key: str, start: int, length: int) -> memoryview | None:
        """A range of a stored member when the page cache holds it (and its local header,
        the first time): what ``will_need`` asked the kernel to read ahead. Anything else
        (a compressed member, bytes not cached, a member found bad) is left to
        ``get_range`` in a worker, which reports every error."""
        m = self._find(key)
        if m is None or m.bad is not None or self._closed:
            return None
        size = m.file_size
        if (m.compress_type != zipfile.ZIP_STORED or m.flag_bits & _UNREADABLE_FLAGS
                or m.compress_size != size or start < 0 or length <= 0 or start >= size):
            return None
        if m.checked != self._now():  # the archive changed: the worker's read checks the member
            return None
        try:
            off = m.data_offset
            if off < 0:
                if not 0 <= m.header_offset < self._size:  # the worker's read tells why
                    return None
                raw = pread_at_once(self._fd, m.header_offset, _header_length(m), self._size)
                if raw is None:
                    return None
                off = self._local_header(key, m, raw)
            length = min(length, size - start)
            data = pread_at_once(self._fd, off + start, length, self._size)
            if data is None or len(data) != length:
                return None
            self._stored_crc.update(key, start, data, size, m.CRC)
        except (StoreError, _Corrupt) as exc:
            if isinstance(exc, _Corrupt):
                m.bad = str(exc)  # the worker's read reports it
            return None
        return data

    def _read(self, key: str, m: _Member, start: int, length: int) -> bytes:
        """Bytes [start, start+length) of the member; a failure counts as a store error
        (``zvfs status``, the metrics), of kind checksum when the member is corrupt."""
        try:
            return self._read_member(key, m, start, length)
        except StoreError:
            self.counters.add("store_errors_checksum" if m.bad is not None else "store_errors_other")
            raise

    def _read_member(self, key: str, m: _Member, start: int, length: int) -> bytes:
        if m.flag_bits & _UNREADABLE_FLAGS:
            raise StoreError(f"{key}: zip member is " + ("compressed patched data" if m.flag_bits & 0x20
                                                         else "encrypted")
                             + ", which zipfile (and so zarr-python) cannot read either")
        if m.bad is not None:
            raise StoreError(f"{key}: {m.bad}")
        off = self._data_offset(key, m)
        try:
            if m.compress_type == zipfile.ZIP_STORED:
                return self._read_stored(key, m, off, start, length)
            if m.compress_type == zipfile.ZIP_DEFLATED:
                return self._inflate.read(key, m, off, start, length)
        except _Corrupt as exc:
            m.bad = str(exc)
            raise StoreError(f"{key}: {exc}") from None
        return self._read_other(key, m, off, start, length)

    def _read_stored(self, key: str, m: _Member, off: int, start: int, length: int) -> bytes:
        """A slice of a stored member, CRC-checked when the reads have covered it in order."""
        if m.compress_size != m.file_size:
            raise StoreError(f"{key}: stored zip member has inconsistent sizes")
        try:
            data = os.pread(self._fd, length, off + start)
        except OSError as e:
            raise StoreError(f"{key}: read failed: {e.strerror}") from e
        if len(data) != length:
            raise StoreError(f"{key}: zip member data is truncated")
        self._stored_crc.update(key, start, data, m.file_size, m.CRC)
        return data

    def _read_other(self, key: str, m: _Member, off: int, start: int, length: int) -> bytes:
        """bzip2, lzma: decompressed in bounded steps (zvfs.stores.zip_unpack), with parked
        readers for sequential reads; any other method is named as unsupported."""
        if m.compress_type not in zip_unpack.METHODS:
            raise StoreError(f"{key}: unsupported zip compression method {m.compress_type} "
                             "(zipfile, and so zarr-python, reads stored, deflate, bzip2 and lzma)")
        pooled = m.file_size >= _POOL_MIN_SIZE and start + length < m.file_size
        reader = self._streams.take(key, start) if pooled else None
        try:
            if reader is None:
                reader = zip_unpack.Unpacker(self._fd, off, m.compress_size, m.compress_type,
                                             m.file_size, m.CRC)
            skip = start - reader.tell()
            while skip > 0:  # read forward in bounded steps, nothing kept
                skip -= len(reader.read(min(skip, 1 << 20)))
            data = reader.read(length)
        except zip_unpack.Corrupt as e:
            # remembered, and counted as a checksum error, as a deflated member's CRC mismatch is
            m.bad = f"corrupt zip member: {e}"
            raise StoreError(f"{key}: corrupt zip member: {e}") from None
        except OSError as e:  # the archive's own read failed: nothing known of the member
            raise StoreError(f"{key}: zip member could not be read: {e}") from e
        if pooled:
            self._streams.give(key, reader)
        return data


_MOVED = ("the zip archive was written over since the mount, and this member is no longer "
          "where its directory says: remount to read it")


def _header_length(m: _Member) -> int:
    """Bytes to read at a member's local header to hold its name too: the header may spell
    the name in the other encoding (UTF-8 is up to three bytes a cp437 character)."""
    return _LOCAL_HEADER.size + 3 * len(m.orig_filename)


def _names_member(m: _Member, fields: tuple[Any, ...], raw: bytes | memoryview) -> bool:
    """Whether a local header (``fields``, unpacked from ``raw``, which holds its name)
    names ``m``, as zipfile compares them: the name decoded by the header's own flag."""
    flags, name_len = fields[2], fields[9]
    name = bytes(raw[_LOCAL_HEADER.size:_LOCAL_HEADER.size + name_len])
    if len(name) != name_len:
        return False
    try:
        return name.decode("utf-8" if flags & 0x800 else "cp437") == m.orig_filename
    except UnicodeDecodeError:
        return False


def _still_the_member(m: _Member, fields: tuple[Any, ...]) -> bool:
    """Whether a local header (``fields``) that names ``m`` still gives its method, CRC
    and sizes."""
    _, _, flags, method, _, _, crc, csize, usize, _, _ = fields
    if method != m.compress_type:
        return False
    if flags & 0x8:  # CRC and sizes in a data descriptor after the data
        return True
    zip64 = 0xFFFFFFFF
    return crc == m.CRC and csize in (m.compress_size, zip64) and usize in (m.file_size, zip64)


class _Corrupt(Exception):
    """The member's data contradicts its directory entry (CRC, size, deflate stream)."""


_ZEROS = bytes(1 << 20)


def _crc32_shift(crc: int, n: int) -> int:
    """CRC-32 of (bytes with CRC ``crc``) followed by ``n`` zero bytes, minus the zeros' own
    CRC: with it, crc(A + B) = _crc32_shift(crc(A), len(B)) ^ crc(B) (CRC-32 is affine)."""
    zeros = 0
    view = memoryview(_ZEROS)
    while n > 0:
        step = min(n, len(_ZEROS))
        crc = zlib.crc32(view[:step], crc)
        zeros = zlib.crc32(view[:step], zeros)
        n -= step
    return crc ^ zeros


class _SequentialCrc:
    """CRC-32 of stored members assembled from the reads that cover them, to verify
    them once they have all been read.

    Per member: the CRC of the prefix read so far (``chain``: its end -> CRC) and
    reads that arrived ahead of it (the kernel's read-ahead does not keep order:
    ``ahead``: start -> (end, CRC of that piece)), joined as the prefix reaches them.
    The read that completes the member compares with the central directory. A
    bounded number of members and pieces is kept; a read that fits nowhere is
    simply not verified.
    """

    def __init__(self, members: int = 256, pieces: int = 64) -> None:
        self._open: OrderedDict[str, tuple[dict[int, int], dict[int, tuple[int, int]]]] = OrderedDict()
        self._members = members
        self._pieces = pieces
        self._lock = threading.Lock()

    def update(self, key: str, start: int, data: bytes, size: int, expected: int) -> None:
        end = start + len(data)
        if start == 0 and end == size:  # the whole member at once: nothing to keep
            crc = zlib.crc32(data)
        else:
            with self._lock:
                entry = self._open.get(key)
                if entry is None:
                    entry = self._open[key] = ({}, {})
                    while len(self._open) > self._members:
                        self._open.popitem(last=False)
                self._open.move_to_end(key)
                chain, ahead = entry
                if start == 0:
                    pos, crc = end, zlib.crc32(data)
                elif start in chain:
                    pos, crc = end, zlib.crc32(data, chain.pop(start))
                else:
                    if len(ahead) < self._pieces:
                        ahead[start] = (end, zlib.crc32(data))
                    return
                while pos in ahead:  # pieces read ahead of the prefix join it now
                    nxt, other = ahead.pop(pos)
                    crc = _crc32_shift(crc, nxt - pos) ^ other
                    pos = nxt
                if pos < size:
                    if len(chain) < self._pieces:
                        chain[pos] = crc
                    return
                if not chain and not ahead:
                    self._open.pop(key, None)
        if crc != expected:
            raise _Corrupt(f"CRC-32 mismatch (computed {crc:08x}, zip directory says {expected:08x})")


@dataclass(slots=True)
class _InflateState:
    """One point of a deflate stream: the zlib state after ``out_pos`` output bytes,
    having consumed ``in_pos`` compressed bytes (its unconsumed tail excluded), and
    the CRC-32 of the output so far."""

    dec: Any
    out_pos: int
    in_pos: int
    crc: int

    def copy(self) -> _InflateState:
        return _InflateState(self.dec.copy(), self.out_pos, self.in_pos, self.crc)


class _Passed:
    """The last ``limit`` bytes (or a little more) of output a read passes over, from ``pos``."""

    def __init__(self, pos: int, limit: int) -> None:
        self.pos = pos
        self.limit = limit
        self.pieces: deque[bytes] = deque()
        self.size = 0

    def append(self, out: bytes) -> None:
        self.pieces.append(out)
        self.size += len(out)
        while self.size - len(self.pieces[0]) >= self.limit:
            first = self.pieces.popleft()
            self.size -= len(first)
            self.pos += len(first)


class _Inflater:
    """Random access into deflated members: checkpoints, parked streams, CRC at the end.

    A read continues the parked stream or the checkpoint nearest before its start
    (or one still being used by another thread that will stop there), decompresses
    forward in bounded steps, and parks the stream where it stopped. Checkpoints are
    taken on the way, about every ``max(1 MiB, size/64)`` of output. The whole blocks of
    output it passes over on its way (the last ``_SKIPPED``) are kept for a read of them
    that comes later: read-ahead may ask for the block after next before the next.
    """

    def __init__(self, fd: int, counters: Counters) -> None:
        self._fd = fd
        self._counters = counters
        self._cond = threading.Condition()
        self._parked: list[tuple[str, _InflateState]] = []  # oldest first
        #: reads in progress or waiting: (token, key, where their stream starts (-1 while
        #: waiting), where it stops passing over and starts keeping, where it stops)
        self._active: list[tuple[object, str, int, int, int]] = []
        self._checkpoints: OrderedDict[str, dict[int, _InflateState]] = OrderedDict()
        self._ncheckpoints = 0
        #: (key, output offset) -> output a read passed over (see _SKIPPED)
        self._skipped: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def clear(self) -> None:
        with self._cond:
            self._parked.clear()
            self._checkpoints.clear()
            self._ncheckpoints = 0
            self._skipped.clear()

    def _keep_skipped(self, key: str, passed: _Passed, until: int) -> None:
        """Keep the whole blocks of what a read passed over on its way to ``until``."""
        if not passed.pieces:
            return
        data = b"".join(passed.pieces)
        bs = COMPRESSED_BLOCK_SIZE
        with self._cond:
            for at in range(-(-passed.pos // bs) * bs, until - bs + 1, bs):
                self._skipped[(key, at)] = data[at - passed.pos : at - passed.pos + bs]
                self._skipped.move_to_end((key, at))
            while len(self._skipped) > _SKIPPED:
                self._skipped.popitem(last=False)
            self._cond.notify_all()  # a read of one of them may be waiting for it

    # -- finding a state to start from -------------------------------------------------------

    def _start_state(self, key: str, start: int, end: int, size: int, me: object) -> _InflateState | bytes:
        """The best state at or before ``start``, or the bytes themselves when a read that
        went past them kept them.

        A reader waits, rather than decompress the same bytes twice, while another
        read of the member (running or itself waiting) will stop after the best state
        available and at or before ``start``: its stream is parked there; and while a
        running read passes over its bytes on the way to its own, which it keeps (the
        block read-ahead asks for after next may start first). Waits only ever point to
        reads that start earlier, or already run, so they cannot form a cycle.
        """
        bs = COMPRESSED_BLOCK_SIZE
        with self._cond:
            self._active.append((me, key, -1, -1, end))
            while True:
                if end < size:  # the member's last bytes go through the stream: its CRC
                    kept = self._skipped.pop((key, start), None)
                    if kept is not None and len(kept) >= end - start:
                        self._active = [a for a in self._active if a[0] is not me]
                        self._cond.notify_all()  # a read waiting for this one waits no more
                        return kept[: end - start]
                if any(t is not me and k == key and 0 <= f <= start and end <= s <= start + _SKIPPED * bs
                       for t, k, f, s, _ in self._active):
                    self._cond.wait(timeout=30)
                    continue
                parked = max(
                    (i for i, (k, st) in enumerate(self._parked) if k == key and st.out_pos <= start),
                    key=lambda i: self._parked[i][1].out_pos,
                    default=None,
                )
                have = self._parked[parked][1].out_pos if parked is not None else 0
                cps = self._checkpoints.get(key)
                cp = None
                if cps:
                    cp = max((c for c in cps.values() if c.out_pos <= start),
                             key=lambda c: c.out_pos, default=None)
                if cp is not None and cp.out_pos > have:
                    have = cp.out_pos
                    parked = None
                if have < start and any(
                    t is not me and k == key and have < e <= start for t, k, _, _, e in self._active
                ):
                    self._cond.wait(timeout=30)
                    continue
                if parked is not None:
                    state = self._parked.pop(parked)[1]
                    if state.out_pos < start:  # leave a copy for a reader of the bytes skipped
                        self._parked.append((key, state.copy()))
                elif cp is not None:
                    self._checkpoints.move_to_end(key)
                    state = cp.copy()
                else:
                    state = _InflateState(zlib.decompressobj(-zlib.MAX_WBITS), 0, 0, 0)
                self._active = [(me, key, state.out_pos, start, end) if a[0] is me else a
                                for a in self._active]
                return state

    def _done(self, me: object, key: str, state: _InflateState | None) -> None:
        with self._cond:
            self._active = [a for a in self._active if a[0] is not me]
            if state is not None:
                self._parked.append((key, state))
                if len(self._parked) > _PARKED:
                    self._parked.pop(0)
            self._cond.notify_all()

    def _checkpoint(self, key: str, state: _InflateState, spacing: int) -> None:
        slot = state.out_pos // spacing
        with self._cond:
            cps = self._checkpoints.get(key)
            if cps is None:
                cps = self._checkpoints[key] = {}
            self._checkpoints.move_to_end(key)
            if slot in cps or len(cps) >= _CHECKPOINTS_PER_MEMBER:
                return
            cps[slot] = state.copy()
            self._ncheckpoints += 1
            while self._ncheckpoints > _CHECKPOINTS:  # the least recently used member's go first
                old_key, old = next(iter(self._checkpoints.items()))
                if old:
                    old.pop(next(iter(old)))
                    self._ncheckpoints -= 1
                if not old:
                    self._checkpoints.pop(old_key)

    # -- reading --------------------------------------------------------------------------------

    def read(self, key: str, m: _Member, off: int, start: int, length: int) -> bytes:
        """``length`` decompressed bytes at ``start`` of the deflated member ``m``."""
        end = start + length
        spacing = max(_CHECKPOINT_MIN_SPACING, -(-m.file_size // _CHECKPOINTS_PER_MEMBER))
        me = object()
        state = self._start_state(key, start, end, m.file_size, me)
        if isinstance(state, bytes):
            return state  # decompressed already by a read that went past it
        keep: _InflateState | None = None
        try:
            parts: list[bytes] = []
            passed = _Passed(state.out_pos, _SKIPPED * COMPRESSED_BLOCK_SIZE)
            self._forward(key, m, off, state, start, passed, spacing)
            self._keep_skipped(key, passed, start)
            self._forward(key, m, off, state, end, parts, spacing)
            if state.out_pos != end:
                raise _Corrupt("deflate stream ended early (fewer bytes than declared)")
            if end == m.file_size:
                self._finish(m, off, state)
            else:
                keep = state  # parked: the next sequential read continues from here
        except zlib.error as exc:
            raise _Corrupt(f"corrupt deflate stream: {exc}") from None
        except OSError as exc:
            raise StoreError(f"{key}: read failed: {exc.strerror}") from exc
        finally:
            self._done(me, key, keep)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _forward(self, key: str, m: _Member, off: int, state: _InflateState, until: int,
                 parts: list[bytes] | _Passed | None, spacing: int) -> None:
        """Decompress until ``until`` output bytes, keeping them in ``parts`` (or dropping them)."""
        dec = state.dec
        big = m.file_size >= 2 * spacing
        while state.out_pos < until:
            feed = dec.unconsumed_tail
            if not feed:
                if dec.eof:
                    return
                # with every compressed byte given, zlib may still hold output (a read that
                # stopped short of the end): decompress(b"") drains it
                n = min(_IN_STEP, m.compress_size - state.in_pos)
                if n > 0:
                    feed = os.pread(self._fd, n, off + state.in_pos)
                    if len(feed) != n:
                        raise _Corrupt("zip member data is truncated")
                    state.in_pos += n
            want = min(_OUT_STEP, until - state.out_pos)
            if big:  # stop on checkpoint boundaries, so checkpoints sit exactly on them
                want = min(want, spacing - state.out_pos % spacing)
            out = dec.decompress(feed, want)
            if not out and not feed and not dec.eof:
                raise _Corrupt("compressed data ends before the deflate stream does")
            if out:
                state.crc = zlib.crc32(out, state.crc)
                state.out_pos += len(out)
                self._counters.add("zip_inflated_bytes", len(out))
                if parts is not None:
                    parts.append(out)
            if big and out and state.out_pos % spacing == 0:
                self._checkpoint(key, state, spacing)

    def _finish(self, m: _Member, off: int, state: _InflateState) -> None:
        """At the declared end: the stream must end here and the CRC must match."""
        dec = state.dec
        if not dec.eof:
            # the end-of-stream marker may still be in the input: any further output is too much
            while not dec.eof:
                feed = dec.unconsumed_tail
                if not feed:
                    n = min(_IN_STEP, m.compress_size - state.in_pos)
                    if n > 0:  # else zlib holds the rest already (see _forward)
                        feed = os.pread(self._fd, n, off + state.in_pos)
                        state.in_pos += len(feed)
                        if not feed:
                            raise _Corrupt("zip member data is truncated")
                if dec.decompress(feed, 1):
                    raise _Corrupt("deflate stream holds more bytes than declared")
                if not feed and not dec.eof:
                    raise _Corrupt("compressed data ends before the deflate stream does")
        if state.crc != m.CRC:
            raise _Corrupt(
                f"CRC-32 mismatch (computed {state.crc:08x}, zip directory says {m.CRC:08x})"
            )



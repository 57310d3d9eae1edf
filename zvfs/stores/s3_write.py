"""Writing to S3: a staged file per open key, uploaded on close() or fsync().

S3 has no partial writes, so a written file is staged on local disk
(:mod:`zvfs.stores.staging`) and becomes an object at :meth:`S3Writer.commit`:
one PUT when it is smaller than a part, else a multipart upload. A sequential
writer's finished parts go up while it is still writing (``background_work``),
so closing a big file waits for its last part, not for the whole file. A part
written again after it went up is uploaded again at commit (parts carry a write
generation). A failed upload aborts its multipart upload, keeps the staged
file, and raises an error that names the key and where the bytes are kept.

An object opened without O_TRUNC is not fetched at the open: the writer holds its size
and ETag (``base``) and fetches its bytes at the first operation that keeps some of
them, and only those (``_take_base``). A truncate to 0 or a write over all of it
fetches nothing, a truncate to N the first N bytes, a write all of it; a read before
that is a range GET of that version, staging nothing; an open closed with nothing changed
fetches and uploads nothing. An append (O_APPEND, or a write where the object ends) to an
object of at least MIN_PART fetches nothing either: only the appended bytes are staged
(``_tail``), and the commit is a multipart upload whose first parts are UploadPartCopy of
the object (If-Match its ETag), then the appended bytes. rclone's VFS cache (writes, full)
fetches lazily as well; mountpoint-s3 refuses such an open.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from zvfs.stats import Counters
from zvfs.stores._util import pread_all, pread_at_once, pwrite_all
from zvfs.stores.base import KeyInfo, KeyNotFound, KeyWriter, Stale, StoreError, WriteRefused
from zvfs.stores.counting import count_read, count_written, timed
from zvfs.stores.s3_wire import Upload, UploadGone, strong_etag
from zvfs.stores.staging import Staging

T = TypeVar("T")


class S3Target(Protocol):
    """What the writes need of the S3 store (:class:`zvfs.stores.s3.S3Store`, which imports
    this module to hand its writes over): its requests, with their retries and their errors
    mapped, and the reads a write builds on."""

    bucket: str
    prefix: str
    counters: Counters
    #: the largest object a write may fetch to change part of it
    rewrite_max: int

    def request(self, key: str, op: str, call: Callable[[Any], T]) -> T: ...
    def check_key_length(self, key: str) -> None: ...
    def info(self, key: str) -> KeyInfo: ...
    def exists(self, key: str) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def get_version(self, key: str, start: int, length: int | None, version: str | None,
                    limit: int | None = None) -> bytes: ...
    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]: ...
    def delete(self, key: str) -> None: ...
    def delete_listed(self, key: str) -> None: ...
    def unfinished_uploads(self, key: str | None = None) -> list[Upload]: ...
    def abort_upload(self, key: str, upload_id: str) -> None: ...

log = logging.getLogger(__name__)

#: tries to fetch an object opened without O_TRUNC that is replaced while it is fetched
FETCH_TRIES = 3
#: S3's limits: parts of 5 MiB (but the last) to 5 GiB, at most 10,000 of them, and a
#: single PutObject or CopyObject of at most 5 GiB
MIN_PART = 5 << 20
MAX_PARTS = 10_000
MAX_PUT = 5 << 30
#: S3's largest object
MAX_OBJECT = 5 << 40
MAX_COPY = 5 << 30
#: the part a copy beyond MAX_COPY is made of
COPY_PART = 1 << 30
#: background parts in flight per writer
PARTS_IN_FLIGHT = 4
#: seconds a commit waits for a handed-out part to be started by a worker thread before it
#: uploads that part itself (see S3Writer._settle_parts)
QUEUED_WAIT = 1.0
#: a link (zarr-python's create-if-absent) copies through the client, as a conditional
#: PUT, up to this size; larger ones are a server-side copy after an existence check
LINK_PUT_LIMIT = 64 << 20
#: a directory rename copies key by key up to this many keys; past it, EXDEV (mv then copies)
RENAME_DIR_LIMIT = 1000
#: seconds an upload's date (S3's clock, in whole seconds on some servers) may lie outside the
#: window in which a CreateMultipartUpload was retried and still count as made by its lost tries
LOST_UPLOAD_SKEW = 5.0


def largest_upload(part_size: int) -> int:
    """The largest file a writer of ``part_size`` parts can upload: MAX_PARTS of them, and no
    more than S3's largest object."""
    return min(MAX_PARTS * part_size, MAX_OBJECT)


class S3Writer(KeyWriter):
    """One S3 key open for writing, staged in ``staging``."""

    staged = True

    def __init__(self, store: S3Target, key: str, staging: Staging, part_size: int,
                 *, fresh: bool, exclusive: bool, stored: bool = False,
                 base: KeyInfo | None = None, headers: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.key = key
        #: the object's own headers an upload keeps (KEPT_HEADERS, from the open's HEAD)
        self.headers = dict(headers or {})
        self.staging = staging
        self.part_size = max(MIN_PART, part_size)
        self.path, self._fd = staging.new_file(key)
        self._size = 0
        self._exclusive = exclusive  # a create that must not replace an object (O_EXCL)
        self.stored = stored  # the key holds an object already (see KeyWriter.stored)
        self._dirty = fresh  # a new or truncated file is uploaded even if never written
        #: writes and truncates so far: a commit stores what it saw, and the file stays dirty
        #: if it changed meanwhile
        self._changes = 0
        #: held by the one commit under way, and by close (see commit)
        self._committing = threading.Lock()
        #: the writer's state; never held across a request: background_work() takes it on
        #: the trio thread, which a slow S3 request would otherwise hold up for every file
        self._lock = threading.Condition()
        #: held by the one part upload that creates the multipart upload, while it does
        self._starting = threading.Lock()
        #: starts of the multipart upload that failed: a background part that waited on
        #: ``_starting`` while one failed gives up rather than try again
        self._start_failures = 0
        #: a background part upload failed (after its own tries): no part goes up in the
        #: background again until a commit stores the file. Handed out again at the next
        #: write(), a part the server refused was tried with every write, each a full round
        #: of --s3-attempts (51 UploadParts of one part for 40 writes of a 40 MiB file; a
        #: helper's audit); commit() uploads what is missing, and says what failed
        self._background_failed = False
        self._gen: dict[int, int] = {}  # part -> writes that touched it
        self._done: dict[int, tuple[str, int, int]] = {}  # part -> (ETag, generation, length) uploaded
        #: parts handed out by background_work(): queued for a worker thread, or uploading
        self._in_flight: set[int] = set()
        #: those of them a worker thread is uploading now
        self._running: set[int] = set()
        self._upload_id: str | None = None
        self._seq_end = 0  # bytes [0, _seq_end) have been written in order
        self._committed = False
        self._closed = False
        self._discarded = False
        #: where the staged bytes are kept was logged (by close or abandon: once)
        self._told = False
        self._closed_before_discard = False
        #: the object opened without O_TRUNC (its size and ETag), none of whose bytes are
        #: staged yet: the first operation that keeps some of them fetches those (see
        #: _take_base); None once that is done, or when there is nothing to fetch
        self._base = base if base is not None and base.size > 0 else None
        #: bytes of ``_base`` were read through this open (or its key was unlinked, and a
        #: read must not get the replacement's): a fetch takes that very version, and one
        #: replaced since is ESTALE rather than a version the application never saw
        self._pinned = False
        #: held while ``_base`` is fetched: an operation that meets it waits, never sees
        #: half a fetch, and never fetches it twice
        self._fetching = threading.Lock()
        #: appends to ``_base`` (see _start_tail): bytes [base.size, _size) are staged, those
        #: before them stay the object's, copied by the server at commit (_commit_tail)
        self._tail = False
        #: bytes of [0, _size) that are not in the staged file (``_base``'s, in tail mode)
        self._unstaged = 0

    # -- staging ----------------------------------------------------------------------------

    def fetch(self, size: int, etag: str | None) -> None:
        """Start from the object's first ``size`` bytes, of the version ``etag`` names. Every
        piece is asked of that version (If-Match), so an object replaced meanwhile is Stale,
        never a mix of two versions' pieces; without an ETag the pieces are taken as they
        come. Called again after a Stale, it starts over at the new version's size."""
        self._resize_staged(size, size - self._size)  # no tail left of a longer version fetched before
        self._size = size
        self._fetch_pieces(0, size, etag)
        self._seq_end = size

    def _resize_staged(self, size: int, counted: int) -> None:
        """The staged file cut or grown to ``size``, ``counted`` bytes taken of the staging
        bound for it (given back, when negative). Taken before it grows, so that no two
        writers pass the bound together, and taken back if it could not (EFBIG past a file
        system's size limit, a disk remounted read-only): the count stayed off by it for
        the mount's life, and the bound refused writes it had room for (a helper's audit)."""
        if counted > 0:
            self.staging.grow(self.key, counted)
        try:
            os.ftruncate(self._fd, size)
        except OSError as e:
            if counted > 0:
                self.staging.grow(self.key, -counted)  # a give-back: never refused
            raise _staging_failed(self.key, self.staging.dir, e) from None
        if counted < 0:
            self.staging.grow(self.key, counted)

    def _fetch_pieces(self, pos: int, end: int, etag: str | None) -> None:
        """Bytes [pos, end) of the version ``etag`` into the staged file, a part at a time."""
        while pos < end:
            piece = _get_counted(self.store, self.key, pos, min(self.part_size, end - pos), etag)
            if not piece:
                raise StoreError(f"{self.key}: object shrank while it was fetched for writing")
            try:
                pos += pwrite_all(self._fd, piece, pos)
            except OSError as e:
                raise _staging_failed(self.key, self.staging.dir, e) from None

    def _take_base(self, keep: int | None) -> None:
        """With ``_fetching`` held, before an operation that keeps the opened object's bytes
        [0, keep) (None: all of them) and changes what follows: fetch those, and no more.

        The version fetched is the one the open saw (If-Match its ETag). One replaced since
        is fetched as it is now, as if opened now, unless bytes of the old one were read
        through this open (``_pinned``): then ESTALE, and the application opens it again.
        More than --rewrite-max-size to fetch is EFBIG; a failed fetch leaves nothing
        staged and the object still to fetch, so the operation fails and nothing is lost."""
        base = self._base
        if base is None:
            return
        size, etag = base.size, base.version
        for tries in range(1, FETCH_TRIES + 1):
            want = size if keep is None else min(size, keep)
            if want > self.store.rewrite_max:
                raise _too_big(self.key, want, self.store.rewrite_max)
            try:
                self.fetch(want, etag)
                break
            except Stale:
                self._unfetch()
                if self._pinned:
                    raise WriteRefused(errno.ESTALE, f"{self.key}: replaced since it was opened, and "
                                       "read through this open before; open it again") from None
                if tries == FETCH_TRIES:
                    raise StoreError(f"{self.key}: replaced {tries} times while it was fetched for "
                                     "writing; open it again once it is no longer being written") from None
                log.info("%s: replaced since it was opened; fetching the version there now", self.key)
                try:
                    found = self.store.info(self.key)
                except KeyNotFound:
                    raise _removed(self.key) from None
                size, etag = found.size, found.version
            except KeyNotFound:
                self._unfetch()
                raise _removed(self.key) from None
            except BaseException:
                self._unfetch()
                raise
        self._base = None  # after _size: a size() in between still gives the open's

    def _can_append(self, base: KeyInfo) -> bool:
        """Appends to ``base`` can be stored without fetching it: it is big enough to be a
        part of a multipart upload, it has an ETag to copy it by, and it is still there."""
        return base.size >= MIN_PART and base.version is not None and not self._discarded

    def _start_tail(self, base: KeyInfo) -> None:
        """With ``_fetching`` held: from now on appends are staged after the object's bytes,
        which stay in the store (and are copied there by the commit). The appends are made
        against this version: a replaced one is an error from then on (``_pinned``)."""
        with self._lock:
            self._tail = True
            self._pinned = True
            self._size = self._unstaged = self._seq_end = base.size

    def _fill_base(self, base: KeyInfo) -> None:
        """With ``_fetching`` held, in tail mode: fetch the object's bytes under the appended
        ones (a write into them), and go on as a file fetched whole."""
        if base.size > self.store.rewrite_max:
            raise _too_big(self.key, base.size, self.store.rewrite_max)
        self.staging.grow(self.key, base.size)
        try:
            self._fetch_pieces(0, base.size, base.version)
        except BaseException as exc:
            self.staging.grow(self.key, -base.size)
            if isinstance(exc, Stale):
                raise WriteRefused(errno.ESTALE, f"{self.key}: replaced since it was opened and "
                                   "appended to; open it again") from None
            if isinstance(exc, KeyNotFound):
                raise _removed(self.key) from None
            raise
        with self._lock:
            for part in self._parts(0, base.size):
                self._gen[part] = self._gen.get(part, 0) + 1
            self._tail = False
            self._unstaged = 0
            self._base = None

    def _drop_tail(self) -> None:
        """With ``_fetching`` held: a truncate into the object's bytes cut every appended
        byte; the open is as it was opened, nothing of it fetched."""
        with self._lock:
            self._resize_staged(0, self._unstaged - self._size)
            self._size = self._unstaged = self._seq_end = 0
            self._tail = False

    def _unfetch(self) -> None:
        """What a fetch that failed staged goes: the file is as it was opened."""
        with self._lock:
            self._resize_staged(0, -self._size)
            self._size = self._seq_end = 0

    def _before_write(self, offset: int, end: int) -> None:
        """Before a write of [offset, end): fetch what of the opened object it keeps, if
        nothing has yet: none for a write over all of it, none for an append to one big
        enough to be copied by the server (see _start_tail), else all of it."""
        if self._base is None:
            return
        with self._fetching:
            base = self._base
            if base is None:
                return
            if self._tail:
                if offset < base.size:  # into the object's bytes, under the appended ones
                    self._fill_base(base)
            elif offset == 0 and end >= base.size:
                self._take_base(0)  # a write over all of it keeps none of it
            elif offset == base.size and self._can_append(base):
                self._start_tail(base)
            else:
                self._take_base(None)

    @property
    def size(self) -> int:
        base = self._base
        return base.size if base is not None and not self._tail else self._size

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _parts(self, start: int, end: int) -> range:
        return range(start // self.part_size, (max(end, start + 1) - 1) // self.part_size + 1)

    def _refuse_past_limit(self, end: int) -> None:
        """EFBIG for a file that would end past what can be uploaded, as it is written or
        truncated: staged whole first (S3 refuses part 10,001), it failed only at close."""
        limit = largest_upload(self.part_size)
        if end > limit:
            why = ("S3's largest object" if limit == MAX_OBJECT else
                   f"what {MAX_PARTS} parts of {self.part_size} hold; raise --part-size")
            raise WriteRefused(errno.EFBIG, f"{self.key}: {end} bytes is more than {limit}, {why}")

    def write(self, offset: int, data: bytes) -> int:
        end = offset + len(data)
        self._refuse_past_limit(end)
        self._before_write(offset, end)
        before = None
        with self._lock:
            if end > self._size:
                self.staging.grow(self.key, end - self._size)
                before, self._size = self._size, end
        try:
            n = pwrite_all(self._fd, data, offset, short=True)
        except OSError as e:
            n, failure = 0, e
        else:
            failure = None
        if n < len(data):
            # the staging disk filled under the bound's check (other writers' bytes, a hole
            # filled, another program): what landed counts, the rest is given back
            with self._lock:
                if before is not None and self._size == end:  # no write past it meanwhile
                    landed = max(before, offset + n)
                    self.staging.grow(self.key, landed - end)
                    self._size = landed
            if failure is not None:
                raise _staging_failed(self.key, self.staging.dir, failure)
            end = offset + n
        # the parts' generations move once the bytes are in place: a part upload that read
        # the new generation has read the new bytes too
        with self._lock:
            for part in self._parts(offset, end):
                self._gen[part] = self._gen.get(part, 0) + 1
            if offset <= self._seq_end < end:
                self._seq_end = end
            self._dirty = True
            self._changes += 1
        return n

    def read(self, offset: int, length: int) -> bytes:
        base = self._base
        if base is None:
            return pread_all(self._fd, offset, max(0, min(length, self._size - offset)), self.key)
        if not self._tail:
            return self._read_base(base, offset, length)
        # appended to: the object's bytes, then the staged ones after them
        end = min(offset + length, self._size)
        head = self._read_base(base, offset, min(end, base.size) - offset) if offset < base.size else b""
        start = max(offset, base.size)
        return head + (pread_all(self._fd, start, end - start, self.key) if end > start else b"")

    def read_at_once(self, offset: int, length: int) -> memoryview | None:
        """The staged bytes, once the whole file is staged, when the page cache holds them:
        a database's pages read back after its first write need no thread hop."""
        fd, size = self._fd, self._size
        if self._base is not None or fd < 0 or offset >= size:
            return None
        return pread_at_once(fd, offset, min(length, size - offset), size)

    def unfetched(self, offset: int, length: int) -> KeyInfo | None:
        base = self._base
        if base is None or base.version is None or self._discarded:
            return None  # staged, unpinnable, or unlinked (its reads are this writer's: ESTALE)
        if self._tail and offset + length > base.size:
            return None  # reaches the appended bytes, which are staged
        self._pinned = True  # as _read_base: a fetch from now on takes this version or fails
        return base

    def _read_base(self, base: KeyInfo, offset: int, length: int) -> bytes:
        """A read before anything is fetched: a range of the opened version, staging
        nothing (a program that opens r+ and reads a header fetches the header)."""
        n = max(0, min(length, base.size - offset))
        if n == 0:
            return b""
        self._pinned = True  # before the GET: a fetch from now on takes this version or fails
        try:
            data = _get_counted(self.store, self.key, offset, n, base.version)
        except Stale:
            raise WriteRefused(errno.ESTALE, f"{self.key}: replaced since it was opened; "
                               "open it again") from None
        except KeyNotFound:
            raise _removed(self.key) from None
        if self._base is not base:  # fetched (and maybe written) meanwhile: what is staged
            return self.read(offset, length)
        return data

    def append(self, data: bytes) -> int:
        if self._base is not None:
            with self._fetching:
                base = self._base
                if base is not None and not self._tail:
                    if self._can_append(base):
                        self._start_tail(base)
                    else:
                        self._take_base(None)  # at the end the file has once fetched
        return self.write(self.size, data)

    def truncate(self, size: int) -> None:
        self._refuse_past_limit(size)
        if self._base is not None:
            with self._fetching:
                base = self._base
                if base is not None and self._tail and size < base.size:
                    self._drop_tail()  # every appended byte goes: as if nothing was appended
                if base is not None and not self._tail:
                    if size == base.size:
                        return  # nothing changes: nothing to fetch, nor to store
                    self._take_base(size)
        with self._lock:
            self._resize_staged(size, size - self._size)
            for part in self._parts(min(size, self._size), max(size, self._size)):
                self._gen[part] = self._gen.get(part, 0) + 1
                self._done.pop(part, None)
            self._size = size
            self._seq_end = min(self._seq_end, size)
            self._dirty = True
            self._changes += 1

    # -- uploading ----------------------------------------------------------------------------

    def background_work(self) -> list[Callable[[], None]]:
        """Parts a sequential writer has finished, to upload while it writes on."""
        with self._lock:
            if (not self._dirty or self._closed or self._tail or self._background_failed
                    or self._seq_end < 2 * self.part_size):
                # a file under two parts is one PUT or a short upload at close; appends to an
                # object the server copies (tail mode) go up at commit, after its copy
                return []
            jobs: list[Callable[[], None]] = []
            for part in range(self._seq_end // self.part_size):
                if len(self._in_flight) >= PARTS_IN_FLIGHT:
                    break
                if part in self._in_flight or self._uploaded(part):
                    continue
                self._in_flight.add(part)
                jobs.append(lambda p=part: self._upload_quietly(p))
            return jobs

    def _uploaded(self, part: int) -> bool:
        """Under the lock: the part went up as it is now, its bytes and its length (a part
        uploaded just after a truncate cut it short, and a write further on made a hole
        of it, is not)."""
        done = self._done.get(part)
        length = min(self.part_size, self._size - part * self.part_size)
        return done is not None and done[1] == self._gen.get(part, 0) and done[2] == length

    def _upload_quietly(self, part: int) -> None:
        with self._lock:
            if part not in self._in_flight:  # taken back by commit or close meanwhile
                return
            self._running.add(part)
            self._lock.notify_all()  # a commit may be waiting for it to start
        try:
            self._upload_part(part, background=True)
        except Exception as exc:  # noqa: BLE001 - commit uploads it again and reports
            log.debug("%s: background upload of part %d failed: %s", self.key, part + 1, exc)
            with self._lock:
                self._background_failed = True
        finally:
            with self._lock:
                self._in_flight.discard(part)
                self._running.discard(part)
                self._lock.notify_all()

    def _settle_parts(self) -> None:
        """Under the lock: wait for the parts handed out to be uploaded, side by side by
        their worker threads. A part that no thread has started within QUEUED_WAIT is taken
        back (commit uploads what is missing itself): the caller runs in a worker thread
        too, and may hold the one that part needs, so waiting on could last for ever."""
        deadline = time.monotonic() + QUEUED_WAIT
        while self._in_flight - self._running:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._lock.wait(left)
        self._in_flight &= self._running
        while self._running:
            self._lock.wait()
        self._in_flight.clear()

    def _start_upload(self, background: bool = False) -> str:
        """The multipart upload's id, created by the first part upload that needs one (the
        others wait for it on ``_starting``, not on the writer's lock).

        A background part that waited while the start failed gives up: each trying again in
        turn, up to PARTS_IN_FLIGHT of them, made a close() that waits for them take that
        many deadlines before its own try (9 s with a 3 s deadline when the answer dripped)."""
        with self._lock:
            failures = self._start_failures
        with self._starting:
            with self._lock:
                if self._upload_id is not None:
                    return self._upload_id
                if background and self._start_failures != failures:
                    raise StoreError(f"{self.key}: the multipart upload could not be started")
            try:
                upload_id = create_upload(self.store, self.key, self.headers)
            except Exception:
                with self._lock:
                    self._start_failures += 1
                raise
            with self._lock:
                self._upload_id = upload_id
                return upload_id

    def _upload_part(self, part: int, background: bool = False) -> None:
        upload_id = self._start_upload(background)
        with self._lock:
            gen = self._gen.get(part, 0)
            start = part * self.part_size
            length = min(self.part_size, self._size - start)
        data = self.read(start, length)
        with timed(self.store.counters, "put"):
            r = self.store.request(self.key, "UploadPart", lambda c: c.upload_part(
                Bucket=self.store.bucket, Key=self.store.prefix + self.key, UploadId=upload_id,
                PartNumber=part + 1, Body=data))
        count_written(self.store.counters, len(data))
        with self._lock:
            if self._upload_id == upload_id:
                self._done[part] = (str(r["ETag"]), gen, length)

    def commit(self, durable: bool = False) -> KeyInfo | None:
        # One commit at a time. A second close of the same open file comes while the writer
        # writes whenever a process spawns another while a file is open (the child's exec
        # closes the inherited descriptor: a FLUSH): each commit PUT the staged copy as it
        # saw it, and the older PUT could land last, so the store kept 0 bytes of a file
        # whose close() had succeeded (a helper's soak: 5 in 350 rewrites)
        with self._committing:
            return self._commit()

    def _commit(self) -> KeyInfo | None:
        with self._lock:
            self._settle_parts()
            if not self._dirty:
                return None
            size = self._size
            seen = self._changes
        try:
            # appends to an object the server copies (tail mode), else the staged file whole
            if not (self._tail and self._commit_tail(size)):
                # one PUT holds at most 5 GiB: a file of 6 GiB with parts of 4 GiB went up
                # whole, and S3 refused it at close (a helper's audit)
                if self._upload_id is None and size < 2 * self.part_size and size <= MAX_PUT:
                    self._put_whole(size)
                else:
                    self._finish_upload(size)
        except Exception as exc:
            self._abort()
            if isinstance(exc, WriteRefused):
                raise
            with self._lock:
                self._keep_where_named(f"its upload failed, and close() or fsync() said so: {exc}")
                self._told = True  # this error's line says where (close() says it no more)
            raise StoreError(f"{self.key}: upload failed ({exc}); the written bytes are kept "
                             f"at {self.path}{self._kept_from()}") from exc
        with self._lock:
            self._dirty = self._changes != seen  # written meanwhile: the next commit stores it
            self._committed = True
            self._background_failed = False  # stored: what is written next may go up meanwhile
            self.stored = True
            self._told = False  # what is written next and never stored is told of again
        return KeyInfo(size, time.time_ns())

    def _commit_tail(self, size: int) -> bool:
        """Store an object appended to in tail mode: a multipart upload of the object's bytes,
        copied by the server (UploadPartCopy, If-Match the version appended to), then the
        appended ones; nothing of the object is fetched. Returns False, with the object
        fetched (tail mode over), when the copy may be of another version: a server that
        ignores the condition gave a part whose ETag is not the object's (checked when the
        object was one PUT copied as one part). A version replaced since: ESTALE."""
        with self._fetching:
            base = self._base
            if base is None or not self._tail:
                return False  # fetched meanwhile: an ordinary commit
            etags = self._copy_parts(base)
            if etags is None:
                self._abort()
                log.info("%s: the server's copy of the object appended to may be of another "
                         "version; fetching it to store the file whole", self.key)
                self._fill_base(base)
                return False
            upload_id = self._upload_id
            assert upload_id is not None
            for start in range(base.size, size, self.part_size):
                data = pread_all(self._fd, start, min(self.part_size, size - start), self.key)
                number = len(etags) + 1
                with timed(self.store.counters, "put"):
                    r = self.store.request(self.key, "UploadPart", lambda c, n=number, data=data: c.upload_part(
                        Bucket=self.store.bucket, Key=self.store.prefix + self.key, UploadId=upload_id,
                        PartNumber=n, Body=data))
                count_written(self.store.counters, len(data))
                etags.append(str(r["ETag"]))
            made = complete_upload(self.store, self.key, upload_id, etags)
            with self._lock:
                self._upload_id = None
            if made is None:  # the answer gave no ETag: the object's, if it is still ours
                found = self.store.info(self.key)
                made = found.version if found.size == size else None
            # the next commit copies the same bytes from the object just made
            self._base = KeyInfo(base.size, time.time_ns(), made)
            return True

    def _copy_parts(self, base: KeyInfo) -> list[str] | None:
        """A new multipart upload whose first parts are the server's copies of ``base``:
        their ETags, or None when the copy cannot be told to be of that version."""
        from botocore.exceptions import ClientError

        upload_id = self._start_upload()
        pieces = -(-base.size // MAX_COPY)
        step = -(-base.size // pieces)  # even pieces: each at least 5 MiB, as S3 asks
        source = {"Bucket": self.store.bucket, "Key": self.store.prefix + self.key}
        etags: list[str] = []
        for start in range(0, base.size, step):
            span = f"bytes={start}-{min(base.size, start + step) - 1}"
            number = len(etags) + 1

            def copy(c: Any, n: int = number, span: str = span) -> Any:
                try:
                    return c.upload_part_copy(
                        Bucket=self.store.bucket, Key=self.store.prefix + self.key, UploadId=upload_id,
                        PartNumber=n, CopySource=source, CopySourceRange=span, CopySourceIfMatch=base.version)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") == "PreconditionFailed" or \
                            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                        raise WriteRefused(errno.ESTALE, f"{self.key}: replaced since it was opened "
                                           "and appended to") from None
                    raise

            r = self.store.request(self.key, "UploadPartCopy", copy)
            etags.append(str(r["CopyPartResult"]["ETag"]))
        plain = base.version is not None and "-" not in base.version
        if pieces == 1 and plain and strong_etag(etags[0]) != strong_etag(base.version):
            return None
        return etags

    def _kept_from(self) -> str:
        """What a line naming the kept file says of it in tail mode: its start is a hole."""
        if not self._unstaged:
            return ""
        return (f" (from byte {self._unstaged} on: the bytes before are the stored object's, "
                "which was not changed)")

    def _put_whole(self, size: int) -> None:
        put_key(self.store, self.key, self.read(0, size), if_absent=self._exclusive and not self._committed,
                headers=self.headers)

    def _finish_upload(self, size: int) -> None:
        if self._exclusive and not self._committed and self.store.exists(self.key):
            raise WriteRefused(errno.EEXIST, f"{self.key}: exists already")
        parts = max(1, -(-size // self.part_size))
        if parts > MAX_PARTS:
            raise WriteRefused(errno.EFBIG, f"{self.key}: {size} bytes need more than {MAX_PARTS} "
                               f"parts of {self.part_size}; raise --part-size")
        for part in range(parts):
            if not self._uploaded(part):
                self._upload_part(part)
        with self._lock:
            upload_id = self._upload_id
            etags = [self._done[p][0] for p in range(parts)]
        complete_upload(self.store, self.key, upload_id, etags)
        with self._lock:
            self._upload_id = None
            self._done.clear()

    def _abort(self) -> None:
        """Abort a multipart upload that cannot complete: never left half-done."""
        with self._lock:
            upload_id, self._upload_id = self._upload_id, None
            self._done.clear()
        if upload_id is None:
            return
        try:
            self.store.request(self.key, "AbortMultipartUpload", lambda c: c.abort_multipart_upload(
                Bucket=self.store.bucket, Key=self.store.prefix + self.key, UploadId=upload_id))
        except UploadGone:  # nothing is left open: no line sending the user to --abort-uploads
            log.info("%s: multipart upload %s is gone already (NoSuchUpload)", self.key, upload_id)
        except StoreError as exc:
            log.warning("%s: could not abort multipart upload %s: %s (the next writable mount "
                        "reports it)", self.key, upload_id, exc)

    def abandon(self) -> None:
        """Closing waits for the parts under way and then aborts the multipart upload, each
        up to the S3 deadline: a store that stopped answering held a SIGTERM for twice it
        (120 s; systemd kills at 30 s, before the kept bytes were logged). The staged file is
        kept and named now; an unfinished multipart upload is left to the next writable
        mount, which reports it."""
        with self._lock:
            if self._told:
                return
            self._told = True
            self._closed = True  # no more background parts
            keep = self._dirty and not self._discarded
            if keep:
                self._keep_where_named("the daemon stopped while the store did not answer")
        if keep:
            self._say_kept(" (the daemon stopped while the store did not answer)")

    def _say_kept(self, why: str = "") -> None:
        log.error("%s: written bytes that were never uploaded are kept at %s%s%s", self.key, self.path,
                  self._kept_from(), why)

    def _keep_where_named(self, why: str) -> None:
        """Under the lock, before a line names ``self.path`` as where the bytes are kept, and
        why (recorded on the file, for the next mount to tell). A
        staged file removed from its directory (the staging directory deleted under the mount:
        systemd-tmpfiles, a clean-up script) lived only in its open descriptor, so the path
        named held nothing and the bytes went with the descriptor's close. They are copied
        into a new staged file, which then stands in the descriptor's place (dup2: a part
        upload reading meanwhile reads the same bytes from either)."""
        if self._fd >= 0:
            self.staging.label_kept(self._fd, why)
        try:
            if self._fd < 0 or os.fstat(self._fd).st_nlink > 0:
                return
            path, fd = self.staging.new_file(self.key, counted=False)  # in this one's place
        except (OSError, WriteRefused) as exc:
            log.error("%s: its staged file was removed, and no other can be made: %s", self.key, exc)
            return
        try:
            for start in range(self._unstaged, self._size, _COPY_STEP):
                pwrite_all(fd, pread_all(self._fd, start, min(_COPY_STEP, self._size - start), self.key), start)
            os.dup2(fd, self._fd)
        except (OSError, StoreError) as exc:
            log.error("%s: its staged file was removed, and copying it to %s failed: %s", self.key, path, exc)
            return
        finally:
            os.close(fd)
        log.warning("%s: its staged file %s was removed under the mount; its bytes are now in %s",
                    self.key, self.path, path)
        self.path = path

    def moved(self, key: str) -> None:
        """The staged bytes are uploaded as ``key`` from now on. A multipart upload begun
        under the old key is aborted (its parts go up again under the new one)."""
        with self._lock:
            self._settle_parts()
        self._abort()
        with self._lock:
            self.key = key
            self._exclusive = False  # the rename decided what the new key holds
            if self._fd >= 0:
                self.staging.label(self._fd, key)
        with self._fetching:
            base = self._base
            if base is None:
                return
            # not fetched yet: the rename's copy holds the same bytes, under an ETag of its
            # own where the object was a multipart upload's (If-Match the old one failed)
            try:
                found = self.store.info(key)
            except StoreError:
                return
            if found.size == base.size:
                self._base = KeyInfo(base.size, base.mtime_ns, found.version)

    def discard(self) -> None:
        with self._lock:
            self._pinned = True  # a read through the open gets the unlinked bytes, or ESTALE
            self._closed_before_discard = self._closed
            self._discarded = True  # what is written after this is not kept either
            self._dirty = False
            self._closed = True  # no more background parts

    def undiscard(self) -> None:
        with self._lock:
            if self._discarded and self._fd >= 0:
                self._discarded = False
                # writes meanwhile were not marked: store the staged copy as it is, once more
                # (unless nothing was fetched: then nothing was written either)
                self._dirty = self._base is None or self._tail
                self._changes += 1
                self._closed = self._closed_before_discard

    def close(self) -> None:
        with self._committing, self._lock:  # not under a commit still reading the staged copy
            if self._fd < 0:
                return
            self._closed = True
            self._settle_parts()
            keep = self._dirty and not self._discarded
            if keep:
                self._keep_where_named("closed with bytes not stored (the last store of them failed, "
                                       "or none was asked)")
            fd, self._fd = self._fd, -1
            told, self._told = self._told, True
        os.close(fd)
        self.staging.file_closed()
        self.staging.grow(self.key, self._unstaged - self._size)
        if keep:
            if not told:  # first: the abort after may wait for its deadline
                self._say_kept()
            self._abort()
        else:
            # unlinked or replaced while a multipart upload was under way: nothing of it will
            # ever be completed (it stayed in the bucket, its parts billed, for ever)
            self._abort()
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _too_big(key: str, size: int, limit: int) -> WriteRefused:
    """EFBIG for a fetch past --rewrite-max-size, at the operation that needs it."""
    return WriteRefused(errno.EFBIG, f"{key}: {size} bytes is more than --rewrite-max-size ({limit}) "
                        "allows to fetch for changing in place; replace it instead (open with O_TRUNC, e.g. cp)")


def _removed(key: str) -> WriteRefused:
    """The object opened without O_TRUNC was removed before its bytes were fetched."""
    return WriteRefused(errno.ESTALE, f"{key}: removed from the store since it was opened; open it again")


def _staging_failed(key: str, where: str, e: OSError) -> StoreError:
    """A write to a staged file that failed: its disk full (past the staging bound's check,
    which only sees the free space before the write: concurrent writers, a hole filled, any
    other program) is ENOSPC to the application, as on a local disk, not EIO."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return WriteRefused(errno.ENOSPC, f"{key}: the staging disk ({where}) is full: {e.strerror}")
    return StoreError(f"{key}: cannot write its staged copy in {where}: {e.strerror}")


#: bytes copied at a time when a removed staged file is kept again (see _keep_where_named)
_COPY_STEP = 8 << 20


def _get_counted(store: S3Target, key: str, start: int, length: int, version: str | None) -> bytes:
    """A ranged GET of ``version`` for a writer, counted as the mount's own reads are (the
    writer calls the store below the counting one: its fetches were in no stats)."""
    with timed(store.counters, "get_range"):
        data = store.get_version(key, start, length, version)
    count_read(store.counters, "get_range", data)
    return data


# -- the store's other write operations ---------------------------------------------------------


def copy_key(store: S3Target, src: str, dst: str, size: int) -> None:
    """Server-side copy of ``src`` to ``dst`` (multipart beyond S3's 5 GiB copy limit)."""
    bucket, full_src, full_dst = store.bucket, store.prefix + src, store.prefix + dst
    source = {"Bucket": bucket, "Key": full_src}
    if size <= MAX_COPY:
        store.request(src, "CopyObject", lambda c: c.copy_object(
            Bucket=bucket, Key=full_dst, CopySource=source))
        return
    upload_id = create_upload(store, dst)
    step = COPY_PART
    try:
        etags = []
        for n, start in enumerate(range(0, size, step), 1):
            span = f"bytes={start}-{min(size, start + step) - 1}"
            part = store.request(src, "UploadPartCopy", lambda c, n=n, span=span: c.upload_part_copy(
                Bucket=bucket, Key=full_dst, UploadId=upload_id, PartNumber=n,
                CopySource=source, CopySourceRange=span))
            etags.append(str(part["CopyPartResult"]["ETag"]))
        complete_upload(store, dst, upload_id, etags)
    except BaseException:
        store.request(dst, "AbortMultipartUpload", lambda c: c.abort_multipart_upload(
            Bucket=bucket, Key=full_dst, UploadId=upload_id))
        raise


def complete_upload(store: S3Target, key: str, upload_id: str, etags: list[str]) -> str | None:
    """Complete the multipart upload (or copy) of ``key`` whose parts 1.. have ``etags``;
    the object's ETag, where the answer gives it.

    A completion whose answer was lost is tried again, and the server may have made the
    object at the first try and answer this one NoSuchUpload (MinIO does): the write or
    rename then failed though it was done. So the object is looked at: made of these very
    parts (its ETag says so), the completion is taken as done."""
    parts = [{"PartNumber": n, "ETag": tag} for n, tag in enumerate(etags, 1)]
    try:
        r = store.request(key, "CompleteMultipartUpload", lambda c: c.complete_multipart_upload(
            Bucket=store.bucket, Key=store.prefix + key, UploadId=upload_id,
            MultipartUpload={"Parts": parts}))
    except UploadGone:
        if not completed_already(store, key, etags):
            raise
        log.info("%s: the multipart upload's completion was answered NoSuchUpload, but the "
                 "object is made of its parts: completed by a try whose answer was lost", key)
        return multipart_etag(etags)
    return strong_etag(r.get("ETag")) if isinstance(r, dict) else None


#: headers of an object that a rewrite through the mount keeps, as a local file keeps its
#: attributes when its bytes change: another client's Content-Type and user metadata
#: (s3fs's mode and owner, rclone's mtime) were dropped by an append through the mount,
#: and an s3fs file of mode 0600 showed 0640 there after (a helper's audit)
KEPT_HEADERS = ("ContentType", "Metadata", "CacheControl", "ContentDisposition", "ContentEncoding",
                "ContentLanguage")


def create_upload(store: S3Target, key: str, headers: Mapping[str, Any] | None = None) -> str:
    """A new multipart upload of ``key``: its id. A create that took more than one try may
    have made an upload on a try whose answer was lost; those are looked for and aborted
    (see abort_lost_uploads), which costs a listing only then."""
    tries = 0

    def create(client: Any) -> Any:
        nonlocal tries
        tries += 1
        return client.create_multipart_upload(Bucket=store.bucket, Key=store.prefix + key, **(headers or {}))

    began = time.time()
    upload_id = str(store.request(key, "CreateMultipartUpload", create)["UploadId"])
    if tries > 1:
        abort_lost_uploads(store, key, upload_id, began, time.time())
    return upload_id


def abort_lost_uploads(store: S3Target, key: str, kept: str, began: float, ended: float) -> None:
    """Abort the uploads of ``key`` that the tries of a CreateMultipartUpload made between
    ``began`` and ``ended`` (our clock) other than ``kept``, the one whose answer came: the
    server made each, but only ``kept`` is ever completed or aborted, so the others stayed
    open (their parts billed) with nothing said.

    Which are ours: an upload's date is S3's clock, so the window is placed on the date S3
    gave ``kept``: from the create's duration (plus LOST_UPLOAD_SKEW) before it to
    LOST_UPLOAD_SKEW after it; our own clock's window, widened as much, only when ``kept``
    is not listed. The uploads of another client of this key, made within that window (and
    by the same principal, when the listing names who made each) are aborted too: its
    upload then fails with NoSuchUpload, an error its writer sees and may retry, as it would
    when it loses to this writer's object (the last to complete wins anyway). Leaving ours
    open instead costs for ever and nobody is told."""
    try:
        listed = store.unfinished_uploads(key)
        ours = next((up for up in listed if up.upload_id == kept), None)
        if ours is not None:
            low, high = ours.started - (ended - began), ours.started
        else:
            low, high = began, ended
        who = ours.initiator if ours is not None else None
        for up in listed:
            if up.upload_id == kept or (who and up.initiator != who):
                continue
            if not low - LOST_UPLOAD_SKEW <= up.started <= high + LOST_UPLOAD_SKEW:
                continue
            store.abort_upload(key, up.upload_id)
            log.warning("%s: aborted multipart upload %s, made by a CreateMultipartUpload whose "
                        "answer was lost (its retry made %s)", key, up.upload_id, kept)
    except StoreError as exc:
        log.warning("%s: a multipart upload of it may be left open (a CreateMultipartUpload's answer "
                    "was lost, and aborting the upload it made failed: %s); `zvfs mount --abort-uploads` "
                    "clears it", key, exc)


def multipart_etag(part_etags: list[str]) -> str | None:
    """The ETag S3 gives the object a multipart upload of these parts makes (the MD5 of
    their MD5s, then "-" and their count), quoted; None when a part's ETag is not an MD5
    (an encrypted object's, or another server's own)."""
    import hashlib

    try:
        digests = b"".join(bytes.fromhex(e.strip().strip('"')) for e in part_etags)
    except ValueError:
        return None
    if len(digests) != 16 * len(part_etags) or not part_etags:
        return None
    return f'"{hashlib.md5(digests).hexdigest()}-{len(part_etags)}"'  # noqa: S324 - S3's ETag


def completed_already(store: S3Target, key: str, part_etags: list[str]) -> bool:
    """Whether ``key`` is now the object a multipart upload of these parts made."""
    expected = multipart_etag(part_etags)
    if expected is None:
        return False
    try:
        return store.info(key).version == expected
    except StoreError:
        return False


def link_key(store: S3Target, src: str, dst: str) -> KeyInfo:
    """``dst`` gets ``src``'s bytes unless it exists (EEXIST): zarr-python's create-if-absent.
    Returns its size, the source's as its HEAD said.

    Small objects go through a conditional PUT (If-None-Match: *), so two writers cannot
    both create ``dst``; servers that refuse the condition get a plain PUT after the check.
    """
    if store.exists(dst):
        raise WriteRefused(errno.EEXIST, f"{dst}: exists already")
    info = store.info(src)
    if info.size > LINK_PUT_LIMIT:
        copy_key(store, src, dst, info.size)
        return KeyInfo(info.size, time.time_ns())
    # the version the HEAD saw, and no more than it may hold: a GET read unbounded took in
    # whatever the server sent (a helper's audit)
    data = store.get_version(src, 0, None, info.version, LINK_PUT_LIMIT + 1)
    if len(data) != info.size:
        sent = f"more than {LINK_PUT_LIMIT}" if len(data) > LINK_PUT_LIMIT else str(len(data))
        raise StoreError(f"{src}: its GET sent {sent} bytes, its HEAD said {info.size}: not linked")
    put_key(store, dst, data, if_absent=True)
    return KeyInfo(info.size, time.time_ns())


def put_key(store: S3Target, key: str, data: bytes, if_absent: bool = False,
            headers: Mapping[str, Any] | None = None) -> None:
    """One PUT of ``data`` as ``key``. ``if_absent``: EEXIST if the key exists, by a conditional
    PUT (If-None-Match: *), or where the server does not implement that, a check first.
    ``headers``: KEPT_HEADERS of the object it replaces."""
    kw: dict[str, Any] = {"Bucket": store.bucket, "Key": store.prefix + key, "Body": data, **(headers or {})}
    tries = 0

    def put(client: Any) -> Any:
        nonlocal tries
        tries += 1
        return client.put_object(**kw, **({"IfNoneMatch": "*"} if if_absent else {}))

    with timed(store.counters, "put"):
        try:
            store.request(key, "PutObject", put)
        except WriteRefused as exc:
            if exc.errno == errno.EEXIST and tries > 1 and _holds(store, key, data):
                # a try served whose answer was lost (a reset, a timeout): the next one met the
                # object it had made. The very bytes sent: this PUT's, not another client's
                log.info("%s: a conditional PUT tried again was answered that the key exists, but it "
                         "holds the bytes sent: made by a try whose answer was lost", key)
            elif exc.errno != errno.ENOTSUP:
                raise
            elif store.exists(key):
                raise WriteRefused(errno.EEXIST, f"{key}: exists already") from None
            else:
                store.request(key, "PutObject", lambda c: c.put_object(**kw))
    count_written(store.counters, len(data))


def _holds(store: S3Target, key: str, data: bytes) -> bool:
    """``key``'s object is ``data``: its size, and its ETag their MD5 (a single PUT's, unless
    the server encrypts with KMS or a customer key: then it cannot be told, and is not)."""
    try:
        info = store.info(key)
    except StoreError:
        return False
    return info.size == len(data) and info.version == f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def rename_prefix(store: S3Target, src: str, dst: str) -> None:
    """Move every key below ``src`` to ``dst``, key by key (not atomic), up to RENAME_DIR_LIMIT."""
    keys = []
    for key, info in store.list_tree(src):
        keys.append((key, info))
        if len(keys) > RENAME_DIR_LIMIT:
            raise WriteRefused(errno.EXDEV, f"{src}: more than {RENAME_DIR_LIMIT} keys to rename on S3; "
                               "copy and delete them instead (mv does so by itself)")
    if keys and len(dst) > len(src):  # the longest must fit under the new name: before a copy
        store.check_key_length(dst + max((key for key, _ in keys), key=lambda k: len(k.encode()))[len(src):])
    # every key below it moves: the folder markers ("dir/", the S3 console's, s3fs's) after
    # the files (one left behind kept the old directory listed, and a directory that was
    # only a marker did not move at all, though mv said it had), and the keys the mount
    # cannot show ("a//b", "a/./c"), deleted as listed (store.delete refuses such a key:
    # the rename failed after its first copy, which stayed below the new name)
    files = sorted(keys, key=lambda item: item[0].endswith("/"))
    for moved, (key, info) in enumerate(files):
        try:
            copy_key(store, key, dst + key[len(src):], info.size)
            store.delete_listed(key)
        except StoreError as exc:
            if not moved:
                raise
            # the keys moved so far stay moved: say so, or the user takes the error for
            # "nothing happened" and finds part of the directory under the new name
            raise part_way(exc, f"{src} -> {dst} stopped part way: {moved} of {len(files)} keys "
                                f"were moved, the rest are still below {src}") from exc


def part_way(exc: StoreError, what: str) -> StoreError:
    """``exc``, a failure that left a change half made, as the same kind of error (the same
    errno) whose message says first what was done already."""
    note = f"{what} ({exc})"
    return WriteRefused(exc.errno, note) if isinstance(exc, WriteRefused) else StoreError(note)

"""The formats' public API: one reader over every Zarr flavour (the package docstring and
``zvfs.formats.__all__`` name what is public; ``ChunkReader`` is the seam to each format)."""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..codecs import CodecError, UnknownCodecError
from ..stores.base import (
    KeyInfo,
    KeyNotFound,
    Listing,
    Store,
    StoreError,
    TooLarge,
    is_store_failure,
)
from ..stores.keys import bad_segment
from . import keys, nczarr, zarr_v1, zarr_v2, zarr_v3
from ._common import attributes_of, get_metadata, join, load_json, parse_json, values_budget
from .known import FLAT_KEYS_MIN, FLAT_KEYS_PER_NODE, Known, Look, Prints, flat_infos, same, trusted
from .meta import ArrayMeta, FormatError


@dataclass(slots=True)
class GroupMeta:
    """One group: its path ('' = root), format, user attributes, and error if unreadable."""

    path: str
    format: str
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    metadata_key: str = ""
    #: NCZarr's ``_nczarr_attr`` types (name -> dtype string), kept for the typed views
    attribute_types: dict[str, str] = field(default_factory=dict)
    #: NCZarr's order of the group's variables and dimensions; empty = by name
    definition_order: nczarr.DefinitionOrder = nczarr.BY_NAME

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "attributes": self.attributes,
            "error": self.error,
        }


#: levels a node's path may have: the views are built by walking the tree recursively, and
#: a path 3,000 levels deep (consolidated metadata may name any) made all of .zvfs/v2 fail
MAX_PATH_DEPTH = 256


@dataclass(slots=True)
class Hierarchy:
    """What :func:`discover` found.

    ``groups`` maps group path → user attributes, ``group_meta`` the same paths →
    GroupMeta (format, error); ``arrays`` maps array path → ArrayMeta (``error``
    set when unreadable); ``errors`` holds listing failures by prefix.
    """

    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_meta: dict[str, GroupMeta] = field(default_factory=dict)
    arrays: dict[str, ArrayMeta] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    consolidated: bool = False
    #: a store request failed (not a format problem): what was found is not the whole
    #: hierarchy, so callers must not keep it as if it were
    incomplete: bool = False
    #: what this discovery read, for the next to read only what changed (discover's
    #: ``known``); None when it was not asked for
    known: Known | None = None

    def add(self, node: ArrayMeta | GroupMeta | None) -> None:
        if node is None:
            return
        if node.path.count("/") >= MAX_PATH_DEPTH:
            self.errors[node.path[:100] + "..."] = f"a node more than {MAX_PATH_DEPTH} levels deep; left out"
            return
        if isinstance(node, ArrayMeta):
            self.arrays[node.path] = node
        else:
            self.groups[node.path] = node.attributes
            self.group_meta[node.path] = node

    def array_errors(self) -> dict[str, str]:
        """Arrays that cannot be read, with their error message."""
        return {p: m.error for p, m in self.arrays.items() if m.error}


class ChunkReader(Protocol):
    """What each format's ``Reader`` (zarr_v1, zarr_v2, zarr_v3, nczarr) does for one array:
    blocking and thread-safe; ``idx`` is a checked index of the decoded chunk grid."""

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        """Store key of the object holding chunk ``idx`` (the shard, for sharded arrays)."""
        ...

    def exists(self, idx: tuple[int, ...]) -> bool:
        """True if chunk ``idx`` was written."""
        ...

    def read(self, idx: tuple[int, ...]) -> np.ndarray | None:
        """Chunk ``idx`` decoded (full chunk shape), or None if it was never written."""
        ...


class ZarrArray:
    """One array: metadata plus a thread-safe reader for its decoded chunks."""

    def __init__(self, store: Store, meta: ArrayMeta):
        self.store = store
        self.meta = meta
        #: None exactly when ``meta.error`` says why the array cannot be read
        self._reader: ChunkReader | None = None
        self._fill: np.ndarray | None = None
        self._lock = threading.Lock()
        if meta.error is None:
            try:
                self._reader = _make_reader(store, meta)
            except (FormatError, CodecError, KeyError, TypeError, ValueError) as exc:
                meta.error = f"{meta.metadata_key}: {exc}"

    def __repr__(self) -> str:
        return f"ZarrArray({self.meta.path!r}, {self.meta.format}, shape={self.meta.shape})"

    def _check(self, idx: tuple[int, ...]) -> tuple[ChunkReader, tuple[int, ...]]:
        """The reader and the checked index; FormatError if the array or the index is bad."""
        reader, checked = self._check_many([idx])
        return reader, checked[0]

    def _check_many(self, indices: list[tuple[int, ...]]) -> tuple[ChunkReader, list[tuple[int, ...]]]:
        """:meth:`_check` of many indices, the array and its grid looked at once."""
        if self.meta.error is not None or self._reader is None:
            raise FormatError(self.meta.error or f"{self.meta.metadata_key}: no reader")
        grid = self.meta.grid_shape
        try:
            return self._reader, [self.meta.check_index(idx, grid) for idx in indices]
        except IndexError as exc:
            raise FormatError(str(exc)) from exc

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        """Store key of the object holding chunk ``idx`` (the shard, for sharded arrays)."""
        reader, idx = self._check(idx)
        return reader.chunk_key(idx)

    def chunk_keys(self, indices: list[tuple[int, ...]]) -> list[str]:
        """:meth:`chunk_key` of each of ``indices``, the array and its grid checked once: a
        read of many tiny chunks spent a third of its time checking each one's grid."""
        reader, checked = self._check_many(indices)
        return [reader.chunk_key(idx) for idx in checked]

    def chunk_exists(self, idx: tuple[int, ...]) -> bool:
        """True if chunk ``idx`` was written (an inner chunk inside its shard, if sharded)."""
        reader, idx = self._check(idx)
        try:
            return bool(reader.exists(idx))
        except (CodecError, StoreError) as exc:
            raise FormatError(f"{reader.chunk_key(idx)}: {exc}") from exc

    def fill_chunk(self) -> np.ndarray:
        """A read-only full chunk of fill_value: one element broadcast to the chunk shape,
        so a never-written chunk of 1 GiB costs no memory."""
        with self._lock:
            if self._fill is None:
                self._fill = np.broadcast_to(self.meta.fill_chunk(()), self.meta.chunks)
            return self._fill

    def read_chunk(self, idx: tuple[int, ...]) -> np.ndarray:
        """Chunk ``idx`` decoded: full chunk shape, C order, declared dtype; fill if missing.

        Blocking (fetch + decode). Raises FormatError naming the key on corrupt
        data, a store failure, or an array whose metadata is unusable.
        """
        reader, idx = self._check(idx)
        try:
            out = reader.read(idx)
        except FormatError:
            raise
        except (CodecError, StoreError, ValueError, TypeError, IndexError, OverflowError) as exc:
            # readers wrap what they expect; this keeps any surprise to one failed read
            raise FormatError(f"{reader.chunk_key(idx)}: {exc}") from exc
        if out is None:
            return self.fill_chunk()
        if out.shape != self.meta.chunks:
            raise FormatError(
                f"{reader.chunk_key(idx)}: decoded shape {out.shape}, expected {self.meta.chunks}"
            )
        if out.dtype != self.meta.dtype:
            out = out.astype(self.meta.dtype)
        return out

    def read_all(self) -> np.ndarray:
        """The whole array (for tests and small arrays): edge chunks clipped."""
        if self.meta.error is not None:
            raise FormatError(self.meta.error)
        out = np.empty(self.meta.shape, dtype=self.meta.dtype)
        for idx in self.meta.chunk_indices():
            region = self.meta.chunk_slices(idx)
            chunk = self.read_chunk(idx)
            out[region] = chunk[tuple(slice(0, s.stop - s.start) for s in region)]
        return out


def _make_reader(store: Store, meta: ArrayMeta) -> ChunkReader:
    if meta.format == "zarr_v3":
        return zarr_v3.Reader(store, meta)
    if meta.format == "zarr_v2":
        return zarr_v2.Reader(store, meta)
    if meta.format == "nczarr":
        return nczarr.Reader(store, meta)
    if meta.format == "zarr_v1":
        return zarr_v1.make_reader(store, meta)
    raise FormatError(f"unknown format {meta.format!r}")


_Node = ArrayMeta | GroupMeta | None  # what _contained gives back


# -- reading one node ------------------------------------------------------------


def _v2_array(path: str, zarray: Any, zattrs: Any, key: str, err: str | None) -> ArrayMeta:
    if err is not None:
        return ArrayMeta(path=path, format="zarr_v2", error=err, metadata_key=key)
    if nczarr.is_nczarr(zarray, zattrs):
        return nczarr.parse_array(path, zarray, zattrs, key)
    return zarr_v2.parse_array(path, zarray, zattrs, key)


def _v3_node(path: str, doc: Any, key: str) -> ArrayMeta | GroupMeta:
    node_type = doc.get("node_type") if isinstance(doc, dict) else None
    if node_type == "group":
        err = zarr_v3.group_error(doc, key)  # an extension may change what its attributes mean
        return GroupMeta(path, "zarr_v3", {} if err else dict(attributes_of(doc)), err, key)
    if node_type != "array":
        return ArrayMeta(
            path=path,
            format="zarr_v3",
            metadata_key=key,
            error=f"{key}: not a Zarr v3 array or group (node_type {node_type!r})",
        )
    return zarr_v3.parse_array(path, doc, key)


def read_array_meta(store: Store, path: str) -> ArrayMeta | None:
    """ArrayMeta of the array at ``path`` (any format), or None if there is no array there."""
    node = _read_node(store, path)
    return node if isinstance(node, ArrayMeta) else None


def open_array(store: Store, path: str, meta: ArrayMeta | None = None) -> ZarrArray:
    """Open the array at ``path`` ('' = root). ``meta`` (e.g. from discover) skips re-reading.

    Raises FormatError if there is no array at ``path``. Broken metadata does not
    raise here: it is in ``meta.error`` and ``read_chunk`` raises.
    """
    if meta is None:
        meta = read_array_meta(store, path)
        if meta is None:
            raise FormatError(f"{path or '/'}: no Zarr array here")
    return ZarrArray(store, meta)


# -- discovery --------------------------------------------------------------------

#: consecutive metadata-less directory levels walked before giving up on a branch
MAX_BARE_DEPTH = 8
#: subdirectories of a broken root probed for metadata of their own, at most
MAX_BROKEN_CHILDREN = 100
#: listings done by one discover() at most (a guard against walking a huge non-Zarr tree)
MAX_LISTINGS = 100_000


def discover(store: Store, known: Known | None = None) -> Hierarchy:
    """Find groups and arrays from metadata only: never lists chunk directories.

    Uses consolidated metadata (v2 ``.zmetadata``, v3 inline ``consolidated_metadata``)
    when the root has it; otherwise walks prefixes, stopping at arrays. One bad
    node gets an error entry; discovery goes on.

    With ``known`` (what an earlier discovery read: its ``h.known``, or an empty Known for
    the first), only what changed since is read again, told by the keys' infos (see
    :mod:`zvfs.formats.known`), with the same result as reading it all; ``h.known`` is then
    what this one read.
    """
    h = Hierarchy()
    try:
        root = store.list_dir("")
    except StoreError as exc:
        h.errors[""] = str(exc)
        h.incomplete = True
        return h
    d = _Discovery(store, known, h, root)
    with values_budget():  # the documents' values together, not only each one's
        if keys.ZMETADATA in root.keys and d.consolidated(keys.ZMETADATA, _from_zmetadata):
            return h
        if keys.ZARR_JSON in root.keys and d.consolidated(keys.ZARR_JSON, _from_v3_consolidated):
            return h
        _walk(d, root)
    return h


class _Discovery:
    """One discovery's reads: what an earlier one read (``before``), and what this one
    reads (``h.known``), when asked to keep it."""

    def __init__(self, store: Store, before: Known | None, h: Hierarchy, root: Listing) -> None:
        self.store = store
        self.before = before
        self.h = h
        self.root = root
        self.prints: Prints | None = None
        if before is not None:
            h.known = Known(flat_refused=before.flat_refused)

    def consolidated(self, name: str, read: Callable[[Store, Hierarchy, list[bool]], bool]) -> bool:
        """``read(store, h, failed)`` (a consolidated document's reader), unless the document
        kept the info it had when an earlier discovery read it: then what it gave then."""
        h, info = self.h, self.root.keys.get(name)
        held = self.before.roots.get(name) if self.before is not None else None
        if held is not None and same(held[0], info):
            got = held[1]
            h.errors.update(got.errors)
            if got.consolidated:
                h.groups.update(got.groups)
                h.group_meta.update(got.group_meta)
                h.arrays.update(got.arrays)
                h.consolidated = True
            if h.known is not None:
                h.known.roots[name] = held
            return got.consolidated
        errors = set(h.errors)
        failed: list[bool] = []
        found = read(self.store, h, failed)
        if h.known is not None and not failed and trusted(info, time.time_ns()):
            got = Hierarchy(errors={k: v for k, v in h.errors.items() if k not in errors})
            if found:
                got = Hierarchy(dict(h.groups), dict(h.group_meta), dict(h.arrays), dict(h.errors),
                                consolidated=True)
            h.known.roots[name] = (info, got)
        return found

    def node(self, path: str, listing: Listing | None) -> _Node:
        """The node at ``path`` (its listing at hand, or None): the earlier discovery's when
        its metadata keys kept their infos, else read."""
        if self.before is None:
            return _contained(path, path or "/", "zarr", _read_node, self.store, path,
                              None if listing is None else Look(None, path, listing.keys))
        if listing is None and self.prints is None:
            self.prints = self.take_prints()
        look = Look(self.prints, path, None if listing is None else listing.keys)
        held = self.before.nodes.get(path)
        if held is not None and getattr(held[0], "error", None) is None and look.unchanged(held[1]):
            node = held[0]
        else:
            look.noted = []
            node = _contained(path, path or "/", "zarr", _read_node, self.store, path, look)
        if self.h.known is not None and getattr(node, "error", None) is None:
            self.h.known.nodes[path] = (node, tuple(look.noted))
        return node

    def take_prints(self) -> Prints:
        """Where the nodes' keys' infos come from: a stat each on a local store; a flat
        listing of a remote one while it pays (see known.FLAT_KEYS_PER_NODE)."""
        if self.store.local or self.before is None or not self.store.flat_listing or self.before.flat_refused:
            return Prints(self.store, None)
        nodes = max(len(self.before.nodes), len(self.root.prefixes))
        listed, refused = flat_infos(self.store, max(FLAT_KEYS_MIN, FLAT_KEYS_PER_NODE * nodes))
        if refused and self.h.known is not None:
            self.h.known.flat_refused = True
        return Prints(self.store, listed)


def _root_doc(store: Store, key: str, failed: list[bool]) -> dict[str, Any] | None:
    """The root's consolidated metadata document ``key``; None when unusable (then we walk),
    and ``failed`` told so when the store failed (not the document)."""
    try:
        doc = load_json(store, key)
    except FormatError as exc:
        if is_store_failure(exc):
            failed.append(True)
        return None
    except StoreError:
        failed.append(True)
        return None
    return doc if isinstance(doc, dict) else None


def _from_zmetadata(store: Store, h: Hierarchy, failed: list[bool]) -> bool:
    """Fill ``h`` from a v2 .zmetadata; False if it is unusable (then we walk)."""
    doc = _root_doc(store, keys.ZMETADATA, failed)
    entries = doc.get("metadata") if doc is not None else None
    if not isinstance(entries, dict):
        return False
    if doc.get("zarr_consolidated_format") != 1:
        # the only format there is (zarr-python 2.18 refuses any other): another's
        # "metadata" taken as the hierarchy hid the arrays it does not name
        h.errors[""] = (f"{keys.ZMETADATA}: zarr_consolidated_format "
                        f"{doc.get('zarr_consolidated_format')!r}, not 1; not used")
        return False
    for key, value in entries.items():
        if not isinstance(key, str) or not _nameable(h, key):
            continue
        path, _, name = key.rpartition("/")
        attrs = entries.get(join(path, keys.ZATTRS))
        if name == keys.ZARRAY:
            h.add(_contained(path, key, "zarr_v2", _v2_array, path, value, attrs, key, None))
        elif name == keys.ZGROUP:
            h.add(_contained(path, key, "zarr_v2", _v2_group, path, value, attrs, key))
    h.consolidated = True
    return True


def _from_v3_consolidated(store: Store, h: Hierarchy, failed: list[bool]) -> bool:
    """Fill ``h`` from the root zarr.json's consolidated_metadata; False if it has none."""
    doc = _root_doc(store, keys.ZARR_JSON, failed)
    if doc is None or doc.get("node_type") != "group":
        return False
    cons = doc.get("consolidated_metadata")
    if not isinstance(cons, dict) or not isinstance(cons.get("metadata"), dict):
        return False
    if cons.get("kind") != "inline":
        # the only kind the spec and zarr-python define: another's "metadata" may mean
        # anything (taken as the hierarchy, an empty one hid every array): walk instead
        h.errors[""] = f"{keys.ZARR_JSON}: consolidated_metadata of kind {cons.get('kind')!r}, not 'inline'; not used"
        return False
    h.add(_contained("", keys.ZARR_JSON, "zarr_v3", _v3_node, "", doc, keys.ZARR_JSON))
    for path, node in cons["metadata"].items():
        if isinstance(path, str) and _nameable(h, path):
            key = join(path, keys.ZARR_JSON)
            h.add(_contained(path, key, "zarr_v3", _v3_node, path, node, key))
    h.consolidated = True
    return True


def _nameable(h: Hierarchy, path: str) -> bool:
    """Whether a path that consolidated metadata names can become file names: JSON may hold
    lone surrogates ("\\ud800"), which are not Unicode text and cannot be encoded into a
    name, a netCDF header or an ENVI header; and paths no store key can have (an empty,
    ``.`` or ``..`` segment, a NUL). Such a node is left out (noted in ``h.errors``)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        h.errors[ascii(path)] = "consolidated metadata names a node whose path is not valid Unicode; left out"
        return False
    why = bad_segment(path) if path else None
    if why is not None:
        # "/abs", "a//b", "./c", "../up", "x<NUL>y": no store holds such a key, and each
        # refuses it as absent, so the node would read as fill whatever the store holds
        h.errors[repr(path)] = f"consolidated metadata names a node whose path is not a safe path ({why}); left out"
        return False
    return True


def _contained(path: str, key: str, fmt: str, read: Callable[..., _Node], *args: Any) -> _Node:
    """``read(*args)``, with any failure turned into an error node for ``path`` only.

    The parsers expect FormatError; hostile metadata may still trip something else
    (RecursionError, TypeError, OverflowError in numpy). Discovery must go on, so the
    other arrays stay readable and this one's meta.json says what went wrong. A
    StoreError is not about the metadata and is passed on.
    """
    try:
        return read(*args)
    except StoreError:
        raise  # the store failed, not the metadata: the caller decides (retry, incomplete)
    except Exception as exc:  # noqa: BLE001 - containment: one bad node, not one bad mount
        msg = str(exc) if key in str(exc) else f"{key}: {type(exc).__name__}: {exc}"
        return ArrayMeta(path=path, format=fmt, error=msg, metadata_key=key)


def _v2_group(path: str, zgroup: Any, zattrs: Any, key: str) -> GroupMeta:
    attrs = dict(zattrs) if isinstance(zattrs, dict) else {}
    fmt = "nczarr" if nczarr.is_nczarr(zgroup, zattrs) else "zarr_v2"
    types: dict[str, str] = {}
    order = nczarr.BY_NAME
    if fmt == "nczarr":
        types = nczarr.attribute_types(attrs)
        attrs = nczarr.strip_nczarr(attrs)
        order = nczarr.definition_order(zgroup)
    err = None if isinstance(zgroup, dict) else f"{key}: expected a JSON object"
    return GroupMeta(path, fmt, attrs, err, key, types, order)


def _get_doc(store: Store, key: str, look: Look, name: str) -> tuple[bool, Any, str | None]:
    """(present, document, error) for a metadata key, skipping the request if a listing (or
    the key's info) says absent."""
    if look.info(name) is None:
        return False, None, None
    try:
        raw = get_metadata(store, key)
    except KeyNotFound:
        look.surprise(name)
        return False, None, None
    except FormatError as exc:  # too big to be metadata
        look.surprise(name)
        return True, None, str(exc)
    # any other StoreError propagates: a metadata key that could not be fetched says
    # nothing about the node, and must not be mistaken for a broken one
    try:
        return True, parse_json(raw, key), None
    except FormatError as exc:
        return True, None, str(exc)


def _read_node(store: Store, path: str, look: Look | None = None) -> ArrayMeta | GroupMeta | None:
    """The node at ``path`` from its metadata keys (probed by get, or skipped where a listing
    or their info says absent: ``look``, which notes the infos for the next discovery)."""
    if look is None:
        look = Look(None, path, None)
    key = join(path, keys.ZARR_JSON)
    present, doc, err = _get_doc(store, key, look, keys.ZARR_JSON)
    if present:
        if err is not None:  # cannot tell array from group: a broken array, not descended into
            return ArrayMeta(path=path, format="zarr_v3", error=err, metadata_key=key)
        # what the parser did not foresee is told with the document's key, not the node's path
        return _contained(path, key, "zarr_v3", _v3_node, path, doc, key)
    key = join(path, keys.ZARRAY)
    present, zarray, err = _get_doc(store, key, look, keys.ZARRAY)
    if present:
        _, zattrs, attrs_err = _get_doc(store, join(path, keys.ZATTRS), look, keys.ZATTRS)
        return _contained(path, key, "zarr_v2", _v2_array, path, zarray, zattrs, key, err or attrs_err)
    key = join(path, keys.ZGROUP)
    present, zgroup, err = _get_doc(store, key, look, keys.ZGROUP)
    if present:
        _, zattrs, attrs_err = _get_doc(store, join(path, keys.ZATTRS), look, keys.ZATTRS)
        group = _v2_group(path, zgroup, zattrs, key)
        group.error = group.error or err or attrs_err
        return group
    key = join(path, keys.ZMETA)
    present, zmeta, err = _get_doc(store, key, look, keys.ZMETA)
    if present:
        if err is not None:
            return ArrayMeta(path=path, format="zarr_v1", error=err, metadata_key=key)
        _, zattr, attrs_err = _get_doc(store, join(path, keys.ZATTR), look, keys.ZATTR)
        if attrs_err is not None:
            return ArrayMeta(path=path, format="zarr_v1", error=attrs_err, metadata_key=key)
        return zarr_v1.parse_array(path, zmeta, zattr, key)
    key = join(path, keys.META)
    meta = _v1_meta(store, key, look)
    if meta is not None:
        _, attrs, attrs_err = _get_doc(store, join(path, keys.ATTRS), look, keys.ATTRS)
        return zarr_v1.parse_spec_array(path, meta, attrs, key, attrs_err)
    return None


def _v1_meta(store: Store, key: str, look: Look) -> dict[str, Any] | None:
    """The Zarr v1 (storage spec) metadata at ``key``, or None: absent, or a file that is no
    such JSON (a store may hold a 'meta' of its own: it stays a plain file, and a big one is
    not even read). Other store errors pass through, as in _get_doc."""
    info = look.info(keys.META)
    if info is None or isinstance(info, KeyInfo) and info.size > keys.META_MAX_BYTES:
        return None
    try:
        doc = parse_json(store.get_at_most(key, keys.META_MAX_BYTES), key)
    except KeyNotFound:
        look.surprise(keys.META)
        return None
    except (TooLarge, FormatError):
        return None
    return doc if keys.is_v1_meta(doc) else None


def _probe_below_broken(h: Hierarchy, queue: deque[tuple[str, Listing | None, int]], path: str,
                        listing: Listing) -> None:
    """Queue the subdirectories of the broken node at ``path`` (its listing at hand: the
    root's) to be probed for metadata of their own, never listed: a truncated root
    zarr.json hid every array of the store, where zarr-python opens each by its own
    metadata. A broken array's chunk directories cost a few failed gets each; past
    MAX_BROKEN_CHILDREN of them the rest is left, and said."""
    names = [name for name in sorted(listing.prefixes) if not name.startswith(".")]
    if len(names) > MAX_BROKEN_CHILDREN:
        h.errors[path] = (f"{len(names)} directories below a node whose metadata is broken: "
                          f"the first {MAX_BROKEN_CHILDREN} were looked into")
    queue.extend((join(path, name), None, MAX_BARE_DEPTH) for name in names[:MAX_BROKEN_CHILDREN])


#: nodes of a remote store (S3) whose metadata keys are fetched at once by a discovery
PROBES_AT_ONCE = 16


#: what a probe read of a node's directory: its listing, the StoreError listing it raised
#: (raised again where the walk lists it), or None when the probe did not list it
_Listed = Listing | StoreError | None


def _wants_listing(node: _Node, path: str, bare: int) -> bool:
    """Whether the walk lists ``path``'s directory once its node is known: a group's or a
    bare directory's (to find children), never an array's (its chunks). The one rule for
    the walk and for the probes that list ahead of it."""
    if isinstance(node, ArrayMeta):
        return False
    if node is not None:
        return path.count("/") < MAX_PATH_DEPTH
    return bare < MAX_BARE_DEPTH


class _Probes:
    """The nodes next in a walk's queue probed by their metadata keys ahead of their turn, on
    a remote store PROBES_AT_ONCE at a time: one after the other, a group of 10,000 arrays on
    S3 was 10,000 sequential GETs (40 s on a server on 127.0.0.1) at every discovery, where
    zarr-python opens a group's members concurrently. A probe that finds a group also lists
    its directory in the same hop: the walk listed each group in turn, and 300 groups of two
    arrays each behind 20 ms took 17 s to discover, most of it 303 LISTs one after another.
    A local store is probed in turn."""

    def __init__(self, d: _Discovery, queue: deque[tuple[str, Listing | None, int]]) -> None:
        self.d = d
        self._queue = queue
        self._pool = None if d.store.local else ThreadPoolExecutor(PROBES_AT_ONCE, "zvfs-discover")
        self._ahead: dict[str, Future[tuple[_Node, _Listed]]] = {}

    def node(self, path: str) -> tuple[_Node, _Listed]:
        """The node at ``path`` (taken from the queue just now, with no listing), as
        _read_node finds it (a StoreError raised as it would be), and what a probe ahead
        read of its directory (see _Listed)."""
        if self._pool is not None:
            for p, listing, bare in itertools.islice(self._queue, PROBES_AT_ONCE):
                if listing is None and p not in self._ahead and len(self._ahead) < PROBES_AT_ONCE:
                    # the budget of values is a context variable: each probe gets its context
                    self._ahead[p] = self._pool.submit(contextvars.copy_context().run, self._probe, p, bare)
            ahead = self._ahead.pop(path, None)
            if ahead is not None:
                return ahead.result()
        return self.d.node(path, None), None

    def _probe(self, path: str, bare: int) -> tuple[_Node, _Listed]:
        node = self.d.node(path, None)
        if not _wants_listing(node, path, bare):
            return node, None
        try:
            return node, self.d.store.list_dir(path + "/")
        except StoreError as exc:
            return node, exc

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _walk(d: _Discovery, root: Listing) -> None:
    """Breadth-first over groups (and a few levels of bare directories); arrays are leaves.

    A child is identified by fetching its metadata keys, never by listing it, so
    an array's directory (full of chunk keys) is never listed.
    """
    queue: deque[tuple[str, Listing | None, int]] = deque([("", root, 0)])
    if d.before is not None and root.prefixes:
        d.prints = d.take_prints()  # before the probes' threads, which share it
    probes = _Probes(d, queue)
    try:
        _walk_queue(d.store, d.h, queue, probes)
    finally:
        probes.close()


def _walk_queue(store: Store, h: Hierarchy, queue: deque[tuple[str, Listing | None, int]],
                probes: _Probes) -> None:
    listings = 1
    while queue:
        path, listing, bare = queue.popleft()
        listed: _Listed = None
        try:
            if listing is None:
                node, listed = probes.node(path)
            else:
                node = probes.d.node(path, listing)
        except StoreError as exc:
            h.errors[path] = str(exc)
            h.incomplete = True
            continue
        if node is not None and path.count("/") >= MAX_PATH_DEPTH:
            # told once and not walked below: an array 1,000 levels down was kept (arrays
            # skipped the check) and the v2 mirror built that deep failed whole (RecursionError)
            h.add(node)
            continue
        if isinstance(node, ArrayMeta):
            h.arrays[path] = node
            if node.error is not None and listing is not None:
                _probe_below_broken(h, queue, path, listing)
            continue
        if node is not None:
            h.add(node)
        if not _wants_listing(node, path, bare):  # past MAX_BARE_DEPTH bare levels
            continue
        if listing is None:
            if listings >= MAX_LISTINGS:
                h.errors[path] = "discovery stopped: too many directories"
                return
            try:
                if isinstance(listed, StoreError):  # what the probe's listing raised
                    raise listed
                listing = listed if listed is not None else store.list_dir(path + "/")
            except KeyNotFound:
                continue
            except StoreError as exc:
                h.errors[path] = str(exc)
                h.incomplete = True
                continue
            listings += 1
        next_bare = 0 if node is not None else bare + 1
        for name in sorted(listing.prefixes):
            if node is None and name.startswith("."):
                continue  # .git, .cache, ... next to stores: not worth probing
            queue.append((join(path, name), None, next_bare))


# re-exported for callers that want to catch codec problems specifically
UnknownCodec = UnknownCodecError

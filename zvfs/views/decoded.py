"""Fills ``.zvfs/`` with the decoded views.

The hierarchy is discovered lazily, on the first lookup under ``arrays/`` or
``v2/``, in one worker hop, and kept for the metadata TTL. Each view family
turns it into nodes; :mod:`zvfs.views.root` reaches them through :func:`family`,
importing this module only when ``.zvfs/`` is first used.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from zvfs import formats
from zvfs.formats.meta import ArrayMeta
from zvfs.formats.nczarr import BY_NAME, DefinitionOrder
from zvfs.views.array_dir import ArrayDir, array_files, text_files
from zvfs.views.arrays import DecodedArray
from zvfs.views.cfattrs import nc_name
from zvfs.views.context import MountContext
from zvfs.views.netcdf import NetcdfFile, group_file_names, group_members, netcdf_file
from zvfs.views.node import DirNode, NodeError, StaticDir
from zvfs.views.v2mirror import (
    consistent_dimensions,
    consolidate,
    mirror_array_dir,
    mirror_group_files,
)
from zvfs.views.values import is_text_vlen
from zvfs.views.vectors import build_vectors_dir
from zvfs.workers import gather_batched

log = logging.getLogger("zvfs")


@dataclass
class Decoded:
    """One discovery's worth of decoded arrays and groups."""

    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> attributes
    arrays: dict[str, DecodedArray] = field(default_factory=dict)
    #: path -> NCZarr attribute types of that group (name -> dtype string)
    group_types: dict[str, dict[str, str]] = field(default_factory=dict)
    #: path -> NCZarr's definition order of that group's variables and dimensions
    group_order: dict[str, DefinitionOrder] = field(default_factory=dict)
    #: a store request failed during discovery: kept only briefly, then discovered again
    incomplete: bool = False
    #: found in consolidated metadata (one document), not by reading each node's own
    consolidated: bool = False
    #: node path -> its zarr.json as far as the views need it (node type and attributes),
    #: None for a node that has none (v2, v1): what the vectors view looks for ZV groups in
    node_docs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: when the store began to be read (what it shows is at least that new), and was read
    began: float = field(default_factory=time.monotonic)
    made: float = field(default_factory=time.monotonic)
    generation: int = field(default_factory=itertools.count().__next__)
    #: what the discovery found, and the mount's write count before it began: a later one
    #: that finds the same nodes, with no write between, is this one (_unchanged)
    source: formats.Hierarchy | None = None
    serial: int = -1
    #: when the latest discovery that found it unchanged began
    confirmed: float = 0.0
    #: the view families built from it (family), with the stable time they took: kept
    #: while it is the current one, which outlives the metadata TTL when the store is
    #: unchanged, and that time is (the mount's metadata scan may end after a first build)
    families: dict[str, tuple[DirNode, int]] = field(default_factory=dict)


#: seconds an incomplete discovery (a store request failed) is served before trying again
INCOMPLETE_TTL = 1.0


def _discover(ctx: MountContext) -> Decoded:
    """Worker-thread side: walk the metadata (never the chunks) and wrap each array."""
    out = Decoded()  # numbered and timed before the store is read: what it saw is that new
    out.serial, out.confirmed = ctx.write_serial, out.began
    # only what changed since the last discovery is read again (formats.known): every TTL a
    # store of 10,000 arrays on S3 was 10,002 GETs
    hierarchy = formats.discover(ctx.store, ctx.metadata_known or formats.Known())
    ctx.metadata_known = hierarchy.known
    last: Decoded | None = ctx.decoded_last
    if last is not None and _unchanged(last, out.serial, hierarchy):
        # the same views: rebuilding them took 0.6 of the 1.9 s of an ls past the TTL of a
        # store of 10,000 arrays, and the kernel dropped every directory it held of them
        last.confirmed = out.began
        return last
    out.incomplete = hierarchy.incomplete
    out.consolidated = hierarchy.consolidated
    for path, attrs in hierarchy.groups.items():
        out.groups[path] = dict(attrs)
    for path, group in hierarchy.group_meta.items():
        if group.error is None:
            out.node_docs[path] = _doc(group.format, "group", group.attributes)
        if group.attribute_types:
            out.group_types[path] = dict(group.attribute_types)
        if group.definition_order != BY_NAME:
            out.group_order[path] = group.definition_order
        if group.error:  # its members stay: each has metadata of its own
            _warn_node(ctx, "group", path, group.metadata_key, group.error)
    for prefix, error in hierarchy.errors.items():
        ctx.warn_once(f"discover-error {prefix}", f"discovery below {prefix or '/'}: {error}")
    # an array the discovery did not read again is the same ArrayMeta: its digests are the
    # ones taken before (made from its metadata as JSON: past the TTL, a store of 10,000
    # arrays that read nothing again spent 4 of its 5 s in them)
    before, digests = ctx.array_digests, {}
    rediscover = functools.partial(decoded, ctx)
    for path, meta in hierarchy.arrays.items():
        if meta.error:
            _warn_node(ctx, "array", path, meta.metadata_key, meta.error)
        else:
            out.node_docs[path] = _doc(meta.format, "array", meta.attributes)
        held = before.get(path)
        try:
            array = DecodedArray(ctx, meta, _opener(ctx, meta), rediscover,
                                 held[1:] if held is not None and held[0] is meta else None)
        except Exception as exc:  # noqa: BLE001 - a bug met by hostile metadata: this array only
            # one array's metadata failed the whole discovery once (a v1 order of 1e400 in
            # its digest): every view of every array was EIO
            ctx.warn_once(f"array-bug {path}", f"array {path or '/'} left out of the views "
                          f"({meta.metadata_key}): {type(exc).__name__}: {exc}")
            continue
        out.arrays[path] = array
        digests[path] = (meta, array.digest, array.layout)
    ctx.array_digests = digests
    out.made = time.monotonic()
    if not out.incomplete:
        out.source = hierarchy
        ctx.decoded_last = out
    return out


def _unchanged(last: Decoded, serial: int, found: formats.Hierarchy) -> bool:
    """Whether ``found`` is what ``last`` was built from: every node the same object (a
    discovery reuses the node of metadata keys it finds unchanged, formats.known), no
    write through the mount since, and nothing failed."""
    was = last.source
    if was is None or last.serial != serial or found.incomplete or found.consolidated != was.consolidated:
        return False
    if found.errors != was.errors or found.arrays.keys() != was.arrays.keys() \
            or found.group_meta.keys() != was.group_meta.keys():
        return False
    return all(node is was.arrays[p] for p, node in found.arrays.items()) \
        and all(node is was.group_meta[p] for p, node in found.group_meta.items())


def _doc(fmt: str, node_type: str, attributes: dict[str, Any]) -> dict[str, Any] | None:
    """A node's zarr.json as far as the vectors view reads it; None for a node of another
    format (it has no zarr.json: the discovery reads that first)."""
    if fmt != "zarr_v3":
        return None
    return {"zarr_format": 3, "node_type": node_type, "attributes": attributes}


def _warn_node(ctx: MountContext, kind: str, path: str, key: str, error: str) -> None:
    """One log line per node and mount (not per rediscovery), naming the metadata key."""
    where = key or path or "/"
    msg = error if where in error else f"{where}: {error}"
    ctx.warn_once(f"{kind}-error {path} {msg}", f"{kind} {path or '/'}: {msg}")


def _opener(ctx: MountContext, meta: ArrayMeta) -> Callable[[], formats.ZarrArray]:
    return lambda: formats.open_array(ctx.store, meta.path, meta)


async def decoded(ctx: MountContext) -> Decoded:
    """The current discovery. One that met a store failure is never kept past
    INCOMPLETE_TTL, whatever the metadata TTL: a 403 or a timeout while listing
    must not hide arrays for a minute, or forever with ``metadata_ttl=indefinite``.

    The first use of the decoded views starts the decoder processes (a local store), so
    they are up by the first chunk read, and cost nothing to a mount that never decodes."""
    if ctx.decoders is not None:
        ctx.decoders.start()
    d: Decoded = await ctx.listings.get(("decoded",), lambda: ctx.workers.run_urgent(_discover, ctx))
    if d.incomplete and time.monotonic() - d.made > INCOMPLETE_TTL:
        ctx.listings.invalidate(("decoded",))
        d = await ctx.listings.get(("decoded",), lambda: ctx.workers.run_urgent(_discover, ctx))
    if d.generation > ctx.layouts_generation:  # what files opened under older ones check
        ctx.layouts_consolidated = d.consolidated
        ctx.learn_layouts(d.generation, d.began, {p: a.layout for p, a in d.arrays.items()},
                          complete=not d.incomplete)
    if d.generation == ctx.layouts_generation:
        ctx.confirm_layouts(d.confirmed)
    return d


def _unknown(d: Decoded) -> NodeError | None:
    """What a name missing from an incomplete discovery is: EIO (the array may be there; the
    store failed), not ENOENT, for the second until it is discovered again."""
    if not d.incomplete:
        return None
    return NodeError(errno.EIO, "the store failed while the hierarchy was read (tried again "
                     "within a second)", key="decoded hierarchy")


def _superseded(ctx: MountContext, d: Decoded) -> Callable[[], bool]:
    """Whether the mount has taken a discovery newer than ``d``: a directory of the views
    built from ``d`` is then looked up again from the top of its family. The kernel keeps
    a directory's entry that a listing told it of (a walk: ls -R, find, glob) with the node
    it had, and a group's directory went on listing an array removed behind the mount,
    and not the one added, for a TTL more after the mount had read the new hierarchy."""
    generation = d.generation  # not d: an old directory the kernel holds would keep every array of it
    return lambda: ctx.layouts_generation > generation


async def build_arrays_dir(ctx: MountContext) -> DirNode:
    d = await decoded(ctx)
    root = StaticDir(mtime_ns=ctx.stable_time_ns, unknown=_unknown(d), superseded=_superseded(ctx, d))
    for path, array in sorted(d.arrays.items()):
        if not path:  # a root array: its files are the directory's own
            root.entries.update(array_files(array))
            if is_text_vlen(array.meta):
                root.entries.update(await text_files(array))
            continue
        parent, _, name = path.rpartition("/")
        # sorted: a path comes before any below it, so the name is free (its files are made
        # at the first look into it: ArrayDir)
        root.place(parent).entries[name] = ArrayDir(array, root.mtime_ns, root.unknown, root.superseded)
    return root


async def build_v2_dir(ctx: MountContext) -> DirNode:
    d = await decoded(ctx)
    mtime = ctx.stable_time_ns
    root = StaticDir(mtime_ns=mtime, unknown=_unknown(d), superseded=_superseded(ctx, d))
    for path, attrs in sorted(d.groups.items()):
        root.place(path).entries.update(mirror_group_files(attrs, mtime, d.group_types.get(path), path, ctx.warn_once))
    arrays = {p: a for p, a in d.arrays.items() if a.readable and not a.meta.error}
    # what the mirror leaves out by design is said once, at info (a bad array's error is
    # logged as the metadata is read)
    for path, array in d.arrays.items():
        if array.meta.vlen is not None and not array.meta.error and ctx.log_once.first(f"v2 vlen {path}"):
            log.info("v2 mirror: array %s left out: variable-length elements (%s) have no "
                     "uncompressed v2 form", path or "/", array.meta.vlen)
    for path in [p for p, a in arrays.items() if 0 in a.meta.shape]:
        # netCDF-C 4.9 has no form for a zero-length dimension but the unlimited one: one such
        # array failed its open of the whole mirror ("NCZarr error"); it holds no value
        del arrays[path]
        if ctx.log_once.first(f"v2 empty {path}"):
            log.info("v2 mirror: array %s left out: a zero-length dimension, which netCDF-C "
                     "cannot open", path or "/")
    # a name netCDF-C cannot hold ('a/b' looks for a group 'a', ' x') failed its open of the
    # whole mirror: such a name is the netCDF files' legal one
    dims = consistent_dimensions({p: a.meta for p, a in arrays.items()}, legal=nc_name)
    for path, array in sorted(arrays.items()):
        if path:
            parent, _, name = path.rpartition("/")
            root.place(parent).entries[name] = mirror_array_dir(array, dims=dims[path])
        else:  # a root array: the mirror's root is that array
            root_files = {k: v for k, v in root.entries.items() if k not in (".zgroup", ".zattrs")}
            return mirror_array_dir(array, root_files, dims[path])
    _groups_everywhere(root, mtime)
    await consolidate(root)
    return root


#: groups whose netCDF files are made at once (see build_netcdf_dir)
NETCDF_GROUPS_AT_ONCE = 64


async def build_netcdf_dir(ctx: MountContext) -> DirNode:
    """One classic netCDF file per group (see views.netcdf for the naming)."""
    d = await decoded(ctx)
    mtime = ctx.mount_time_ns
    root = StaticDir(mtime_ns=mtime, unknown=_unknown(d), superseded=_superseded(ctx, d))
    members = group_members(sorted(d.groups), sorted(d.arrays))
    names = group_file_names(sorted(members))

    async def file_of(group: str) -> NetcdfFile:
        arrays = {v: d.arrays[p] for v, p in members[group].items()}
        # its bytes are its arrays': a write through the mount below the group changes them
        return await netcdf_file(d.groups.get(group, {}), arrays, max(mtime, ctx.changed_at_ns(group)),
                                 d.group_types.get(group), d.group_order.get(group, BY_NAME))

    # several groups at once: a group's string arrays are read for their width (each a
    # request or more on S3), and 300 such groups one after another took 10 s behind 20 ms
    files = await gather_batched(sorted(members), file_of, NETCDF_GROUPS_AT_ONCE)
    for group, node in sorted(files.items()):
        parent, name = names[group]
        root.place(parent).entries[name] = node
    return root


def _groups_everywhere(node: StaticDir, mtime_ns: int) -> None:
    """Give every directory of the mirror that is not an array a .zgroup (v2 needs one)."""
    if ".zgroup" not in node.entries:
        node.entries.update(mirror_group_files({}, mtime_ns))
    for child in node.entries.values():
        if isinstance(child, StaticDir):
            _groups_everywhere(child, mtime_ns)


async def _vectors_or_empty(ctx: MountContext, build: Callable[..., Awaitable[DirNode | None]]) -> DirNode:
    d = await decoded(ctx)  # the ZV groups are looked for in what it read, not read again
    node = await build(ctx.store, ctx, None if d.incomplete else d.node_docs)
    return node if node is not None else StaticDir(mtime_ns=ctx.stable_time_ns)


#: the families below ``.zvfs/``, each built from one discovery (views.root makes the nodes)
BUILDERS: dict[str, Callable[[MountContext], Awaitable[DirNode]]] = {
    "arrays": lambda ctx: build_arrays_dir(ctx),
    "v2": lambda ctx: build_v2_dir(ctx),
    "netcdf": lambda ctx: build_netcdf_dir(ctx),
    "vectors": lambda ctx: _vectors_or_empty(ctx, build_vectors_dir),
}


async def family(ctx: MountContext, tag: str) -> DirNode:
    """The ``tag`` directory of the current discovery, built once per discovery and held
    by it (``Decoded.families``): an entry of the mount's cache keyed by the discovery was
    never asked for again once a new one came (every metadata TTL, every write), and the
    cache kept every old copy of the views (a helper measured 4 MB per rediscovery of 400
    arrays, 60 -> 315 MB in 62). The cache's entry only makes one build of those asking
    at once."""
    d = await decoded(ctx)
    held = d.families.get(tag)
    if held is not None and held[1] == ctx.stable_time_ns:
        return held[0]
    key = ("lazy", tag)  # one build for every asker at once
    building = ctx.listings.peek(key)
    if building is not None and building[0] != d.generation:
        ctx.listings.invalidate(key)  # an older discovery's: let it go

    async def build() -> tuple[int, DirNode, int]:
        stable = ctx.stable_time_ns
        return d.generation, await BUILDERS[tag](ctx), stable

    generation, node, stable = await ctx.listings.get(key, build)
    if generation != d.generation:  # joined a build of the discovery before a write's: once more
        ctx.listings.invalidate(key)
        generation, node, stable = await ctx.listings.get(key, build)
    if generation == d.generation:
        d.families[tag] = (node, stable)
        ctx.listings.invalidate(key)
    return node

"""MOUNTPOINT/.zvfs/vectors: decoded Zarr Vectors geometry as npy, PLY, TrackVis and SWC files.

``build_vectors_dir(store, ctx)`` finds the ZV groups of a store and returns the
directory tree (None when there is none); its nodes share the mount's context
(chunk cache, mtime, log-once). A ZV group at the store root puts its
levels directly below ``vectors/``; a deeper group gets them below its path.
Level directories are built lazily, one worker hop each, and their sizes come
from metadata and fragment indexes; file contents are decoded on first read.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from zvfs.formats import zv
from zvfs.stores.base import Store, is_store_failure
from zvfs.views.context import MountContext
from zvfs.views.node import DirNode, Node, StaticDir
from zvfs.views.vectors.level import level_dir
from zvfs.views.vectors.nodes import ErrorDir, blocking

__all__ = ["build_vectors_dir", "build_vectors_dir_blocking_parts"]

_tokens = itertools.count()


def build_vectors_dir_blocking_parts(store: Store, known: Mapping[str, dict[str, Any] | None] | None = None
                                     ) -> list[tuple[str, zv.ZVGroup | Exception]]:
    """Find the ZV groups (blocking): (path, group or the error opening it). ``known``: the
    zarr.json of the nodes a discovery read (see zv.find_groups)."""
    out: list[tuple[str, zv.ZVGroup | Exception]] = []
    for path in zv.find_groups(store, known=known):
        try:
            group = zv.open_group(store, path)
        except zv.ZVError as exc:
            if is_store_failure(exc):
                raise  # may pass: the vectors directory is not kept, rather than an ErrorDir
            out.append((path, exc))
            continue
        if group is not None:
            out.append((path, group))
    return out


def _group_dir(ctx: MountContext, token: int, path: str, group: zv.ZVGroup | Exception) -> DirNode:
    if isinstance(group, Exception):
        return ErrorDir(ctx, f"{path or '/'}zarr.json", group)
    entries: dict[str, Node] = {}
    for name in group.level_names:
        entries[name] = level_dir(ctx, ("zv", token, path, name), group, name)
    return StaticDir(entries, mtime_ns=ctx.stable_time_ns)


async def build_vectors_dir(store: Store, ctx: MountContext,
                            known: Mapping[str, dict[str, Any] | None] | None = None) -> DirNode | None:
    """The ``vectors`` directory for ``store``, or None when it holds no ZV group; ``known``:
    the zarr.json of the nodes a discovery read, which are not read again."""
    found = await blocking(ctx, "finding ZV groups", build_vectors_dir_blocking_parts, store, known)
    if not found:
        return None
    token = next(_tokens)
    if len(found) == 1 and found[0][0] == "":
        return _group_dir(ctx, token, "", found[0][1])
    root = StaticDir(mtime_ns=ctx.stable_time_ns)
    for path, group in found:
        parent, _, name = path.rpartition("/")
        root.place(parent).entries[name] = _group_dir(ctx, token, path, group)
    return root

"""MOUNTPOINT/.zvfs/vectors: decoded Zarr Vectors geometry as npy, PLY, TrackVis and SWC files.

``build_vectors_dir(store, ctx)`` finds the ZV groups of a store and returns the
directory tree (None when there is none). A ZV group at the store root puts its
levels directly below ``vectors/``; a deeper group gets them below its path.
Level directories are built lazily, one worker hop each, and their sizes come
from metadata and fragment indexes; file contents are decoded on first read.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from zvfs.cache import Cache
from zvfs.formats import zv
from zvfs.stores.base import Store
from zvfs.views.node import DirNode, Node, StaticDir
from zvfs.views.vectors.level import level_dir
from zvfs.views.vectors.nodes import Env, ErrorDir

__all__ = ["build_vectors_dir", "build_vectors_dir_blocking_parts"]

_tokens = itertools.count()


def _env(ctx: Any) -> Env:
    """Accept a MountContext (shared cache, mount time), a bare Cache, or nothing."""
    cache = getattr(ctx, "chunks", None)
    if not isinstance(cache, Cache):
        cache = ctx if isinstance(ctx, Cache) else Cache(max_bytes=256 << 20)
    mtime = float(getattr(ctx, "stable_time", time.time()))
    return Env(cache, mtime, bool(getattr(ctx, "immutable", False)))


def build_vectors_dir_blocking_parts(store: Store) -> list[tuple[str, zv.ZVGroup | Exception]]:
    """Find the ZV groups (blocking): (path, group or the error opening it)."""
    out: list[tuple[str, zv.ZVGroup | Exception]] = []
    for path in zv.find_groups(store):
        try:
            group = zv.open_group(store, path)
        except zv.ZVError as exc:
            out.append((path, exc))
            continue
        if group is not None:
            out.append((path, group))
    return out


def _group_dir(env: Env, token: int, path: str, group: zv.ZVGroup | Exception) -> DirNode:
    if isinstance(group, Exception):
        return ErrorDir(env, f"{path or '/'}zarr.json", group)
    entries: dict[str, Node] = {}
    for name in group.level_names:
        entries[name] = level_dir(env, ("zv", token, path, name), group, name)
    return StaticDir(entries, mtime=env.mtime)


async def build_vectors_dir(store: Store, stats_or_cache: Any = None) -> DirNode | None:
    """The ``vectors`` directory for ``store``, or None when it holds no ZV group."""
    env = _env(stats_or_cache)
    found = await env.blocking("finding ZV groups", build_vectors_dir_blocking_parts, store)
    if not found:
        return None
    token = next(_tokens)
    if len(found) == 1 and found[0][0] == "":
        return _group_dir(env, token, "", found[0][1])
    root = StaticDir(mtime=env.mtime)
    for path, group in found:
        parent = root
        parts = path.split("/")
        for seg in parts[:-1]:
            nxt = parent.entries.get(seg)
            if not isinstance(nxt, StaticDir):
                nxt = StaticDir(mtime=env.mtime)
                parent.entries[seg] = nxt
            parent = nxt
        parent.entries[parts[-1]] = _group_dir(env, token, path, group)
    return root

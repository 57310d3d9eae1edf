"""The mount root: the raw tree plus the reserved ``.zvfs`` control directory.

Like ZFS's ``.zfs``, ``.zvfs`` is left out of the root listing (so ``cp -r``,
``rsync`` and ``gsutil`` never copy it) but answers lookups by path.

The decoded families under it (``arrays``, ``v2``, ``netcdf``, ``vectors``) are
:class:`DecodedDir` nodes that import :mod:`zvfs.views.decoded` (and with it
numpy, the codecs and the formats) on first use, in a worker thread: the mount
answers without those imports, which were half of its start-up time. The daemon
warms them in the background as soon as the mount answers.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from importlib import import_module
from types import ModuleType

from zvfs.views.context import MountContext
from zvfs.views.node import DirNode, FileHandle, FileNode, Node, NodeError, StaticDir
from zvfs.views.raw import RawDir, RawDirHolder

CONTROL_NAME = ".zvfs"
DECODED_MODULE = "zvfs.views.decoded"
DECODED_FAMILIES = ("arrays", "v2", "netcdf", "vectors")


_decoded_views: list[ModuleType] = []


async def load_decoded_views(ctx: MountContext) -> ModuleType:
    """The decoded views' module, imported off the trio thread. Not sys.modules: a module
    another thread is still importing is there half-made; import_module waits for it."""
    if not _decoded_views:
        _decoded_views.append(await ctx.workers.run_urgent(import_module, DECODED_MODULE))
    return _decoded_views[0]


class DecodedDir(DirNode):
    """One decoded family: built from the current discovery on first use, rebuilt after the TTL."""

    def __init__(self, ctx: MountContext, tag: str) -> None:
        self.ctx = ctx
        self.tag = tag
        self.mtime_ns = ctx.stable_time_ns

    async def _target(self) -> DirNode:
        return await (await load_decoded_views(self.ctx)).family(self.ctx, self.tag)

    async def lookup(self, name: str) -> Node | None:
        return await (await self._target()).lookup(name)

    async def children(self) -> Sequence[tuple[str, Node]]:
        return await (await self._target()).children()


class MountRoot(RawDirHolder):
    """The raw root plus ``.zvfs``; writes go to the raw root, and never touch ``.zvfs``."""

    def __init__(self, ctx: MountContext, control: StaticDir | None) -> None:
        self.ctx = ctx
        self.raw = RawDir(ctx, "")
        self.control = control
        self.writable = ctx.writable
        if control is not None:
            control.hidden = ctx.decoded != "visible"

    @property
    def mtime_ns(self) -> int:  # type: ignore[override]
        """The raw root's (RawDir.mtime_ns): the store's newest metadata mtime as it is now, or
        the last change through the mount when later."""
        return self.raw.mtime_ns

    async def lookup(self, name: str) -> Node | None:
        if name == CONTROL_NAME and self.control is not None:
            return self.control
        return await self.raw.lookup(name)

    async def children(self) -> Sequence[tuple[str, Node]]:
        if self.control is None:
            return await self.raw.children()
        # it hides the store's own .zvfs, which decoded=off shows
        return await self.raw.entries({CONTROL_NAME: None if self.control.hidden else self.control})

    def _plain(self, name: str) -> None:
        if name == CONTROL_NAME and self.control is not None:
            # the mount's own name: an answer (logged at info), not a failure of the store
            raise NodeError(errno.EPERM if self.writable else errno.EROFS, answer=True)

    async def create(self, name: str, exclusive: bool, truncate: bool = True) -> tuple[FileNode, FileHandle]:
        self._plain(name)
        return await self.raw.create(name, exclusive, truncate)

    async def mkdir(self, name: str) -> DirNode:
        self._plain(name)
        return await self.raw.mkdir(name)

    async def unlink(self, name: str) -> None:
        self._plain(name)
        await self.raw.unlink(name)

    async def rmdir(self, name: str) -> None:
        self._plain(name)
        await self.raw.rmdir(name)

    async def rename(self, name: str, target: DirNode, new_name: str, replace: bool) -> None:
        self._plain(name)  # new_name: the raw directory's rename asks its target
        await self.raw.rename(name, target, new_name, replace)

    async def link(self, node: FileNode, name: str) -> FileNode:
        self._plain(name)
        return await self.raw.link(node, name)

    async def set_mtime_ns(self, mtime_ns: int) -> None:
        await self.raw.set_mtime_ns(mtime_ns)

    async def sync(self) -> None:
        await self.raw.sync()


def build_root(ctx: MountContext) -> MountRoot:
    """The root node, with ``.zvfs`` (stats.json and the decoded families) unless decoded=off."""
    control = None if ctx.decoded == "off" else StaticDir(mtime_ns=ctx.stable_time_ns)
    if control is not None:
        from zvfs.views.stats import StatsFile

        control.entries["stats.json"] = StatsFile(ctx)
        for tag in DECODED_FAMILIES:
            control.entries[tag] = DecodedDir(ctx, tag)
    return MountRoot(ctx, control)

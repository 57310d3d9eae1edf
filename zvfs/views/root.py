"""The mount root: the raw tree plus the reserved ``.zvfs`` control directory.

Like ZFS's ``.zfs``, ``.zvfs`` is left out of the root listing (so ``cp -r``,
``rsync`` and ``gsutil`` never copy it) but answers lookups by path. The
decoded views register themselves as its children.
"""

from __future__ import annotations

from collections.abc import Sequence

from zvfs.views.context import MountContext
from zvfs.views.node import DirNode, Node, StaticDir
from zvfs.views.raw import RawDir

CONTROL_NAME = ".zvfs"


class MountRoot(DirNode):
    def __init__(self, ctx: MountContext, control: StaticDir | None) -> None:
        self.ctx = ctx
        self.raw = RawDir(ctx, "")
        self.control = control
        self.mtime = ctx.stable_time
        if control is not None:
            control.hidden = ctx.decoded != "visible"

    async def lookup(self, name: str) -> Node | None:
        if name == CONTROL_NAME and self.control is not None:
            return self.control
        return await self.raw.lookup(name)

    async def children(self) -> Sequence[tuple[str, Node]]:
        entries = [(n, c) for n, c in await self.raw.children() if n != CONTROL_NAME]
        if self.control is not None and not self.control.hidden:
            entries.append((CONTROL_NAME, self.control))
            entries.sort(key=lambda e: e[0])
        return entries


def build_root(ctx: MountContext) -> MountRoot:
    """The root node; ``.zvfs`` is an empty directory until decoded views are added to it."""
    control = None if ctx.decoded == "off" else StaticDir(mtime=ctx.stable_time)
    if control is not None:
        from zvfs.views.stats import StatsFile

        control.entries["stats.json"] = StatsFile(ctx)
    return MountRoot(ctx, control)

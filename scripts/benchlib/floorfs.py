"""The least a pyfuse3 daemon can do to serve a zip's files: the floor of the zip rows.

  floorfs.py ZIP MOUNTPOINT [--busy-poll SECONDS]

Every member is read into memory before the mount, and each request is answered from a
dict: no store, cache, view, worker thread or page push; one coroutine a request, as zvfs's
handlers are. It is built as zvfs is (pyfuse3 on trio, entries and attributes kept 60 s,
keep_cache at every open), so its files a second bound what any daemon so built can
reach on this machine: whatever zvfs does above it is zvfs's own Python, and what a peer
does beyond it needs another core than pyfuse3 on trio. ``--busy-poll`` installs zvfs's
wait for the next request (zvfs.fs.loop), as a zvfs mount does by default.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import zipfile

import pyfuse3
import trio

ROOT = pyfuse3.ROOT_INODE
TTL = 60.0


class FloorFS(pyfuse3.Operations):
    """A read-only tree of a zip's members, held in memory."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.children: dict[int, dict[bytes, int]] = {ROOT: {}}
        self.attrs: dict[int, pyfuse3.EntryAttributes] = {ROOT: self._attr(ROOT, True)}
        self.data: dict[int, bytes] = {}
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                *dirs, name = info.filename.rstrip("/").split("/")
                parent = ROOT
                for d in dirs:
                    parent = self._node(parent, d.encode(), True)
                if info.is_dir():
                    self._node(parent, name.encode(), True)
                else:
                    ino = self._node(parent, name.encode(), False)
                    self.data[ino] = z.read(info)
                    self.attrs[ino].st_size = info.file_size

    def _node(self, parent: int, name: bytes, is_dir: bool) -> int:
        ino = self.children[parent].get(name)
        if ino is None:
            ino = len(self.attrs) + ROOT
            self.children[parent][name] = ino
            self.attrs[ino] = self._attr(ino, is_dir)
            if is_dir:
                self.children[ino] = {}
        return ino

    @staticmethod
    def _attr(ino: int, is_dir: bool) -> pyfuse3.EntryAttributes:
        """A node's entry, size 0 (a member's is set once it is read)."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = (stat.S_IFDIR | 0o755) if is_dir else (stat.S_IFREG | 0o644)
        a.st_nlink = 2 if is_dir else 1
        a.st_blksize = 4096
        a.entry_timeout = a.attr_timeout = TTL
        return a

    async def lookup(self, parent_inode, name, ctx=None):  # noqa: ANN001, ANN201 - pyfuse3's signature
        ino = self.children.get(parent_inode, {}).get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.attrs[ino]

    async def getattr(self, inode, ctx=None):  # noqa: ANN001, ANN201
        return self.attrs[inode]

    async def opendir(self, inode, ctx):  # noqa: ANN001, ANN201
        return inode

    async def readdir(self, fh, start_id, token):  # noqa: ANN001, ANN201
        for i, (name, ino) in enumerate(self.children[fh].items()):
            if i >= start_id and not pyfuse3.readdir_reply(token, name, self.attrs[ino], i + 1):
                return

    async def open(self, inode, flags, ctx):  # noqa: ANN001, ANN201
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh, off, size):  # noqa: ANN001, ANN201
        return self.data[fh][off:off + size]

    async def release(self, fh):  # noqa: ANN001, ANN201
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("zip")
    ap.add_argument("mountpoint")
    ap.add_argument("--busy-poll", type=float, default=0.0,
                    help="seconds to poll for the next request before sleeping (zvfs's wait)")
    args = ap.parse_args()
    ops = FloorFS(args.zip)
    options = set(pyfuse3.default_options) | {"fsname=zvfs-floor", "ro", "noatime"}
    pyfuse3.init(ops, args.mountpoint, options)

    async def serve() -> None:
        if args.busy_poll > 0:
            from zvfs.fs.loop import install

            if install(busy_poll=args.busy_poll) is None:
                raise SystemExit("floorfs: zvfs's wait could not be installed")
        await pyfuse3.main()

    try:
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=os.path.ismount(args.mountpoint))


if __name__ == "__main__":
    main()

"""zvfs's own handlers, called in process in the order a reader's requests come: the part
of a FUSE workload that is zvfs's Python, with neither the kernel nor the wake-ups.

Through the mount the zip's small-member row varied threefold from one round to the next
on a shared host (sixty-fourth session); the handlers' CPU, by 5-20%. So a change
to the request path is measured here first (scripts/files-floor --handlers), then through
the mount. The daemon's context, root and operations are built as zvfs.daemon builds them,
from the default options; the kernel's page push is a stand-in that accepts every push, as
the kernel does for a file it has no pages of.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HANDLERS = ("lookup", "open", "read", "release")


class AcceptingPages:
    """The page push (zvfs.fs.push.PagePush) as the kernel answers it for an inode whose
    pages it does not have: accepted."""

    def __init__(self) -> None:
        self.pushed = 0

    def push(self, inode: int, data: bytes | memoryview) -> bool:
        self.pushed += 1
        return True


@dataclass
class HandlerTimes:
    """One pass: CPU-seconds of the handlers on the calling (trio) thread, each kind apart;
    wall seconds of the pass; CPU-seconds of the process (the worker threads too)."""

    files: int
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HANDLERS, 0.0))
    wall: float = 0.0
    process_cpu: float = 0.0
    reads: int = 0
    pushed: int = 0

    def per_file_us(self, seconds: float) -> float:
        return seconds / self.files * 1e6


def _daemon_parts(source: str):  # noqa: ANN202 - (ctx, ops), imported late: zvfs is the code measured
    from zvfs.daemon import build_context, tune_process
    from zvfs.fs.operations import ZvfsOperations
    from zvfs.options import add_arguments, resolve
    from zvfs.stats import Counters
    from zvfs.stores.opener import open_store
    from zvfs.stores.url import parse_source
    from zvfs.views.root import CONTROL_NAME, build_root

    tune_process()  # as the daemon: how soon a worker gets the GIL back counts
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = resolve(parser.parse_args([]))
    counters = Counters()
    store = open_store(parse_source(source), counters=counters)
    ctx = build_context(store, opts, counters)
    ops = ZvfsOperations(build_root(ctx), ctx, derived=[f"/{CONTROL_NAME}/"])
    return ctx, ops


def time_handlers(source: str, files: Sequence[str]) -> HandlerTimes:
    """Look up, open, read (unless the open pushed the file) and release each of ``files``
    (paths relative to the store, in the reader's order) once, through a fresh context."""
    import pyfuse3
    import trio

    ctx, ops = _daemon_parts(source)
    pages = ops.pages = AcceptingPages()
    out = HandlerTimes(len(files))
    cpu = time.thread_time

    async def timed(kind: str, call):  # noqa: ANN001, ANN202
        t = cpu()
        result = await call
        out.cpu[kind] += cpu() - t
        return result

    async def run() -> None:
        inodes = {"": pyfuse3.ROOT_INODE}
        async with trio.open_nursery() as nursery:
            ctx.nursery = nursery
            wall, process = time.perf_counter(), time.process_time()
            for path in files:
                parent = ""
                for name in path.split("/"):
                    here = f"{parent}/{name}" if parent else name
                    if here not in inodes:
                        entry = await timed("lookup", ops.lookup(inodes[parent], os.fsencode(name)))
                        inodes[here] = entry.st_ino
                    parent = here
                before = pages.pushed
                fi = await timed("open", ops.open(inodes[path], os.O_RDONLY, None))
                if pages.pushed == before:  # the kernel would read it
                    off = 0
                    while data := await timed("read", ops.read(fi.fh, off, 128 << 10)):
                        off += len(data)
                        out.reads += 1
                await timed("release", ops.release(fi.fh))
                await trio.sleep(0)  # the kernel's next request comes after a wake-up
            out.wall = time.perf_counter() - wall
            out.process_cpu = time.process_time() - process
            nursery.cancel_scope.cancel()

    trio.run(run)
    out.pushed = pages.pushed
    return out


def time_in_child(repo: Path, source: Path, files: Sequence[str]) -> HandlerTimes:
    """One pass of time_handlers in a fresh process, importing ``repo``'s zvfs."""
    from benchlib.systems import with_repo  # the parent's import: the child runs this file alone

    proc = subprocess.run([sys.executable, __file__, str(source)], input="\n".join(files),
                          env=with_repo(dict(os.environ), repo), capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the handler pass of {repo} failed:\n{proc.stderr[-3000:]}")
    return HandlerTimes(**json.loads(proc.stdout.splitlines()[-1]))


def report(passes: dict[str, list[HandlerTimes]], source: Path) -> str:
    """Per checkout, its median pass (by handler CPU): µs a file for each handler."""
    def total(p: HandlerTimes) -> float:
        return sum(p.cpu.values())

    mids = {name: sorted(ps, key=total)[len(ps) // 2] for name, ps in passes.items()}

    def row(label: str, cell: Callable[[HandlerTimes], str]) -> str:
        return f"| {label} | " + " | ".join(cell(m) for m in mids.values()) + " |"

    def us(seconds: Callable[[HandlerTimes], float]) -> Callable[[HandlerTimes], str]:
        return lambda m: f"{m.per_file_us(seconds(m)):.1f}"

    first = next(iter(mids.values()))
    lines = [f"zvfs's handlers in process, {first.files:,} files of {source.name} in tree "
             f"order: CPU µs a file on the trio thread, the median pass by their sum", "",
             "| handler | " + " | ".join(mids) + " |", "|---" * (len(mids) + 1) + "|"]
    lines += [row(k, us(lambda m, k=k: m.cpu[k])) for k in HANDLERS]
    lines += [row("all", us(total)), row("wall", us(lambda m: m.wall)),
              row("process CPU (workers too)", us(lambda m: m.process_cpu)),
              row("reads", lambda m: f"{m.reads:,}"), row("opens pushed", lambda m: f"{m.pushed:,}"), ""]
    lines += [f"- {name}, every pass (handler CPU µs a file): "
              + ", ".join(f"{p.per_file_us(total(p)):.1f}" for p in ps) for name, ps in passes.items()]
    return "\n".join(lines)


if __name__ == "__main__":  # one pass: SOURCE, the files on stdin; its times as JSON
    times = time_handlers(sys.argv[1], sys.stdin.read().splitlines())
    print(json.dumps(times.__dict__))

"""The console scripts' entry points (``zvfs``, ``mount.zvfs``, ``python -m zvfs``).

They exist so a mount's start-up read-ahead (:mod:`zvfs.warmup`) begins before the CLI
and everything after it is imported, not after: those imports are what it speeds up.
"""

from __future__ import annotations

import os
import sys

# zvfs does no linear algebra, but numpy's OpenBLAS starts a thread per core when numpy
# is first imported (during a mount's first decoded read) and that thread spins for a
# while before it sleeps: on 2 cores it took a tenth of the daemon's CPU during a cold
# read. Set before anything imports numpy; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from zvfs import earlystop, warmup  # noqa: E402

#: the commands of ``zvfs``; anything else first, with two operands, is mount.fuse's call
_COMMANDS = ("mount", "unmount", "umount", "status")


def _called_by_mount_fuse(args: list[str]) -> bool:
    """Whether ``zvfs`` was run as ``zvfs SOURCE MOUNTPOINT [-o OPTS]``: how mount.fuse (the
    helper of ``mount -t fuse.zvfs``, an fstab line of that type, and every ``mount -o
    remount`` of a zvfs mount, whose type the mount table gives as fuse.zvfs) runs the
    program named by the type. It failed as "invalid choice" of COMMAND."""
    if not args or args[0] in _COMMANDS or args[0].startswith("-"):
        return False
    operands = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-o")]
    return len(operands) == 2 and ("-o" in args or os.path.isdir(operands[1]))


def _std_streams() -> None:
    """Give a closed stdin, stdout or stderr /dev/null (``zvfs mount ... >&- 2>&-``): Python
    then sets sys.stdout to None, and the mount died on its flush (status 1, nothing
    mounted); a pipe opened later would also take descriptor 0 or 1, which the daemon
    points at /dev/null when it detaches."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            got = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
            if got != fd:
                os.dup2(got, fd)
                os.close(got)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 - lives as long as the process


def main() -> int:
    _std_streams()
    if _called_by_mount_fuse(sys.argv[1:]):
        return mount_helper_main()
    if sys.argv[1:2] == ["mount"]:
        earlystop.watch()
        warmup.start()
    from zvfs.cli import main as cli_main

    return cli_main()


def mount_helper_main() -> int:
    _std_streams()
    earlystop.watch()
    if "-N" not in sys.argv[1:]:  # entering a mount namespace needs a single thread
        warmup.start()
    from zvfs.cli import mount_helper_main as helper

    return helper()

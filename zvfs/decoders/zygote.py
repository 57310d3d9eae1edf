"""The decoder processes' parent: imports what they need once, then forks each one.

A decoder process that starts as a fresh interpreter imports numpy, the codecs and the
formats: about 0.15 s of CPU each, more with a cold page cache. Three of them starting
when a mount's first decoded read starts took that CPU from the read itself (a cold
`cat data.raw` of the bench's array went from 0.26 to 0.43 s). The daemon starts this one
process as it mounts instead; it imports while the daemon mounts, on the other CPU, and a
decoder forked from it later is ready in a millisecond, with those pages shared.

It is single-threaded when it forks, so a fork is safe. It talks to the daemon over a
SOCK_SEQPACKET socket: ("ready", pid) goes once its imports are done, ("spawn", spec)
comes with a new process's two pipe ends (SCM_RIGHTS), and ("exited", pid, code) goes
back when one of them ends, the code as ``Popen.returncode``
gives it (negative: the signal), so the daemon can tell a crash from a kill. It ends
when the daemon closes the socket (or dies: then the kernel signals it), after its
processes have ended.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from zvfs.decoders.child import die_with_parent
from zvfs.decoders.wire import MAX_MESSAGE, decode, encode

#: seconds the zygote waits for its processes to end once the daemon is gone
EXIT_WAIT = 2.0
#: the nice value of the zygote's imports (see _preload_niced)
PRELOAD_NICE = 10


def _preload() -> None:
    """What every decoder needs, imported before the first fork (shared by them all)."""
    import numpy  # noqa: F401
    from numcodecs import blosc  # noqa: F401

    import zvfs.codecs.sharding  # noqa: F401
    import zvfs.codecs.v2  # noqa: F401
    import zvfs.codecs.v3  # noqa: F401
    import zvfs.formats.api  # noqa: F401
    import zvfs.stores.counting  # noqa: F401
    import zvfs.stores.directory  # noqa: F401
    import zvfs.stores.zip  # noqa: F401


def _preload_niced() -> None:
    """:func:`_preload` in a thread of lower priority (nice applies to one thread on Linux,
    and anyone may raise it): the imports take a CPU nobody else wants, as the daemon
    mounts, but yield it to readers of a mount just made (a raw reader's requests, which
    the daemon answers by busy polling, came late while this imported at full priority).
    The processes are forked from the main thread, at its priority."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PRELOAD_NICE)
        except OSError:
            pass
        try:
            _preload()
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            errors.append(exc)

    t = threading.Thread(target=run, name="preload")
    t.start()
    t.join()
    if errors:
        raise errors[0]


def main(argv: list[str]) -> int:
    """``zygote CTL_FD ARENA_FD ARENA_BYTES``."""
    die_with_parent()
    ctl = socket.socket(fileno=int(argv[0]))
    arena_fd, nbytes = int(argv[1]), int(argv[2])
    _preload_niced()
    _send(ctl, ("ready", os.getpid()))
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready, _, _ = select.select([ctl, *children], [], [])
        for fd in ready:
            if fd is ctl:
                continue
            pid = children.pop(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            _send(ctl, ("exited", pid, os.waitstatus_to_exitcode(status)))
        if ctl not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, MAX_MESSAGE, 2)
        except ConnectionResetError:
            data, fds = b"", []
        if not data:  # the daemon is done
            break
        _, spec = decode(data)
        inp, out = fds
        pid = os.fork()
        if pid == 0:  # the decoder: nothing of the zygote's but its pipes and the arena
            code = 1
            try:
                ctl.close()
                for fd in children:
                    os.close(fd)
                from zvfs.decoders.child import serve

                code = serve(inp, out, arena_fd, nbytes, spec)
            except BaseException:  # noqa: BLE001 - shown, then this process ends
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(inp)
        os.close(out)
        children[os.pidfd_open(pid)] = pid
    _end(children)
    return 0


def _send(ctl: socket.socket, message: tuple[object, ...]) -> None:
    try:
        ctl.send(encode(message))  # a packet is a message: no length before it
    except OSError:  # the daemon is gone: nobody to tell
        pass


def _end(children: dict[int, int]) -> None:
    """Wait for the processes (their input ends with the daemon's), then kill what is
    left, each by its own pid."""
    deadline = time.monotonic() + EXIT_WAIT
    while children and (left := deadline - time.monotonic()) > 0:
        for fd in select.select(list(children), [], [], left)[0]:
            os.waitpid(children.pop(fd), 0)
            os.close(fd)
    for fd, pid in children.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

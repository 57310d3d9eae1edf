"""Start-up read-ahead: the files a mount imports, read from disk together rather than
one import at a time.

Before a mount answers, the interpreter imports some 300 modules (trio and pyfuse3 are
most of them). With a cold page cache each one is a disk read, and the reads come one
after another. So the files the last start had imported when its mount answered are
listed in a manifest under the user's cache directory; the next ``zvfs mount`` hands them
to ``posix_fadvise(WILLNEED)`` from a thread at once (the kernel starts every read and
returns; the calls release the GIL), and its imports then find them in memory. The
manifest is rewritten when the list changes. Any failure is ignored: this only saves time.
"""

from __future__ import annotations

import os
import sys
import threading
import zlib

from zvfs.pagecache import read_ahead_and_close


def manifest_path() -> str | None:
    """Where this interpreter's manifest lives, or None without a cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None
    # one per environment and per copy of zvfs in it: two checkouts run in turn (a
    # worktree's tests, then an install's mounts) each keep their own list, rather than
    # each start reading the other's files and writing its own list back
    where = f"{sys.prefix}\0{os.path.dirname(os.path.abspath(__file__))}"
    tag = f"{sys.implementation.cache_tag}-{zlib.crc32(where.encode()):08x}"
    return os.path.join(base, "zvfs", f"startup-{tag}.txt")


#: the manifest as this process's start read it (a forked daemon inherits it)
_read: list[str] | None = None
#: held while :func:`record` writes; :func:`finish` takes it so that a daemon exiting just
#: after its mount answered does not cut a write short and leave its temporary file
_writing = threading.Lock()
#: set by :func:`finish`: no write starts after it
_finished = False


def start() -> threading.Thread | None:
    """Ask the kernel for the files of the manifest, in a thread; None when there is none."""
    global _read
    if os.environ.get("ZVFS_NO_WARMUP"):
        return None
    path = manifest_path()
    try:
        with open(path or "", encoding="utf-8") as f:
            files = f.read().splitlines()
    except (OSError, ValueError):
        return None
    _read = files
    thread = threading.Thread(target=_advise, args=(files,), name="zvfs-warmup", daemon=True)
    thread.start()
    return thread


def _advise(files: list[str]) -> None:
    for name in files:
        try:
            # O_NONBLOCK: a name that became a FIFO must not hold the thread
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, ValueError):
            continue
        read_ahead_and_close(fd)


def imported_files() -> list[str]:
    """The source and bytecode files of every module imported so far (cheap: no I/O)."""
    out: set[str] = set()
    for module in list(sys.modules.values()):
        for name in (getattr(module, "__file__", None), getattr(module, "__cached__", None)):
            if isinstance(name, str) and os.path.isabs(name):
                out.add(name)
    return sorted(out)


def unchanged(files: list[str]) -> bool:
    """True when ``files`` is what this process's start read: nothing to record, and
    nothing to check on disk."""
    return files == _read


def record(files: list[str]) -> None:
    """Write ``files`` (those that exist) as the manifest, unless it already says that."""
    path = manifest_path()
    if path is None:
        return
    text = "".join(f"{name}\n" for name in files if os.path.isfile(name))
    with _writing:
        if not _finished:
            _write(path, text)


def _write(path: str, text: str) -> None:
    """``text`` as the manifest at ``path``, through a temporary file, unless it is that."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        _sweep(path)
    except OSError:
        pass


def finish(timeout: float = 1.0) -> None:
    """Before the process exits: wait up to ``timeout`` for a manifest being written (in a
    worker thread, which the exit would otherwise stop half way, leaving its temporary
    file), and let no write start after."""
    global _finished
    if _writing.acquire(timeout=timeout):
        _finished = True
        _writing.release()


def _sweep(path: str) -> None:
    """Remove what earlier starts left in the manifests' directory: the temporary manifests
    (``path.<pid>``) of starts killed while writing theirs, and the manifests of copies of
    zvfs that are gone. Each copy (a checkout, an environment) keeps a manifest of its own,
    so every clone a CI job or a test run mounted from left one behind for ever."""
    directory, base = os.path.split(path)
    for name in os.listdir(directory):
        full = os.path.join(directory, name)
        pid = name[len(base) + 1:]
        if name.startswith(base + ".") and pid.isdigit():
            gone = not os.path.exists(f"/proc/{pid}")
        else:
            gone = (full != path and name.startswith("startup-") and name.endswith(".txt")
                    and _orphaned(full))
        if gone:
            try:
                os.unlink(full)
            except OSError:
                pass  # another start swept it first


def _orphaned(manifest: str) -> bool:
    """Whether ``manifest`` belongs to a copy of zvfs that is gone: it lists that copy's
    package, and the package's ``__init__.py`` is no longer there. A manifest that names
    no package (or cannot be read) is kept: it is not known to be stale."""
    try:
        with open(manifest, encoding="utf-8") as f:
            for line in f:
                name = line.rstrip("\n")
                if name.endswith(_PACKAGE_INIT):
                    return not os.path.exists(name)
    except (OSError, ValueError):
        pass
    return False


#: how a manifest names its copy's package (any start imports zvfs/__init__.py)
_PACKAGE_INIT = f"{os.sep}zvfs{os.sep}__init__.py"

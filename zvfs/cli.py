"""Command line: ``zvfs mount``, ``zvfs unmount`` and the ``mount.zvfs`` helper for mount(8).

``zvfs mount`` daemonizes by starting itself again with ``-f`` in a new
session and waiting on a pipe: it returns 0 only once the mount answers a
``stat``, and otherwise prints the child's one-line reason and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import select
import shutil
import subprocess
import sys
import time
from typing import Any

from zvfs import options as zopts
from zvfs.mounts import is_mounted

log = logging.getLogger("zvfs")

READY_TIMEOUT = 120.0
EXIT_USAGE = 2
EXIT_FAIL = 1


class CliError(Exception):
    """A user-facing error: printed as 'zvfs: error: ...', exit status 1."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zvfs",
        description="Mount a Zarr store (directory, .zip, S3) as a read-only file system, "
        "with decoded arrays under MOUNTPOINT/.zvfs/.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    m = sub.add_parser("mount", help="mount SOURCE at MOUNTPOINT",
                       description="SOURCE: a directory, a .zip file, s3://bucket[/prefix], "
                       "file:///path#mode=zarr,file, file:///path.zip#mode=nczarr,zip, "
                       "https://s3.REGION.amazonaws.com/bucket/prefix or "
                       "https://bucket.s3.REGION.amazonaws.com/prefix")
    m.add_argument("source")
    m.add_argument("mountpoint")
    m.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground (for systemd and debugging)")
    m.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    zopts.add_arguments(m)
    u = sub.add_parser("unmount", aliases=["umount"], help="unmount MOUNTPOINT")
    u.add_argument("mountpoint")
    u.add_argument("-z", "--lazy", action="store_true", help="detach now, clean up when no longer busy")
    return p


def _setup_logging(opts: dict[str, Any], daemon: bool) -> None:
    level = getattr(logging, opts["log_level"].upper())
    fmt = "%(asctime)s zvfs[%(process)d] %(levelname)s %(message)s"
    handler: logging.Handler
    if opts["log_file"]:
        handler = logging.FileHandler(opts["log_file"])
    elif daemon and os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler("/dev/log")
        fmt = "zvfs[%(process)d]: %(levelname)s %(message)s"
    elif daemon:
        handler = logging.NullHandler()
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    log.setLevel(level)


def check_mountpoint(path: str) -> str:
    if not os.path.exists(path):
        raise CliError(f"mountpoint {path} does not exist; create it with: mkdir -p {path}")
    if not os.path.isdir(path):
        raise CliError(f"mountpoint {path} is not a directory")
    if is_mounted(path):
        raise CliError(f"{path} is already mounted; unmount it first with: zvfs unmount {path}")
    return os.path.abspath(path)


def _open_source(source: str, opts: dict[str, Any]):  # type: ignore[no-untyped-def]
    from zvfs.stores.base import SourceError
    from zvfs.stores.retry import RetryPolicy
    from zvfs.stores.url import open_store, parse_source

    try:
        spec = parse_source(source, endpoint_url=opts["endpoint_url"], region=opts["region"],
                            profile=opts["profile"], no_sign_request=opts["no_sign_request"])
        retry = RetryPolicy(attempts=opts["s3_attempts"], timeout=opts["s3_timeout"],
                            deadline=opts["s3_deadline"])
        return open_store(spec, retry), spec.describe()
    except (SourceError, ValueError) as exc:
        raise CliError(str(exc)) from None


def _mount_foreground(args: argparse.Namespace, opts: dict[str, Any]) -> int:
    daemon = args.ready_fd is not None
    _setup_logging(opts, daemon)
    try:
        mountpoint = check_mountpoint(args.mountpoint)
        store, description = _open_source(args.source, opts)
    except CliError as exc:
        if daemon:
            os.write(args.ready_fd, f"ERR {exc}\n".encode())
            return EXIT_FAIL
        raise
    from zvfs.daemon import serve

    try:
        serve(store, mountpoint, description, opts, ready_fd=args.ready_fd)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the user gets one line, not a traceback
        log.debug("mount failed", exc_info=True)
        msg = f"cannot mount {args.source} at {mountpoint}: {exc}"
        if daemon:
            os.write(args.ready_fd, f"ERR {msg}\n".encode())
            return EXIT_FAIL
        raise CliError(msg) from None
    return 0


def _child_argv(args: argparse.Namespace, opts: dict[str, Any], mountpoint: str) -> list[str]:
    """The same mount as a command line of resolved options and absolute paths (the child runs in /)."""
    source = args.source
    if "://" not in source and os.path.exists(source):
        source = os.path.abspath(source)
    out = ["mount", source, mountpoint]
    for opt in zopts.OPTIONS:
        value = opts[opt.name]
        if value == opt.default:
            continue
        flag = "--" + opt.name.replace("_", "-")
        out += [flag] if opt.parse is None else [flag, zopts.format_value(opt, value)]
    return out


def _mount_daemon(args: argparse.Namespace, opts: dict[str, Any]) -> int:
    # cheap checks first, so the common mistakes answer at once
    mountpoint = check_mountpoint(args.mountpoint)
    read_fd, write_fd = os.pipe()
    child_argv = [sys.executable, "-m", "zvfs", *_child_argv(args, opts, mountpoint), "--ready-fd", str(write_fd)]
    with open(os.devnull, "rb") as devnull_in, open(os.devnull, "wb") as devnull_out:
        proc = subprocess.Popen(child_argv, stdin=devnull_in, stdout=devnull_out, stderr=devnull_out,
                                pass_fds=(write_fd,), start_new_session=True, cwd="/")
    os.close(write_fd)
    message = b""
    deadline = time.monotonic() + READY_TIMEOUT
    while b"\n" not in message:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.terminate()
            raise CliError(f"the mount did not become ready within {READY_TIMEOUT:.0f} s; "
                           "run with -f --log-level debug to see why")
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        message += chunk
    os.close(read_fd)
    text = message.decode(errors="replace").strip()
    if text == "OK":
        return 0
    if text.startswith("ERR "):
        proc.wait(timeout=30)
        raise CliError(text[4:])
    code = proc.wait(timeout=30)
    raise CliError(f"the mount process exited ({code}) before the mount was ready; "
                   "run with -f --log-level debug to see why")


def _unmount(path: str, lazy: bool) -> int:
    if not os.path.isdir(path):
        raise CliError(f"{path} does not exist or is not a directory")
    if not is_mounted(path):
        raise CliError(f"{path} is not mounted")
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise CliError("fusermount3 not found; install the fuse3 package (apt-get install fuse3)")
    res = subprocess.run([tool, "-uz" if lazy else "-u", path], capture_output=True, text=True)
    if res.returncode != 0:
        reason = res.stderr.strip() or f"{tool} exited {res.returncode}"
        hint = " (it is busy: close the files open in it, or use zvfs unmount -z)" if "busy" in reason else ""
        raise CliError(f"cannot unmount {path}: {reason}{hint}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("unmount", "umount"):
            return _unmount(args.mountpoint, args.lazy)
        try:
            opts = zopts.resolve(args)
        except ValueError as exc:
            parser.error(str(exc))
        if args.foreground or args.ready_fd is not None:
            return _mount_foreground(args, opts)
        return _mount_daemon(args, opts)
    except CliError as exc:
        print(f"zvfs: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130


def mount_helper_main(argv: list[str] | None = None) -> int:
    """``mount.zvfs SOURCE MOUNTPOINT [-sfnv] [-o opts] [-t type]``, as mount(8) calls it.

    Note mount(8)'s ``-f`` means *fake*, not foreground.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    positional: list[str] = []
    o_values: list[str] = []
    fake = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-o" and i + 1 < len(argv):
            o_values.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("-o") and len(a) > 2:
            o_values.append(a[2:])
        elif a == "-t" and i + 1 < len(argv):
            i += 1
        elif a.startswith("-") and len(a) > 1:
            fake = fake or "f" in a[1:]
        else:
            positional.append(a)
        i += 1
    if len(positional) != 2:
        print("usage: mount.zvfs SOURCE MOUNTPOINT [-o options]", file=sys.stderr)
        return EXIT_USAGE
    if fake:
        return 0
    cmd = ["mount", *positional]
    for value in o_values:
        cmd += ["-o", value]
    return main(cmd)


if __name__ == "__main__":
    sys.exit(main())

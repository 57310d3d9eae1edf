"""Command line: ``zvfs mount``, ``zvfs unmount`` and the ``mount.zvfs`` helper for mount(8).

``zvfs mount`` checks what it can at once (options, mountpoint, source), then
daemonizes: it forks a child in a new session and waits on a pipe. It returns 0
only once the mount answers a ``stat`` and its source is open, and otherwise
prints the child's one-line reason and exits non-zero. (A fork, not a new
interpreter: the child starts with the modules the parent has imported.)

Exit status: 0 mounted; 1 a failure that may go away (endpoint unreachable,
FUSE refused); 2 a command line argparse cannot read; 78 (EX_CONFIG) a
configuration error that a retry cannot fix (bad option, missing source,
refused credentials, unusable mountpoint), so systemd's
``RestartPreventExitStatus=78`` stops restarting.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

from zvfs import earlystop
from zvfs import options as zopts
from zvfs.mounts import (
    BUSY_WAIT,
    MOUNT_TABLE_PREFIX,
    UnmountFailed,
    fusermount,
    is_dead,
    mount_entry,
    mounts_inside,
    source_of_table,
)
from zvfs.stats import Counters

log = logging.getLogger("zvfs")
T = TypeVar("T")

READY_TIMEOUT = 120.0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG; systemd knows it by that name too


class CliError(Exception):
    """A user-facing error: printed as 'zvfs: error: ...'; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line, without the usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"zvfs: error: {message} (see: {self.prog} --help)\n")


class _Version(argparse.Action):
    """--version, reading the installed version only when asked (importlib.metadata is slow
    to import, and every mount would pay for it)."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> NoReturn:
        import zvfs

        print(f"zvfs {zvfs.__version__}")
        parser.exit()


def _positive_seconds(text: str) -> float:
    """zvfs.options.parse_seconds, as an argparse type (which words a ValueError itself)."""
    try:
        return zopts.parse_seconds(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is no number of seconds above 0") from None


#: the longest `zvfs status` waits for a mount: a timeout of 35 days was a traceback (the
#: selector's OverflowError; a helper's audit), and no operator waits a day for an answer
MAX_STATUS_TIMEOUT = 86400


def _probe_seconds(text: str) -> float:
    seconds = _positive_seconds(text)
    if seconds > MAX_STATUS_TIMEOUT:
        raise argparse.ArgumentTypeError(f"{text} is more than a day ({MAX_STATUS_TIMEOUT} s)")
    return seconds


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="zvfs",
        description="Mount a Zarr store (directory, .zip, S3) as a file system (read-only "
        "unless --writable), with decoded arrays under MOUNTPOINT/.zvfs/.",
    )
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    m = sub.add_parser("mount", help="mount SOURCE at MOUNTPOINT",
                       description="SOURCE: a directory, a .zip file, s3://bucket[/prefix], "
                       "file:///path#mode=zarr,file, file:///path.zip#mode=nczarr,zip, "
                       "https://s3.REGION.amazonaws.com/bucket/prefix, "
                       "https://bucket.s3.REGION.amazonaws.com/prefix or, for an S3-compatible "
                       "server, http(s)://host[:port]/bucket/prefix#mode=zarr,s3")
    m.add_argument("source")
    m.add_argument("mountpoint")
    m.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground (for systemd and debugging)")
    zopts.add_arguments(m)
    u = sub.add_parser("unmount", aliases=["umount"], help="unmount MOUNTPOINT")
    u.add_argument("mountpoint")
    u.add_argument("-z", "--lazy", action="store_true", help="detach now, clean up when no longer busy")
    st = sub.add_parser("status", help="show the zvfs mounts of this machine: source, options, "
                        "health, traffic, errors")
    p.set_defaults(_commands={"mount": m, "unmount": u, "umount": u, "status": st})
    st.add_argument("mountpoint", nargs="?", help="only this mount (default: all)")
    st.add_argument("--json", action="store_true", help="print JSON for scripts (default: text)")
    st.add_argument("--timeout", type=_probe_seconds, default=5.0, metavar="SECONDS",
                    help="a mount that does not answer within this is reported hung (default: 5)")
    return p


def default_log_file(mountpoint: str) -> str:
    """Where a daemon logs when not told: /var/log/zvfs/ for root, else $XDG_STATE_HOME/zvfs/."""
    if os.geteuid() == 0:
        base = "/var/log/zvfs"
    else:
        state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        base = os.path.join(state, "zvfs")
    # the path's "/" as "-", its own "-" (and "\\") escaped as systemd-escape --path escapes
    # them (other characters stay as they are): as plain dashes, /data/a-b/c and /data/a/b-c
    # shared one log file
    parts = os.path.abspath(mountpoint).strip("/").split("/")
    name = "-".join(p.replace("\\", "\\x5c").replace("-", "\\x2d") for p in parts if p) or "root"
    if len(os.fsencode(name + ".log")) > _NAME_MAX:
        # a file name has at most 255 bytes: a mountpoint of a longer path was refused ("File
        # name too long; pass --log-file PATH"). Its end, which tells mounts apart, is kept,
        # after a digest of the whole name
        import hashlib

        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
        tail = os.fsencode(name)[-(_NAME_MAX - len(digest) - len("-.log")):]
        name = digest + "-" + tail.decode(errors="ignore")
    return os.path.join(base, name + ".log")


#: the longest file name, in bytes (Linux's NAME_MAX)
_NAME_MAX = 255


def _log_target(opts: dict[str, Any], daemon: bool, mountpoint: str) -> str:
    """The log file, 'syslog', or '' for stderr (the foreground, and systemd)."""
    return opts["log_file"] or (default_log_file(mountpoint) if daemon else "")


def _log_file(path: str) -> logging.Handler:
    """A handler appending to ``path``, opened again once logrotate (or anyone) has moved or
    removed it (a long-lived daemon never writes into a rotated file), and that never raises.

    WatchedFileHandler reopens the file outside the try that guards its writes: once the
    log's directory was removed, or its disk went read-only, the first line logged raised
    OSError into whatever was logging, and a read that logged its error ended the daemon.
    A line that cannot be written is lost instead (stderr, where logging reports it, is
    /dev/null in the daemon), and the next one tries the path again.

    Opened at once, not at the first line: a daemon that had logged nothing yet (the
    default level) when it ran out of descriptors could not open its log to say so, and
    lost every line of the failures that followed."""
    from logging.handlers import WatchedFileHandler

    class LogFile(WatchedFileHandler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                super().emit(record)
            except Exception:  # noqa: BLE001 - see above
                self.handleError(record)

    return LogFile(path)


#: control characters a message's names may hold (a key may hold any but NUL), written
#: escaped; a tab is left as it is
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if c != 0x09} | {0x0A: "\\n", 0x0D: "\\r"}


class _SafeFormatter(logging.Formatter):
    """Lines that every handler can write, one line a message: a name that is not UTF-8
    (os.fsdecode's lone surrogates) is escaped, where writing it raised and the line was
    lost; so is a control character in the message (a newline in a key split its line in
    two, the second looking like a line of its own). A traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).encode("utf-8", "backslashreplace").decode("utf-8")


def _setup_logging(opts: dict[str, Any], daemon: bool, mountpoint: str) -> str:
    """Send the log where the options say; returns where, for the user ('' for stderr)."""
    level = getattr(logging, opts["log_level"].upper())
    fmt = "%(asctime)s zvfs[%(process)d] %(levelname)s %(message)s"
    handler: logging.Handler
    where = _log_target(opts, daemon, mountpoint)
    try:
        if where == "syslog":
            if not os.path.exists("/dev/log"):  # the handler would drop every line silently
                raise FileNotFoundError(errno.ENOENT, "no syslog daemon listens there")
            from logging.handlers import SysLogHandler

            handler = SysLogHandler("/dev/log")
            fmt = "zvfs[%(process)d]: %(levelname)s %(message)s"
        elif where:
            if not opts.get("log_file"):  # the default's directory (/var/log/zvfs); a path given
                os.makedirs(os.path.dirname(where), exist_ok=True)  # with a typo is told, not made
            os.close(os.open(where, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644))
            handler = _log_file(where)
        else:  # the foreground, and systemd: stderr goes to the journal
            handler = logging.StreamHandler(sys.stderr)
    except OSError as exc:
        what = "the syslog socket /dev/log" if where == "syslog" else f"the log file {where}"
        if where == "syslog":
            hint = "pass --log-file PATH instead"
        elif opts.get("log_file"):  # the user's own path: it is that path that needs fixing
            hint = "give --log-file a file in a directory that exists and that you may write in"
        else:  # the default place
            hint = "pass --log-file PATH"
        raise CliError(f"cannot write to {what}: {exc.strerror}; {hint}") from None
    handler.setFormatter(_SafeFormatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    log.setLevel(level)
    return where


def _warn(message: str) -> None:
    print(f"zvfs: warning: {message}", file=sys.stderr)


def _along(inside: list[str]) -> str:
    """What a warning of a dead mount detached adds of the mounts inside it, which went too."""
    if not inside:
        return ""
    return f", and with it {', '.join(inside)}, mounted inside it: mount {'that' if len(inside) == 1 else 'those'} again"


def _warn_unreachable_owner(opts: dict[str, Any]) -> None:
    """--uid/--gid naming someone else, without --allow-other: FUSE lets no one but the
    mounting user in, so the owner given could not even list the mount."""
    others = [f"--{name} {opts[name]}" for name, mine in (("uid", os.getuid()), ("gid", os.getgid()))
              if opts[name] is not None and opts[name] != mine]
    if others and not opts["allow_other"]:
        _warn(f"{' and '.join(others)} without --allow-other (-o allow_other): only the user "
              "who mounts can reach the mount, whoever owns its files")


def check_mountpoint(path: str, allow_non_empty: bool = False) -> str:
    """The absolute mountpoint, if it can be mounted on; clears a dead zvfs mount left there."""
    mp = os.path.abspath(path)
    entry = mount_entry(mp)
    if entry is not None and is_dead(entry.mountpoint):
        if entry.fstype != "fuse.zvfs":
            raise CliError(f"{mp} is a dead {entry.fstype} mount (transport endpoint is not connected); "
                           f"clear it with: fusermount3 -u {entry.mountpoint}")
        # a mount inside it goes with it (a detach takes it along; it cannot be unmounted
        # alone, fusermount3 cannot enter the dead parent): said, not ended unseen
        inside = mounts_inside(entry.mountpoint)
        # ENOTCONN on a zvfs mount: its daemon is gone, so nothing in it can be used any more;
        # a process still holding it open only makes a plain unmount busy: detach it then
        try:
            _fusermount(entry.mountpoint, lazy=False)
        except CliError:
            _fusermount(entry.mountpoint, lazy=True)
        _warn(f"cleared a dead zvfs mount at {mp} (its daemon had died){_along(inside)}")
        entry = mount_entry(mp)
    if entry is not None and entry.fstype != "fuse.zvfs":  # `zvfs unmount` refuses those
        raise CliError(f"{mp} is already mounted ({entry.fstype}); choose another mountpoint, or "
                       f"unmount it first with: umount {entry.mountpoint}")
    if entry is not None:
        raise CliError(f"{mp} is already mounted; unmount it first with: zvfs unmount {mp}")
    if not os.path.exists(mp):
        raise CliError(f"mountpoint {mp} does not exist; create it with: mkdir -p {mp}")
    if not os.path.isdir(mp):
        raise CliError(f"mountpoint {mp} is not a directory")
    if not allow_non_empty:
        try:
            entries = os.listdir(mp)
        except OSError as exc:
            raise CliError(f"cannot read the mountpoint {mp}: {exc.strerror}") from None
        if entries:
            hidden = "1 entry" if len(entries) == 1 else f"{len(entries)} entries"
            raise CliError(f"mountpoint {mp} is not empty ({hidden} would be hidden); "
                           "use an empty directory, or pass --allow-non-empty (-o nonempty)")
    return mp


def lock_mountpoint(path: str) -> int | None:
    """An exclusive flock on the mountpoint's directory, for the caller to hold until its mount
    is made: two ``zvfs mount`` at once on one mountpoint each found it free, and stacked two
    mounts. The second waits here, then finds the first mounted. None when the directory
    cannot be opened (check_mountpoint says why)."""
    import fcntl

    if mount_entry(os.path.abspath(path)) is not None:
        return None  # mounted already, perhaps hung (an open would wait): check_mountpoint says so
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _inside(path: str, top: str) -> bool:
    """True if ``path`` is ``top`` or lies below it (both resolved)."""
    path, top = os.path.realpath(path), os.path.realpath(top)
    return path == top or path.startswith(top.rstrip("/") + "/")


def check_overlaps(mountpoint: str, spec: Any, opts: dict[str, Any], daemon: bool) -> None:
    """Refuse local paths the daemon would reach through its own mount once it is up: each
    such access waits for the daemon, which may be the one waiting (a log line written from
    the loop that answers the kernel hangs the mount for ever). A zip is exempt: it is
    opened before the mount covers it."""
    if spec.kind == "directory":
        if _inside(mountpoint, spec.path) or _inside(spec.path, mountpoint):
            raise CliError(f"the mountpoint {mountpoint} and the source directory {spec.path} overlap: "
                           "zvfs would read the store through its own mount; mount it somewhere "
                           "outside the source")
    for option, path in (("--log-file", _log_target(opts, daemon, mountpoint)),
                         ("--cache-dir", opts["cache_dir"])):
        if path and path != "syslog" and _inside(path, mountpoint):
            raise CliError(f"the {option[2:].replace('-', ' ')} {path} lies inside the mountpoint "
                           f"{mountpoint}, which the daemon would have to answer itself; "
                           f"give {option} a path outside it")


def check_cache_dir(path: str | None, stages: bool = False) -> None:
    """--cache-dir must be a directory zvfs can write in (made if missing): a file there, or
    no permission, failed the mount as a failure to retry (exit 1) with a raw errno. So must
    its ``staging/`` when the mount ``stages`` writes there (a writable S3 mount): a file
    of that name failed it so too ("[Errno 17] File exists")."""
    if not path:
        return
    _check_writable_dir(path, path)
    if stages:
        _check_writable_dir(os.path.join(path, "staging"), path)


def _check_writable_dir(path: str, given: str) -> None:
    import tempfile

    if os.path.exists(path) and not os.path.isdir(path):
        what = "not a directory" if path == given else f"{path} is not a directory"
        raise CliError(f"cannot use --cache-dir {given}: {what}; give a directory zvfs can write in")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != given else ""
        raise CliError(f"cannot use --cache-dir {given}: {reason}{where}; give a directory zvfs can "
                       "write in") from None


def source_from_mount_table(source: str) -> str:
    """SOURCE as the mount table shows it (``zvfs:/data/run.zarr``, ``zvfs:s3://bucket/x``),
    for an fstab line copied from it, is the source after the prefix: it was taken for a
    relative path ("source directory /root/zvfs:/data/run.zarr does not exist"). A name that
    only begins so (``zvfs:notes``, a relative path) stays what it is."""
    rest = source.removeprefix(MOUNT_TABLE_PREFIX)
    scheme, sep, _ = rest.partition("://")
    if rest != source and (rest.startswith("/") or (sep and scheme.replace("+", "").isalnum())):
        return source_of_table(source)
    return source


def _source_spec(source: str, opts: dict[str, Any]) -> Any:
    """SOURCE parsed, local paths checked (cheap: no store is opened, nothing is asked of S3)."""
    from zvfs.stores.base import SourceError
    from zvfs.stores.url import parse_source

    try:
        spec = parse_source(source, endpoint_url=opts["endpoint_url"], region=opts["region"],
                            profile=opts["profile"], no_sign_request=opts["no_sign_request"],
                            requester_pays=opts["requester_pays"])
    except (SourceError, ValueError) as exc:
        raise CliError(str(exc)) from None
    _check_s3_options(spec, opts)
    if spec.kind == "s3":  # what the URL set (an endpoint, a region, a profile) is in effect too:
        for name in ("endpoint_url", "region", "profile"):  # status, stats.json and the disk
            if not opts[name] and getattr(spec, name):  # cache's identity name it
                opts[name] = getattr(spec, name)
    return spec


def _check_s3_options(spec: Any, opts: dict[str, Any]) -> None:
    """Options only an S3 source (or only its writes) can use are refused elsewhere, not ignored:
    a user who asked for encryption must not get unencrypted objects without a word, and one
    who gives an endpoint or a region believes the source is S3. An option set to its default
    changes nothing, and passes. So is a number of decoder processes for S3 refused, which only
    a local source has (``auto`` is taken as "what suits the source": none for S3)."""
    given = [name for name in zopts.S3_OPTIONS if opts[name] != zopts.BY_NAME[name].default]
    if given and spec.kind != "s3":
        raise CliError(f"{zopts.flag(given[0])} applies to S3 sources only, and {spec.describe()} is a "
                       f"{spec.kind}: drop it")
    if spec.kind == "s3" and opts["decoders"]:
        raise CliError(f"{zopts.flag('decoders')} {opts['decoders']} starts processes that read and decode "
                       "a directory's or a zip's chunks; an S3 source's are decoded in the daemon's "
                       "threads while others wait on the network: drop it (or give auto, which is "
                       "none for S3)")
    writes = [name for name in zopts.S3_WRITABLE_OPTIONS if opts[name]]
    if writes and not opts["writable"]:  # how objects are written, or what a writable start does
        raise CliError(f"{zopts.flag(writes[0])} is for a writable mount, but the mount is read-only: "
                       "add --writable (-o writable), or drop it")
    if opts["sse_kms_key_id"] and opts["sse"] not in ("aws:kms", "aws:kms:dsse"):
        raise CliError("--sse-kms-key-id names the key of KMS encryption: add --sse aws:kms "
                       "(or aws:kms:dsse)")


def _source_errors(fn: Callable[[], T]) -> T:
    """``fn()``, with a source that cannot be opened as the CLI's error (1 if it may pass)."""
    from zvfs.stores.base import SourceError, SourceUnavailable

    try:
        return fn()
    except SourceUnavailable as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    except (SourceError, ValueError) as exc:
        raise CliError(str(exc)) from None


def _open_source(spec: Any, opts: dict[str, Any], counters: Counters) -> Any:
    """The store, open when that is cheap (a directory); an S3 store or a zip is a
    PendingStore, opened by ``prepare`` once the mount answers."""
    from zvfs.stores.opener import open_store
    from zvfs.stores.retry import RetryPolicy

    def make() -> Any:
        retry = RetryPolicy(attempts=opts["s3_attempts"], timeout=opts["s3_timeout"],
                            deadline=opts["s3_deadline"])
        return open_store(spec, retry, allow_empty=opts["allow_empty"], counters=counters, pending=True)

    return _source_errors(make)


class _Reporter:
    """Says how the mount went: to the waiting parent through the ready pipe, or on stderr."""

    def __init__(self, ready_fd: int | None) -> None:
        self.fd = ready_fd

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        if self.fd is None:
            _warn(message)
        else:
            self._tell(f"WARN {message}")

    def fail(self, exc: CliError) -> int:
        # the user reads it on stderr; at debug level a refused mount leaves no log file behind
        log.debug("%s", exc)
        if self.fd is None:
            raise exc
        if not self._tell(f"ERR {exc.code} {exc}"):
            log.error("%s", exc)  # no one waits to read it: the log says it
        return exc.code

    def _tell(self, line: str) -> bool:
        """False when the waiting command is gone (killed: it stops its daemon otherwise)."""
        try:
            os.write(self.fd, f"{line}\n".encode())  # type: ignore[arg-type]
        except BrokenPipeError:
            return False
        return True


def _scan(store: Any, description: str, report: _Reporter, decoded: bool = True,
          empty_expected: bool = False) -> Any:
    """Look at the store's key names once: warn when it holds no Zarr metadata at all (its
    plain files still mount) or nothing at all (a wrong path, unless ``empty_expected``: a
    writable mount, or S3's --allow-empty), and learn the metadata mtimes the decoded views show.
    Returns a daemon.Prepared: the mtimes, and for a store listed flat (S3) that listing,
    resumed, for the raw tree's index."""
    from zvfs.daemon import Prepared
    from zvfs.formats.probe import scan_flat, scan_metadata
    from zvfs.stores.base import StoreError
    from zvfs.views.root import CONTROL_NAME

    listing = None
    reserved = CONTROL_NAME if decoded else None
    try:
        if store.flat_listing:
            scan, listing = scan_flat(store, reserved=reserved)
        else:
            scan = scan_metadata(store, reserved=reserved)
    except StoreError as exc:  # listing fails later too, with its own message; not worth a refusal
        log.debug("could not look for Zarr metadata: %s", exc)
        return Prepared({}, None)
    except Exception:  # noqa: BLE001 - the scan only informs; the mount goes on without it
        log.debug("metadata scan failed", exc_info=True)
        return Prepared({}, None)
    if scan.empty and not empty_expected:
        hint = " (to write into it, mount it with --writable)" if getattr(store, "can_write", False) else ""
        report.warn(f"{description} holds no files; mounting it all the same{hint}")
    if scan.found is False:
        report.warn(f"{description} holds no Zarr metadata (zarr.json, .zarray, .zgroup, a v1 meta); "
                    "mounting its plain files, and .zvfs/ will have no arrays")
    if scan.reserved_used:
        report.warn(f"{description} holds keys under {CONTROL_NAME}/, which the mount's decoded "
                    f"views hide (mount with -o decoded=off to see them)")
    return Prepared(scan.mtimes, listing)


def _refuse_read_only(store: Any, description: str) -> None:
    """--writable on a store that cannot write: refused before mounting."""
    if not store.can_write:
        raise CliError(f"{description} is a zip file, and zip sources are read-only: "
                       "mount it without --writable (-o writable)")
    root = getattr(store, "root", None)
    if root is not None and not os.access(root, os.W_OK):
        raise CliError(f"{description} is not writable by this user: mount it without --writable, "
                       "or fix its permissions")


#: staged files a dead daemon left that the warning names one by one
_STAGED_NAMED = 10


def _check_left_staged(store: Any, report: _Reporter) -> None:
    """--writable: tell where earlier daemons that died (kill -9) left bytes they never stored."""
    staging = getattr(store, "staging", None)
    if staging is None:
        return
    from zvfs.stores.staging import KEY_ATTR, staged_keys

    for path, files, size in staging.left_behind():
        staged = staged_keys(path)
        named = []
        for name, key, source, why in staged[:_STAGED_NAMED]:
            what = f"{name} is {key} of {source or 'a source not recorded'}" if key else \
                f"{name} (its key was not recorded)"
            # a file whose upload failed was kept with a word to the application and the log;
            # one of a killed daemon, with none
            named.append(f"{what}, kept: {why}" if why else f"{what}, its daemon stopped before storing it")
        more = files - len(named)
        where = (f"each file's extended attribute {KEY_ATTR} holds its key: getfattr -d FILE"
                 if any(key for _n, key, _s, _w in staged) else "each is named <id>-<file name>")
        report.warn(f"{path} holds {files} staged file(s), {size} bytes, written through a zvfs mount "
                    f"and never stored: {'; '.join(named)}"
                    f"{f'; and {more} more' if more > 0 else ''}. Copy back what you need ({where}), "
                    "after comparing it with what the store holds now (a later write may have stored "
                    "newer bytes), then remove the directory")


def _check_uploads(store: Any, description: str, opts: dict[str, Any], report: _Reporter) -> None:
    """--writable: tell of (or abort) the multipart uploads an earlier writer left unfinished."""
    from zvfs.stores.base import StoreError

    unfinished = getattr(store, "unfinished_uploads", None)
    if unfinished is None:
        return
    try:
        leftovers = unfinished()
    except StoreError as exc:
        report.warn(f"could not look for unfinished multipart uploads: {exc}")
        return
    if not leftovers:
        return
    if opts["abort_uploads"]:
        from zvfs.stores.s3_wire import UploadGone

        failed: list[StoreError] = []
        gone = 0
        for up in leftovers:
            try:
                store.abort_upload(up.key, up.upload_id)
            except UploadGone:  # completed or aborted since it was listed: not left open
                log.info("the unfinished multipart upload of %s (%s) is gone already", up.key, up.upload_id)
                gone += 1
                continue
            except StoreError as exc:  # refused: the mount goes on (it failed)
                failed.append(exc)
                continue
            log.warning("aborted the unfinished multipart upload of %s (%s)", up.key, up.upload_id)
        done = len(leftovers) - len(failed) - gone
        report.warn(f"aborted {done} unfinished multipart upload(s) under {description}"
                    + (f"; {gone} gone already" if gone else "")
                    + (f"; {len(failed)} could not be aborted ({failed[0]})" if failed else ""))
        return
    named = ", ".join(sorted({up.key for up in leftovers})[:5])
    report.warn(f"{description} has {len(leftovers)} unfinished multipart upload(s), left by a writer "
                f"that was stopped ({named}): no object was made of them, but their parts take space; "
                "mount with --abort-uploads (-o abort_uploads) to abort them")


def _mount_foreground(args: argparse.Namespace, opts: dict[str, Any], spec: Any = None,
                      ready_fd: int | None = None) -> int:
    """Mount and serve here; ``ready_fd``: the daemon's pipe to the waiting parent."""
    daemon = ready_fd is not None
    report = _Reporter(ready_fd)
    raise_fd_limit()
    # the mount's counters, which the store, the wrappers, the views and the fs layer count into
    counters = Counters()
    lock = None
    try:
        spec = spec or _source_spec(args.source, opts)
        check_overlaps(os.path.abspath(args.mountpoint), spec, opts, daemon)  # before the log's directory is made
        if not daemon:  # a daemon's parent checked it, before the fork
            check_cache_dir(opts["cache_dir"], stages=opts["writable"] and spec.kind == "s3")
        where = _setup_logging(opts, daemon, args.mountpoint)
        if ready_fd is not None and where:
            os.write(ready_fd, f"LOG {where}\n".encode())
        lock = lock_mountpoint(args.mountpoint)  # held until the mount answers
        mountpoint = check_mountpoint(args.mountpoint, opts["allow_non_empty"])
        store = _open_source(spec, opts, counters)
    except CliError as exc:
        return report.fail(exc)
    description = spec.describe()
    try:
        if opts["writable"]:
            _refuse_read_only(store, description)
    except CliError as exc:
        store.close()
        return report.fail(exc)

    def unlock() -> None:
        nonlocal lock
        if lock is not None:
            os.close(lock)
            lock = None

    def prepare(counted: Any) -> Any:
        """Once the mount answers: the source opened (S3), checked, and scanned; ``counted`` is
        the store as the mount reads it, so the scan's requests show in stats.json."""
        unlock()  # mounted: another zvfs mount here now finds it so
        opening = getattr(store, "open", None)
        opened = store if opening is None else _source_errors(opening)
        if opts["writable"]:
            _check_uploads(opened, description, opts, report)
            _check_left_staged(opened, report)
        return _scan(counted, description, report, decoded=opts["decoded"] != "off",
                     empty_expected=opts["writable"] or opts["allow_empty"])

    from zvfs.daemon import MountRefused, SessionAborted, serve

    try:
        serve(store, mountpoint, description, opts, counters, ready_fd=ready_fd, prepare=prepare)
    except CliError as exc:
        return report.fail(exc)
    except MountRefused as exc:
        return report.fail(CliError(f"cannot mount at {mountpoint}: {exc}", EXIT_CONFIG))
    except SessionAborted:
        return EXIT_FAIL  # after the mount was ready, and the log has said it
    except Exception as exc:  # noqa: BLE001 - whatever it is, the user gets one line, not a traceback
        log.debug("mount failed", exc_info=True)
        return report.fail(CliError(f"cannot mount {args.source} at {mountpoint}: {exc}", EXIT_FAIL))
    finally:
        unlock()
    return 0


def _mount_daemon(args: argparse.Namespace, opts: dict[str, Any]) -> int:
    # cheap checks first, so the common mistakes answer at once, before any child exists
    mountpoint = check_mountpoint(args.mountpoint, opts["allow_non_empty"])
    spec = _source_spec(args.source, opts)
    check_overlaps(mountpoint, spec, opts, daemon=True)
    check_cache_dir(opts["cache_dir"], stages=opts["writable"] and spec.kind == "s3")
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # from the fork on, an interruption (Ctrl-C; SIGTERM or SIGHUP, as timeout(1) sends) stops
    # the daemon too: it went on without anyone told of its mount, and wrote its answer into
    # the closed pipe (a BrokenPipeError traceback in its log). SIGQUIT keeps its default
    # here: the daemon may be mounting, so "before anything was mounted" would not be true
    earlystop.forget()
    stops = {s: signal.signal(s, _interrupt) for s in _STOPS}
    pid = -1
    try:
        # The stops are blocked across the fork, and the child unblocks them once its own
        # handlers are in (in _daemon). A SIGTERM this process passed on to a child that had
        # not yet run again after fork() (a busy machine) reached it with _interrupt still
        # in place and was dropped by CPython's reset of a child's pending signals: the
        # daemon mounted on while this process waited for it (2 runs in 15 of a lifecycle
        # test under load). Blocked, it waits in the kernel until the child unblocks it. In
        # this process a stop that comes while forking (one another thread, such as
        # warmup's, took) is held until the child's PID is known, so the child is always
        # stopped with it.
        _fork.active = True
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        pid = os.fork()
        if pid == 0:
            for signum, handler in stops.items():
                signal.signal(signum, handler)
            earlystop.watch()  # the daemon mounts nothing before its SignalStop is in
            os.close(read_fd)
            _daemon(args, opts, spec, mountpoint, write_fd)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        _fork.active = False
        os.close(write_fd)
        if _fork.take_held():
            raise KeyboardInterrupt
        return _await_ready(pid, read_fd, mountpoint, tell_log=not opts["log_file"])
    except KeyboardInterrupt:
        if pid <= 0:
            raise
        for signum in _STOPS:  # a second Ctrl-C while the daemon stops: no traceback
            signal.signal(signum, signal.SIG_IGN)
        os.kill(pid, signal.SIGTERM)
        code = _exit_status(pid, timeout=READY_TIMEOUT)
        if code == -1:
            os.kill(pid, signal.SIGKILL)
            _exit_status(pid)
        _warn(f"interrupted: no mount was left at {mountpoint} (its daemon stopped)")
        return 130
    finally:
        _fork.active = False
        _fork.take_held()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # the fork failed
        for signum, handler in stops.items():
            signal.signal(signum, handler)
        os.close(read_fd)


#: what stops a waiting ``zvfs mount``, besides Ctrl-C (SIGINT)
_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

class _Forking:
    """While ``zvfs mount`` forks its daemon (``active``), a stop is held, not raised (see
    _mount_daemon)."""

    def __init__(self) -> None:
        self.active = False
        self.held = False

    def take_held(self) -> bool:
        """Whether a stop was held while forking (forgotten once asked)."""
        held, self.held = self.held, False
        return held


_fork = _Forking()


def _interrupt(_signum: int, _frame: object) -> None:
    if _fork.active:
        _fork.held = True
        return
    raise KeyboardInterrupt


def _daemon(args: argparse.Namespace, opts: dict[str, Any], spec: Any, mountpoint: str,
            ready_fd: int) -> NoReturn:
    """The forked child: its own session, no terminal, in /; serves the mount, then exits."""
    code = EXIT_FAIL
    pipe = os.fstat(ready_fd)
    try:
        os.setsid()
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        # the stops, blocked across the fork (see _mount_daemon), come now: not before its
        # stderr is the caller's no more, where earlystop's line would be a second one
        # after the "interrupted" that `zvfs mount` says
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        # what the caller held open (a lock, a pipe) is not the daemon's to keep for the
        # whole mount: a `flock 9 zvfs mount ...` in a cron script kept its lock until unmount
        os.closerange(3, ready_fd)
        os.closerange(ready_fd + 1, 1 << 20)
        args.mountpoint = mountpoint
        code = _mount_foreground(args, opts, spec, ready_fd)
    except BaseException as exc:  # noqa: BLE001 - the parent hears of it when the pipe closes
        log.error("the mount process failed", exc_info=True)
        # before the mount was ready the parent waits: it says why, not only "see the log".
        # (Once ready, the pipe is closed, and its number may name another file by now.)
        try:
            now = os.fstat(ready_fd)
            if (now.st_dev, now.st_ino) == (pipe.st_dev, pipe.st_ino):
                os.write(ready_fd, f"ERR {EXIT_FAIL} the mount process failed: "
                                   f"{type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    finally:
        logging.shutdown()
        os._exit(code)


def raise_fd_limit() -> None:
    """Raise the soft limit on open files to the hard one, as Go programs (rclone) do at
    start: a directory store's readers each hold a descriptor, and 1,024 (a shell's usual
    soft limit) failed reads with EIO under 1,200 open chunk files."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # the hard limit stays as it is
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.debug("could not raise the open-file limit to %d: %s", target, exc)


def _ready_lines(pid: int, read_fd: int) -> Iterator[str]:
    """The child's report lines (LOG/WARN/OK/ERR) until it closes the pipe."""
    buf = b""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            yield line.decode(errors="replace")
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGTERM)
            raise CliError(f"the mount did not become ready within {READY_TIMEOUT:.0f} s; "
                           "run with -f --log-level debug to see why", EXIT_FAIL)
        ready, _, _ = select.select([read_fd], [], [], left)
        if ready:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                return
            buf += chunk


def _exit_status(pid: int, timeout: float = 30.0) -> int:
    """The child's exit status, once it has exited (-1 if it has not within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return -1
        time.sleep(0.01)


def _await_ready(pid: int, read_fd: int, mountpoint: str, tell_log: bool) -> int:
    log_where = ""
    for line in _ready_lines(pid, read_fd):
        kind, _, rest = line.partition(" ")
        if kind == "LOG":
            log_where = rest
        elif kind == "WARN":
            _warn(rest)
        elif kind == "OK":
            if tell_log and log_where:  # the file appears with the first line logged
                print(f"zvfs: mounted at {mountpoint}; its log goes to {log_where}", file=sys.stderr)
            return 0
        elif kind == "ERR":
            _exit_status(pid)
            code, _, message = rest.partition(" ")
            raise CliError(message, int(code) if code.isdigit() else EXIT_FAIL)
    code = _exit_status(pid)
    hint = f"; see the log in {log_where}" if log_where else "; run with -f --log-level debug to see why"
    raise CliError(f"the mount process exited ({code}) before the mount was ready{_clear_dead(mountpoint)}"
                   f"{hint}", EXIT_FAIL)


def _clear_dead(mountpoint: str) -> str:
    """Unmount the dead mount a daemon killed while starting left (a later command would
    have found it); what to add to the message about it."""
    entry = mount_entry(mountpoint)
    if entry is None or entry.fstype != "fuse.zvfs" or not is_dead(entry.mountpoint):
        return ""
    try:
        _fusermount(entry.mountpoint, lazy=True)
    except CliError as exc:
        return f" (it left a dead mount: {exc})"
    return " (the dead mount it left was unmounted)"


def _fusermount(path: str, lazy: bool, busy_wait: float = 0.0) -> None:
    try:
        fusermount(path, lazy, busy_wait)
    except UnmountFailed as exc:
        raise CliError(str(exc), EXIT_FAIL) from None


def _unmount(path: str, lazy: bool) -> int:
    # the mount table first: a dead mount (ENOTCONN) cannot even be stat'ed, but is unmounted
    # all the same, and mount_entry asks nothing of the mount, so a hung one is found too
    entry = mount_entry(path)
    if entry is not None:
        if entry.fstype != "fuse.zvfs":
            raise CliError(f"{entry.mountpoint} is a {entry.fstype} mount, not zvfs; "
                           f"unmount it with: umount {entry.mountpoint}")
        if os.geteuid() != 0 and entry.owner not in (None, os.geteuid()):
            raise CliError(f"{entry.mountpoint} was mounted by uid {entry.owner}: only that user "
                           "or root can unmount it")
        try:
            _fusermount(entry.mountpoint, lazy, busy_wait=BUSY_WAIT)
        except CliError:
            if lazy or not is_dead(entry.mountpoint):
                raise
            # a dead mount still held (a shell inside it, a mount inside it): nothing in it
            # works any more
            inside = mounts_inside(entry.mountpoint)
            _fusermount(entry.mountpoint, lazy=True)
            _warn(f"{entry.mountpoint} was a dead mount still in use: detached (zvfs unmount -z)"
                  f"{_along(inside)}")
        return 0
    if not os.path.isdir(path):
        raise CliError(f"{path} does not exist or is not a directory")
    raise CliError(f"{path} is not mounted")


def _refuse_extra(top: argparse.ArgumentParser, command: argparse.ArgumentParser, name: str,
                  argv: list[str], extra: list[str]) -> NoReturn:
    """What argparse could not place, said as what it is: an option no one knows, named (with
    the one meant, when it is near), rather than argparse's "unrecognized arguments" that also
    lists the positional the typo pushed out of place. Exits EXIT_USAGE through the parser
    the option was given to (so the hint is ``zvfs mount --help`` after the command, ``zvfs
    --help`` before it); what follows ``--`` is an argument, never an option."""
    import difflib

    end = argv.index("--") if "--" in argv else len(argv)
    at = argv.index(name) if name in argv[:end] else 0
    for x in extra:
        if not x.startswith("-") or x in ("-", "--") or x not in argv[:end]:
            continue
        where = top if argv.index(x) < at else command
        option = x.split("=", 1)[0]
        known = [o for action in where._actions for o in action.option_strings]
        near = difflib.get_close_matches(option, known, n=1)
        where.error(f"unknown option {option}" + (f" (did you mean {near[0]}?)" if near else ""))
    args = [x for x in extra if x != "--"]
    command.error(f"unexpected argument{'s' if len(args) > 1 else ''}: {' '.join(args)}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_extra(parser, args._commands[args.command], args.command, argv, extra)
    if getattr(args, "mountpoint", None) == "":  # os.path.abspath("") is the current directory
        args._commands[args.command].error("MOUNTPOINT is empty")
    try:
        if args.command in ("unmount", "umount"):
            return _unmount(args.mountpoint, args.lazy)
        if args.command == "status":
            from zvfs.status import main as status_main

            code = status_main(args.mountpoint, as_json=args.json, timeout=args.timeout)
            sys.stdout.flush()  # here, where a failure to write is told (not at exit, as a traceback)
            return code
        try:
            opts = zopts.resolve(args)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        args.source = source_from_mount_table(args.source)
        _warn_unreachable_owner(opts)
        if args.foreground:
            return _mount_foreground(args, opts)
        return _mount_daemon(args, opts)
    except CliError as exc:
        print(f"zvfs: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # its reader went away (zvfs status | head -1): nothing more to say, as `ls` in a
        # pipeline; the output still buffered must not be flushed again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if exc.errno != errno.ENOSPC or exc.filename is not None:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"zvfs: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return EXIT_FAIL


def _known_options(o_values: list[str]) -> list[str]:
    """``-o`` lists without the keys zvfs does not know, each told on stderr (``mount -s``)."""
    kept, dropped = [], []
    for item in zopts.split_o(o_values):
        given = item.partition("=")[0].strip()
        key = given.replace("-", "_")
        known = (key in zopts.BY_KEY or key in zopts.IGNORED or key in zopts.NEGATIONS
                 or given.lower().startswith("x-") or given == "comment")
        (kept if known else dropped).append(item)
    if dropped:
        print(f"mount.zvfs: ignoring unknown option{'s' if len(dropped) > 1 else ''} "
              f"{', '.join(dropped)} (mount -s)", file=sys.stderr)
    return [",".join(item.replace(",", "\\,") for item in kept)] if kept else []


def mount_helper_main(argv: list[str] | None = None) -> int:
    """``mount.zvfs SOURCE MOUNTPOINT [-sfnv] [-o opts] [-t type] [-N ns]``, as mount(8) calls it.

    Note mount(8)'s ``-f`` means *fake*, not foreground. ``-N`` (``mount -N``/``--namespace``)
    names the mount namespace to mount in: mount(8) runs its helper in its own namespace.
    ``-s`` (sloppy) asks that options the helper does not know be ignored, not refused.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    positional: list[str] = []
    o_values: list[str] = []
    namespace: str | None = None
    fake = sloppy = False
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
        elif a == "-N" and i + 1 < len(argv):
            namespace = argv[i + 1]
            i += 1
        elif a.startswith("-") and len(a) > 1:
            fake = fake or "f" in a[1:]
            sloppy = sloppy or "s" in a[1:]
        else:
            positional.append(a)
        i += 1
    if "remount" in (item.partition("=")[0].strip() for item in zopts.split_o(o_values)):
        print("mount.zvfs: a zvfs mount's options cannot be changed while it is mounted "
              "(-o remount): unmount it and mount it again with the new options", file=sys.stderr)
        return EXIT_CONFIG
    if sloppy:
        o_values = _known_options(o_values)
    if len(positional) != 2:
        print("usage: mount.zvfs SOURCE MOUNTPOINT [-o options]", file=sys.stderr)
        return EXIT_USAGE
    if fake:
        return 0
    if namespace is not None:
        from zvfs.stores.url import is_url

        # paths given relative to where mount(8) ran; setns moves the cwd to the namespace's root
        positional = [p if is_url(p) else os.path.abspath(p) for p in positional]
        try:
            from zvfs.mounts import enter_mount_namespace

            enter_mount_namespace(namespace)
        except OSError as exc:
            print(f"mount.zvfs: cannot enter the mount namespace {namespace}: {exc.strerror or exc} "
                  "(-N takes /proc/PID/ns/mnt of a process in that namespace; entering one needs root)",
                  file=sys.stderr)
            return EXIT_FAIL
    cmd = ["mount", *positional]
    for value in o_values:
        cmd += ["-o", value]
    return main(cmd)


if __name__ == "__main__":
    sys.exit(main())

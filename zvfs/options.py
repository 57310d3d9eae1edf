"""Mount options: one table feeds argparse flags, ``-o key=value`` and fstab.

Every option has a long flag (``--cache-size 1G``) and the same name as a
``-o`` key with underscores (``-o cache_size=1G``), so a command line, an
/etc/fstab line and a systemd unit say the same things the same way.
"""

from __future__ import annotations

import argparse
import grp
import math
import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_size(text: str) -> int:
    """'512M', '1G', '1.5GiB', '1048576' -> bytes (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size >= 0 (use e.g. 512M, 2G, 1048576)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _number(text: str, convert: Callable[[str], float] = float) -> float:
    """``convert(text)``, or NaN when it is no number: the caller then says what it expects."""
    try:
        return convert(text)
    except ValueError:
        return math.nan


def parse_ttl(text: str) -> float | None:
    """Seconds, or 'indefinite' (None): the store never changes while mounted."""
    if str(text).strip().lower() == "indefinite":
        return None
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a number of seconds >= 0 or 'indefinite'")
    return value


def parse_seconds(text: str) -> float:
    """A timeout: a number of seconds > 0."""
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a number of seconds > 0")
    return value


def parse_micros(text: str) -> int:
    """A short wait in microseconds: an integer from 0 to 10000."""
    value = _number(text, int)
    if not 0 <= value <= 10_000:  # NaN too
        raise ValueError(f"{text!r} is not a number of microseconds from 0 to 10000")
    return int(value)


def parse_count(text: str) -> int:
    """A count of workers or tries: an integer of at least 1 (0 threads would hang every read)."""
    value = _number(text, int)
    if not value >= 1:  # NaN too
        raise ValueError(f"{text!r} is not an integer >= 1")
    return int(value)


def parse_processes(text: str) -> int | None:
    """A count of helper processes: an integer from 0 (none) to 64, or 'auto' (None)."""
    if str(text).strip().lower() == "auto":
        return None
    value = _number(text, int)
    if not 0 <= value <= 64:  # NaN too
        raise ValueError(f"{text!r} is not an integer from 0 to 64")
    return int(value)


def parse_part_size(text: str) -> int:
    """An S3 multipart part size: S3 refuses parts under 5 MiB (but the last) and over 5 GiB."""
    size = parse_size(text)
    if size < 5 << 20:
        raise ValueError(f"{text!r} is smaller than S3's 5M minimum part size")
    if size > 5 << 30:
        raise ValueError(f"{text!r} is larger than S3's 5G maximum part size")
    return size


def parse_addr(text: str) -> str:
    """'PORT', ':PORT' or 'HOST:PORT' -> 'HOST:PORT'; the host defaults to 127.0.0.1 (not exposed).
    Port 0 asks the OS for a free port: a port picked beforehand may be taken before it is bound."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep:
        host, port = "", str(text).strip()
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT with a port from 0 (any free one) to 65535 "
                         "(e.g. 127.0.0.1:9464)")
    return join_addr(host.strip("[]") or "127.0.0.1", int(port))


def join_addr(host: str, port: int) -> str:
    """'HOST:PORT', an IPv6 host bracketed ('[::1]:9464'), as a URL and a reader need it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_addr(addr: str) -> tuple[str, int]:
    """(host, port) of an address parse_addr returned; the host without brackets."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def metrics_url(addr: str) -> str:
    """The URL of the metrics served at ``addr`` ('HOST:PORT', as parse_addr returns it)."""
    return f"http://{join_addr(*split_addr(addr))}/metrics"


def parse_uid(text: str) -> int:
    """A user: a name from the user database, or a number."""
    return _parse_id(text, "user", lambda name: pwd.getpwnam(name).pw_uid)


def parse_gid(text: str) -> int:
    """A group: a name from the group database, or a number."""
    return _parse_id(text, "group", lambda name: grp.getgrnam(name).gr_gid)


def _parse_id(text: str, what: str, by_name: Callable[[str], int]) -> int:
    text = str(text).strip()
    if text.isdigit():
        value = int(text)
        if value >= 2**32 - 1:  # (uid_t)-1 means "no change" to the kernel
            raise ValueError(f"{text!r} is not a {what} number below 4294967295")
        return value
    try:
        return by_name(text)
    except KeyError:
        raise ValueError(f"no {what} called {text!r} on this machine (give a name or a number)") from None


def parse_mode(text: str) -> int:
    """Permission bits in octal: '0640', '640' or '0o640' (no setuid, setgid or sticky bit)."""
    digits = str(text).strip().lower().removeprefix("0o")
    if not re.fullmatch(r"[0-7]{1,4}", digits) or int(digits, 8) > 0o777:
        raise ValueError(f"{text!r} is not permission bits in octal from 000 to 777 (e.g. 0644)")
    return int(digits, 8)


def parse_path(text: str) -> str:
    """A local path, made absolute (the daemon runs in /)."""
    return os.path.abspath(os.path.expanduser(text))


def parse_log_file(text: str) -> str:
    """A log file path made absolute, or the word 'syslog' (/dev/log)."""
    return text if text == "syslog" else parse_path(text)


def format_value(opt: Option, value: Any) -> str:
    """The inverse of ``opt.parse``, so resolved options can be passed on as flags."""
    if opt.parse is parse_ttl and value is None:
        return "indefinite"
    if opt.parse is parse_processes and value is None:
        return "auto"
    if opt.parse in (parse_size, parse_part_size):
        return _human(value)
    if opt.parse is parse_mode:
        return f"{value:04o}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


#: S3's storage classes that an upload may ask for
STORAGE_CLASSES = ("STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING",
                   "GLACIER", "DEEP_ARCHIVE", "OUTPOSTS", "GLACIER_IR", "SNOW", "EXPRESS_ONEZONE")
#: options that only an S3 source's writes have a use for (each is one upload parameter)
S3_WRITE_OPTIONS = ("sse", "sse_kms_key_id", "storage_class")
#: options that only a writable S3 mount has a use for
S3_WRITABLE_OPTIONS = (*S3_WRITE_OPTIONS, "abort_uploads")
#: options that only an S3 source has a use for: how it is reached, signed and retried, and
#: how its writes are staged and uploaded
S3_OPTIONS = ("endpoint_url", "region", "profile", "no_sign_request", "requester_pays", "s3_attempts",
              "s3_timeout", "s3_deadline", "allow_empty", "staging_max_size", "staging_min_free",
              "part_size", "rewrite_max_size", *S3_WRITABLE_OPTIONS)


def flag(name: str) -> str:
    """The command-line flag of option ``name``: ``cache_size`` -> ``--cache-size``."""
    return "--" + name.replace("_", "-")


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    parse.choices = allowed  # type: ignore[attr-defined]
    return parse


@dataclass(frozen=True)
class Option:
    name: str  # -o key; the flag is --name-with-dashes
    parse: Callable[[str], Any] | None  # None: a boolean switch
    default: Any
    help: str
    #: what --help shows as the default when it is not simply the value (None: no default)
    shown_default: str | None = None
    #: other -o keys meaning the same (e.g. fuse's 'nonempty')
    aliases: tuple[str, ...] = ()

    @property
    def choices(self) -> tuple[str, ...] | None:
        return getattr(self.parse, "choices", None)

    def help_text(self) -> str:
        """The help line with its default spelled out, as --help shows it."""
        also = f"; also -o {', -o '.join(self.aliases)}" if self.aliases else ""
        if self.parse is None:
            return f"{self.help} (default: off{also})"
        shown = self.shown_default
        if shown is None and self.default is not None:
            shown = format_value(self, self.default)
        return f"{self.help} (default: {shown}{also})" if shown else self.help + (f" ({also[2:]})" if also else "")


def _human(n: int) -> str:
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


OPTIONS: tuple[Option, ...] = (
    Option("endpoint_url", str, None, "S3 endpoint URL (e.g. http://127.0.0.1:9000 for MinIO or moto)",
           shown_default="AWS"),
    Option("region", str, None, "S3 region", shown_default="from the AWS config chain"),
    Option("profile", str, None, "AWS profile name from ~/.aws/config", shown_default="from the AWS config chain"),
    Option("no_sign_request", None, False, "access S3 anonymously (public buckets)"),
    Option("metadata_ttl", parse_ttl, 60.0, "seconds to cache listings and attributes, or 'indefinite' for data that never changes"),
    Option("cache_size", parse_size, 512 << 20, "memory bound for decoded chunks (e.g. 512M, 2G)"),
    Option("decoded", _choice("hidden", "visible", "off"), "hidden", "the .zvfs/ decoded views: hidden from the root listing, visible, or off"),
    Option("cache_dir", parse_path, None, "S3: keep fetched objects on disk here too (a disk tier under the memory cache; a directory or zip source keeps nothing here)",
           shown_default="off"),
    Option("cache_max_size", parse_size, 10 << 30, "bound for --cache-dir (e.g. 10G)"),
    Option("cache_min_free", parse_size, 1 << 30, "free space --cache-dir always leaves on its disk"),
    Option("s3_attempts", parse_count, 10, "tries per S3 request: throttling, 5xx, resets, stalls and broken bodies are retried with exponential backoff and jitter"),
    Option("s3_timeout", parse_seconds, 10.0, "seconds an S3 try waits to connect or for the next bytes (a try after a timeout waits twice as long as the one before, up to --s3-deadline)"),
    Option("s3_deadline", parse_seconds, 60.0, "seconds after which an S3 request stops retrying: a read fails with EIO within about twice s3_deadline + s3_timeout + 2 seconds (the kernel tries a failed read once more)"),
    Option("threads", parse_count, 16, "worker threads for store I/O and decoding (at least 1)"),
    Option("decoders", parse_processes, 0, "processes that read and decode the chunks of a local "
           "store (a directory or a zip) for the decoded views, beside the daemon, or 'auto' (as "
           "many as CPUs, and one more); 0: decode in the daemon's threads. Cold decoded reads "
           "about 25%% faster, for a process more at mount and about 10 MiB a process",
           shown_default="0"),
    Option("busy_poll", parse_micros, 100, "microseconds the daemon polls for the next request after "
           "answering one before it sleeps, when nothing else needs it (a reader going file by file asks "
           "again sooner than a sleeping daemon wakes); needs 2 CPUs; 0: never"),
    Option("allow_other", None, False, "let other users access the mount (needs user_allow_other in /etc/fuse.conf for non-root)"),
    Option("noexec", None, False, "the kernel runs no program from the mount, as mount(8)'s noexec "
           "(-o exec, mount(8)'s default, undoes it)"),
    Option("uid", parse_uid, None, "owner of every file and directory: a user name or number "
           "(other users reach the mount only with --allow-other)", shown_default="the user who mounts"),
    Option("gid", parse_gid, None, "group of every file and directory: a group name or number",
           shown_default="the group of the user who mounts"),
    Option("file_mode", parse_mode, 0o644, "permission bits of every file, in octal; a file that "
           "cannot be written (a read-only mount, .zvfs/) shows them without the write bits"),
    Option("dir_mode", parse_mode, 0o755, "permission bits of every directory, in octal; without "
           "the write bits where nothing can be written"),
    Option("log_file", parse_log_file, None, "write the log here, or 'syslog'",
           shown_default="stderr with -f; a daemon logs to /var/log/zvfs/ (root) or "
           "$XDG_STATE_HOME/zvfs/ and says where"),
    Option("log_level", _choice("debug", "info", "warning", "error"), "warning", "log level"),
    Option("allow_empty", None, False, "mount an S3 prefix that holds no keys (e.g. to write into it later)"),
    Option("allow_non_empty", None, False, "mount over a mountpoint that is not empty, hiding its files",
           aliases=("nonempty",)),
    Option("writable", None, False, "let writes through to the store (directory or S3; zip is read-only): "
           "create, write, truncate, unlink, mkdir, rmdir, rename, link"),
    Option("staging_max_size", parse_size, 10 << 30, "S3 writes: bound for the files staged on local "
           "disk until uploaded (under --cache-dir, else a private temporary directory)"),
    Option("staging_min_free", parse_size, 1 << 30, "S3 writes: free space staging always leaves on its disk"),
    Option("part_size", parse_part_size, 8 << 20, "S3 writes: multipart part size (5M to 5G); "
           "files of two parts or more are uploaded in parts, while they are written"),
    Option("rewrite_max_size", parse_size, 1 << 30, "S3 writes: the most bytes of an object opened "
           "without O_TRUNC fetched to change it in place (a write into it, an append, a truncate that "
           "keeps them); past it that operation is EFBIG (the open, reads and truncate -s 0 fetch nothing)"),
    Option("abort_uploads", None, False, "S3 writes: at mount, abort the unfinished multipart uploads "
           "under the prefix (left by a writer that was killed)"),
    Option("sse", _choice("AES256", "aws:kms", "aws:kms:dsse"), None, "S3 writes: server-side "
           "encryption of the objects written (S3-managed keys, KMS, or dual-layer KMS)",
           shown_default="the bucket's default"),
    Option("sse_kms_key_id", str, None, "S3 writes: the KMS key (ID or ARN) of --sse aws:kms or "
           "aws:kms:dsse", shown_default="the account's AWS managed key"),
    Option("storage_class", _choice(*STORAGE_CLASSES), None, "S3 writes: the storage class of the "
           "objects written", shown_default="none: S3 stores STANDARD"),
    Option("requester_pays", None, False, "S3: send every request as paid by the requester (to "
           "read or write a bucket that has Requester Pays on)"),
    Option("metrics_addr", parse_addr, None, "serve Prometheus metrics at HOST:PORT (host 127.0.0.1 "
           "unless given; port 0: a free one, shown by the log and zvfs status)", shown_default="off"),
    Option("metrics_label", str, None, "the 'mount' label of the metrics", shown_default="the source"),
)

BY_NAME = {o.name: o for o in OPTIONS}
#: every -o key, aliases included
BY_KEY = {**BY_NAME, **{a: o for o in OPTIONS for a in o.aliases}}

#: generic mount(8)/fstab options that mean nothing to zvfs and are accepted silently
IGNORED = {"rw", "ro", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
           "nofail", "_netdev", "_rnetdev", "suid", "nosuid", "dev", "nodev",
           "atime", "noatime", "relatime", "norelatime", "strictatime", "nostrictatime", "diratime",
           "nodiratime", "lazytime", "nolazytime", "symfollow", "nosymfollow", "iversion",
           "noiversion", "sync", "async", "dirsync", "silent", "loud", "default_permissions",
           # the kernel's own FUSE options, which the mount table shows (an fstab line copied
           # from it holds them): set by the mount itself, whatever they say (uid/gid own files)
           "user_id", "group_id", "rootmode", "max_read", "blksize"}

#: generic options that turn a switch off: mount(8)'s default, given to undo an fstab line's
#: opposite. suid and dev stay ignored: a FUSE mount is always nosuid and nodev
NEGATIONS = {"exec": "noexec"}

#: the words a switch's -o value may be (a bare key means on)
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for opt in OPTIONS:
        if opt.parse is None:
            parser.add_argument(flag(opt.name), dest=opt.name, action="store_true", default=None, help=opt.help_text())
        else:
            metavar = "{" + ",".join(opt.choices) + "}" if opt.choices else opt.name.upper()
            parser.add_argument(flag(opt.name), dest=opt.name, default=None, metavar=metavar,
                                help=opt.help_text())
    parser.add_argument("-o", dest="o", action="append", default=[], metavar="OPT[,OPT...]",
                        help="any option above as key=value (switches as bare keys), comma separated")


#: one item of an -o list: a value in double quotes may hold commas (mount(8)'s own rule:
#: `-o context="a,b"`, which mount passes on to its helper quotes and all), and a backslash
#: escapes a comma anywhere
_O_ITEM = re.compile(r'(?:"[^"]*"|\\.|\\$|[^,\\])+')


def split_o(values: list[str]) -> list[str]:
    """Split -o lists on commas, keeping backslash-escaped commas inside values, and the
    commas of a value in double quotes (the quotes are dropped: `key="a,b"` is key=a,b)."""
    out: list[str] = []
    for value in values:
        for item in _O_ITEM.findall(value):
            key, eq, v = item.partition("=")
            if eq and len(v) >= 2 and v[0] == v[-1] == '"':
                v = v[1:-1]
            out.append(key + eq + re.sub(r"\\,", ",", v))
    return out


def resolve(ns: argparse.Namespace) -> dict[str, Any]:
    """Merge flags and -o into typed values; flags win over -o. Raises ValueError with a user message."""
    raw: dict[str, Any] = {}
    read_only = False
    for item in split_o(ns.o):
        given, eq, value = item.partition("=")
        given = given.strip()
        key = given.replace("-", "_")
        # x-* and comment=: for systemd, mount(8) and desktops (x-systemd.*, x-gvfs-show)
        if key in IGNORED or given.lower().startswith("x-") or given == "comment":
            read_only = read_only or key == "ro"
            continue
        if key in NEGATIONS and not eq:
            raw[NEGATIONS[key]] = False
            continue
        opt = BY_KEY.get(key)
        if opt is None:
            raise ValueError(f"unknown option -o {given}; the options are listed by: zvfs mount --help")
        if opt.parse is None:
            if eq and value.strip().lower() not in _ON + _OFF:
                raise ValueError(f"invalid -o {given}={value}: a switch is on or off ("
                                 f"{'/'.join(_ON)} or {'/'.join(_OFF)}), or on as a bare -o {given}")
            raw[opt.name] = value.strip().lower() in _ON if eq else True
        else:
            if not eq:
                raise ValueError(f"option -o {key} needs a value: -o {key}=VALUE")
            raw[opt.name] = value
    for opt in OPTIONS:
        flag_value = getattr(ns, opt.name, None)
        if flag_value is not None:
            overridden = raw.get(opt.name)
            if opt.parse is not None and isinstance(overridden, str):
                try:  # the flag wins, but a typo in the -o it overrides is still told
                    opt.parse(overridden)
                except ValueError as exc:
                    raise ValueError(f"invalid -o {opt.name}={overridden} (the {flag(opt.name)} given "
                                     f"too wins, but fix or drop it): {exc}") from None
            raw[opt.name] = flag_value
    if read_only and raw.get("writable"):
        raise ValueError("-o ro and writable contradict each other: drop one of them")
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.name not in raw:
            values[opt.name] = opt.default
        elif opt.parse is None or not isinstance(raw[opt.name], str):
            values[opt.name] = raw[opt.name]
        else:
            try:
                values[opt.name] = opt.parse(raw[opt.name])
            except ValueError as exc:
                raise ValueError(f"invalid {flag(opt.name)} (-o {opt.name}): {exc}") from None
    return values

"""Mount options: one table feeds argparse flags, ``-o key=value`` and fstab.

Every option has a long flag (``--cache-size 1G``) and the same name as a
``-o`` key with underscores (``-o cache_size=1G``), so a command line, an
/etc/fstab line and a systemd unit say the same things the same way.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_size(text: str) -> int:
    """'512M', '1G', '1.5GiB', '1048576' -> bytes (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 2G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def parse_ttl(text: str) -> float | None:
    """Seconds, or 'indefinite' (None): the store never changes while mounted."""
    if str(text).lower() in ("indefinite", "inf", "infinite", "forever"):
        return None
    value = float(text)
    if value < 0:
        raise ValueError("metadata TTL cannot be negative")
    return value


def parse_path(text: str) -> str:
    """A local path, made absolute (the daemon runs in /)."""
    return os.path.abspath(os.path.expanduser(text))


def format_value(opt: Option, value: Any) -> str:
    """The inverse of ``opt.parse``, so resolved options can be passed on as flags."""
    if opt.parse is parse_ttl and value is None:
        return "indefinite"
    return str(value)


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return parse


@dataclass(frozen=True)
class Option:
    name: str  # -o key; the flag is --name-with-dashes
    parse: Callable[[str], Any] | None  # None: a boolean switch
    default: Any
    help: str


OPTIONS: tuple[Option, ...] = (
    Option("endpoint_url", str, None, "S3 endpoint URL (e.g. http://127.0.0.1:9000 for MinIO or moto)"),
    Option("region", str, None, "S3 region (default: from the AWS config chain)"),
    Option("profile", str, None, "AWS profile name from ~/.aws/config"),
    Option("no_sign_request", None, False, "access S3 anonymously (public buckets)"),
    Option("metadata_ttl", parse_ttl, 60.0, "seconds to cache listings and attributes, or 'indefinite' for data that never changes"),
    Option("cache_size", parse_size, 512 << 20, "memory bound for decoded chunks (e.g. 512M, 2G)"),
    Option("decoded", _choice("hidden", "visible", "off"), "hidden", "the .zvfs/ decoded views: hidden from the root listing, visible, or off"),
    Option("cache_dir", parse_path, None, "keep fetched objects on disk here too (a disk tier under the memory cache); off by default"),
    Option("cache_max_size", parse_size, 10 << 30, "bound for --cache-dir (e.g. 10G)"),
    Option("cache_min_free", parse_size, 1 << 30, "free space --cache-dir always leaves on its disk"),
    Option("s3_attempts", int, 10, "tries per S3 request: throttling, 5xx, resets, stalls and broken bodies are retried with exponential backoff and jitter"),
    Option("s3_timeout", float, 10.0, "seconds an S3 try waits to connect or for the next bytes"),
    Option("s3_deadline", float, 60.0, "seconds after which an S3 request stops retrying: a read fails with EIO within about s3_deadline + s3_timeout"),
    Option("threads", int, 16, "worker threads for store I/O and decoding"),
    Option("allow_other", None, False, "let other users access the mount (needs user_allow_other in /etc/fuse.conf for non-root)"),
    Option("log_file", parse_path, None, "write the log here (default: stderr; syslog when daemonized)"),
    Option("log_level", _choice("debug", "info", "warning", "error"), "warning", "log level"),
)

BY_NAME = {o.name: o for o in OPTIONS}

#: generic mount(8)/fstab options that mean nothing to zvfs and are accepted silently
IGNORED = {"rw", "ro", "defaults", "auto", "noauto", "user", "nouser", "users", "nofail", "_netdev",
           "exec", "noexec", "suid", "nosuid", "dev", "nodev", "atime", "noatime", "relatime", "sync", "async"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for opt in OPTIONS:
        flag = "--" + opt.name.replace("_", "-")
        if opt.parse is None:
            parser.add_argument(flag, dest=opt.name, action="store_true", default=None, help=opt.help)
        else:
            parser.add_argument(flag, dest=opt.name, default=None, metavar=opt.name.upper(), help=opt.help)
    parser.add_argument("-o", dest="o", action="append", default=[], metavar="OPT[,OPT...]",
                        help="any option above as key=value (switches as bare keys), comma separated")


def split_o(values: list[str]) -> list[str]:
    """Split -o lists on commas, keeping backslash-escaped commas inside values."""
    out: list[str] = []
    for value in values:
        out.extend(p.replace("\\,", ",") for p in re.split(r"(?<!\\),", value) if p)
    return out


def resolve(ns: argparse.Namespace) -> dict[str, Any]:
    """Merge flags and -o into typed values; flags win over -o. Raises ValueError with a user message."""
    raw: dict[str, Any] = {}
    for item in split_o(ns.o):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key in IGNORED or key.startswith("x-") or key.startswith("comment="):
            continue
        opt = BY_NAME.get(key)
        if opt is None:
            known = ", ".join(sorted(BY_NAME))
            raise ValueError(f"unknown option -o {key}; known options: {known}")
        if opt.parse is None:
            raw[key] = value.lower() not in ("0", "false", "no", "off") if eq else True
        else:
            if not eq:
                raise ValueError(f"option -o {key} needs a value: -o {key}=VALUE")
            raw[key] = value
    for opt in OPTIONS:
        flag_value = getattr(ns, opt.name, None)
        if flag_value is not None:
            raw[opt.name] = flag_value
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
                raise ValueError(f"bad value for {opt.name}: {exc}") from None
    return values

"""Turn a SOURCE argument into a :class:`SourceSpec` (:mod:`zvfs.stores.opener` opens one).

Accepted forms (see DESIGN.md):

* a directory path, or a ``.zip`` path (any regular file that is a zip archive);
* ``s3://bucket[/prefix]``;
* NCZarr URLs: ``file:///path#mode=zarr,file``, ``file:///path.zip#mode=nczarr,zip``,
  ``https://s3.<region>.amazonaws.com/bucket/prefix`` (path style),
  ``https://bucket.s3.<region>.amazonaws.com/prefix`` (virtual-host style),
  ``https://s3.amazonaws.com/bucket/prefix``, and any other ``http(s)://host/bucket/prefix``
  with ``s3`` in its mode list (an S3-compatible endpoint).

Fragment keys ``aws.profile=`` and ``aws.region=`` set the profile and region.
Precedence: explicit flags, then the fragment, then the URL's hostname, then
the standard AWS chain (environment, config files).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, unquote_to_bytes, urlsplit

from zvfs.stores.base import SourceError

Kind = Literal["directory", "zip", "s3"]

#: the raw view's read unit on S3: one GET serves many FUSE reads
S3_BLOCK_SIZE = 4 << 20

ACCEPTED_FORMS = (
    "a directory path, a .zip file, s3://bucket[/prefix], "
    "file:///path#mode=zarr,file, file:///path.zip#mode=nczarr,zip, "
    "https://s3.<region>.amazonaws.com/bucket/prefix, "
    "https://bucket.s3.<region>.amazonaws.com/prefix, "
    "or http(s)://host[:port]/bucket/prefix#mode=zarr,s3 for an S3-compatible endpoint"
)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# s3.amazonaws.com, s3.<region>.amazonaws.com, s3-<region>.amazonaws.com,
# s3.dualstack.<region>.amazonaws.com (and .amazonaws.com.cn); optional "<bucket>." in front.
_AWS_HOST = re.compile(
    r"^(?:(?P<bucket>.+)\.)?s3(?:[.-](?:dualstack\.)?(?P<region>[a-z0-9-]+))?"
    r"\.amazonaws\.com(?:\.cn)?$"
)


#: what such a host's "region" may be and is not: Transfer Acceleration and the static
#: website endpoints (no S3 API to list, or no region), taken for regions of those names
_NOT_REGIONS = ("accelerate", "website")


def check_endpoint(url: str) -> None:
    """Refuse an S3 endpoint URL that can never work, as a configuration error (exit 78,
    which systemd does not retry): botocore refused a bad scheme or port late, as if the
    server could not be reached (exit 1), and a user and password in it were shown in
    stats.json, `zvfs status` and error lines, unused (a helper's audit)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise SourceError(f"the S3 endpoint URL {url!r} has no scheme: use --endpoint-url http://{url} (or https://)")
    if scheme.lower() not in ("http", "https"):
        raise SourceError(f"the S3 endpoint URL {url!r} is not http:// or https://: "
                          f"use --endpoint-url http://{rest} (or https://)")
    u = urlsplit(url)
    if "@" in u.netloc:
        raise SourceError(f"the S3 endpoint URL {scheme}://…@{u.netloc.rpartition('@')[2]} holds a user "
                          "name or password, which zvfs does not use (and would show): give the keys "
                          "through the AWS chain (AWS_ACCESS_KEY_ID, ~/.aws/credentials, --profile)")
    if not u.hostname:
        raise SourceError(f"the S3 endpoint URL {url!r} names no host")
    try:
        u.port  # noqa: B018 - urlsplit checks the port when it is read
    except ValueError:
        raise SourceError(f"the S3 endpoint URL {url!r} has a port that is no number from 0 to 65535") from None


def is_aws_endpoint(url: str) -> bool:
    """``url`` names one of Amazon S3's own endpoints (not an S3-compatible server)."""
    return _AWS_HOST.match((urlsplit(url).hostname or "").lower()) is not None


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where the data lives and how to reach it; building one does no network I/O."""

    kind: Kind
    path: str | None = None  # absolute path, for directory and zip
    bucket: str | None = None
    prefix: str = ""  # S3 key prefix, no leading '/', '' or ending in '/'
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    no_sign_request: bool = False
    requester_pays: bool = False

    def describe(self) -> str:
        """Short name for fsname= and log lines: '/abs/path' or 's3://bucket/prefix'."""
        if self.kind == "s3":
            tail = self.prefix.rstrip("/")
            return f"s3://{self.bucket}/{tail}" if tail else f"s3://{self.bucket}"
        return str(self.path)


def is_url(source: str) -> bool:
    """SOURCE names a URL (``s3://``, ``file://``, ``https://``), not a local path."""
    return _SCHEME.match(source) is not None


def parse_source(
    source: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    no_sign_request: bool = False,
    requester_pays: bool = False,
) -> SourceSpec:
    """Parse SOURCE; local paths are checked (exists, directory or zip), S3 is not contacted."""
    if not source:
        raise SourceError(f"empty source; expected {ACCEPTED_FORMS}")
    m = _SCHEME.match(source)
    if m is None:
        return _local(source, modes=set())
    scheme = m.group(1).lower()
    body, _, fragment = source.partition("#")
    if scheme == "s3" and "#" in source:
        # an S3 key may hold '#' (s3://bkt/run#3/x.zarr, as the AWS CLI takes it): what
        # follows the last '#' is a fragment only if it is NCZarr's (mode=, aws.profile=...);
        # else it is part of the prefix. Cut at the first '#', such a source mounted the
        # prefix before it (run/, a parent holding other data), without a word; and an
        # empty tail is none (s3://bkt/run# mounted run/)
        head, _, tail = source.rpartition("#")
        body, fragment = (head, tail) if _is_fragment(tail) else (source, "")
    frag = _fragment(fragment)
    modes = {x.strip().lower() for x in frag.get("mode", "").split(",") if x.strip()}
    s3 = {
        "endpoint_url": endpoint_url,
        "region": region or frag.get("aws.region") or None,
        "profile": profile or frag.get("aws.profile") or None,
        "no_sign_request": no_sign_request,
        "requester_pays": requester_pays,
    }
    if scheme == "file":
        u = urlsplit(body)
        if u.netloc not in ("", "localhost"):
            raise SourceError(f"file URL {source!r} names host {u.netloc!r}; only local files work")
        # the path's bytes: %FF is a byte of a name, as a path argument's (U+FFFD before)
        return _local(os.fsdecode(unquote_to_bytes(u.path)), modes=modes)
    if scheme == "s3":
        rest = body[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise SourceError(f"S3 URL {source!r} has no bucket; expected s3://bucket[/prefix]")
        return _s3(bucket, prefix, **s3)
    if scheme in ("http", "https"):
        u = urlsplit(body)
        host = (u.hostname or "").lower()
        path = unquote(u.path).lstrip("/")
        hm = _AWS_HOST.match(host)
        if hm and not hm.group("bucket"):
            bucket, _, prefix = path.partition("/")
        elif hm:
            bucket, prefix = hm.group("bucket"), path
        elif "s3" in modes:
            bucket, _, prefix = path.partition("/")
            if not s3["endpoint_url"]:
                check_endpoint(f"{u.scheme}://{u.netloc}")
                s3["endpoint_url"] = f"{u.scheme}://{u.netloc}"
        else:
            raise SourceError(
                f"{source!r} is not an Amazon S3 URL; for an S3-compatible server add "
                f"'#mode=zarr,s3'. Accepted: {ACCEPTED_FORMS}"
            )
        if not bucket:
            raise SourceError(f"S3 URL {source!r} has no bucket name")
        region = hm.group("region") if hm else None
        if region and region.startswith(_NOT_REGIONS):
            raise SourceError(f"{host} is an Amazon S3 {region.split('-')[0]} endpoint, which zvfs does "
                              f"not read: use s3://{bucket}/{prefix} with --region")
        if region == "external-1":  # the legacy us-east-1 endpoint
            region = "us-east-1"
        if region and not s3["region"]:
            s3["region"] = region
        return _s3(bucket, prefix, **s3)
    raise SourceError(f"unsupported source {source!r} (scheme {scheme}://); expected {ACCEPTED_FORMS}")


#: the keys of an NCZarr URL fragment (what zvfs reads, and netCDF-C's own others)
_FRAGMENT_KEYS = frozenset({"mode", "aws.profile", "aws.region", "log", "show"})


def _is_fragment(text: str) -> bool:
    """Whether ``text`` (after a '#') is an NCZarr fragment: '&'-separated items, each a key
    it knows, bare or with '=value'."""
    return all(unquote(part.partition("=")[0]).strip().lower() in _FRAGMENT_KEYS
               for part in text.split("&") if part) and bool(text.strip("&"))


def _fragment(fragment: str) -> dict[str, str]:
    """NCZarr fragment: '&'-separated key=value pairs; a bare key has the value ''."""
    out: dict[str, str] = {}
    for part in fragment.split("&"):
        if part:
            k, _, v = part.partition("=")
            out[unquote(k).strip().lower()] = unquote(v).strip()
    return out


def _s3(bucket: str, prefix: str, **kw: object) -> SourceSpec:
    prefix = prefix.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return SourceSpec("s3", bucket=bucket, prefix=prefix, **kw)  # type: ignore[arg-type]


def _local(raw: str, *, modes: set[str]) -> SourceSpec:
    """A local path: a directory, or a zip file (by its name, by mode=zip, or by its content)."""
    path = os.path.abspath(os.path.expanduser(raw))
    want_zip = "zip" in modes
    want_dir = "file" in modes and not want_zip
    looks_zip = path.lower().endswith(".zip")
    if not os.path.exists(path):
        what = "zip file" if (want_zip or looks_zip) and not want_dir else "directory"
        raise SourceError(f"source {what} {path} does not exist")
    if os.path.isdir(path):
        if want_zip:
            raise SourceError(f"mode=zip was given but {path} is a directory, not a zip file")
        return SourceSpec("directory", path=path)
    if not os.path.isfile(path):
        raise SourceError(f"source {path} is neither a directory nor a regular file")
    if want_dir:
        raise SourceError(f"mode=file was given but {path} is a file, not a directory")
    if want_zip or looks_zip:
        return SourceSpec("zip", path=path)
    import zipfile  # only for a file whose name does not say (a directory mount never needs it)

    if zipfile.is_zipfile(path):
        return SourceSpec("zip", path=path)
    raise SourceError(f"source {path} is a regular file but not a zip archive; "
                      "mount a Zarr directory, a .zip file or s3://bucket/prefix")

"""Listing pages (ListObjectsV2, ListObjects) parsed by ElementTree, not by botocore's
walk of the output shape.

A flat listing is pages of 1,000 keys one after another, and each page costs the daemon
CPU on its one GIL: botocore walks the output shape for every field of every key (about
17 ms a page here with the store's timestamp parser, 78 with its own), after parsing the
page once already to see whether a 200 hides an S3 error (about 4 ms). ElementTree alone
reads the page in about 4 ms. Measured against moto, a client's CPU for a 1,000-key page
fell from 46 ms to 18 (medians of 8 listings), and the daemon's CPU for a `find` of a
20,000-key bucket from 1.37 s to 1.05 (6 alternated pairs). On S3 in its region, where a
page comes in some tens of milliseconds, that CPU is a large share of a big listing.

The page parsed here is the dict botocore would make of it, to the same types, for every
element this module knows (each compared with botocore's own parse in
tests/test_s3_pages.py). A page it does not take whole is left to botocore as before: one
that is not well-formed, whose root is not ListBucketResult (an Error in a 200), or that
holds any element it does not know (a field S3 adds later, that the store might one day
read). It runs as botocore's before-parse hook: it hands botocore an empty body and gives
its page as the customized response botocore merges into its (empty) parse, so headers
are still read by botocore.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import datetime
from typing import Any

from botocore import handlers

#: the listings this takes over
LISTINGS = frozenset({"ListObjectsV2", "ListObjects"})

_TEXT = {"Name", "Prefix", "Delimiter", "EncodingType", "ContinuationToken",
         "NextContinuationToken", "StartAfter", "Marker", "NextMarker"}
_INTS = {"MaxKeys", "KeyCount"}
_OBJECT_TEXT = {"Key", "ETag", "StorageClass", "ChecksumType"}
_OWNER = {"ID", "DisplayName"}
_PREFIX = {"Prefix"}


class _NotOurs(Exception):
    """The page holds something this parser leaves to botocore."""


def parse_page(body: bytes, timestamp: Callable[[str], datetime]) -> dict[str, Any] | None:
    """The listing page ``body`` as botocore parses it (its ResponseMetadata aside), or None
    when botocore should parse it (see the module's docstring)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    tag = root.tag
    ns = tag[: tag.index("}") + 1] if tag.startswith("{") else ""
    if tag[len(ns):] != "ListBucketResult":
        return None
    cut = len(ns)
    page: dict[str, Any] = {}
    contents: list[dict[str, Any]] = []
    prefixes: list[dict[str, str]] = []
    try:
        for child in root:
            name = child.tag[cut:]
            text = child.text or ""
            if name == "Contents":
                contents.append(_object(child, cut, timestamp))
            elif name == "CommonPrefixes":
                prefixes.append(_texts(child, cut, _PREFIX))
            elif len(child) or name in page:  # one of each: botocore's reading of two is its own
                raise _NotOurs
            elif name in _TEXT:
                page[name] = text
            elif name in _INTS:
                page[name] = int(text)
            elif name == "IsTruncated":
                page[name] = text == "true"  # as botocore reads a boolean
            else:
                raise _NotOurs
    except (_NotOurs, ValueError):
        return None
    if contents:
        page["Contents"] = contents
    if prefixes:
        page["CommonPrefixes"] = prefixes
    return page


def _object(element: ET.Element, cut: int, timestamp: Callable[[str], datetime]) -> dict[str, Any]:
    """One Contents entry, as botocore parses it."""
    obj: dict[str, Any] = {}
    for field in element:
        name = field.tag[cut:]
        text = field.text or ""
        if name == "Owner" and name not in obj:
            obj[name] = _texts(field, cut, _OWNER)
        elif len(field) or (name in obj and name != "ChecksumAlgorithm"):
            raise _NotOurs
        elif name in _OBJECT_TEXT:
            obj[name] = text
        elif name == "Size":
            obj[name] = int(text)
        elif name == "LastModified":
            obj[name] = timestamp(text)
        elif name == "ChecksumAlgorithm":  # a list, each algorithm its own element
            obj.setdefault(name, []).append(text)
        else:
            raise _NotOurs
    return obj


def _texts(element: ET.Element, cut: int, names: set[str]) -> dict[str, str]:
    """A structure of text fields (an Owner, a CommonPrefixes entry), each at most once."""
    out: dict[str, str] = {}
    for part in element:
        name = part.tag[cut:]
        if name not in names or len(part) or name in out:
            raise _NotOurs
        out[name] = part.text or ""
    return out


def take_over(client: Any, timestamp: Callable[[str], datetime]) -> bool:
    """Have ``client`` parse its listing pages here. Returns False, and changes nothing,
    where botocore is not laid out as expected.

    botocore's check of every S3 answer for an error inside a 200 (``_handle_200_error``,
    registered first for ``before-parse.s3.*``) would parse the page before any hook of the
    operation's own runs; it is replaced by one hook that parses a listing page first and
    then calls that check, which finds the body emptied for a page taken here, and the
    body as it came for every other answer."""
    check = getattr(handlers, "_handle_200_error", None)
    events = getattr(getattr(client, "meta", None), "events", None)
    if check is None or events is None:
        return False

    def before_parse(operation_model: Any, response_dict: dict[str, Any],
                     customized_response_dict: dict[str, Any] | None = None, **kw: Any) -> None:
        if (customized_response_dict is not None and response_dict
                and operation_model.name in LISTINGS and response_dict.get("status_code") == 200
                and isinstance(response_dict.get("body"), bytes)):
            page = parse_page(response_dict["body"], timestamp)
            if page is not None:
                customized_response_dict.update(page)
                response_dict["body"] = b""
        check(operation_model=operation_model, response_dict=response_dict, **kw)

    events.unregister("before-parse.s3.*", check)
    events.register_first("before-parse.s3.*", before_parse, unique_id="zvfs-listing-pages")
    return True

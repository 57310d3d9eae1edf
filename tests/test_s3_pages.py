"""Listing pages parsed by zvfs.stores.s3_pages, against botocore's own parse of the same
bytes (the reference: the library every other S3 answer of the store goes through)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape

import botocore.session
import pytest
from botocore.parsers import ResponseParserFactory
from hypothesis import given, settings
from hypothesis import strategies as st
from moto_server import s3_client

from zvfs.stores import s3_pages
from zvfs.stores.s3_client import fast_timestamp

_MODEL = botocore.session.get_session().get_service_model("s3")
_NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def botocore_page(body: bytes, op: str) -> dict[str, Any]:
    """botocore's parse of a 200 answer, with the store's timestamp parser."""
    factory = ResponseParserFactory()
    factory.set_parser_defaults(timestamp_parser=fast_timestamp)
    parsed = factory.create_parser("rest-xml").parse(
        {"body": body, "headers": {}, "status_code": 200},
        _MODEL.operation_model(op).output_shape)
    parsed.pop("ResponseMetadata", None)
    return parsed


# text XML 1.0 can carry (no control characters but tab and newline; CR is normalised by
# every XML parser, so it reads back as LF in both), with the characters XML escapes
_text = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff")
                | st.sampled_from("&<>\"'\t\n /%+"), max_size=30)
_dates = st.datetimes(datetime(1970, 1, 1), datetime(2200, 1, 1)).map(
    lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z")
_etags = st.sampled_from(['"d41d8cd98f00b204e9800998ecf8427e"', '"9b2cf535f27731c974343645a3985328-3"',
                          "d41d8cd98f00b204e9800998ecf8427e", ""])


@st.composite
def _objects(draw: Any) -> str:
    parts = [f"<Key>{escape(draw(_text))}</Key>",
             f"<LastModified>{draw(_dates)}</LastModified>",
             f"<ETag>{escape(draw(_etags))}</ETag>",
             f"<Size>{draw(st.integers(0, 2**64))}</Size>"]
    if draw(st.booleans()):
        parts.append(f"<StorageClass>{draw(st.sampled_from(['STANDARD', 'GLACIER', 'X']))}</StorageClass>")
    for algo in draw(st.lists(st.sampled_from(["CRC32", "CRC64NVME", "SHA256"]), max_size=2)):
        parts.append(f"<ChecksumAlgorithm>{algo}</ChecksumAlgorithm>")
    if draw(st.booleans()):
        parts.append("<ChecksumType>FULL_OBJECT</ChecksumType>")
    if draw(st.booleans()):
        parts.append(f"<Owner><ID>{escape(draw(_text))}</ID>"
                     + (f"<DisplayName>{escape(draw(_text))}</DisplayName>" if draw(st.booleans()) else "")
                     + "</Owner>")
    return "<Contents>" + "".join(draw(st.permutations(parts))) + "</Contents>"


@st.composite
def _pages(draw: Any) -> tuple[bytes, str]:
    op = draw(st.sampled_from(["ListObjectsV2", "ListObjects"]))
    top = [f"<Name>{escape(draw(_text))}</Name>", f"<Prefix>{escape(draw(_text))}</Prefix>",
           f"<MaxKeys>{draw(st.integers(0, 1000))}</MaxKeys>",
           f"<IsTruncated>{draw(st.sampled_from(['true', 'false']))}</IsTruncated>"]
    names = (["KeyCount", "ContinuationToken", "NextContinuationToken", "StartAfter"]
             if op == "ListObjectsV2" else ["Marker", "NextMarker"]) + ["Delimiter", "EncodingType"]
    for name in draw(st.lists(st.sampled_from(names), unique=True)):
        value = draw(st.integers(0, 1000)) if name == "KeyCount" else escape(draw(_text))
        top.append(f"<{name}>{value}</{name}>")
    top += draw(st.lists(_objects(), max_size=6))
    top += [f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
            for p in draw(st.lists(_text, max_size=4))]
    ns = draw(st.sampled_from([_NS, ""]))
    head = draw(st.sampled_from(['<?xml version="1.0" encoding="UTF-8"?>\n', ""]))
    body = f"{head}<ListBucketResult {ns}>{''.join(draw(st.permutations(top)))}</ListBucketResult>"
    return body.encode(), op


@settings(max_examples=400, deadline=None)
@given(_pages())
def test_a_page_reads_as_botocore_reads_it(page: tuple[bytes, str]) -> None:
    body, op = page
    assert s3_pages.parse_page(body, fast_timestamp) == botocore_page(body, op)


@pytest.mark.parametrize("op", ["ListObjectsV2", "ListObjects"])
@pytest.mark.parametrize("body", [
    b"<ListBucketResult></ListBucketResult>",
    b"<ListBucketResult><Contents></Contents><CommonPrefixes/></ListBucketResult>",
    b"<ListBucketResult><Contents><Key>a</Key><Owner/></Contents></ListBucketResult>",
    # botocore's readings: a boolean is true only as "true"; an int may have spaces around it
    b"<ListBucketResult><IsTruncated>True</IsTruncated><Contents><Key/><Size> 5 </Size>"
    b"</Contents></ListBucketResult>",
])
def test_an_edge_page_reads_as_botocore_reads_it(body: bytes, op: str) -> None:
    assert s3_pages.parse_page(body, fast_timestamp) == botocore_page(body, op)


@pytest.mark.parametrize("body", [
    # not a listing: an S3 error inside a 200, which botocore's check makes a 500 (retried)
    b'<?xml version="1.0"?><Error><Code>InternalError</Code></Error>',
    # cut short, or not XML at all: botocore's check makes it a 500 too
    b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Conte',
    b"",
    # an element this parser does not know, at the top or in an object: botocore reads it
    b"<ListBucketResult><Name>b</Name><RequestCharged>requester</RequestCharged></ListBucketResult>",
    b"<ListBucketResult><Contents><Key>k</Key><RestoreStatus><IsRestoreInProgress>true"
    b"</IsRestoreInProgress></RestoreStatus></Contents></ListBucketResult>",
    # one of a kind given twice
    b"<ListBucketResult><Name>a</Name><Name>b</Name></ListBucketResult>",
    b"<ListBucketResult><Contents><Key>a</Key><Key>b</Key></Contents></ListBucketResult>",
    # a number that is none
    b"<ListBucketResult><Contents><Key>a</Key><Size>1.5</Size></Contents></ListBucketResult>",
])
def test_a_page_it_does_not_take_whole_is_left_to_botocore(body: bytes) -> None:
    assert s3_pages.parse_page(body, fast_timestamp) is None


def test_a_client_lists_through_it_as_without_it(moto, monkeypatch) -> None:
    """Against moto: the same pages with the hook as without it, and the hook took them."""
    plain, hooked = s3_client(moto.endpoint), s3_client(moto.endpoint)
    assert s3_pages.take_over(hooked, fast_timestamp)
    taken = []
    parse = s3_pages.parse_page
    monkeypatch.setattr(s3_pages, "parse_page", lambda body, ts: taken.append(parse(body, ts)) or taken[-1])
    bucket = f"pages-{uuid.uuid4().hex[:8]}"
    plain.create_bucket(Bucket=bucket)
    keys = [f"g/a &<>/{i}" for i in range(25)] + ["top", "g/zarr.json"]
    for k in keys:
        plain.put_object(Bucket=bucket, Key=k, Body=k.encode())
    for kw in ({"MaxKeys": 10}, {"Delimiter": "/"}, {"Prefix": "g/", "Delimiter": "/"}):
        for op in ("list_objects_v2", "list_objects"):
            pages = [[], []]
            for n, client in enumerate((plain, hooked)):
                args = dict(kw, Bucket=bucket)
                while True:
                    page = getattr(client, op)(**args)
                    page.pop("ResponseMetadata")
                    pages[n].append(page)
                    if not page.get("IsTruncated"):
                        break
                    if op == "list_objects_v2":
                        args["ContinuationToken"] = page["NextContinuationToken"]
                    else:
                        args["Marker"] = page.get("NextMarker") or page["Contents"][-1]["Key"]
            assert pages[0] == pages[1], (op, kw)
    assert taken and all(page is not None for page in taken)
    # an error is botocore's still
    with pytest.raises(hooked.exceptions.NoSuchBucket):
        hooked.list_objects_v2(Bucket=bucket + "-none")

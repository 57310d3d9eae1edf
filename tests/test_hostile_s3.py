"""An S3 server whose listings lie (tests/hostile_s3.py): what moto cannot be made to send.

Each case was found by an audit with a hostile server. A listing that loops held an
``ls`` for ever; one key with a size no file can have, or a date that is no date, or a
key a thousand levels deep, failed every listing of the raw tree that held it; a name
longer than 4 KiB failed its directory's listing with nothing logged. Now the bad key
costs only itself (one log line naming it), and a listing that cannot end fails.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import daemon_pids
from hostile_s3 import HostileS3, Listed
from moto_server import DUMMY_ENV

BUCKET = "hostile"


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out.update(DUMMY_ENV)
    return out


def mount_it(mount, server: HostileS3, *opts: str):
    return mount(f"s3://{BUCKET}/s", "--endpoint-url", server.endpoint, "--no-sign-request",
                 "--s3-timeout", "2", "--s3-deadline", "5", *opts, env=env())


def test_keys_listed_with_impossible_sizes_or_dates_cost_only_themselves(mount) -> None:
    good = b"good bytes\n" * 50
    objects = {"s/good.txt": good, "s/huge.bin": b"x", "s/negative.bin": b"y", "s/sizeless.bin": b"z",
               "s/undated.txt": b"no date\n", "s/sub/also.txt": b"below\n"}
    lies = {"s/huge.bin": Listed(size=2**70), "s/negative.bin": Listed(size=-5),
            "s/undated.txt": Listed(last_modified="not-a-date")}
    with HostileS3(BUCKET, objects, lies) as server:
        m = mount_it(mount, server)
        names = sorted(os.listdir(m.path))
        assert names == ["good.txt", "sizeless.bin", "sub", "undated.txt"], names
        assert (m.path / "good.txt").read_bytes() == good
        assert (m.path / "undated.txt").read_bytes() == b"no date\n"
        assert (m.path / "undated.txt").stat().st_mtime == 0  # listed, with no date to show
        assert (m.path / "sub" / "also.txt").read_bytes() == b"below\n"
        log = m.log_text()
        for key in ("huge.bin", "negative.bin"):
            lines = [ln for ln in log.splitlines() if f"skipping store key 's/{key}'" in ln]
            assert len(lines) == 1 and "no file can have" in lines[0], log[-3000:]


def test_keys_that_cannot_be_paths_are_named_as_they_are_in_one_line_each(mount) -> None:
    """Keys with an empty, '.' or '..' segment are no path: they are left out and logged once
    each. The line named the prefix they are listed under as a key ("skipping store key
    'x/'", "(empty key)" for x//y), a key the store does not hold; it names the keys under
    it now, and why. Their directories stay, with the good keys beside them."""
    objects = {"s/good.txt": b"good\n", "s/x//y": b"1", "s/a/../b": b"2", "s/./c": b"3", "s/z/ok": b"4"}
    with HostileS3(BUCKET, objects) as server:
        m = mount_it(mount, server)
        assert sorted(os.listdir(m.path)) == ["a", "good.txt", "x", "z"]
        assert os.listdir(m.path / "x") == [] and os.listdir(m.path / "a") == []
        assert (m.path / "z" / "ok").read_bytes() == b"4"
        lines = [ln.split(" WARNING ", 1)[1] for ln in m.log_text().splitlines() if "skipping" in ln]
        assert sorted(lines) == [
            "skipping the store keys under './': cannot be a POSIX path (segment '.')",
            "skipping the store keys under 'a/../': cannot be a POSIX path (segment '..')",
            "skipping the store keys under 'x//': cannot be a POSIX path (empty segment)",
        ], lines


def test_a_key_a_thousand_levels_deep_and_a_name_of_5000_bytes_cost_only_themselves(mount) -> None:
    deep = "s/" + "d/" * 1000 + "f"
    long_name = "s/" + "L" * 5000
    objects = {"s/good.txt": b"good\n", deep: b"deep\n", long_name: b"long\n", "s/" + "M" * 300: b"m\n"}
    with HostileS3(BUCKET, objects) as server:
        m = mount_it(mount, server)
        assert sorted(os.listdir(m.path)) == ["d", "good.txt"], sorted(os.listdir(m.path))[:5]
        assert (m.path / "good.txt").read_bytes() == b"good\n"
        assert os.listdir(m.path / "d") == ["d"]
        log = m.log_text()
        assert "left out of its directory's listing" in log and "a name of 5000 bytes" in log, log[-3000:]
        assert "a name of 300 bytes" in log


def test_a_listing_that_loops_fails_at_once(mount) -> None:
    """Every page truncated, handing back the same continuation token: the mount's scan
    paged for a minute, then every `ls` waited for ever. Now the second sight of the token
    ends the listing with an error naming the loop: the mount comes up at once, and its
    listing fails (EIO) within seconds, the daemon serving on."""
    objects = {f"s/k{i:03d}": b"v" for i in range(5)}
    with HostileS3(BUCKET, objects, loop_token="SAME") as server:
        t0 = time.monotonic()
        m = mount_it(mount, server)
        assert time.monotonic() - t0 < 20
        t0 = time.monotonic()
        with pytest.raises(OSError) as err:
            os.listdir(m.path)
        assert err.value.errno == errno.EIO
        assert time.monotonic() - t0 < 10
        assert "listing loops" in m.log_text() and "'SAME'" in m.log_text(), m.log_text()[-3000:]
        assert daemon_pids(m.path)


@pytest.mark.parametrize("server_kind", ["no_token", "v1_only"])
def test_truncated_pages_without_a_continuation_token_are_listed_on(mount, server_kind: str) -> None:
    """A server that answers ListObjectsV2 as V1 (IsTruncated, but no NextContinuationToken;
    one that knows only V1 also ignores continuation-token and start-after): the listing was
    taken as complete at its first page, so every name past it was missing, with nothing
    logged. Now the listing goes on with V1's markers, with one line saying so, in the flat
    listing and in a directory's alike."""
    objects = {f"s/k{i:03d}": b"v%d" % i for i in range(7)}
    objects.update({f"s/d{j}/x{i}": b"x" for j in range(3) for i in range(3)})
    with HostileS3(BUCKET, objects, page_keys=2, **{server_kind: True}) as server:
        m = mount_it(mount, server)
        assert sorted(os.listdir(m.path)) == ["d0", "d1", "d2"] + [f"k{i:03d}" for i in range(7)]
        assert (m.path / "k006").read_bytes() == b"v6"
        for j in range(3):
            assert sorted(os.listdir(m.path / f"d{j}")) == ["x0", "x1", "x2"]
        lines = [ln for ln in m.log_text().splitlines() if "no continuation token" in ln]
        assert len(lines) == 1, m.log_text()[-3000:]


def test_a_read_never_mixes_two_versions_when_the_server_ignores_if_match(mount) -> None:
    """An object replaced between two reads of one open file, on a server that ignores
    If-Match (the hostile server, as many small S3-compatible ones): the second read got
    the new object's bytes after the first got the old one's, one file mixing two objects.
    Now the answer's ETag is checked against the one the open is pinned to: ESTALE."""
    size = 12 << 20
    with HostileS3(BUCKET, {"s/big.bin": b"\1" * size}) as server:
        m = mount_it(mount, server, "--metadata-ttl", "0")
        fd = os.open(m.path / "big.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == b"\1" * 4096
            server.objects["s/big.bin"] = b"\2" * size
            with pytest.raises(OSError) as err:
                os.pread(fd, 4096, 10 << 20)
            assert err.value.errno == errno.ESTALE
        finally:
            os.close(fd)
        # a new open (metadata_ttl=0: listed afresh) reads the new object
        assert (m.path / "big.bin").read_bytes()[-4:] == b"\2" * 4
        assert daemon_pids(m.path)


def test_a_listing_whose_etags_lack_their_quotes_still_reads(mount) -> None:
    """A listing giving ETags bare (abc) where the GET's header quotes them ("abc"), from a
    server comparing If-Match strictly: every read was pinned to the bare one, refused (412),
    and the file read ESTALE at every open, for ever. ETags are now spelled one way."""
    with HostileS3(BUCKET, {"s/a.txt": b"hello\n"}, if_match=True, bare_list_etags=True) as server:
        m = mount_it(mount, server)
        assert (m.path / "a.txt").read_bytes() == b"hello\n"


def test_a_listing_of_multipart_uploads_that_loops_fails_at_once(mount) -> None:
    """ListMultipartUploads pages each truncated, handing back the same markers: a writable
    mount, which looks for uploads an earlier writer left open, waited for ever (`zvfs mount`
    gave up after its 90 s, the daemon listing on, its list of uploads growing), as would a
    close() whose CreateMultipartUpload answer was lost. Now the second sight of the
    markers ends the listing with an error: the mount comes up at once and says it could
    not look."""
    with HostileS3(BUCKET, {"s/a.txt": b"a"}, uploads_loop="SAME") as server:
        t0 = time.monotonic()
        m = mount_it(mount, server, "--writable")
        assert time.monotonic() - t0 < 20
        assert os.listdir(m.path) == ["a.txt"]
        log = m.log_text()
        assert "could not look for unfinished multipart uploads" in log and "'SAME'" in log, log[-3000:]


@pytest.mark.parametrize("announced", [False, True], ids=["until-close", "content-length"])
def test_a_listing_page_without_end_fails_in_bounded_memory(mount, announced: bool) -> None:
    """A listing page of 4 GiB (blanks inside the document, sent as fast as loopback goes,
    its length announced or not):
    botocore reads an answer whole before it parses it, so the daemon grew by what came
    within s3_deadline, gigabytes, and then parsed it. Now an answer read whole stops at
    ANSWER_MAX (32 MiB): that listing fails at once (EIO), its line naming the directory,
    and the daemon serves on, its memory not grown."""
    import psutil

    objects = {"s/a.txt": b"a", "s/sub/b.txt": b"b"}
    with HostileS3(BUCKET, objects, pad=4 << 30, pad_after=1, pad_announced=announced) as server:
        m = mount_it(mount, server, "--metadata-ttl", "0")
        (pid,) = daemon_pids(m.path)
        before = psutil.Process(pid).memory_info().rss
        t0 = time.monotonic()
        with pytest.raises(OSError) as err:
            os.listdir(m.path / "sub")
        assert err.value.errno == errno.EIO
        assert time.monotonic() - t0 < 10
        assert psutil.Process(pid).memory_info().rss - before < 200 << 20
        log = m.log_text()
        assert "more than 33,554,432 bytes" in log, log[-3000:]
        server.pad = 0
        assert os.listdir(m.path / "sub") == ["b.txt"]  # nothing remembered


def test_a_head_of_an_object_past_the_answer_bound_is_not_refused(mount) -> None:
    """The bound on answers read whole must not take a HEAD's Content-Length (the object's
    size; a HEAD has no body) for its answer's: a HEAD of a 40 MiB object failed, and so
    every open for writing without O_TRUNC of it."""
    big = b"b" * (40 << 20)
    with HostileS3(BUCKET, {"s/big.bin": big}) as server:
        m = mount_it(mount, server, "--writable")
        fd = os.open(m.path / "big.bin", os.O_WRONLY | os.O_APPEND)  # a HEAD (nothing is fetched)
        os.close(fd)  # nothing written: nothing to upload
        assert "more than 33,554,432 bytes" not in m.log_text(), m.log_text()[-3000:]


@pytest.mark.parametrize("lie", ["self_prefix", "repeat_prefixes"])
def test_a_directory_listed_as_its_own_subdirectory_or_twice_costs_nothing(mount, lie: str) -> None:
    """A store of big directories is listed directory by directory (s3_walk). A server whose
    listing of a directory gave that directory as one of its own subdirectories made the
    walk list it again and again, for ever (1,600 requests in 30 s, the mount's listing
    never done); one giving a subdirectory twice failed the walk with a KeyError. Now a
    common prefix is taken only once, and only one level below the directory listed."""
    import threading

    objects = {f"s/d{j}/{i:04d}": b"v" for j in range(3) for i in range(600)}
    with HostileS3(BUCKET, objects, **{lie: True}) as server:
        m = mount_it(mount, server)
        got: dict[str, object] = {}

        def ls() -> None:
            try:
                got["root"] = sorted(os.listdir(m.path))
                got["d1"] = len(os.listdir(m.path / "d1"))
            except OSError as exc:
                got["error"] = exc

        t = threading.Thread(target=ls, daemon=True)
        t.start()
        t.join(30)
        assert got == {"root": ["d0", "d1", "d2"], "d1": 600}, (got, m.log_text()[-3000:])
        assert server.listings < 20


def test_a_head_without_last_modified_does_not_fail_an_open_for_writing(mount) -> None:
    """A HEAD answered without Last-Modified (a small server's): the store's info raised
    KeyError, so every open for writing without O_TRUNC (and every rename and link) of the
    file failed with EIO, "KeyError: 'LastModified'" the only line. The mtime is now the
    epoch, as for a listing's missing date; a HEAD without a usable size is a StoreError."""
    with HostileS3(BUCKET, {"s/a.txt": b"hello\n"}, head_without=("Last-Modified",)) as server:
        m = mount_it(mount, server, "--writable")
        fd = os.open(m.path / "a.txt", os.O_WRONLY | os.O_APPEND)
        os.close(fd)  # nothing written: nothing to upload
        assert (m.path / "a.txt").read_bytes() == b"hello\n"
        assert "KeyError" not in m.log_text(), m.log_text()[-3000:]


def test_a_skewed_clock_is_named_not_taken_for_bad_credentials(mount) -> None:
    """S3 refuses a request signed with a clock 15 minutes off its own with a 403
    RequestTimeTooSkewed. zvfs took every 403 for refused credentials: the mount failed
    with "S3 credentials were refused ... Fix the credentials", and a read's line said to
    fix them too, on a machine whose only fault was its clock. Both now say to set the
    clock (and the read is not retried: the same clock cannot do better)."""
    with HostileS3(BUCKET, {"s/a.txt": b"hello\n"}, get_status=403, error_code="RequestTimeTooSkewed") as server:
        m = mount_it(mount, server)
        t0 = time.monotonic()
        with pytest.raises(OSError) as err:
            (m.path / "a.txt").read_bytes()
        assert err.value.errno == errno.EIO and time.monotonic() - t0 < 5
        lines = [ln for ln in m.log_text().splitlines() if "RequestTimeTooSkewed" in ln]
        assert lines and all("set the clock" in ln and "fix them" not in ln for ln in lines), lines
    with HostileS3(BUCKET, {"s/a.txt": b"hello\n"}, list_status=403, error_code="RequestTimeTooSkewed") as server:
        res = mount(f"s3://{BUCKET}/s", "--endpoint-url", server.endpoint, "--no-sign-request",
                    "--s3-timeout", "2", "--s3-deadline", "5", env=env(), check=False)
        assert res.result.returncode != 0
        assert "set the clock" in res.result.stderr and "credentials were refused" not in res.result.stderr, \
            res.result.stderr


def test_a_bucket_in_another_region_is_named_from_the_error_document(mount) -> None:
    """S3 refuses a request signed for another region than the bucket's with a 400
    AuthorizationHeaderMalformed whose document names the bucket's region (<Region>). The
    mount said only "pass the bucket's --region": it read the region from a header alone."""
    with HostileS3(BUCKET, {"s/a.txt": b"hello\n"}, list_status=400, error_code="AuthorizationHeaderMalformed",
                   error_fields={"Region": "eu-west-1"}) as server:
        res = mount(f"s3://{BUCKET}/s", "--endpoint-url", server.endpoint, "--no-sign-request",
                    env=env(), check=False)
    assert res.result.returncode != 0
    assert "another region" in res.result.stderr and "--region eu-west-1" in res.result.stderr, res.result.stderr


@pytest.mark.parametrize("v1_only", [False, True])
def test_a_refused_directory_of_a_walk_is_listed_on_flat_each_key_once(v1_only: bool) -> None:
    """A directory whose listing a policy refuses (403) while the walk lists the store
    directory by directory: the rest is listed flat from the last key walked, each key once,
    also from a server that knows only V1 and lists again from the start (StartAfter
    ignored): 24 keys came twice."""
    from zvfs.stores.s3 import S3Store

    objects = {f"s/c/{i}/{j:02d}": b"x" for i in range(6) for j in range(6)}
    objects |= {"s/top.txt": b"t", "s/zarr.json": b"{}"}
    with HostileS3(BUCKET, objects, page_keys=10, v1_only=v1_only, refused_prefixes=("s/c/4/",)) as server:
        st = S3Store(BUCKET, "s", endpoint_url=server.endpoint, no_sign_request=True, page_keys=10)
        try:
            got = [k for k, _ in st.list_tree("")]
        finally:
            st.close()
    assert got == sorted(k[2:] for k in objects)


def test_a_listing_of_endless_empty_pages_fails(mount) -> None:
    """Every page after the first empty, truncated, with a new continuation token each
    time: no token came twice and no entry was counted, so the listing went on for ever
    (an `ls` waiting on it, ~20 requests a second). Now more than MAX_EMPTY_PAGES empty
    pages in a row fail the listing (EIO), one line saying so, the daemon serving on."""
    objects = {f"s/k{i}": b"v" for i in range(5)}
    with HostileS3(BUCKET, objects, page_keys=2, empty_pages=True) as server:
        m = mount_it(mount, server)
        t0 = time.monotonic()
        with pytest.raises(OSError) as err:
            os.listdir(m.path)
        assert err.value.errno == errno.EIO
        assert time.monotonic() - t0 < 60
        assert "pages in a row listed nothing" in m.log_text(), m.log_text()[-3000:]
        assert daemon_pids(m.path)


def test_a_server_that_lists_out_of_order_loses_no_key(mount) -> None:
    """A store of big directories listed by a server that does not sort (S3 Express
    directory buckets list in no order; here, in reverse): the first page made the
    listing go on directory by directory after that page's last key, so every key sorting
    before it that came on a later page was lost, silently (a whole directory of 600 keys
    here). A first page out of order is now listed flat to its end."""
    objects = {f"s/d{j}/{i:04d}": b"v" for j in range(3) for i in range(600)}
    with HostileS3(BUCKET, objects, unsorted=True) as server:
        m = mount_it(mount, server)
        assert sorted(os.listdir(m.path)) == ["d0", "d1", "d2"]
        for d in ("d0", "d1", "d2"):
            assert len(os.listdir(m.path / d)) == 600, d


def test_a_first_listing_page_that_is_empty_but_truncated_mounts(mount) -> None:
    """S3 may answer a page with no keys that says more follow (IsTruncated, a token): the
    check at mount took such a first page for an empty store and refused the mount ("holds
    no keys ... --allow-empty"). It now refuses only a page that says nothing follows."""
    with HostileS3(BUCKET, {"s/a.txt": b"a", "s/d/b.txt": b"b"}, empty_first=True) as server:
        m = mount_it(mount, server)
        assert sorted(os.listdir(m.path)) == ["a.txt", "d"]
        assert (m.path / "d" / "b.txt").read_bytes() == b"b"


def test_a_server_that_ignores_the_prefix_shows_no_other_key(mount) -> None:
    """A server that ignores Prefix lists the whole bucket: each key from elsewhere was cut
    to the store's keys as if it were under the prefix ("other/k00" became the file
    "her/k00" of s3://bucket/s). Such keys are now left out, the first few with a line
    each and then one saying more are, not a line for every key of the bucket."""
    objects = {"s/a.txt": b"a", "s/d/b.txt": b"b"}
    objects.update({f"other/k{i:02d}": b"o" for i in range(50)})
    with HostileS3(BUCKET, objects, ignore_prefix=True) as server:
        m = mount_it(mount, server)
        assert sorted(os.listdir(m.path)) == ["a.txt", "d"]
        assert (m.path / "d" / "b.txt").read_bytes() == b"b"
        lines = [ln for ln in m.log_text().splitlines() if "where it cannot be" in ln]
        assert 1 <= len(lines) <= 11 and "more such names" in lines[-1], lines


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (openssl, from scripts/setup)."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = str(where / "cert.pem"), str(where / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.mark.parametrize("server_kind", ["refuse", "store"])
def test_writes_to_an_https_server_that_predates_aws_chunked_uploads(mount, tls_cert, server_kind) -> None:
    """botocore sends an upload over HTTPS in aws-chunked encoding, its CRC32 in a trailer,
    unless told to send checksums only where required. S3-compatible servers that predate
    that encoding (older MinIO and Ceph, several hosted ones) refuse it (every close() of a
    written file failed) or store the framing as the object's bytes (the worst: a silent
    corruption). To any endpoint but Amazon's, uploads go plain, in one body."""
    with HostileS3(BUCKET, {"s/old.txt": b"old\n"}, tls=tls_cert, aws_chunked=server_kind) as server:
        m = mount(f"s3://{BUCKET}/s", "--endpoint-url", server.endpoint, "--no-sign-request",
                  "--s3-timeout", "2", "--s3-deadline", "5", "--writable",
                  env=env() | {"AWS_CA_BUNDLE": tls_cert[0]})
        data = os.urandom(100_000)
        (m.path / "new.bin").write_bytes(data)
        assert server.objects["s/new.bin"] == data
        assert (m.path / "old.txt").read_bytes() == b"old\n"
        assert server.puts and not any("aws-chunked" in h.get("Content-Encoding", "") for h in server.puts)


def test_the_users_checksum_setting_wins_for_an_s3_compatible_server(mount, tls_cert) -> None:
    """AWS_REQUEST_CHECKSUM_CALCULATION set by the user (here: when_supported, botocore's own
    default) is kept: the upload goes with its CRC32 in an aws-chunked trailer."""
    with HostileS3(BUCKET, {"s/old.txt": b"old\n"}, tls=tls_cert, aws_chunked="store") as server:
        m = mount(f"s3://{BUCKET}/s", "--endpoint-url", server.endpoint, "--no-sign-request",
                  "--s3-timeout", "2", "--s3-deadline", "5", "--writable",
                  env=env() | {"AWS_CA_BUNDLE": tls_cert[0], "AWS_REQUEST_CHECKSUM_CALCULATION": "when_supported"})
        (m.path / "new.bin").write_bytes(b"payload")
        assert any("aws-chunked" in h.get("Content-Encoding", "") for h in server.puts), server.puts
        assert b"x-amz-checksum-crc32" in server.objects["s/new.bin"]


def test_a_write_answered_404_without_a_body_says_so(mount, tmp_path) -> None:
    """A PUT answered 404 with no error document (moto does so for a key holding a newline;
    a proxy in front of a server that does not serve that bucket): botocore calls it "404",
    which zvfs takes for a missing key, so close() failed with EIO and a log line that said
    only "upload failed (new.bin)", no reason. It says the server answered Not Found to a
    write now, and the bytes are kept as ever."""
    with HostileS3(BUCKET, {"s/old.txt": b"old\n"}, put_status=404) as server:
        # the bytes are kept under the test's directory: removed from /tmp before the daemon
        # let go of them (its release comes after close() returns), they were kept again
        m = mount_it(mount, server, "--writable", "--cache-dir", str(tmp_path / "cache"))
        with pytest.raises(OSError) as err:
            (m.path / "new.bin").write_bytes(b"payload")
        assert err.value.errno == errno.EIO
        lines = [ln for ln in m.log_text().splitlines() if "new.bin" in ln and "upload failed" in ln]
        assert len(lines) == 1 and "404" in lines[0] and "Not Found" in lines[0], m.log_text()[-3000:]
        kept = lines[0].split("kept at ")[-1].strip()
        assert Path(kept).read_bytes() == b"payload" and Path(kept).is_relative_to(tmp_path)
        assert (m.path / "old.txt").read_bytes() == b"old\n"


def test_a_suffix_answered_with_the_whole_object_is_asked_again_as_a_range(mount, tmp_path) -> None:
    """A shard's index is read with ``Range: bytes=-N``. A server that does not know
    suffix ranges answered with the whole shard (206, Content-Range from byte 0), and zvfs
    took the start it was told: it read the whole shard in as the index, then failed the
    read (EIO, "shard index truncated"), the daemon holding the shard's bytes meanwhile.
    Now an answer from elsewhere than the suffix is let go unread and the suffix asked
    again as an absolute range, which this server answers: the values are zarr-python's."""
    import numpy as np
    import zarr

    src = tmp_path / "src"
    a = zarr.create_array(zarr.storage.LocalStore(str(src)), name="sharded", shape=(64, 64),
                          chunks=(8, 8), shards=(32, 32), dtype="int32")
    a[:] = np.arange(64 * 64, dtype="int32").reshape(64, 64)
    want = zarr.open_array(zarr.storage.LocalStore(str(src)), path="sharded", mode="r")[:].tobytes()
    objects = {f"s/{p.relative_to(src).as_posix()}": p.read_bytes() for p in src.rglob("*") if p.is_file()}
    with HostileS3(BUCKET, objects, suffix_whole=True) as server:
        m = mount_it(mount, server)
        assert (m.path / ".zvfs/arrays/sharded/data.raw").read_bytes() == want
        shards = [k for k in objects if "/c/" in k]
        assert len(shards) == 4
        for key in shards:
            asked = [rng for k, rng in server.ranges if k == key]
            size = len(objects[key])
            # the suffix, then the same bytes as a range; the chunks' own ranges after
            assert asked[0].startswith("bytes=-"), asked
            tail = int(asked[0][len("bytes=-"):])
            assert asked[1] == f"bytes={size - tail}-{size - 1}", asked
        assert daemon_pids(m.path)


def test_a_link_of_an_object_whose_head_says_less_than_its_get_sends_is_refused(mount) -> None:
    """A hard link on S3 copies the object: one under 64 MiB by its HEAD's size is read
    and PUT as the new key. The read was unbounded and pinned to nothing: an object whose
    GET sends more than its HEAD said (a broken server, or one replaced in between) was
    read in whole, 65 MiB here, and stored as the link (a helper's audit). Now the read
    stops past 64 MiB and the link fails with EIO, storing nothing."""
    from zvfs.stores.s3_write import LINK_PUT_LIMIT

    body = bytes(LINK_PUT_LIMIT + (1 << 20))
    with HostileS3(BUCKET, {"s/zarr.json": b"{}", "s/big.bin": body},
                   head_sizes={"s/big.bin": 10}) as server:
        m = mount_it(mount, server, "--writable")
        with pytest.raises(OSError) as err:
            os.link(m.path / "big.bin", m.path / "copy.bin")
        assert err.value.errno == errno.EIO
        assert "s/copy.bin" not in server.objects
        assert not [p for p in server.puts if "copy.bin" in str(p)]
        assert "big.bin" in m.log_text()
        assert daemon_pids(m.path)

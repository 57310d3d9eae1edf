"""`zvfs mount` error paths: a clear message on stderr, a non-zero exit, nothing left mounted.

Refused credentials: the ``auth_moto`` fixture (conftest) is a second moto server
whose IAM authentication is on; it answers every request whose access key it does
not know with 403 InvalidAccessKeyId, as AWS does, so zvfs meets a real refusal
over HTTP.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    S3_BUCKET,
    S3_PREFIX,
    Mounted,
    _pid_alive,
    daemon_pids,
    force_unmount,
    mount_entry,
    probes_every_mount,
    run,
    tool,
    wait_until,
    zvfs_cmd,
)

from zvfs.mounts import mount_table

FAST = 60  # an error must come back within this many seconds (no endless retries)


def zvfs_mount(*args, env=None, timeout=FAST + 30):
    t0 = time.monotonic()
    res = run([*zvfs_cmd(), "mount", *map(str, args)], env=env, timeout=timeout)
    res.elapsed = time.monotonic() - t0
    return res


def assert_fails(res, *patterns: str) -> None:
    assert res.returncode != 0, f"expected failure, got 0; stderr: {res.stderr}"
    err = res.stderr.strip()
    assert err, "no message on stderr"
    assert "Traceback" not in err, f"a traceback instead of a message:\n{err}"
    assert len(err.splitlines()) <= 3, f"message is not short:\n{err}"
    for pat in patterns:
        assert re.search(pat, err, re.I), f"{pat!r} not in stderr: {err}"
    assert res.elapsed < FAST, f"took {res.elapsed:.1f}s to fail"


def assert_nothing_mounted(mnt: Path) -> None:
    assert mount_entry(mnt) is None, f"{mnt} is mounted after a failed mount"
    time.sleep(0.2)
    assert daemon_pids(mnt) == [], "a zvfs process is still running after a failed mount"


@pytest.fixture
def mnt(tmp_path) -> Iterator[Path]:
    """A mountpoint; whatever a test mounted there (a mount that should have been refused
    and was not) is unmounted and its daemon stopped, pass or fail."""
    p = tmp_path / "mnt"
    p.mkdir()
    yield p
    force_unmount(p)


# --------------------------------------------------------------------------- sources


def test_missing_directory_source(tmp_path, mnt) -> None:
    src = tmp_path / "no-such-store.zarr"
    res = zvfs_mount(src, mnt)
    assert_fails(res, re.escape(str(src)), r"(does not exist|no such|not found)")
    assert_nothing_mounted(mnt)


def test_missing_zip_source(tmp_path, mnt) -> None:
    src = tmp_path / "no-such.zip"
    res = zvfs_mount(src, mnt)
    assert_fails(res, re.escape(str(src)), r"(does not exist|no such|not found)")
    assert_nothing_mounted(mnt)


def test_missing_file_url_source(tmp_path, mnt) -> None:
    src = tmp_path / "gone.zarr"
    res = zvfs_mount(f"file://{src}#mode=zarr,file", mnt)
    assert_fails(res, re.escape(str(src)), r"(does not exist|no such|not found)")
    assert_nothing_mounted(mnt)


def test_not_a_zip(tmp_path, mnt) -> None:
    src = tmp_path / "fake.zip"
    src.write_bytes(b"this is not a zip file\n" * 10)
    res = zvfs_mount(src, mnt)
    assert_fails(res, re.escape(str(src)), r"zip")
    assert_nothing_mounted(mnt)


def test_missing_bucket(moto, s3_env, mnt) -> None:
    res = zvfs_mount("s3://no-such-bucket-zvfs/prefix", mnt, "--endpoint-url", moto.endpoint, env=s3_env)
    assert_fails(res, r"no-such-bucket-zvfs", r"(does not exist|no such bucket|not found)")
    assert_nothing_mounted(mnt)


@pytest.mark.parametrize("url", ["127.0.0.1:9", "ftp://127.0.0.1:9", "s3://127.0.0.1:9",
                                 "http://127.0.0.1:99999", "http://alice:S3cretPW@127.0.0.1:9"])
def test_an_endpoint_that_is_no_http_url_is_a_configuration_error(s3_env, mnt, url) -> None:
    """An endpoint of another scheme was refused by botocore, late, as if the server could
    not be reached: exit 1, which a systemd unit retries for ever (a helper's audit). Like
    one without a scheme, it is exit 78, saying what to write instead."""
    res = zvfs_mount("s3://bucket/prefix", mnt, "--endpoint-url", url, env=s3_env)
    if "@" in url:  # never shown (a helper's audit)
        assert_fails(res, "holds a user name or password", "AWS chain")
        assert "S3cretPW" not in res.stderr and "alice" not in res.stderr
    elif "99999" in url:
        assert_fails(res, re.escape(repr(url)), "no number from 0 to 65535")
    else:
        assert_fails(res, re.escape(repr(url)), re.escape("use --endpoint-url http://127.0.0.1:9 (or https://)"))
    assert res.returncode == 78, res
    assert_nothing_mounted(mnt)


def test_unreachable_endpoint(s3_env, mnt) -> None:
    """Nothing listens on the port: a clear failure, not a hang."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = zvfs_mount("s3://bucket/prefix", mnt, "--endpoint-url", f"http://127.0.0.1:{port}", env=s3_env)
    assert_fails(res, rf"(127\.0\.0\.1:{port}|connect|endpoint)")
    assert_nothing_mounted(mnt)


def test_refused_credentials(auth_moto, s3_env, mnt) -> None:
    res = zvfs_mount(f"s3://{S3_BUCKET}/{S3_PREFIX}", mnt, "--endpoint-url", auth_moto.endpoint, env=s3_env)
    assert_fails(res, S3_BUCKET,
                 r"(credential|access denied|forbidden|403|InvalidAccessKeyId|not authori[sz]ed)")
    assert_nothing_mounted(mnt)


def test_credentials_that_may_not_list_are_told_so(auth_moto, s3_env, mnt) -> None:
    """Credentials S3 accepts, whose policy allows GetObject but not ListBucket: the mount
    fails saying so. It said "S3 credentials were refused ... Fix the credentials", which
    sent the user to keys that were fine."""
    iam = auth_moto.client("iam")
    iam.create_user(UserName="nolist")
    iam.put_user_policy(UserName="nolist", PolicyName="get", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="nolist")["AccessKey"]
    env = {k: v for k, v in s3_env.items() if k not in ("AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")}
    env |= {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    res = zvfs_mount(f"s3://{S3_BUCKET}", mnt, "--endpoint-url", auth_moto.endpoint, env=env)
    assert_fails(res, "AccessDenied", "s3:ListBucket", "policy")
    assert "fix the credentials" not in res.stderr.lower(), res.stderr
    assert_nothing_mounted(mnt)


# --------------------------------------------------------------------------- mountpoints


@pytest.mark.parametrize("layout", ["mountpoint in source", "source in mountpoint", "same"])
def test_a_directory_source_and_its_mountpoint_must_not_overlap(zarr_dir, tmp_path, layout) -> None:
    """The daemon would read the store through its own mount (and wait for itself)."""
    src = tmp_path / "store"
    shutil.copytree(zarr_dir, src)
    if layout == "mountpoint in source":
        source, mp = src, src / "mnt"
        mp.mkdir()
    elif layout == "source in mountpoint":
        source, mp = src, tmp_path
    else:
        source, mp = src, src
    for fg in ([], ["-f"]):
        res = zvfs_mount(source, mp, "--allow-non-empty", *fg)
        assert_fails(res, "overlap", re.escape(str(mp)), "outside the source")
        assert_nothing_mounted(mp)


@pytest.mark.parametrize("option", ["--log-file", "--cache-dir"])
def test_a_log_file_or_cache_dir_inside_the_mountpoint_is_refused(zarr_dir, mnt, option) -> None:
    """Once mounted, the path would be reached through the mount: the daemon's first log
    line (written from the thread that answers the kernel) would wait for that thread."""
    inside = mnt / "sub" / ("zvfs.log" if option == "--log-file" else "cache")
    for fg in ([], ["-f"]):
        res = zvfs_mount(zarr_dir, mnt, option, inside, *fg)
        assert_fails(res, option[2:].replace("-", " "), "inside the mountpoint", f"give {option} a path outside")
        assert_nothing_mounted(mnt)


def test_missing_mountpoint(zarr_dir, tmp_path) -> None:
    mp = tmp_path / "no-such-dir"
    res = zvfs_mount(zarr_dir, mp)
    assert_fails(res, re.escape(str(mp)), r"(does not exist|no such|not found)")
    assert not mp.exists()


def test_mountpoint_is_a_file(zarr_dir, tmp_path) -> None:
    mp = tmp_path / "a-file"
    mp.write_text("x")
    res = zvfs_mount(zarr_dir, mp)
    assert_fails(res, re.escape(str(mp)), r"not a directory")


def test_mountpoint_not_empty(zarr_dir, tmp_path) -> None:
    """Refused with a count of what would be hidden (in English for one entry too) and the way out."""
    mp = tmp_path / "full"
    mp.mkdir()
    (mp / "one").write_text("x")
    res = zvfs_mount(zarr_dir, mp)
    assert_fails(res, re.escape(str(mp)), r"is not empty \(1 entry would be hidden\)", r"--allow-non-empty")
    (mp / "two").write_text("x")
    res = zvfs_mount(zarr_dir, mp)
    assert_fails(res, r"\(2 entries would be hidden\)")
    assert_nothing_mounted(mp)


def test_already_mounted(zarr_dir, mount) -> None:
    first: Mounted = mount(zarr_dir)
    pids = daemon_pids(first.path)
    res = zvfs_mount(zarr_dir, first.path)
    assert_fails(res, re.escape(str(first.path)), r"already mounted")
    # the first mount is untouched and still answers
    assert daemon_pids(first.path) == pids
    assert (first.path / "zarr.json").read_bytes() == (zarr_dir / "zarr.json").read_bytes()
    # also when the first mount is of another kind (not ours)
    res = zvfs_mount(zarr_dir, "/proc")
    assert_fails(res, r"/proc", r"already mounted \(proc\)", r"umount /proc")
    assert "zvfs unmount" not in res.stderr  # which refuses a mount not zvfs's


def test_foreground_errors_too(tmp_path, mnt) -> None:
    """-f reports the same message and exit status, without daemonizing."""
    src = tmp_path / "missing"
    res = zvfs_mount("-f", src, mnt)
    assert_fails(res, re.escape(str(src)), r"(does not exist|no such|not found)")
    assert_nothing_mounted(mnt)


# --------------------------------------------------------------------------- options


def test_unknown_option(zarr_dir, mnt) -> None:
    res = zvfs_mount(zarr_dir, mnt, "-o", "no_such_option=1")
    assert_fails(res, r"no_such_option")
    assert_nothing_mounted(mnt)


def test_a_mistyped_flag_is_named_with_the_one_meant(zarr_dir, mnt) -> None:
    """A typo in a long flag was "unrecognized arguments: --cache-sze MNT" (the flag's value
    pushed the mountpoint out of place) with a hint at ``zvfs --help``: it is named as an
    unknown option, with the flag meant and the command's own help. Exit 2, which the
    systemd unit does not retry (a typo in OPTIONS= was restarted five times)."""
    res = zvfs_mount("--cache-sze", "1G", zarr_dir, mnt)
    assert_fails(res, r"unknown option --cache-sze \(did you mean --cache-size\?\)", r"zvfs mount --help")
    assert res.returncode == 2 and str(mnt) not in res.stderr
    assert_nothing_mounted(mnt)
    res = zvfs_mount(zarr_dir, mnt, "surplus")
    assert_fails(res, r"unexpected argument: surplus")
    assert res.returncode == 2
    res = zvfs_mount(zarr_dir, mnt, "--", "--x")  # after "--": an argument, not an option
    assert_fails(res, r"unexpected argument: --x")
    res = run([*zvfs_cmd(), "-x", "mount", zarr_dir, mnt])  # before the command: zvfs's own
    assert res.returncode == 2 and "unknown option -x (see: zvfs --help)" in res.stderr, res.stderr
    assert_nothing_mounted(mnt)
    res = zvfs_mount(zarr_dir, "")  # was the current directory
    assert_fails(res, r"MOUNTPOINT is empty")
    assert res.returncode == 2
    unit = (Path(__file__).resolve().parents[1] / "systemd" / "zvfs@.service").read_text()
    prevent = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M)
    assert prevent and {"2", "78"} <= set(prevent.group(1).split()), prevent


@pytest.mark.parametrize("args,pattern", [
    (["--cache-size", "lots"], r"cache"),
    (["--metadata-ttl", "-5"], r"ttl"),
    (["--decoded", "sideways"], r"decoded"),
    (["--log-level", "chatty"], r"log"),
    (["--busy-poll", "-1"], r"busy.poll.*microseconds"),
    (["-o", "busy_poll=forever"], r"busy.poll.*microseconds"),
    (["--uid", "no-such-user-zvfs"], r"--uid.*no user called 'no-such-user-zvfs'"),
    (["-o", "gid=4294967295"], r"--gid.*below 4294967295"),
    (["--file-mode", "0999"], r"--file-mode.*octal"),
    (["-o", "dir_mode=1777"], r"--dir-mode.*octal"),
    (["-o", "sse=maybe"], r"--sse.*not one of AES256, aws:kms, aws:kms:dsse"),
    (["--storage-class", "COLD"], r"--storage-class.*not one of STANDARD"),
    # the flag wins over -o, but the typo it overrides is still told (it was mounted, exit 0)
    (["--cache-size", "1G", "-o", "cache_size=2X"], r"invalid -o cache_size=2X .*--cache-size given too"),
])
def test_bad_option_values(zarr_dir, mnt, args, pattern) -> None:
    res = zvfs_mount(zarr_dir, mnt, *args)
    assert res.returncode != 0
    assert re.search(pattern, res.stderr, re.I), res.stderr
    assert_nothing_mounted(mnt)


@pytest.mark.parametrize("source,args,pattern", [
    ("dir", ["--sse", "AES256", "--writable"], r"--sse applies to S3 sources only.*is a directory"),
    ("dir", ["-o", "requester_pays"], r"--requester-pays applies to S3 sources only"),
    ("s3", ["--storage-class", "STANDARD_IA"], r"--storage-class .*read-only: add --writable"),
    ("s3", ["--writable", "--sse-kms-key-id", "k1"], r"--sse-kms-key-id .*add --sse aws:kms"),
    ("s3", ["--writable", "--sse", "AES256", "--sse-kms-key-id", "k1"], r"add --sse aws:kms"),
    ("dir", ["--abort-uploads", "--writable"], r"--abort-uploads applies to S3 sources only"),
    ("s3", ["--abort-uploads"], r"--abort-uploads .*read-only.*add --writable"),
    ("s3", ["-o", "abort_uploads"], r"--abort-uploads .*read-only.*add --writable"),
    ("s3", ["--decoders", "2"], r"--decoders 2 starts processes .*S3 source.*drop it"),
    ("s3", ["-o", "decoders=1"], r"--decoders 1 starts processes"),
    # how S3 is reached, signed, retried and written to: given for a local source, the user
    # believes it is S3 (they were accepted and ignored)
    ("dir", ["--endpoint-url", "http://127.0.0.1:9"], r"--endpoint-url applies to S3 sources only.*is a directory"),
    ("dir", ["--no-sign-request"], r"--no-sign-request applies to S3 sources only"),
    ("zip", ["-o", "region=eu-west-1"], r"--region applies to S3 sources only.*is a zip"),
    ("zip", ["--profile", "other"], r"--profile applies to S3 sources only"),
    ("dir", ["--s3-timeout", "3"], r"--s3-timeout applies to S3 sources only"),
    ("dir", ["--allow-empty"], r"--allow-empty applies to S3 sources only"),
    ("dir", ["--writable", "--part-size", "16M"], r"--part-size applies to S3 sources only"),
])
def test_s3_only_options_are_refused_where_they_cannot_apply(zarr_dir, zarr_zip_cmd, mnt, source, args,
                                                             pattern) -> None:
    """Encryption asked for and silently not done would be worse than an error: options
    only S3 (or its writes) uses are refused elsewhere, before anything is opened (the S3
    endpoint here answers nothing)."""
    src = {"dir": str(zarr_dir), "zip": str(zarr_zip_cmd), "s3": "s3://zvfs-nowhere/p"}[source]
    endpoint = ["--endpoint-url", "http://127.0.0.1:9"] if source == "s3" else []
    res = zvfs_mount(src, mnt, *endpoint, *args)
    assert res.returncode == 78, (res.returncode, res.stderr)
    assert re.search(pattern, res.stderr), res.stderr
    assert_nothing_mounted(mnt)


def test_an_s3_option_at_its_default_changes_nothing_and_passes(zarr_dir, mount) -> None:
    """An fstab line may spell out a default (`s3_attempts=10`): for a directory that asks
    for nothing it does not do, and it mounts."""
    m = mount(zarr_dir, "-o", "s3_attempts=10,no_sign_request=off")
    assert sorted(os.listdir(m.path)) == sorted(p.name for p in zarr_dir.iterdir())


def test_unmount_errors(tmp_path, mnt) -> None:
    res = run([tool("zvfs"), "unmount", mnt])
    assert res.returncode != 0 and "not mounted" in res.stderr, res.stderr
    res = run([tool("zvfs"), "unmount", tmp_path / "nope"])
    assert res.returncode != 0 and str(tmp_path / "nope") in res.stderr, res.stderr


def test_mount_helper_errors(tmp_path, mnt) -> None:
    """mount.zvfs (as mount(8) calls it) reports the same errors."""
    src = tmp_path / "missing.zarr"
    res = run([tool("mount.zvfs"), src, mnt, "-o", "ro"])
    assert res.returncode != 0
    assert str(src) in res.stderr, res.stderr
    assert_nothing_mounted(mnt)


def test_truncated_zip(zarr_zip_cmd, tmp_path, mnt) -> None:
    src = tmp_path / "truncated.zip"
    data = zarr_zip_cmd.read_bytes()
    src.write_bytes(data[: len(data) // 2])  # the central directory is gone
    res = zvfs_mount(src, mnt)
    assert_fails(res, re.escape(str(src)), r"zip")
    assert_nothing_mounted(mnt)


def test_a_zip_that_fails_with_eio_is_not_called_corrupt(tmp_path, mnt, mount) -> None:
    """An I/O error reading the archive (a failing disk; here the inner zip is a file of an
    outer zvfs mount whose member is corrupt, so reading it is EIO) was "not a valid zip
    archive" with exit 78, which tells systemd never to retry (a helper's audit). It is
    an I/O error, exit 1."""
    import struct
    import zipfile

    inner = tmp_path / "inner.zip"
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("zarr.json", b'{"zarr_format": 3, "node_type": "group", "attributes": {}}')
        z.writestr("blob", os.urandom(1 << 20))
    outer = tmp_path / "outer.zip"
    with zipfile.ZipFile(outer, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(inner, "inner.zip")
    with zipfile.ZipFile(outer) as z:
        zi = z.getinfo("inner.zip")
    with open(outer, "r+b") as f:  # flip bytes in the middle of the member's deflate stream
        f.seek(zi.header_offset + 26)
        n, e = struct.unpack("<HH", f.read(4))
        at = zi.header_offset + 30 + n + e + zi.compress_size // 2
        f.seek(at)
        flipped = bytes(b ^ 0x55 for b in f.read(8))
        f.seek(at)
        f.write(flipped)
    m = mount(outer)
    with pytest.raises(OSError) as ei:
        (m.path / "inner.zip").read_bytes()
    assert ei.value.errno == errno.EIO
    res = zvfs_mount(m.path / "inner.zip", mnt)
    assert_fails(res, "cannot read the zip archive", "Input/output error")
    assert res.returncode == 1, res.returncode
    assert_nothing_mounted(mnt)


def test_empty_source_file(tmp_path, mnt) -> None:
    src = tmp_path / "empty.zip"
    src.write_bytes(b"")
    res = zvfs_mount(src, mnt)
    assert_fails(res, re.escape(str(src)))
    assert_nothing_mounted(mnt)


def test_unusual_mountpoint_names(zarr_dir, tmp_path, mount) -> None:
    """Spaces and non-ASCII in the mountpoint: mount, 'already mounted', unmount all work."""
    for name in ("mnt with space", "mnt-\u00fc\u00f1\u00ee", "tab\there"):
        mp = tmp_path / name
        mp.mkdir()
        m = mount(zarr_dir, mountpoint=mp)
        assert (m.path / "zarr.json").exists()
        res = zvfs_mount(zarr_dir, mp)
        assert_fails(res, r"already mounted")
        res = run([tool("zvfs"), "unmount", mp])
        assert res.returncode == 0, res.stderr
        assert mount_entry(mp) is None


def test_relative_paths(zarr_dir, tmp_path, mount) -> None:
    """SOURCE and MOUNTPOINT relative to the working directory (the daemon runs elsewhere)."""
    import shutil as _shutil

    _shutil.copytree(zarr_dir, tmp_path / "src.zarr")
    (tmp_path / "rel-mnt").mkdir()
    res = run([tool("zvfs"), "mount", "src.zarr", "rel-mnt", "--log-file", "rel.log", "--log-level", "info"],
              cwd=tmp_path, timeout=FAST + 30)
    mount.mountpoints.append(tmp_path / "rel-mnt")  # cleaned up by the fixture whatever happens
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "rel.log").exists(), "a relative --log-file is not relative to the caller's cwd"
    assert run(["diff", "-r", zarr_dir, tmp_path / "rel-mnt"]).returncode == 0
    res = run([tool("zvfs"), "unmount", "rel-mnt"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert mount_entry(tmp_path / "rel-mnt") is None


def test_unmount_busy_then_lazy(zarr_dir, mount) -> None:
    m = mount(zarr_dir)
    f = open(m.path / "zarr.json", "rb")  # noqa: SIM115 - kept open on purpose
    try:
        res = run([tool("zvfs"), "unmount", m.path])
        assert res.returncode != 0
        assert "busy" in res.stderr.lower(), res.stderr
        assert mount_entry(m.path) is not None
        res = run([tool("zvfs"), "unmount", "-z", m.path])
        assert res.returncode == 0, res.stderr
        assert mount_entry(m.path) is None
        assert f.read()  # the open file still reads after a lazy unmount
    finally:
        f.close()


def test_unmount_waits_for_a_file_held_open_a_moment(zarr_dir, mount) -> None:
    """Whatever walks the machine's mounts (`zvfs status`, df, updatedb) holds each for a
    moment, and a plain unmount in that moment (systemd's ExecStop) was refused as busy.
    It waits a little for the mount to be let go."""
    m = mount(zarr_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "f = open(sys.argv[1], 'rb'); print('open', flush=True); time.sleep(1.0)\n"
         "f.close(); print(time.monotonic(), flush=True)", str(m.path / "zarr.json")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        started = time.monotonic()
        res = run([tool("zvfs"), "unmount", m.path])
        closed = float(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()
    assert closed > started, "the file was closed before the unmount began: nothing was tested"
    assert res.returncode == 0, res.stderr
    assert mount_entry(m.path) is None


@probes_every_mount
def test_unmount_beside_status_walking_every_mount(zarr_dir, mount) -> None:
    """`zvfs status` run over and over (a monitoring agent) beside mounts and unmounts: each
    unmount succeeds. 18 of 40 were refused as busy, the probe's open of stats.json
    holding the mount at that moment."""
    stop = threading.Event()
    probes = []

    def probe() -> None:
        while not stop.is_set():
            probes.append(run([tool("zvfs"), "status", "--json"], timeout=60).returncode)

    walker = threading.Thread(target=probe)
    walker.start()
    try:
        for _ in range(5):
            m = mount(zarr_dir)
            res = run([tool("zvfs"), "unmount", m.path])
            assert res.returncode == 0, res.stderr
            assert mount_entry(m.path) is None
    finally:
        stop.set()
        walker.join()
    assert probes, "zvfs status never ran beside the unmounts"


def test_unmount_of_a_mount_that_holds_another_names_it(zarr_dir, zarr_zip_cmd, mount) -> None:
    """A mount with another mounted inside it (a zip mounted at OUTER/sub) is busy for
    that mount alone, with no file open: the refusal said 'close the files open in it, or
    use zvfs unmount -z', and there were none to close. It names the mount inside, to
    unmount first."""
    outer = mount(zarr_dir)
    inner = mount(zarr_zip_cmd, "--allow-non-empty", mountpoint=outer.path / "sub")
    res = run([tool("zvfs"), "unmount", outer.path])
    assert res.returncode != 0
    assert f"{inner.path} is mounted inside it: unmount that first" in res.stderr, res.stderr
    assert "close the files" not in res.stderr, res.stderr
    run([tool("zvfs"), "unmount", inner.path], check=True)
    run([tool("zvfs"), "unmount", outer.path], check=True)


@pytest.mark.parametrize("how", ["mount", "unmount"])
def test_a_live_mount_taken_along_with_a_dead_one_is_named(zarr_dir, zarr_zip_cmd, mount, how) -> None:
    """A daemon killed under a mount that holds another (a zip mounted at OUTER/sub): the
    mount of OUTER again (systemd's restart), or 'zvfs unmount OUTER', clears the dead mount
    by detaching it, and the mount inside goes with it (it cannot be unmounted alone:
    fusermount3 cannot enter its dead parent), its daemon ended. Only 'cleared a dead zvfs
    mount' was said, and the mount inside was gone unseen. It is named."""
    outer = mount(zarr_dir)
    inner = mount(zarr_zip_cmd, "--allow-non-empty", mountpoint=outer.path / "sub")
    inner_pids = daemon_pids(inner.path)
    for pid in daemon_pids(outer.path):
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not daemon_pids(outer.path), 10)
    if how == "mount":
        said = mount(zarr_dir, mountpoint=outer.path).result.stderr
        assert "cleared a dead zvfs mount" in said, said
    else:
        res = run([tool("zvfs"), "unmount", outer.path])
        assert res.returncode == 0, res.stderr
        said = res.stderr
    assert f"and with it {inner.path}, mounted inside it: mount that again" in said, said
    assert mount_entry(inner.path) is None
    assert wait_until(lambda: not any(_pid_alive(p) for p in inner_pids), 10)


def test_status_of_a_mount_inside_a_dead_one_names_the_dead_one(zarr_dir, zarr_zip_cmd, mount) -> None:
    """A zip mounted at OUTER/sub, OUTER's daemon killed: once the kernel asks OUTER again for
    'sub', the mount inside cannot be reached, and status called it dead ('clear it with:
    zvfs unmount OUTER/sub'), though its daemon lives, and that command fails (fusermount3
    cannot enter the dead OUTER). It says which mount is dead, and to clear that one."""
    outer = mount(zarr_dir, "--metadata-ttl", "0")
    inner = mount(zarr_zip_cmd, "--allow-non-empty", mountpoint=outer.path / "sub")
    for pid in daemon_pids(outer.path):
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not daemon_pids(outer.path), 10)
    res = run([tool("zvfs"), "status", inner.path])
    assert res.returncode == 1
    assert f"the mount it is inside, {outer.path}, is dead" in res.stdout, res.stdout
    assert f"clear it with: zvfs unmount {outer.path}\n" in res.stdout, res.stdout
    info = json.loads(run([tool("zvfs"), "status", "--json", inner.path]).stdout)[0]
    assert info["health"] == "dead" and info["inside_dead"] == str(outer.path), info
    run([tool("zvfs"), "unmount", outer.path], check=True)  # as said: both go
    assert mount_entry(inner.path) is None and mount_entry(outer.path) is None


def test_missing_profile(moto, s3_env, mnt) -> None:
    env = dict(s3_env)
    res = zvfs_mount(f"s3://{S3_BUCKET}/{S3_PREFIX}", mnt, "--profile", "no-such-profile-zvfs",
                     "--endpoint-url", moto.endpoint, env=env)
    assert_fails(res, r"no-such-profile-zvfs", r"profile")
    assert_nothing_mounted(mnt)


@pytest.mark.parametrize("which", ["AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"])
def test_an_aws_file_that_cannot_be_parsed_is_a_configuration_error(moto, s3_env, mnt, tmp_path,
                                                                    which) -> None:
    """botocore's ConfigParseError went out as a failure that may pass (exit 1), so a systemd
    unit restarted on it where RestartPreventExitStatus=78 stops. It is 78, naming the file."""
    broken = tmp_path / "aws-file"
    broken.write_text("[profile broken\nregion=\n" if which == "AWS_CONFIG_FILE" else "[default]\nkey_only\n")
    res = zvfs_mount(f"s3://{S3_BUCKET}/{S3_PREFIX}", mnt, "--endpoint-url", moto.endpoint,
                     env={**s3_env, which: str(broken)})
    assert res.returncode == 78, (res.returncode, res.stderr)
    assert_fails(res, re.escape(f"Unable to parse config file: {broken}: fix that file"))
    assert_nothing_mounted(mnt)


# --------------------------------------------------------------------------- operating faults

def test_a_switch_is_on_or_off_and_ro_contradicts_writable(zarr_dir, mnt) -> None:
    """A typo in a switch's value was taken as on: -o writable=flase mounted read-write."""
    res = zvfs_mount(zarr_dir, mnt, "-o", "writable=flase")
    assert res.returncode == 78, (res.returncode, res.stderr)
    assert_fails(res, r"invalid -o writable=flase: a switch is on or off")
    res = zvfs_mount(zarr_dir, mnt, "-o", "ro,writable")
    assert res.returncode == 78, (res.returncode, res.stderr)
    assert_fails(res, r"-o ro and writable contradict")
    assert_nothing_mounted(mnt)


def test_generic_mount_options_are_accepted(zarr_dir, mount) -> None:
    """What fstab lines carry for systemd, desktops and mount(8) (x-*, comment=, atime
    variants): ignored, as the README says, when zvfs is called directly too. The key's
    dashes were turned into underscores before the x- test, so x-systemd.* was refused."""
    m = mount(zarr_dir, "-o", "x-systemd.automount,comment=systemd.foo,x-gvfs-show,X-mount.mkdir,"
              "nodiratime,lazytime,_rnetdev,writable=no")
    assert mount_entry(m.path)["options"].startswith("ro,"), mount_entry(m.path)


def test_noexec_reaches_the_kernel_and_exec_undoes_it(mount, tmp_path) -> None:
    """fstab's noexec hardens a mount: it was accepted and dropped, so a program on the mount
    still ran (fuse-zip and sshfs pass it on). The kernel now has it: the mount table shows
    it and exec() is refused; a later -o exec, mount(8)'s default, undoes it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    for options, refused in (("noexec", True), ("noexec,exec", False), ("ro", False)):
        m = mount(src, "-o", f"{options},file_mode=0755")
        try:
            assert ("noexec" in mount_entry(m.path)["options"].split(",")) == refused, mount_entry(m.path)
            if refused:
                with pytest.raises(PermissionError):
                    subprocess.run([str(m.path / "run.sh")], capture_output=True)
            else:
                res = subprocess.run([str(m.path / "run.sh")], capture_output=True, text=True)
                assert res.stdout == "ran\n", res
        finally:
            force_unmount(m.path)
    mnt = tmp_path / "m"
    mnt.mkdir()
    res = run(["mount", "-t", "zvfs", str(src), str(mnt), "-o", f"noexec,log_file={tmp_path / 'log'}"])
    try:
        assert res.returncode == 0, res.stderr
        assert "noexec" in mount_entry(mnt)["options"].split(","), mount_entry(mnt)
    finally:
        force_unmount(mnt)


def test_a_quoted_option_value_holds_its_commas_as_mount8_quotes_it(zarr_dir, tmp_path) -> None:
    """mount(8) and fstab quote a value that holds commas (`-o context="a,b"`) and pass it to
    the helper quotes and all: zvfs split it at its commas ("unknown option -o b\"")."""
    mnt = tmp_path / "m"
    mnt.mkdir()
    res = run(["mount", "-t", "zvfs", str(zarr_dir), str(mnt), "-o",
               f'metrics_addr=0,metrics_label="run a,b",comment="x,y",log_file={tmp_path / "log"}'])
    try:
        assert res.returncode == 0, res.stderr
        stats = json.loads((mnt / ".zvfs" / "stats.json").read_bytes())
        assert stats["options"]["metrics_label"] == "run a,b", stats["options"]
    finally:
        force_unmount(mnt)


def test_mount_fuse_type_and_remount(zarr_dir, tmp_path) -> None:
    """The mount table gives a zvfs mount's type as fuse.zvfs, so `mount -o remount,...`, and
    an fstab line of type fuse.zvfs (the FUSE convention: fuse.sshfs, fuse.rclone), go
    through mount.fuse, which runs `zvfs SOURCE MOUNTPOINT -o OPTS`: that failed with
    "argument COMMAND: invalid choice: 'zvfs:/...'". Such a call mounts; a remount, which
    zvfs cannot do, is refused in one line saying what to do, and the mount stays."""
    mnt = tmp_path / "m"
    mnt.mkdir()
    res = run(["mount", "-t", "fuse.zvfs", str(zarr_dir), str(mnt), "-o",
               f"metadata_ttl=5,log_file={tmp_path / 'log'}"])
    try:
        assert res.returncode == 0, res.stderr
        assert mount_entry(mnt)["fstype"] == "fuse.zvfs"
        assert sorted(os.listdir(mnt)) == sorted(p.name for p in zarr_dir.iterdir())
        res = run(["mount", "-o", "remount,ro", str(mnt)])
        assert res.returncode != 0
        assert res.stderr.strip() == ("mount.zvfs: a zvfs mount's options cannot be changed while it "
                                      "is mounted (-o remount): unmount it and mount it again with the "
                                      "new options"), res.stderr
        assert sorted(os.listdir(mnt)) == sorted(p.name for p in zarr_dir.iterdir())
    finally:
        force_unmount(mnt)
    # a mistyped command is still told as one
    res = run([tool("zvfs"), "mout", str(zarr_dir), str(tmp_path / "missing")])
    assert res.returncode == 2 and "invalid choice: 'mout'" in res.stderr, res.stderr


@pytest.mark.parametrize("name", ["store", "café 温度", "caf\\xe9,100%41"])
def test_an_fstab_line_copied_from_the_mount_table_mounts(zarr_dir, tmp_path, name) -> None:
    """`grep MNT /proc/mounts >> /etc/fstab` is how many keep a mount they made by hand. The
    line's source is `zvfs:/path`, taken for a relative path ("source directory
    /root/zvfs:/path does not exist"), and its options hold the kernel's own (user_id=0,
    group_id=0): "unknown option -o user_id". The line, verbatim, now mounts the same.
    A source of other than ASCII was written to the table as Python's backslash escape, one
    text for ``café`` and a literal ``caf\\xe9``: neither the line nor `zvfs status` of a
    decoded=off mount named the source (a helper's audit). It is %-escaped UTF-8 now."""
    src = tmp_path / name
    shutil.copytree(zarr_dir, src)
    zarr_dir = src
    mnt = tmp_path / "m"
    mnt.mkdir()
    log = tmp_path / "log"
    res = run([tool("zvfs"), "mount", "--log-file", str(log), str(zarr_dir), str(mnt), "-o", "decoded=off"])
    assert res.returncode == 0, res.stderr
    try:
        (line,) = [ln for ln in Path("/proc/mounts").read_text().splitlines()
                   if ln.split()[1] == str(mnt)]
        res = run([tool("zvfs"), "status", "--json", str(mnt)])
        assert res.returncode == 0 and json.loads(res.stdout)[0]["source"] == str(src), res
        first = mount_entry(mnt)["source"]
    finally:
        force_unmount(mnt)
    assert line.startswith("zvfs:/") and "user_id=" in line, line
    fstab = tmp_path / "fstab"
    fstab.write_text(line + "\n")
    res = run(["mount", "-T", str(fstab), str(mnt), "-o", f"log_file={log}"])
    try:
        assert res.returncode == 0, res.stderr
        assert sorted(os.listdir(mnt)) == sorted(p.name for p in zarr_dir.iterdir())
        assert mount_entry(mnt)["source"] == first
    finally:
        force_unmount(mnt)
    # a source that only begins with the prefix is still a path of its own
    res = run([tool("zvfs"), "mount", "zvfs:notes", str(mnt)], cwd=tmp_path)
    assert res.returncode == 78 and "zvfs:notes does not exist" in res.stderr, res.stderr


def test_unmount_refuses_a_file_system_that_is_not_zvfs(tmp_path) -> None:
    """zvfs unmount ran fusermount3 -u on whatever was mounted there: as root, a tmpfs went."""
    tm = tmp_path / "tm"
    tm.mkdir()
    run(["mount", "-t", "tmpfs", "zvfs-test-tmpfs", tm], check=True)
    try:
        res = run([tool("zvfs"), "unmount", tm])
        assert res.returncode == 78 and "is a tmpfs mount, not zvfs" in res.stderr, res
        assert mount_entry(tm) is not None
    finally:
        run(["umount", tm], check=True)


def test_unmount_through_a_symlink_to_the_mountpoint(zarr_dir, tmp_path, mount) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    m = mount(zarr_dir, mountpoint=link, check=False)
    mount.mountpoints.append(real)  # unmounted at teardown by its real path
    assert m.result.returncode == 0, m.result.stderr
    assert mount_entry(real) is not None
    res = run([tool("zvfs"), "unmount", link])
    assert res.returncode == 0, res.stderr
    assert mount_entry(real) is None


# a stopped daemon blocks whatever walks the machine's mounts beside it (plain df in another
# test held this one's unmount busy: EBUSY): the tests that stop one run alone
@pytest.mark.exclusive
def test_a_hung_mount_is_told_hung_refused_and_unmounted(zarr_dir, mount) -> None:
    """With the daemon stopped (SIGSTOP), `zvfs status MNT`, `zvfs mount` onto it and `zvfs
    unmount` each waited for ever: they resolved the path with realpath, whose lstat of the
    mountpoint is a request to the daemon. Now each answers within seconds."""
    m = mount(zarr_dir)
    pid, = daemon_pids(m.path)
    os.kill(pid, signal.SIGSTOP)
    try:
        res = run([tool("zvfs"), "status", m.path, "--timeout", "2"], timeout=30)
        assert res.returncode == 1 and f"{m.path}: hung" in res.stdout, res
        res = zvfs_mount(zarr_dir, m.path, timeout=30)
        assert res.returncode == 78 and "already mounted" in res.stderr, res
        res = run([tool("zvfs"), "unmount", m.path], timeout=30)
        assert res.returncode == 0, res
        assert mount_entry(m.path) is None
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_until(lambda: not _pid_alive(pid), 20), "the daemon did not end once unmounted"


# a stopped daemon blocks whatever walks the machine's mounts beside it (plain df in another
# test held this one's unmount busy: EBUSY): the tests that stop one run alone
@pytest.mark.exclusive
def test_hung_mounts_cost_status_one_timeout_not_one_each(zarr_dir, mount) -> None:
    """`zvfs status` probed the mounts one after the other: three hung ones took three
    timeouts (and many healthy ones on a busy machine added up: 47 s seen). They are
    probed side by side now: one timeout, each still told hung, in the mount table's
    order."""
    mounts = [mount(zarr_dir) for _ in range(3)]
    pids = [pid for m in mounts for pid in daemon_pids(m.path)]
    assert len(pids) == 3
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        res = run([tool("zvfs"), "status", "--json", "--timeout", "4"], timeout=60)
        took = time.monotonic() - t0
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert res.returncode == 1, res
    infos = {i["mountpoint"]: i for i in json.loads(res.stdout)}
    for m in mounts:
        assert infos[str(m.path)]["health"] == "hung", infos[str(m.path)]
    mine = {str(m.path) for m in mounts}
    assert [i["mountpoint"] for i in json.loads(res.stdout) if i["mountpoint"] in mine] == \
        [e.mountpoint for e in mount_table() if e.mountpoint in mine]
    assert took < 8, f"three hung mounts took {took:.1f} s (one after the other: 12 s at least)"


def test_a_dead_mount_still_in_use_is_unmounted(zarr_dir, mount) -> None:
    """A killed daemon's mount with a shell inside: a plain unmount is busy, and nothing in
    it works any more, so `zvfs unmount` detaches it, as `zvfs mount` does, and says so."""
    m = mount(zarr_dir)
    pid, = daemon_pids(m.path)
    inside = subprocess.Popen(["sleep", "60"], cwd=m.path)
    try:
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not _pid_alive(pid), 10)
        res = run([tool("zvfs"), "unmount", m.path], timeout=30)
        assert res.returncode == 0, res
        assert "dead mount still in use: detached" in res.stderr, res.stderr
        assert mount_entry(m.path) is None
    finally:
        inside.kill()
        inside.wait()


def test_a_cache_dir_that_cannot_be_used_is_a_configuration_error(zarr_dir, mnt, tmp_path) -> None:
    """A file, or a place nothing can be made in, given as --cache-dir failed the mount with
    exit 1 (a failure systemd retries) and a raw errno message (a helper's audit)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for bad, why in ((a_file, "not a directory"), (Path("/proc/zvfs-cache"), "no such file")):
        for fg in ([], ["-f"]):
            res = zvfs_mount(zarr_dir, mnt, "--cache-dir", bad, *fg)
            assert res.returncode == 78, (res.returncode, res.stderr)
            assert_fails(res, f"cannot use --cache-dir {re.escape(str(bad))}", why, "a directory zvfs can write in")
            assert "Errno" not in res.stderr, res.stderr
            assert_nothing_mounted(mnt)


def test_a_cache_dir_whose_staging_cannot_be_used_is_a_configuration_error(zarr_s3, moto, s3_env, mnt,
                                                                            tmp_path) -> None:
    """A writable S3 mount stages under --cache-dir/staging: a file of that name failed the
    mount with exit 1 (which systemd retries, to no end) and "[Errno 17] File exists". A
    read-only mount, which stages nothing, still mounts."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "staging").write_text("x")
    for fg in ([], ["-f"]):
        res = zvfs_mount(zarr_s3, mnt, "--endpoint-url", moto.endpoint, "--cache-dir", cache, "--writable",
                         *fg, env=s3_env)
        assert res.returncode == 78, (res.returncode, res.stderr)
        assert_fails(res, f"cannot use --cache-dir {re.escape(str(cache))}: "
                          f"{re.escape(str(cache / 'staging'))} is not a directory")
        assert "Errno" not in res.stderr, res.stderr
        assert_nothing_mounted(mnt)
    res = zvfs_mount(zarr_s3, mnt, "--endpoint-url", moto.endpoint, "--cache-dir", cache,
                     "--log-file", tmp_path / "log", env=s3_env)
    try:
        assert res.returncode == 0, res.stderr
    finally:
        force_unmount(mnt)


@probes_every_mount
@pytest.mark.parametrize("args", [[], ["--json"]], ids=["text", "json"])
def test_status_whose_output_cannot_be_written_says_so_without_a_traceback(zarr_dir, mount, args) -> None:
    """`zvfs status | head -0` (its reader gone) and `zvfs status > /dev/full` printed a
    traceback (a helper's audit)."""
    mount(zarr_dir)
    read_end, write_end = os.pipe()
    os.close(read_end)  # nothing will read: the first write is EPIPE
    try:
        res = subprocess.run([*zvfs_cmd(), "status", *args], stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=FAST)
    finally:
        os.close(write_end)
    assert res.returncode == 141 and res.stderr == "", (res.returncode, res.stderr)
    with open("/dev/full", "w") as full:
        res = subprocess.run([*zvfs_cmd(), "status", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                             timeout=FAST)
    assert res.returncode == 1, res
    assert res.stderr.strip() == "zvfs: error: cannot write the output: No space left on device", res.stderr


def test_a_log_file_that_cannot_be_written_is_refused(zarr_dir, mnt) -> None:
    res = zvfs_mount(zarr_dir, mnt, "--log-file", "/proc/zvfs-test.log")
    assert res.returncode == 78, (res.returncode, res.stderr)
    assert_fails(res, r"cannot write to the log file /proc/zvfs-test.log")
    assert_nothing_mounted(mnt)


def test_a_log_file_in_a_directory_that_does_not_exist_is_refused(zarr_dir, mnt, tmp_path) -> None:
    """A typo in --log-file's directory made the whole path and mounted, the log going to a
    stray place: it is refused, as a file a shell redirection could not create (the default
    log's own directory, /var/log/zvfs, is still made)."""
    typo = tmp_path / "var" / "lgo" / "zvfs.log"
    res = zvfs_mount(zarr_dir, mnt, "--log-file", typo)
    assert res.returncode == 78, (res.returncode, res.stderr)
    assert_fails(res, rf"cannot write to the log file {re.escape(str(typo))}: No such file or directory")
    # the path was given: the hint is to fix it, not to 'pass --log-file PATH' again
    assert "give --log-file a file in a directory that exists" in res.stderr, res.stderr
    assert not (tmp_path / "var").exists()
    assert_nothing_mounted(mnt)


def test_the_log_directory_removed_under_a_mount_ends_nothing(tmp_path, mount) -> None:
    """The log's directory removed (a cleanup, logrotate gone wrong): the next line logged
    (a corrupt chunk's) raised out of logging and ended the daemon, and the mount with it."""
    import numpy as np
    import zarr

    src = tmp_path / "store"
    n = 1 << 20  # chunks of 4 MiB: a read of the second is not read ahead into the first
    a = zarr.open_array(str(src / "a"), mode="w", shape=(2 * n,), chunks=(n,), dtype="i4")
    a[:] = np.arange(2 * n)
    (src / "a" / "c" / "0").write_bytes(b"not a chunk")
    logs = tmp_path / "logs"
    logs.mkdir()
    m = mount(src, "--log-file", str(logs / "zvfs.log"), "--log-level", "info")
    pid, = daemon_pids(m.path)
    shutil.rmtree(logs)
    data = m.path / ".zvfs" / "arrays" / "a" / "data.raw"
    with pytest.raises(OSError) as err:
        data.read_bytes()
    assert err.value.errno == errno.EIO
    assert _pid_alive(pid) and mount_entry(m.path) is not None
    logs.mkdir()
    with open(data, "rb") as f:  # the healthy chunk still reads
        f.seek(4 * n)
        assert f.read(40) == np.arange(n, n + 10, dtype="i4").tobytes()
    assert (m.path / "a" / "zarr.json").read_bytes() == (src / "a" / "zarr.json").read_bytes()


def test_why_fuse_refused_the_mount_is_the_error(monkeypatch) -> None:
    """libfuse and fusermount3 say why they refuse a mount (allow_other not allowed, no write
    access to the mountpoint, /dev/fuse not openable) on stderr, which a daemonized mount
    had pointed at /dev/null: its error was only "fuse_session_mount failed", exit 1. The
    text is now the error (MountRefused, which the CLI exits 78 with). pyfuse3.init is
    replaced by one that fails as it does, writing on file descriptor 2 as C code does."""
    from zvfs import daemon

    said = b"fusermount3: option allow_other only allowed if 'user_allow_other' is set in /etc/fuse.conf\n"

    def refused(*_args: object) -> None:
        os.write(2, said)
        raise RuntimeError("fuse_session_mount failed")

    monkeypatch.setattr(daemon.pyfuse3, "init", refused)
    before = os.fstat(2)
    with pytest.raises(daemon.MountRefused) as err:
        daemon.init_fuse(None, "/nowhere", set())
    assert str(err.value) == said.decode().strip()
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)  # stderr is back


def test_unmounting_another_users_mount_says_whose_it_is(monkeypatch) -> None:
    """As a user other than the one who mounted (and not root), fusermount3 said only
    "entry for ... not found in /etc/mtab". In process: the CLI's unmount, with the mount
    table's entry and the caller's uid given."""
    from zvfs import cli
    from zvfs.mounts import MountEntry

    entry = MountEntry("/mnt/theirs", "0:99", "fuse.zvfs", "zvfs:/data/x.zarr", "ro,nosuid",
                       "ro,user_id=1234,group_id=1234,default_permissions")
    monkeypatch.setattr(cli, "mount_entry", lambda _path: entry)
    monkeypatch.setattr(cli.os, "geteuid", lambda: 4321)
    with pytest.raises(cli.CliError) as err:
        cli._unmount("/mnt/theirs", lazy=False)
    assert str(err.value) == "/mnt/theirs was mounted by uid 1234: only that user or root can unmount it"


def test_default_log_files_of_two_mountpoints_are_two_files() -> None:
    """/tmp/a-b/c and /tmp/a/b-c both logged to tmp-a-b-c.log (a helper's audit). The name is
    the mountpoint's path as `systemd-escape --path` gives it (its output for these paths)."""
    from zvfs.cli import default_log_file

    one, two = default_log_file("/tmp/a-b/c"), default_log_file("/tmp/a/b-c")
    assert one != two
    assert os.path.basename(one) == "tmp-a\\x2db-c.log" and os.path.basename(two) == "tmp-a-b\\x2dc.log"
    assert os.path.basename(default_log_file("/mnt/store")) == "mnt-store.log"


def test_a_mountpoint_too_long_for_a_log_file_name_mounts(zarr_dir, tmp_path) -> None:
    """A mountpoint whose escaped path has more than 255 bytes was refused without --log-file
    ("File name too long; pass --log-file PATH"): its default log's name is then a digest
    of the path and the path's end, 255 bytes at most, one for each mountpoint."""
    from zvfs.cli import default_log_file

    long_a = tmp_path / ("d" * 120) / ("e" * 140)
    long_b = tmp_path / ("d" * 121) / ("e" * 140)
    names = {os.path.basename(default_log_file(str(p))) for p in (long_a, long_b)}
    assert len(names) == 2 and all(len(os.fsencode(n)) <= 255 and n.endswith("e" * 100 + ".log") for n in names)
    long_a.mkdir(parents=True)
    log = Path(default_log_file(str(long_a)))
    res = run([*zvfs_cmd(), "mount", str(zarr_dir), str(long_a)], timeout=FAST + 30)
    try:
        assert res.returncode == 0, res.stderr
        assert str(log) in res.stderr and log.exists(), (res.stderr, log)
    finally:
        force_unmount(long_a)
        log.unlink(missing_ok=True)

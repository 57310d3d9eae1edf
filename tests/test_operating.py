"""Operating zvfs like a production mount (issue 12): version, help, option checks, error
messages, exit codes, logs, stats.json, `zvfs status`, Prometheus metrics, df, mtimes.

Every check drives the installed console scripts against real mounts; the metrics
are scraped over HTTP and parsed by prometheus-client's own parser.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import importlib.metadata
import json
import math
import os
import re
import shutil
import signal
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import (
    Mounted,
    _pid_alive,
    daemon_pids,
    force_unmount,
    in_threads,
    mount_entry,
    mount_stats,
    probes_every_mount,
    run,
    store_files,
    tool,
    wait_until,
    zvfs_cmd,
)
from metrics_scrape import metrics_url, scrape, scrape_text, total
from moto_server import free_port

EX_CONFIG = 78


def zvfs(*args, **kw):
    return run([*zvfs_cmd(), *map(str, args)], timeout=90, **kw)


def one_line(res, *words: str, code: int | None = None) -> str:
    assert res.returncode != 0, res.stderr
    if code is not None:
        assert res.returncode == code, (res.returncode, res.stderr)
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, f"not one line:\n{err}"
    assert "usage:" not in err and "Traceback" not in err, err
    for w in words:
        assert re.search(w, err, re.I), f"{w!r} not in: {err}"
    return err


# --------------------------------------------------------------------------- version, help, options


def test_version() -> None:
    res = zvfs("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"zvfs {importlib.metadata.version('zvfs')}"


def test_help_shows_every_default_and_choice() -> None:
    from zvfs.options import OPTIONS

    res = zvfs("mount", "--help", env=dict(os.environ, COLUMNS="200"))
    assert res.returncode == 0, res.stderr
    # one entry per option: a line that starts with the flag, and its indented continuation
    entries: dict[str, str] = {}
    flag = None
    for line in res.stdout.split("options:", 1)[1].splitlines():
        m = re.match(r"^  (--[a-z0-9-]+|-\w)\b(.*)", line)
        if m:
            flag = m.group(1)
            entries[flag] = m.group(2)
        elif flag:
            entries[flag] += " " + line.strip()
    for opt in OPTIONS:
        flag = "--" + opt.name.replace("_", "-")
        assert flag in entries, f"{flag} missing from --help"
        assert "(default: " in entries[flag], f"{flag} shows no default: {entries[flag]}"
        for choice in opt.choices or ():
            assert choice in entries[flag], f"{flag} does not list {choice!r}"


@pytest.mark.parametrize("args,words", [
    (["--threads", "0"], [r"--threads", r">= 1"]),
    (["--threads", "-3"], [r"--threads", r">= 1"]),
    (["-o", "threads=0"], [r"threads", r">= 1"]),
    (["--cache-size=-1G"], [r"--cache-size", r"size >= 0"]),
    (["--metadata-ttl", "-5"], [r"--metadata-ttl", r">= 0", "indefinite"]),
    (["--metadata-ttl", "forever"], [r"--metadata-ttl", "indefinite"]),
    (["--decoded", "sideways"], [r"--decoded", "hidden, visible, off"]),
    (["--log-level", "chatty"], [r"--log-level", "debug, info, warning, error"]),
    (["--metrics-addr", "here"], [r"--metrics-addr", "HOST:PORT"]),
    (["--metrics-addr", "127.0.0.1:65536"], [r"--metrics-addr", "HOST:PORT", "0 .any free one. to 65535"]),
    (["--s3-attempts", "0"], [r"--s3-attempts", r">= 1"]),
    (["-o", "s3_timeout=0"], [r"s3_timeout", r"> 0"]),
    (["-o", "no_such_option=1"], [r"no_such_option", "--help"]),
])
def test_invalid_values_are_one_line(zarr_dir, tmp_path, args, words) -> None:
    (tmp_path / "m").mkdir()
    one_line(zvfs("mount", zarr_dir, tmp_path / "m", *args), *words, code=EX_CONFIG)
    assert mount_entry(tmp_path / "m") is None


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_status_timeout_must_be_seconds_above_0(value) -> None:
    """A timeout of 0 or less reported every mount hung."""
    res = run([tool("zvfs"), "status", "--timeout", value])
    assert res.returncode == 2, res
    assert f"--timeout: {value} is no number of seconds above 0" in res.stderr, res.stderr


@pytest.mark.parametrize("value", ["86401", "3000000", "1e300"])
def test_status_timeout_of_more_than_a_day_is_one_line(value) -> None:
    """A timeout of 35 days or more was a traceback (the selector's OverflowError; a
    helper's audit)."""
    res = run([tool("zvfs"), "status", "--timeout", value])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert f"--timeout: {value} is more than a day (86400 s)" in res.stderr, res.stderr


def test_bad_command_line_is_one_line() -> None:
    res = zvfs("mount", "only-a-source")
    one_line(res, "mountpoint", "--help", code=2)


# --------------------------------------------------------------------------- error messages


def test_endpoint_without_scheme(tmp_path, s3_env) -> None:
    (tmp_path / "m").mkdir()
    res = zvfs("mount", "s3://b/p", tmp_path / "m", "--endpoint-url", "127.0.0.1:9", env=s3_env)
    one_line(res, r"--endpoint-url http://127\.0\.0\.1:9", code=EX_CONFIG)


def test_endpoint_that_is_not_s3(tmp_path, s3_env) -> None:
    """A plain HTTP server (404 to everything) is no S3 server, not a missing bucket."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        (tmp_path / "m").mkdir()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        res = zvfs("mount", "s3://bucket/p", tmp_path / "m", "--endpoint-url", url, env=s3_env)
        err = one_line(res, re.escape(url), "not look like an S3 server", "--endpoint-url")
        assert "does not exist" not in err
    finally:
        server.shutdown()
        server.server_close()


def test_invalid_bucket_name(moto, s3_env, tmp_path) -> None:
    (tmp_path / "m").mkdir()
    res = zvfs("mount", "s3://Bad_Bucket!/p", tmp_path / "m", "--endpoint-url", moto.endpoint, env=s3_env)
    err = one_line(res, "Bad_Bucket!", "not a valid S3 bucket name", code=EX_CONFIG)
    assert "regex" not in err and "^[" not in err


def test_plain_file_that_is_no_zip(tmp_path) -> None:
    src = tmp_path / "data.bin"
    src.write_bytes(b"not a zip at all\n")
    (tmp_path / "m").mkdir()
    err = one_line(zvfs("mount", src, tmp_path / "m"), re.escape(str(src)), "not a zip", code=EX_CONFIG)
    assert len(err) - len(str(src)) < 150, err  # one short line, whatever the temporary path


def test_unreachable_endpoint_is_not_a_config_error(tmp_path, s3_env) -> None:
    """A closed port: one picked beforehand (nothing must listen on it, so nothing binds it)."""
    (tmp_path / "m").mkdir()
    res = zvfs("mount", "s3://b/p", tmp_path / "m", "--endpoint-url", f"http://127.0.0.1:{free_port()}",
               env=s3_env)
    one_line(res, "cannot reach", code=1)


def test_service_config_error_is_not_restarted(tmp_path) -> None:
    """The unit's RestartPreventExitStatus= is the status a configuration error exits with."""
    from test_systemd import SERVICE, expand_exec, read_unit

    unit = read_unit(SERVICE)
    svc = unit["Service"]
    assert int(unit["Unit"]["StartLimitBurst"]) > 0 and int(unit["Unit"]["StartLimitIntervalSec"]) > 0
    prevent = {int(x) for x in svc["RestartPreventExitStatus"].split()}
    (tmp_path / "m").mkdir()
    argv = expand_exec(svc["ExecStart"], {"SOURCE": str(tmp_path / "missing.zarr"),
                                          "MOUNTPOINT": str(tmp_path / "m"), "OPTIONS": ""})
    res = run([tool("zvfs"), *argv[1:]], timeout=90)
    assert res.returncode in prevent, (res.returncode, prevent, res.stderr)


# --------------------------------------------------------------------------- logs


def test_daemon_logs_to_a_default_file_it_names(zarr_dir, tmp_path) -> None:
    """No --log-file and no syslog: the log lands in a file, and `zvfs mount` says which."""
    mnt = tmp_path / "m"
    mnt.mkdir()
    res = zvfs("mount", zarr_dir, mnt, "--log-level", "info")
    m = None
    try:
        assert res.returncode == 0, res.stderr
        m = re.search(r"its log goes to (\S+)", res.stderr)
        assert m, res.stderr
        log = Path(m.group(1))
        assert log.parent == Path("/var/log/zvfs" if os.geteuid() == 0 else
                                  os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) \
            / ("" if os.geteuid() == 0 else "zvfs")
        assert wait_until(lambda: f"mounted {mnt}" in log.read_text(), 10), log.read_text()
        assert f"zvfs[{daemon_pids(mnt)[0]}]" in log.read_text()
    finally:
        force_unmount(mnt)
        if m:
            Path(m.group(1)).unlink(missing_ok=True)


def test_the_daemon_keeps_none_of_its_callers_descriptors_and_raises_its_file_limit(
        zarr_dir, tmp_path) -> None:
    """`flock 9 zvfs mount ...` (a cron script) gave the daemon the lock's descriptor, held
    for the whole mount, so the script's next run waited on its own lock: the daemon now
    closes what it inherited beyond stdio. And a shell's soft limit of 1,024 open files
    made reads fail with EIO under 1,200 open chunk files: the daemon raises its soft
    limit to the hard one, as rclone does."""
    import fcntl
    import resource
    import subprocess

    mnt = tmp_path / "m"
    mnt.mkdir()
    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    try:
        res = subprocess.run([*zvfs_cmd(), "mount", str(zarr_dir), str(mnt), "--log-file", str(tmp_path / "log")],
                             pass_fds=(fd,), preexec_fn=low_limit, capture_output=True, text=True,
                             timeout=90)
        assert res.returncode == 0, res.stderr
        (pid,) = daemon_pids(mnt)
        held = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
        assert str(lock) not in held, held
        with open(f"/proc/{pid}/limits") as f:
            line = next(ln for ln in f if ln.startswith("Max open files"))
        assert int(line.split()[3]) == (hard if hard != resource.RLIM_INFINITY else 1 << 20), line
        os.close(fd)  # our own lock goes; another taker gets it at once
        other = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
        assert sorted(os.listdir(mnt)) == sorted(p.name for p in zarr_dir.iterdir())
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
        force_unmount(mnt)


def test_a_daemon_out_of_descriptors_reads_on_and_says_which_limit(tmp_path) -> None:
    """Under a hard limit of 64 open files the daemon's scan kept 58 metadata files open (its
    cache of read descriptors held 128), so every open through the mount failed with EIO,
    a `cat` of one raw file too, and its log, not opened until its first line, could not be
    opened to say why: the log stayed empty. The descriptors kept are now at most an eighth
    of the limit, and shed when an open finds none left.

    And each raw file open through the mount held a descriptor: a program holding as many
    as the limit allows (160 here; 244 at a limit of 256) made every other file of the mount
    fail with EIO, a decoded view, zarr.json and a listing too, for as long as it held them,
    and its own opens past the limit failed EIO. The opens now hold at most the limit less a
    reserve (a quarter, 32 at least); past it an open holds none and reads the file it
    found (ESTALE once that is replaced), one line saying so and which limit to raise."""
    import resource
    import subprocess

    import zarr

    store = tmp_path / "many.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    for i in range(40):
        g.create_array(f"a{i}", shape=(8, 8), chunks=(4, 4), dtype="u1")[:] = _values(i)
    mnt = tmp_path / "m"
    mnt.mkdir()
    log = tmp_path / "log"

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    res = subprocess.run([*zvfs_cmd(), "mount", str(store), str(mnt), "--log-file", str(log)],
                         preexec_fn=low_limit, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    held: list[int] = []
    try:
        _read_on_out_of_descriptors(store, mnt, log, held)
    finally:
        for fd in held:
            os.close(fd)
        force_unmount(mnt)


def _read_on_out_of_descriptors(store: Path, mnt: Path, log: Path, held: list[int]) -> None:
    for i in range(20):  # decoded reads: each of its 4 chunks read through the kept descriptors
        assert (mnt / ".zvfs/arrays" / f"a{i}" / "data.raw").read_bytes() == _values(i).tobytes()
        assert (mnt / f"a{i}" / "0.0").read_bytes() == (store / f"a{i}" / "0.0").read_bytes()
    try:
        # every chunk file open at once: 160 opens, more than the daemon's 64 descriptors
        names = [f"a{i}/{c}" for i in range(40) for c in ("0.0", "0.1", "1.0", "1.1")]
        for name in names:
            held.append(os.open(mnt / name, os.O_RDONLY))
        # (the last one is read only once its file is replaced, below: no page of it cached)
        assert [os.pread(fd, 100, 0) for fd in held[:-1]] == [(store / n).read_bytes() for n in names[:-1]]
        # meanwhile the rest of the mount serves: a decoded view not read yet, metadata, a listing
        assert (mnt / ".zvfs/arrays/a33/data.raw").read_bytes() == _values(33).tobytes()
        assert (mnt / "a34" / ".zarray").read_bytes() == (store / "a34" / ".zarray").read_bytes()
        assert sorted(os.listdir(mnt / "a35")) == sorted(os.listdir(store / "a35"))
        # the last open holds no descriptor: replaced outside the mount, it is stale
        (store / "a39" / "1.1.new").write_bytes(b"another file")
        os.replace(store / "a39" / "1.1.new", store / "a39" / "1.1")
        with pytest.raises(OSError) as ei:
            os.pread(held[-1], 100, 0)
        assert ei.value.errno == errno.ESTALE, ei.value
        text = log.read_text()
        assert text.count("files are open through the mount") == 1, text
        assert "daemon's open-file limit, 64, is kept for its other work; raise it" in text, text
        assert "ERROR" not in text, text
    finally:
        for fd in held:
            os.close(fd)
        held.clear()
    # and once they are closed, everything reads again
    assert (mnt / "a39" / "1.1").read_bytes() == b"another file"
    assert (mnt / ".zvfs/arrays/a7/data.raw").read_bytes() == _values(7).tobytes()


def _values(i: int):
    import numpy as np

    return (np.arange(64, dtype="u1") + 1 + i).reshape(8, 8)


# --------------------------------------------------------------------------- stats.json


def test_stats_json_keys_are_stable_and_size_is_true(zarr_dir, mount) -> None:
    from zvfs.stats import ERROR_KINDS

    m: Mounted = mount(zarr_dir)
    before = mount_stats(m.path)
    for kind in ERROR_KINDS:
        assert before[f"store_errors_{kind}"] == 0
    assert before["store_retries"] == 0
    assert before["version"] == importlib.metadata.version("zvfs")
    assert before["source"] == str(zarr_dir)
    assert before["options"]["threads"] == "16" and before["options"]["decoded"] == "hidden"
    assert "bytes" not in before["listing_cache"] and before["listing_cache"]["max_entries"] > 0
    assert before["pid"] == daemon_pids(m.path)[0]
    data = (m.path / ".zvfs" / "arrays" / "temperature" / "data.raw").read_bytes()
    assert data
    after = mount_stats(m.path)
    assert set(after) == set(before)
    assert after["chunks_decoded"] > before["chunks_decoded"]
    # the size stat reports is the size of what a read returns
    for _ in range(3):
        with open(m.path / ".zvfs" / "stats.json", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            body = f.read()
        assert size == len(body), (size, len(body))
        json.loads(body)
        (m.path / "zarr.json").read_bytes()


def test_stats_json_read_by_many_at_once_is_whole(zarr_dir, mount) -> None:
    """Readers opening stats.json at once shared one snapshot: an open by another reader
    replaced it mid-read, and a reader got the head of one rendering and the tail of the
    next (json 'Extra data'). (The size fstat reports is the inode's, that of the last
    open by anyone: with readers at once it may be another's, so it is not compared here.)"""
    m: Mounted = mount(zarr_dir)
    stats = m.path / ".zvfs" / "stats.json"
    bad: list = []

    def read(_i: int) -> None:
        for _ in range(100):
            with open(stats, "rb") as f:
                head = f.read(64)
                (m.path / "zarr.json").read_bytes()  # counters move between the reads
                body = head + f.read()
            try:
                json.loads(body)
            except ValueError as exc:
                bad.append(str(exc))

    assert not in_threads(read, 8)
    assert not bad, bad[:5]


def test_mount_started_with_its_standard_streams_closed(zarr_dir, mount, tmp_path) -> None:
    """`zvfs mount ... >&- 2>&- <&-` (a job runner, a service wrapper that closes them) failed
    with status 1 and mounted nothing: Python gives sys.stdout as None then, and the mount
    died on sys.stdout.flush() (AttributeError, on a stderr that was not there either)."""
    import subprocess

    mp = mount.new_mountpoint()
    mount.mountpoints.append(mp)
    log = tmp_path / "closed.log"

    def close_std() -> None:
        for fd in (0, 1, 2):
            os.close(fd)

    res = subprocess.run([*zvfs_cmd(), "mount", str(zarr_dir), str(mp), "--log-file", str(log)],
                         preexec_fn=close_std, timeout=60)
    assert res.returncode == 0, log.read_text() if log.exists() else "no log"
    assert mount_entry(mp) is not None
    assert json.loads((mp / ".zvfs" / "stats.json").read_bytes())["source"] == str(zarr_dir)


# --------------------------------------------------------------------------- status


def test_status_shows_decoders_auto_among_the_options(zarr_dir, mount) -> None:
    """``--decoders auto`` parses to "not set", and the options in effect (status, its JSON,
    stats.json) had no decoders at all then, while the default showed decoders=0 (a
    helper's audit of the README)."""
    m = mount(zarr_dir, "--decoders", "auto")
    stats = json.loads((m.path / ".zvfs/stats.json").read_bytes())
    assert stats["options"]["decoders"] == "auto", stats["options"]
    res = zvfs("status", m.path)
    assert res.returncode == 0 and "decoders=auto" in res.stdout, res.stdout


@pytest.mark.parametrize("planted", [
    {"source": "s3://someone-elses-bucket/x", "pid": 1, "version": "9.9", "uptime_seconds": 999999,
     "ready": False, "store_requests": 12345, "chunk_cache": {"hits": 5, "misses": 5},
     "options": {"metrics_addr": "10.0.0.1:1"}, "time": 0, "last_error": {"time": 0, "message": "made up"}},
    [1, 2],
    "not json",
], ids=["another-mounts-copy", "json-not-an-object", "not-json"])
def test_status_of_decoded_off_ignores_a_stats_json_the_store_holds(tmp_path, mount, planted) -> None:
    """With ``decoded=off`` the store's own ``.zvfs/`` keys are shown, and a copy made of
    another mount holds a ``.zvfs/stats.json``: status read it as this mount's own, and
    showed that mount's source, pid, metrics address and counters (and, with ``ready``
    false, "starting" for ever); JSON that was no object was a traceback (a helper's
    audit). The daemon's is rendered at its open, and only that is taken."""
    src = tmp_path / "src"
    (src / ".zvfs").mkdir(parents=True)
    (src / "a").write_text("hi")
    body = planted if isinstance(planted, str) else json.dumps(planted)
    (src / ".zvfs" / "stats.json").write_text(body)
    m = mount(src, "-o", "decoded=off")
    assert (m.path / ".zvfs" / "stats.json").read_text() == body  # the store's, as the README says
    res = zvfs("status", m.path, "--json")
    assert res.returncode == 0, (res.stdout, res.stderr)
    [info] = json.loads(res.stdout)
    assert info["health"] == "ok" and info["source"] == str(src), info
    assert info["pid"] is None and info["metrics"] is None and "store" not in info, info
    res = zvfs("status", m.path)
    assert res.returncode == 0 and res.stderr == "", res
    assert "counters:   not available" in res.stdout and "someone-elses" not in res.stdout, res.stdout


@probes_every_mount
def test_status_lists_health_source_options_and_traffic(zarr_dir, zarr_s3, moto, s3_env, mount) -> None:
    local = mount(zarr_dir, "--threads", "3", "--metadata-ttl", "indefinite")
    remote = mount(zarr_s3, "--endpoint-url", moto.endpoint, env=s3_env)
    (remote.path / "temperature" / "zarr.json").read_bytes()
    (local.path / ".zvfs" / "arrays" / "temperature" / "data.raw").read_bytes()
    res = zvfs("status", "--json")
    assert res.returncode in (0, 1), res.stderr  # other mounts of the machine may be unhealthy
    infos = {i["mountpoint"]: i for i in json.loads(res.stdout)}
    mine = infos[str(local.path)], infos[str(remote.path)]
    for info, m in zip(mine, (local, remote), strict=True):
        assert info["health"] == "ok"
        assert info["pid"] == daemon_pids(m.path)[0]
        assert info["uptime_seconds"] > 0
        assert info["version"] == importlib.metadata.version("zvfs")
        assert info["store"]["requests"] > 0 and info["store"]["bytes"] > 0
        assert set(info["store"]["errors"]) >= {"throttled", "timeout", "denied"}
        assert info["cache"]["max_bytes"] == 512 << 20
        assert info["last_error"] is None
    assert mine[0]["source"] == str(zarr_dir) and mine[0]["options"]["threads"] == "3"
    # the option an operator most needs to see (it was left out: it parses to None)
    assert mine[0]["options"]["metadata_ttl"] == "indefinite" and mine[1]["options"]["metadata_ttl"] == "60"
    assert mine[1]["source"] == zarr_s3 and mine[1]["options"]["endpoint_url"] == moto.endpoint
    assert mine[0]["cache"]["misses"] > 0 and mine[0]["cache"]["hit_rate"] is not None
    # one mount, as text
    res = zvfs("status", local.path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"{local.path}: ok") and str(zarr_dir) in res.stdout
    assert "metadata_ttl=indefinite" in res.stdout, res.stdout
    # a dead mount is reported dead (and the status exits 1)
    pid = daemon_pids(remote.path)[0]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not _pid_alive(pid), 10)
    res = zvfs("status", remote.path, "--json")
    assert res.returncode == 1
    assert json.loads(res.stdout)[0]["health"] == "dead"
    res = zvfs("status", remote.path)  # as text, it says how to clear it
    assert res.returncode == 1 and f"clear it with: zvfs unmount {remote.path}" in res.stdout, res.stdout
    one_line(zvfs("status", "/proc"), "not a zvfs mount")


# --------------------------------------------------------------------------- metrics


def test_status_tells_a_mount_whose_source_is_still_being_opened_starting(
        zarr_s3, moto, s3_env, tmp_path) -> None:
    """While an S3 source is still being probed the mount answers (its stats.json too), but
    every listing waits for the store, and the mount is undone if the probe fails: `zvfs
    status` called it "ok" and exited 0. It is "starting" (exit 1) until it is ready."""
    import subprocess

    from faultproxy import FaultProxy

    mnt = tmp_path / "m"
    mnt.mkdir()
    with FaultProxy(moto.port) as proxy:
        proxy.set({"kind": "silent", "ops": ["list"]})  # the probe hangs until cleared
        proc = subprocess.Popen([*zvfs_cmd(), "mount", zarr_s3, str(mnt), "--endpoint-url", proxy.endpoint,
                                 "--log-file", str(tmp_path / "log")], env=s3_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_until(lambda: mount_entry(mnt) is not None, 60), proc.poll()
            assert wait_until(lambda: proxy.stats().get("requests_list", 0) >= 1, 60)
            res = zvfs("status", mnt, "--json")
            (info,) = json.loads(res.stdout)
            assert info["health"] == "starting" and res.returncode == 1, res.stdout
            assert "still being opened" in info["error"], info
            text = zvfs("status", mnt)
            assert text.stdout.startswith(f"{mnt}: starting (its source is still being opened"), text.stdout
            assert "process:    pid" in text.stdout, text.stdout
            proxy.clear()
            _out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            res = zvfs("status", mnt, "--json")
            assert json.loads(res.stdout)[0]["health"] == "ok" and res.returncode == 0, res.stdout
        finally:
            if proc.poll() is None:
                proc.kill()
            force_unmount(mnt)


def test_metrics_endpoint_moves_with_a_workload(zarr_s3, zarr_dir, moto, s3_env, mount) -> None:
    m = mount(zarr_s3, "--endpoint-url", moto.endpoint, "--metrics-addr", "0",
              "--metrics-label", "sample", env=s3_env)
    url = metrics_url(m.path)
    port = int(re.fullmatch(r"http://127\.0\.0\.1:(\d+)/metrics", url).group(1))
    # a port alone listens on loopback only
    with open("/proc/net/tcp") as f:
        listening = [ln.split()[1] for ln in f if ln.split()[3] == "0A"]
    assert f"0100007F:{port:04X}" in listening, listening
    before = scrape(url)
    assert all(dict(lab).get("mount") == "sample" for (_n, lab) in before)
    for kind in ("throttled", "server", "timeout", "denied"):
        assert ("zvfs_store_errors_total", (("kind", kind), ("mount", "sample"))) in before
    # every family the README lists is there from the start (at 0), so dashboards never miss one
    names = {n for (n, _lab) in before}
    for name in ("zvfs_store_retries_total", "zvfs_cache_hits_total", "zvfs_cache_misses_total",
                 "zvfs_cache_evictions_total", "zvfs_chunk_cache_bytes", "zvfs_prefetch_hits_total",
                 "zvfs_decode_seconds_total", "zvfs_fuse_errors_total", "zvfs_store_request_seconds_bucket",
                 "zvfs_inodes", "zvfs_s3_requests_total"):
        assert name in names, (name, sorted(names))
    for cache in ("chunk", "listing"):
        assert ("zvfs_cache_evictions_total", (("cache", cache), ("mount", "sample"))) in before
    files = sorted(store_files(zarr_dir))
    half = len(files) // 2

    def work(keys: list[str]) -> None:
        for k in keys:
            assert (m.path / k).read_bytes() == (zarr_dir / k).read_bytes()

    work(files[:half])
    during = scrape(url)
    work(files[half:])
    (m.path / ".zvfs" / "arrays" / "temperature" / "data.raw").read_bytes()
    after = scrape(url)
    for name, labels in (("zvfs_store_requests_total", {}), ("zvfs_store_bytes_total", {}),
                         ("zvfs_s3_requests_total", {"op": "GetObject"}),
                         ("zvfs_fuse_operations_total", {"op": "read"}),
                         ("zvfs_store_request_seconds_count", {})):
        a, b, c = total(before, name, **labels), total(during, name, **labels), total(after, name, **labels)
        assert a < b < c, (name, a, b, c)
    assert total(after, "zvfs_chunks_decoded_total") > 0
    assert total(after, "zvfs_cache_misses_total", cache="chunk") > 0
    assert total(after, "zvfs_decode_seconds_total") > 0
    assert total(after, "zvfs_store_request_seconds_bucket", le="+Inf") == \
        total(after, "zvfs_store_request_seconds_count")
    assert total(after, "zvfs_mount_info", source=zarr_s3) == 1


def test_metrics_on_port_0_are_served_where_the_log_and_status_say(zarr_dir, mount, tmp_path) -> None:
    """`--metrics-addr 0`: the OS picks a free port as the daemon binds, so no other process
    can take it in between, and the daemon says which it got: in its log, in `zvfs status`
    (text and JSON) and in the options stats.json shows. A fixed port already in use still
    fails the mount with one clear line, and leaves nothing behind (its disk cache's
    directory stayed: the store was opened, and never closed; a helper's audit)."""
    m = mount(zarr_dir, "--metrics-addr", "0")
    res = zvfs("status", m.path)
    assert res.returncode == 0, res.stderr
    line = re.search(r"^  metrics: +(http://127\.0\.0\.1:(\d+)/metrics)$", res.stdout, re.M)
    assert line, res.stdout
    url, port = line.group(1), int(line.group(2))
    assert 0 < port < 65536
    assert f"metrics_addr=127.0.0.1:{port} " in res.stdout, res.stdout
    assert metrics_url(m.path) == url
    assert mount_stats(m.path)["options"]["metrics_addr"] == f"127.0.0.1:{port}"
    assert f"serving Prometheus metrics at {url}\n" in m.log_text(), m.log_text()
    samples = scrape(url)
    assert total(samples, "zvfs_mount_info", source=str(zarr_dir)) == 1
    assert ("zvfs_store_retries_total", (("mount", str(zarr_dir)),)) in samples
    # a mount without metrics shows none
    plain = mount(zarr_dir)
    res = zvfs("status", "--json", plain.path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["metrics"] is None
    assert "metrics" not in zvfs("status", plain.path).stdout
    # the port bound, asked for as a fixed port by another mount, is in use
    busy = mount(zarr_dir, "--metrics-addr", str(port), "--cache-dir", tmp_path / "cache", check=False)
    one_line(busy.result, rf"cannot serve metrics at 127\.0\.0\.1:{port}\b", "already in use",
             "choose another --metrics-addr", code=1)
    assert mount_entry(busy.path) is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []
    assert total(scrape(url), "zvfs_mount_info", source=str(zarr_dir)) == 1  # the first serves on


def test_metrics_addr_parses_and_shows_as_a_url() -> None:
    from zvfs.options import metrics_url as url_of
    from zvfs.options import parse_addr, split_addr

    assert parse_addr("9464") == "127.0.0.1:9464" and parse_addr(":0") == "127.0.0.1:0"
    assert parse_addr("0.0.0.0:0") == "0.0.0.0:0" and parse_addr("[::1]:9464") == "[::1]:9464"
    with pytest.raises(ValueError, match="65535"):
        parse_addr("65536")
    assert url_of("127.0.0.1:9464") == "http://127.0.0.1:9464/metrics"
    assert url_of("[::1]:9464") == "http://[::1]:9464/metrics"
    # an IPv6 host was shown as "::1:9464" in the options in effect (status, stats.json):
    # bracketed now, as a URL and a reader take it; the bare form is still accepted
    assert parse_addr("::1:9464") == "[::1]:9464" and split_addr("[::1]:0") == ("::1", 0)


def test_uptime_does_not_follow_a_stepped_wall_clock(monkeypatch) -> None:
    """Uptime was wall-clock time since the start: NTP stepping the clock back an hour at boot,
    after systemd had started the mount, made `zvfs status` say "up -1h..." and the metric
    negative. It is counted on the monotonic clock; `started` stays the wall-clock time."""
    import time

    from zvfs.stats import Counters

    counters = Counters()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    up = counters.snapshot()["uptime_seconds"]
    assert 0 <= up < 60, up


def test_what_can_go_down_is_a_gauge(zarr_dir, mount) -> None:
    """The decoder processes running now go down when one ends: exported as counters, a
    Prometheus rate() read each drop as a reset."""
    m = mount(zarr_dir, "--decoders", "1", "--metrics-addr", "127.0.0.1:0")
    url = metrics_url(m.path)
    assert os.listdir(m.path / ".zvfs" / "arrays")  # starts the processes
    assert wait_until(lambda: total(scrape(url), "zvfs_decoder_processes") == 1, 30), scrape(url)
    text = scrape_text(url)
    for name in ("zvfs_decoder_processes", "zvfs_decoder_zygote"):
        assert f"# TYPE {name} gauge" in text, text
    assert "# TYPE zvfs_bytes_decoded_total counter" in text, text  # what only grows stays a counter


def test_idle_metrics_clients_are_bounded_and_dropped(zarr_dir, mount) -> None:
    """A client that connects to the metrics port and sends nothing (a stuck scraper, a
    half-open connection, a slowloris) held a daemon thread and a descriptor for ever:
    300 of them made 300 threads that stayed until the clients left."""
    from zvfs.metrics import IDLE_SECONDS, MAX_CLIENTS

    m = mount(zarr_dir, "--metrics-addr", "0")
    url = metrics_url(m.path)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    (pid,) = daemon_pids(m.path)
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
        idle = [stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
                for _ in range(300)]
        # every connection is accepted; the ones above the bound are closed at once
        assert wait_until(lambda: len(os.listdir(f"/proc/{pid}/task")) <= 64 + MAX_CLIENTS, 10)
        refused = 0
        for s in idle[-50:]:
            with contextlib.suppress(ConnectionResetError):
                refused += s.recv(1) == b""
        assert refused == 50, refused
        threads = len(os.listdir(f"/proc/{pid}/task"))
        assert threads <= 64 + MAX_CLIENTS, threads
        # an idle client is dropped after IDLE_SECONDS, never held
        first.settimeout(IDLE_SECONDS + 30)
        assert first.recv(1) == b""
    assert wait_until(lambda: "zvfs_mount_info" in scrape_text(url), 10)
    assert "Traceback" not in m.log_text(), m.log_text()


def test_metrics_filtered_by_name_are_served(zarr_dir, mount) -> None:
    """`/metrics?name[]=NAME` (Prometheus federation, curl checks of one series) answered 200
    with an empty body for every name: the registry knew no name of the mount's collector."""
    m = mount(zarr_dir, "--metrics-addr", "0")
    url = metrics_url(m.path)
    text = scrape_text(url + "?name[]=zvfs_mount_info&name[]=zvfs_uptime_seconds")
    assert "zvfs_mount_info{" in text and "zvfs_uptime_seconds{" in text, text
    assert "zvfs_cache_hits" not in text, text


def test_metrics_are_served_at_their_path_and_answer_head(zarr_dir, mount) -> None:
    """prometheus-client's app served the metrics at every path (a scrape config's typo went
    unnoticed) and answered HEAD, a load balancer's health check, with 405."""
    m = mount(zarr_dir, "--metrics-addr", "0")
    url = metrics_url(m.path)
    base = url.removesuffix("/metrics")
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
        assert r.status == 200 and r.read() == b""
        assert r.headers["Content-Type"].startswith("text/plain"), r.headers
    # HEAD's headers are GET's, its body's length too (it said 0: a helper's audit); the
    # counters move between the two renderings, so the lengths are near, not equal
    for encoding in ("identity", "gzip"):
        asked = {"Accept-Encoding": encoding}
        with urllib.request.urlopen(urllib.request.Request(url, headers=asked), timeout=10) as r:
            got = len(r.read())
            assert int(r.headers["Content-Length"]) == got
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD", headers=asked), timeout=10) as r:
            assert r.read() == b"" and r.headers.get("Content-Encoding") == (None if encoding == "identity" else "gzip")
            assert abs(int(r.headers["Content-Length"]) - got) < got // 20, (encoding, r.headers, got)
    for path in ("/metrics/", "/metric", "/favicon.ico", "/x/metrics"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + path, timeout=10)
        assert err.value.code == 404, path
        assert b"/metrics" in err.value.read()
    assert 'href="/metrics"' in scrape_text(base + "/")
    assert "zvfs_mount_info{" in scrape_text(url)


# --------------------------------------------------------------------------- df, mtimes


def test_the_connection_is_tuned_and_never_congested(zarr_dir, mount) -> None:
    """What zvfs sets through sysfs once mounted (pyfuse3 cannot pass it as options): the
    read-ahead, the requests in the background, and a congestion threshold above anything
    the kernel queues. At the kernel's own (3/4 of max_background), 64 random readers
    left read-ahead pages unread in the page cache, which later readers then fetched one
    page per request: single reads took 7-12 s (zvfs.daemon.tune_kernel)."""
    m = mount(zarr_dir)
    dev = os.stat(m.path).st_dev
    conn = Path(f"/sys/fs/fuse/connections/{os.minor(dev)}")
    background = int((conn / "max_background").read_text())
    assert background == 64
    assert int((conn / "congestion_threshold").read_text()) == 65535  # the most it takes
    read_ahead = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    assert int(read_ahead.read_text()) == 4096


def test_df_shows_the_store_size(zarr_dir, mount) -> None:
    m = mount(zarr_dir)
    # Plain df lists every file system; one that is not ours may be broken on this machine
    # (a dead FUSE mount exits df with 1), so only our own line and our own errors count.
    res = run(["df", "-B1", "--output=size,used,avail,target"])
    assert str(m.path) in res.stdout, "df (without -a) leaves the mount out"
    assert str(m.path) not in res.stderr, res.stderr
    res = run(["df", "-B1", "--output=used,avail", m.path], check=True)
    used, avail = map(int, res.stdout.split()[-2:])
    want = sum(p.stat().st_size for p in store_files(zarr_dir).values())
    assert used == math.ceil(want / 4096) * 4096
    free = shutil.disk_usage(zarr_dir).free  # a directory store: the free space of its disk
    assert abs(avail - free) <= max(free // 100, 64 << 20), (avail, free)


def test_decoded_mtimes_come_from_the_source_and_survive_a_remount(zarr_dir, tmp_path, mount) -> None:
    paths = [".zvfs", ".zvfs/arrays", ".zvfs/arrays/temperature", ".zvfs/arrays/temperature/data.raw",
             ".zvfs/arrays/temperature/meta.json", ".zvfs/arrays/temperature/chunks/0.0",
             ".zvfs/arrays/sub/grp/counts/data.npy", ".zvfs/v2/temperature/.zarray"]
    first = mount(zarr_dir)
    seen = {p: os.stat(first.path / p).st_mtime_ns for p in paths}
    force_unmount(first.path)
    second = mount(zarr_dir, mountpoint=first.path)
    again = {p: os.stat(second.path / p).st_mtime_ns for p in paths}
    assert again == seen
    # an array's files carry its metadata key's mtime
    ref = os.stat(zarr_dir / "temperature" / "zarr.json").st_mtime
    assert os.stat(second.path / ".zvfs/arrays/temperature/data.raw").st_mtime == pytest.approx(ref, abs=1e-6)
    ref = os.stat(zarr_dir / "sub" / "grp" / "counts" / "zarr.json").st_mtime
    assert os.stat(second.path / ".zvfs/arrays/sub/grp/counts/data.npy").st_mtime == pytest.approx(ref, abs=1e-6)


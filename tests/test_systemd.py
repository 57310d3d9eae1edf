"""The systemd units in systemd/: `systemd-analyze verify`, and their commands run for real.

There is no systemd as PID 1 here, so the service's commands are run the way
systemd would run them: the environment file's variables expanded, NOTIFY_SOCKET
pointing at a datagram socket of ours that must receive READY=1 once the mount
answers, then ExecStop. The example .mount unit's Type= and Options= go through
mount(8) and /sbin/mount.zvfs.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, force_unmount, mount_entry, run, wait_until
from procs import stop

UNITS = REPO / "systemd"
SERVICE = UNITS / "zvfs@.service"
MOUNT_UNIT = UNITS / "mnt-zarr.mount"


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze is missing (Debian package systemd): run scripts/setup"
    return path


def read_unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    cp.optionxform = str  # keys are case-sensitive
    cp.read_string(path.read_text())
    return cp


def test_units_exist() -> None:
    assert SERVICE.is_file(), SERVICE
    assert MOUNT_UNIT.is_file(), MOUNT_UNIT


@pytest.mark.parametrize("unit", ["zvfs@.service", "mnt-zarr.mount"])
def test_systemd_analyze_verify(unit, tmp_path) -> None:
    tool = systemd_analyze()
    # ExecStart= must name an executable that exists: scripts/setup installs it
    assert os.access("/usr/local/bin/zvfs", os.X_OK), "/usr/local/bin/zvfs missing: run scripts/setup as root"
    assert os.access("/sbin/mount.zvfs", os.X_OK), "/sbin/mount.zvfs missing: run scripts/setup as root"
    shutil.copy(UNITS / unit, tmp_path / unit)
    res = run([tool, "verify", "--man=no", tmp_path / unit], cwd=tmp_path, timeout=120)
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 0, out
    # verify exits 0 even for unknown keys or bad values, printing "<unit>:<line>: ..." lines;
    # it may also complain about the host (no PID 1), but nothing may be about our unit
    stem = unit.split("@")[0].split(".")[0]
    ours = [ln for ln in out.splitlines() if stem in ln or unit in ln]
    assert not ours, out


def test_verify_an_instance(tmp_path) -> None:
    tool = systemd_analyze()
    inst = tmp_path / "zvfs@zarr.service"
    shutil.copy(SERVICE, inst)
    res = run([tool, "verify", "--man=no", inst], cwd=tmp_path, timeout=120)
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 0, out
    assert not [ln for ln in out.splitlines() if "zvfs" in ln], out


def test_service_contract() -> None:
    svc = read_unit(SERVICE)["Service"]
    assert svc["Type"] == "notify"
    assert svc["EnvironmentFile"].lstrip("-") == "/etc/zvfs/%i.env"
    start = shlex.split(svc["ExecStart"])
    assert start[:3] == ["/usr/local/bin/zvfs", "mount", "-f"], start
    assert "${SOURCE}" in start and "${MOUNTPOINT}" in start
    assert start.index("${SOURCE}") < start.index("${MOUNTPOINT}")
    stop = shlex.split(svc["ExecStop"])
    assert stop == ["/usr/local/bin/zvfs", "unmount", "${MOUNTPOINT}"], stop


def test_mount_unit_contract() -> None:
    unit = read_unit(MOUNT_UNIT)
    m = unit["Mount"]
    assert m["Type"] == "zvfs"
    assert m["What"] and m["Where"]
    # systemd requires the unit name to be the escaped Where=
    res = run(["systemd-escape", "--path", "--suffix=mount", m["Where"]], check=True)
    assert res.stdout.strip() == MOUNT_UNIT.name


# --------------------------------------------------------------------------- run the units


def expand_exec(line: str, env: dict[str, str]) -> list[str]:
    """systemd's expansion of an Exec line: ${VAR} is one word, a lone $VAR splits on whitespace."""
    out: list[str] = []
    for word in shlex.split(line):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            out.extend(env.get(m.group(1), "").split())
            continue
        out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda mm: env.get(mm.group(1), ""), word))
    return out


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k.strip()] = v.strip().strip('"')
    return env


def test_service_runs_and_notifies_ready(zarr_dir, tmp_path) -> None:
    svc = read_unit(SERVICE)["Service"]
    mnt = tmp_path / "svc-mnt"
    log = tmp_path / "svc.log"
    env_file = tmp_path / "zarr.env"  # stands for /etc/zvfs/zarr.env
    env_file.write_text(
        f"SOURCE={zarr_dir}\nMOUNTPOINT={mnt}\nOPTIONS=--metadata-ttl 30 --log-file {log} -o log_level=info\n"
    )
    unit_env = read_env_file(env_file)
    run_start_pre(svc, unit_env)
    mnt.mkdir(exist_ok=True)
    argv = expand_exec(svc["ExecStart"], unit_env)
    assert argv[:3] == ["/usr/local/bin/zvfs", "mount", "-f"]

    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(1.0)
    env = dict(os.environ, NOTIFY_SOCKET=str(sock_path))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd="/")
    try:
        messages: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("READY=1" in m for m in messages):
            if proc.poll() is not None:
                break
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                continue
        assert any("READY=1" in m.split("\n") for m in messages), (messages, proc.poll(), log.read_text()
                                                                     if log.exists() else "")
        # READY=1 means the mount already answers
        entry = mount_entry(mnt)
        assert entry is not None and entry["fstype"] == "fuse.zvfs"
        assert run(["diff", "-r", zarr_dir, mnt]).returncode == 0
        # the process is the main one systemd watches: it is still in the foreground
        assert proc.poll() is None
        stop = expand_exec(svc["ExecStop"], unit_env)
        res = run(stop)
        assert res.returncode == 0, res.stderr
        proc.wait(timeout=30)
        assert proc.returncode == 0, proc.stderr.read()
        assert mount_entry(mnt) is None
    finally:
        sock.close()
        end(proc)
        force_unmount(mnt)


def end(proc: subprocess.Popen) -> None:
    """Stop a daemon the test started, by its PID: SIGTERM, then SIGKILL after 15 s."""
    stop(proc, grace=15)


def run_start_pre(svc: dict, env: dict[str, str]) -> None:
    """The unit's ExecStartPre lines as systemd runs them: a leading "-" lets one fail."""
    for pre in [v for k, v in svc.items() if k == "ExecStartPre"]:
        may_fail = pre.startswith("-")
        res = run(expand_exec(pre.lstrip("-"), env))
        assert may_fail or res.returncode == 0, (pre, res.stderr)


def test_service_restarts_over_the_dead_mount_of_a_killed_daemon(zarr_dir, tmp_path) -> None:
    """Restart=on-failure after the daemon was killed (the OOM killer): the mountpoint is a
    dead mount, where mkdir -p fails (ENOTCONN). A failing ExecStartPre would fail every
    restart before zvfs could clear the dead mount itself."""
    svc = read_unit(SERVICE)["Service"]
    mnt = tmp_path / "m"
    # no attributes kept by the kernel: mkdir's stat of the mountpoint reaches the dead
    # connection (with them cached it would succeed for their time)
    env = {"SOURCE": str(zarr_dir), "MOUNTPOINT": str(mnt), "OPTIONS": "--metadata-ttl 0"}
    argv = expand_exec(svc["ExecStart"], env)
    procs: list[subprocess.Popen] = []

    def mounted_anew(proc: subprocess.Popen) -> bool:
        """The new mount answers (the dead one stays in the table until zvfs clears it,
        and the new one may get its device number)."""
        return proc.poll() is not None or run(["diff", "-r", zarr_dir, mnt]).returncode == 0

    try:
        for attempt in range(2):
            run_start_pre(svc, env)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            assert wait_until(lambda p=proc: mounted_anew(p), 60)
            assert proc.poll() is None, proc.communicate()
            if attempt == 0:
                proc.kill()  # SIGKILL: the mount stays, dead
                proc.wait(timeout=10)
                assert run(["mkdir", "-p", mnt]).returncode != 0  # what the unit meets
        procs[1].terminate()  # systemd's stop
        _, err = procs[1].communicate(timeout=30)
        assert procs[1].returncode == 0, err
        assert "cleared a dead zvfs mount" in err, err
        assert mount_entry(mnt) is None
    finally:
        for proc in procs:
            end(proc)
        force_unmount(mnt)


def test_service_stops_on_sigterm(zarr_dir, tmp_path) -> None:
    """systemd stops a service with SIGTERM to the main process (KillSignal=)."""
    svc = read_unit(SERVICE)["Service"]
    assert svc.get("KillSignal", "SIGTERM") in ("SIGTERM", "SIGINT")
    mnt = tmp_path / "m"
    mnt.mkdir()
    argv = expand_exec(svc["ExecStart"], {"SOURCE": str(zarr_dir), "MOUNTPOINT": str(mnt), "OPTIONS": ""})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: mount_entry(mnt) is not None or proc.poll() is not None, 60)
        assert proc.poll() is None, proc.communicate()
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.returncode == 0
        assert mount_entry(mnt) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        force_unmount(mnt)


def test_mount_unit_type_and_options_work_with_mount8(zarr_dir, zarr_s3_public, moto, tmp_path) -> None:
    """What systemd runs for the .mount unit: mount -t <Type> <What> <Where> -o <Options>.

    What= is replaced by the sample store in a public bucket of the test's moto (no network
    here), whose endpoint is added to Options=, which otherwise stay as written (S3's
    options, refused for a local source, are the unit's own).
    """
    m = read_unit(MOUNT_UNIT)["Mount"]
    assert m["What"].startswith("s3://"), m["What"]
    mnt = tmp_path / "unit-mnt"
    mnt.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # nothing signs
    try:
        res = run(["mount", "-t", m["Type"], zarr_s3_public, mnt, "-o",
                   f"{m['Options']},endpoint_url={moto.endpoint}"], timeout=120, env=env)
        assert res.returncode == 0, res.stderr
        entry = mount_entry(mnt)
        assert entry is not None and entry["fstype"] == "fuse.zvfs"
        assert run(["diff", "-r", zarr_dir, mnt]).returncode == 0
        res = run(["umount", mnt])
        assert res.returncode == 0, res.stderr
    finally:
        force_unmount(mnt)

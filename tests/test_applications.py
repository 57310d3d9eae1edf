"""Applications that keep their state in files on a writable mount: git, SQLite, and
netCDF-C (through xarray) writing and appending to its files.

They are what a user runs on a mounted store besides copy tools, and they lean on the
parts of POSIX a copy never touches: `link()` + `unlink()` to place objects, renames over
existing names, `fsync()`, byte-range locks, files rewritten in place, and (SQLite's WAL
mode) a shared memory map. The README says what works on each store; these tests hold it.

The reference is the application itself run on a local directory with the same inputs:
git with fixed identities and dates makes the same commit IDs from the same trees, and
SQLite's `.dump` of a database is its content, whatever the file's layout, and so is
`ncdump`'s text of a netCDF file.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import force_unmount, run, tool
from test_writes import Store, new_store


@pytest.fixture(params=["dir", "s3"])
def store(request, tmp_path) -> Store:
    return new_store(request.param, request, tmp_path)


# --------------------------------------------------------------------------- git


def _git_env(home: Path) -> dict:
    """git with no user or system configuration, and fixed names and dates, so the same
    trees make the same commit IDs on the mount and on the local reference."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null",
               GIT_AUTHOR_NAME="A U Thor", GIT_AUTHOR_EMAIL="author@example.com",
               GIT_COMMITTER_NAME="C O Mitter", GIT_COMMITTER_EMAIL="committer@example.com",
               GIT_AUTHOR_DATE="2026-01-02T03:04:05Z", GIT_COMMITTER_DATE="2026-01-02T03:04:05Z")
    return env


def _git(repo: Path, *args: str, env: dict) -> str:
    res = run([tool("git"), "-C", repo, *args], env=env, timeout=300)
    assert res.returncode == 0, f"git {' '.join(args)} in {repo} failed ({res.returncode}):\n{res.stderr[-3000:]}"
    return res.stdout


def _git_history(repo: Path, env: dict) -> None:
    """Three commits: a tree with a binary large enough for git to deflate in pieces, then
    an edit in place (`sed -i`), a removal and a rename, then `git gc` (packs the objects,
    packs the refs, deletes the loose ones) and one more commit after it."""
    _git(repo.parent, "init", "-q", "-b", "main", repo.name, env=env)
    (repo / "src/pkg").mkdir(parents=True)
    (repo / "README").write_text("a repository on a zvfs mount\n")
    for i in range(40):
        (repo / f"src/pkg/m{i:02}.py").write_text("".join(f"line {j} of {i}\n" for j in range(i * 7)))
    (repo / "blob.bin").write_bytes(np.random.default_rng(1).bytes(3 << 20))
    _git(repo, "add", "-A", env=env)
    _git(repo, "commit", "-q", "-m", "one", env=env)
    run(["sed", "-i", "s/line 3 of/LINE 3 OF/", repo / "src/pkg/m05.py"], check=True)
    _git(repo, "rm", "-q", "src/pkg/m07.py", env=env)
    _git(repo, "mv", "src/pkg/m08.py", "src/moved.py", env=env)
    _git(repo, "commit", "-q", "-am", "two", env=env)
    _git(repo, "gc", "-q", "--prune=now", env=env)
    (repo / "after-gc.txt").write_text("written after the objects were packed\n")
    _git(repo, "add", "after-gc.txt", env=env)
    _git(repo, "commit", "-q", "-m", "three", env=env)


def _git_state(repo: Path, env: dict) -> dict:
    return {"log": _git(repo, "log", "--format=%H %s", env=env),
            "tree": _git(repo, "ls-tree", "-r", "-l", "HEAD", env=env),
            "status": _git(repo, "status", "--porcelain", env=env)}


def test_git_works_in_a_writable_mount_and_after_a_remount(store: Store, mount, tmp_path) -> None:
    """git init, add, commit, `sed -i`, rm, mv, gc and `clone --no-hardlinks` in the mount
    make the commits git makes on a local directory, `git fsck --full --strict` finds
    nothing wrong, and a fresh mount of the store shows the same repository."""
    env = _git_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    local = tmp_path / "local" / "repo"
    local.parent.mkdir()
    _git_history(local, env)
    want = _git_state(local, env)
    assert want["status"] == "" and len(want["log"].splitlines()) == 3

    m = store.mount(mount)
    repo = m.path / "repo"
    _git_history(repo, env)
    assert _git_state(repo, env) == want
    _git(repo, "fsck", "--no-progress", "--full", "--strict", env=env)
    clone = m.path / "clone"
    _git(m.path, "clone", "-q", "--no-hardlinks", "repo", "clone", env=env)
    assert _git_state(clone, env) == want
    assert (clone / "blob.bin").read_bytes() == (local / "blob.bin").read_bytes()
    assert store.get("repo/.git/packed-refs") is not None  # gc's packed refs reached the store

    force_unmount(m.path)
    again = store.mount(mount)
    for name in ("repo", "clone"):
        assert _git_state(again.path / name, env) == want, name
        _git(again.path / name, "fsck", "--no-progress", "--full", "--strict", env=env)
    res = run(["diff", "-r", "--exclude=.git", local, again.path / "repo"])
    assert res.returncode == 0 and res.stdout == "", res.stdout[-2000:]


# --------------------------------------------------------------------------- SQLite


def _sqlite_history(db: Path, journal_mode: str) -> None:
    """Transactions committed and one rolled back, an index, an update of many rows,
    deletes, then VACUUM (which rewrites the whole file through its journal)."""
    con = sqlite3.connect(db, isolation_level=None)
    try:
        mode = con.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0]
        assert mode == journal_mode.lower(), f"journal mode {mode!r}, asked {journal_mode}"
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, payload BLOB)")
        rng = np.random.default_rng(7)
        for batch in range(10):
            con.execute("BEGIN")
            con.executemany("INSERT INTO t (name, payload) VALUES (?, ?)",
                            [(f"row {batch}-{i}", rng.bytes(int(rng.integers(0, 3000))))
                             for i in range(200)])
            con.execute("COMMIT")
        con.execute("BEGIN")
        con.execute("DELETE FROM t")
        con.execute("ROLLBACK")
        con.execute("CREATE INDEX t_name ON t (name)")
        con.execute("UPDATE t SET name = upper(name) WHERE id % 3 = 0")
        con.execute("DELETE FROM t WHERE id % 5 = 0")
        con.execute("VACUUM")
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()


def _dump(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return list(con.iterdump())
    finally:
        con.close()


@pytest.mark.parametrize("journal_mode", ["DELETE", "TRUNCATE", "PERSIST"])
def test_sqlite_with_a_rollback_journal_works_in_a_writable_mount(
        journal_mode: str, store: Store, mount, tmp_path) -> None:
    """SQLite with each kind of rollback journal (deleted, truncated or kept after each
    transaction) writes a database in the mount whose content is the one it writes on a
    local directory, in the mount and, through a fresh mount, in the store."""
    local = tmp_path / "local.db"
    _sqlite_history(local, journal_mode)
    want = _dump(local)
    assert len(want) > 1500

    m = store.mount(mount)
    _sqlite_history(m.path / "x.db", journal_mode)
    assert _dump(m.path / "x.db") == want
    force_unmount(m.path)
    again = store.mount(mount)
    assert _dump(again.path / "x.db") == want
    left = sorted(p.name for p in again.path.iterdir())
    assert left == (["x.db", "x.db-journal"] if journal_mode in ("TRUNCATE", "PERSIST") else ["x.db"]), left


def test_sqlite_wal_mode_works_on_a_directory_store_and_fails_at_once_on_s3(store: Store, mount, tmp_path) -> None:
    """WAL mode maps its `-shm` file. On a directory store that works, and the database
    reads as the local one does; on a writable S3 mount, whose reads bypass the page cache
    and so cannot be mapped, it fails at once with SQLite's "disk I/O error" (as the README
    says) and the store keeps no database it could have half written."""
    local = tmp_path / "local.db"
    _sqlite_history(local, "WAL")
    want = _dump(local)
    m = store.mount(mount)
    if store.kind == "dir":
        _sqlite_history(m.path / "x.db", "WAL")
        assert _dump(m.path / "x.db") == want
        force_unmount(m.path)
        again = store.mount(mount)
        assert _dump(again.path / "x.db") == want
        return
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        _sqlite_history(m.path / "x.db", "WAL")
    db = store.get("x.db")
    if db:  # what was stored before the failure is a database SQLite finds sound
        (tmp_path / "stored.db").write_bytes(db)
        _dump(tmp_path / "stored.db")


# --------------------------------------------------------------------------- netCDF


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT"])
def test_netcdf_files_written_into_a_writable_mount_read_as_the_local_ones(
        fmt: str, store: Store, mount, tmp_path) -> None:
    """xarray (netCDF-C, HDF5 for NETCDF4) writes a file into the mount, reads it back and
    appends a variable to it (mode "a": an open read-write that rewrites the header, and
    for HDF5 its metadata in place). `ncdump` of it, in the mount and through a fresh
    mount, is `ncdump` of the same steps on a local file; a classic file is the same bytes."""
    import xarray as xr

    rng = np.random.default_rng(11)
    ds = xr.Dataset({"t": (("time", "y", "x"), rng.standard_normal((20, 60, 70)).astype("f4")),
                     "q": (("time",), np.arange(20.0))},
                    coords={"time": np.arange(20)}, attrs={"title": "written through zvfs"})
    encoding = {"t": {"zlib": True, "chunksizes": (5, 30, 35)}} if fmt == "NETCDF4" else None

    def steps(path: Path) -> None:
        ds.to_netcdf(path, format=fmt, encoding=encoding)
        with xr.open_dataset(path) as back:
            xr.testing.assert_identical(back.load(), ds)
        xr.Dataset({"extra": (("time",), np.ones(20))}).to_netcdf(path, mode="a", format=fmt)

    def dump(path: Path) -> str:
        res = run([tool("ncdump"), path], timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout

    (tmp_path / "local").mkdir()
    local = tmp_path / "local" / "out.nc"
    steps(local)
    want = dump(local)
    assert "extra" in want and "written through zvfs" in want
    m = store.mount(mount)
    steps(m.path / "out.nc")
    assert dump(m.path / "out.nc") == want
    force_unmount(m.path)
    again = store.mount(mount)
    assert dump(again.path / "out.nc") == want
    if fmt != "NETCDF4":
        assert (again.path / "out.nc").read_bytes() == local.read_bytes()

"""Listing a directory store's tree fast: large directories listed by find in a process of
its own (zvfs.stores.find_lister), and a walk's next directories listed ahead of it
(MountContext.list_ahead).

The reference for every listing is the in-process one (os.scandir and lstat), which the
store used alone before, and the kernel's own view of the source directory.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
from conftest import mount_stats

from zvfs.stores import find_lister
from zvfs.stores.directory import DirectoryStore
from zvfs.stores.listing import Listing

ODD_NAMES = ["plain", "with space", "new\nline", "tab\tand  two", "ünïcode", "-dash", ".hidden"]


def _tree(root: Path, files: int) -> None:
    """A directory of ``files`` files (odd names and random nanosecond mtimes, some before
    1970), subdirectories, and what a listing leaves out or follows."""
    rng = random.Random(7)
    big = root / "big"
    big.mkdir(parents=True)
    names = ODD_NAMES + [f"k{i:05d}" for i in range(files)]
    for name in names:
        p = big / name
        p.write_bytes(b"x" * rng.randrange(300))
        ns = rng.randrange(-(2**40), 2**41) * 1000 + rng.randrange(1000)
        os.utime(p, ns=(ns, ns))
    os.mkdir(os.fsencode(big) + b"/\xff\xfe-not-utf8")  # a name as os.scandir gives it
    (big / "sub").mkdir()
    (big / "sub" / "inner").write_bytes(b"inner")
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    os.symlink(outside / "secret", big / "escape")  # out of the store: absent
    os.symlink("k00001", big / "inside")  # a file in the store: followed
    os.symlink("sub", big / "inside_dir")  # a directory: never followed
    os.symlink("missing", big / "dangling")
    os.mkfifo(big / "fifo")


def _in_process(store: DirectoryStore, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Listing:
    with monkeypatch.context() as m:
        m.setattr(find_lister, "MIN_DIR_BYTES", 1 << 62)
        return store.list_dir(prefix)


def _as_dict(listing: Listing) -> tuple[dict, set[str]]:
    return {n: (i.size, i.mtime_ns) for n, i in listing.keys.items()}, set(listing.prefixes)


def test_a_large_directory_listed_by_find_is_the_in_process_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    _tree(root, files=2000)
    assert find_lister.is_large(os.stat(root / "big")), os.stat(root / "big").st_size
    store = DirectoryStore(root)
    calls = []
    real = find_lister.list_dir
    monkeypatch.setattr(find_lister, "list_dir", lambda p: calls.append(p) or real(p))
    by_find = store.list_dir("big/")
    # find did list it, through the store's checked descriptor of the directory
    assert len(calls) == 1 and calls[0].startswith(f"/proc/{os.getpid()}/fd/"), calls
    reference = _in_process(store, "big/", monkeypatch)
    assert _as_dict(by_find) == _as_dict(reference)  # sizes and mtimes equal, to the nanosecond
    keys, prefixes = _as_dict(by_find)
    assert set(ODD_NAMES) <= set(keys) and "inside" in keys
    assert not {"escape", "dangling", "fifo", "inside_dir"} & (set(keys) | prefixes)
    assert prefixes == {"sub", os.fsdecode(b"\xff\xfe-not-utf8")}
    for name in ODD_NAMES + ["k01999", "inside"]:  # and what the store says of each key
        info = store.info("big/" + name)
        assert (info.size, info.mtime_ns) == keys[name], name
        assert info.mtime_ns == os.stat(root / "big" / name).st_mtime_ns, name


def test_a_small_directory_is_listed_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").write_bytes(b"a")
    assert not find_lister.is_large(os.stat(tmp_path))
    monkeypatch.setattr(find_lister, "list_dir", lambda p: pytest.fail(f"find for {p}"))
    assert set(DirectoryStore(tmp_path).list_dir("").keys) == {"a"}


@pytest.mark.parametrize("failure", ["no find", "find fails", "find without -printf"])
def test_without_find_a_large_directory_is_listed_in_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    root = tmp_path / "store"
    _tree(root, files=600)
    store = DirectoryStore(root)
    reference = _as_dict(_in_process(store, "big/", monkeypatch))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "find"
    if failure == "find fails":  # exits 1 with half its output, as when a file vanishes meanwhile
        fake.write_text('#!/bin/sh\n[ "$3" = 0 ] && exit 0  # the probe: -maxdepth 0\n'
                        "printf 'f 1 1.0000000000 half\\0'\nexit 1\n")
    elif failure == "find without -printf":  # as busybox's: refused at the first probe
        fake.write_text("#!/bin/sh\necho \"find: unrecognized: -printf\" >&2\nexit 1\n")
    if failure != "no find":
        fake.chmod(0o755)
    monkeypatch.setattr(find_lister, "SYSTEM_PATH", str(bin_dir))
    monkeypatch.setattr(find_lister, "_find", False)  # looked up again, in bin_dir alone
    assert find_lister.list_dir(str(root / "big")) is None
    assert find_lister._find == (str(fake) if failure == "find fails" else None)
    assert _as_dict(store.list_dir("big/")) == reference


def test_find_output_that_is_not_of_the_form_is_refused() -> None:
    assert find_lister.parse(b"f 12 1700000000.1234567890 a b\0d 4096 -5.2500000000 c\0") == [
        find_lister.Found("a b", "f", 12, 1700000000_123456789),
        find_lister.Found("c", "d", 4096, -5_000000000 + 250000000),
    ]
    for bad in (b"f 12 notatime a\0", b"f twelve 1.0 a\0", b"f 12\0"):
        assert find_lister.parse(bad) is None, bad


def test_prefixes_after_follows_the_sorted_order_and_changes() -> None:
    listing = Listing(prefixes={"b", "a", "d", "c"})
    assert listing.prefixes_after(None, 2) == ["a", "b"]
    assert listing.prefixes_after("b", 5) == ["c", "d"]
    assert listing.prefixes_after("bb", 1) == ["c"]
    assert listing.prefixes_after("d", 3) == []
    listing.prefixes.add("aa")  # a mkdir through the mount
    assert listing.prefixes_after("a", 2) == ["aa", "b"]


def _walk_tree(root: Path, dirs: int, files: int) -> None:
    """A Zarr-like tree: a group with one directory per row, each of ``files`` chunk files."""
    root.mkdir()
    (root / ".zgroup").write_text('{"zarr_format": 2}')
    for d in range(dirs):
        row = root / "a" / str(d)
        row.mkdir(parents=True)
        for f in range(files):
            (row / str(f)).write_bytes(bytes([d % 256]) * (f % 50))


def _find_listing(path: Path) -> list[str]:
    out = subprocess.run(["find", str(path), "-printf", "%P %s %y\\n"], check=True,
                         capture_output=True, text=True).stdout
    # a directory's size is the file system's (FUSE shows its own): compare names only
    return sorted(line if line.endswith(" f") else line.split(" ")[0] for line in out.splitlines())


def test_find_through_the_mount_lists_ahead_and_sees_every_key(mount, tmp_path: Path) -> None:
    """find over a directory store of 24 large directories: the listings of the next
    directories are made ahead of it, each directory is listed once, and find sees what
    find sees in the source."""
    src = tmp_path / "walk.zarr"
    _walk_tree(src, dirs=24, files=700)
    assert find_lister.is_large(os.stat(src / "a" / "0"))
    m = mount(src)
    assert _find_listing(m.path) == _find_listing(src)
    stats = mount_stats(m.path)
    assert stats["listings_ahead"] > 0, stats
    listed = stats["store_requests_list"]
    assert listed <= 24 + 3, stats  # the rows, a/ and the root, once each (not again ahead)


def test_a_writable_mount_does_not_list_ahead(mount, tmp_path: Path) -> None:
    """A listing made in the background and cached after a write could hide that write."""
    src = tmp_path / "walk.zarr"
    _walk_tree(src, dirs=6, files=10)
    m = mount(src, "--writable")
    assert _find_listing(m.path) == _find_listing(src)
    assert mount_stats(m.path)["listings_ahead"] == 0

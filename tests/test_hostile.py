"""Hostile input (issue 8, "Done when" 2): stores built to break a reader.

Every case mounts for real and checks what a user sees: the errno of the bad
file (EIO for data that cannot be read, ENOENT for what must not exist), one
log line naming the bad key (``--log-file``), every other file still readable
and the daemon alive. References come from the libraries that wrote the data
(zarr-python, zipfile, the ``zip`` command), never from zvfs.

The fixtures are built here, in tmp_path, from real bytes: symlink cycles,
links out of the store, metadata nested 5,000 levels, absurd shapes, unknown
codecs and dtypes, corrupt/truncated/empty chunks, zips with wrong CRCs,
truncated zips, unsafe member names, and a 2 GiB deflated bomb.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from conftest import Mounted, daemon_pids, in_threads, is_mounted, read_errno, run, tool
from zarr_model import parse_npy_header

MiB = 1 << 20


# --------------------------------------------------------------------------- helpers


def stat_errno(path: Path) -> int | None:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno
    return None


def lines_naming(m: Mounted, key: str) -> list[str]:
    return [ln for ln in m.log_text().splitlines() if key in ln]


def assert_one_line(m: Mounted, key: str) -> str:
    """Exactly one log line names ``key`` (however often it was read)."""
    lines = lines_naming(m, key)
    assert len(lines) == 1, (key, lines, m.log_text()[-3000:])
    return lines[0]


def assert_metadata_errors(m: Mounted, bad: dict[str, str]) -> None:
    """Each array of ``bad`` (path -> its metadata key) shows only meta.json, whose error
    names the key, and is in no other view."""
    arrays = m.path / ".zvfs/arrays"
    for name, key in bad.items():
        meta = json.loads((arrays / name / "meta.json").read_text())
        assert meta["error"] and key in meta["error"], (name, meta["error"])
        assert sorted(os.listdir(arrays / name)) == ["meta.json"], name
        for f in ("data.raw", "data.npy", "chunks"):
            assert stat_errno(arrays / name / f) == errno.ENOENT, (name, f)
        assert not (m.path / ".zvfs/v2" / name).exists()


def daemon_pid(m: Mounted) -> int:
    pids = daemon_pids(m.path)
    assert len(pids) == 1, pids
    return pids[0]


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def assert_alive(m: Mounted, pid: int) -> None:
    """Still mounted, same daemon, and it answers."""
    assert is_mounted(m.path)
    with open(f"/proc/{pid}/stat") as f:
        assert f.read().split(") ")[-1][:1] != "Z"
    assert json.loads((m.path / ".zvfs/stats.json").read_text())["uptime_seconds"] > 0


def tree_of(root: Path) -> set[str]:
    """Relative paths below ``root`` as find(1) lists them."""
    res = run(["find", root], timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    out = set()
    for line in res.stdout.splitlines():
        rel = os.path.relpath(line, root)
        if rel != ".":
            out.add(rel)
    return out


def v3_array(root: Path, name: str, data: np.ndarray, chunks: tuple[int, ...], **kw) -> Path:
    import zarr

    a = zarr.create_array(zarr.storage.LocalStore(str(root)), name=name, shape=data.shape,
                          chunks=chunks, dtype=data.dtype, zarr_format=3, **kw)
    a[:] = data
    return root / name


def v2_array(root: Path, name: str, data: np.ndarray, chunks: tuple[int, ...], **kw) -> Path:
    import zarr

    a = zarr.create_array(zarr.storage.LocalStore(str(root)), name=name, shape=data.shape,
                          chunks=chunks, dtype=data.dtype, zarr_format=2, **kw)
    a[:] = data
    return root / name


def zarr_read(root: Path, name: str) -> np.ndarray:
    import zarr

    return zarr.open_array(zarr.storage.LocalStore(str(root)), path=name, mode="r")[...]


GOOD = np.arange(20 * 12, dtype="<i4").reshape(20, 12)


def new_store(root: Path) -> Path:
    """A v3 root group holding the healthy array ``good`` that every test reads back."""
    import zarr

    zarr.open_group(zarr.storage.LocalStore(str(root)), mode="w", zarr_format=3)
    v3_array(root, "good", GOOD, (8, 8))
    return root


def assert_good(m: Mounted, root: Path) -> None:
    assert (m.path / ".zvfs/arrays/good/data.raw").read_bytes() == zarr_read(root, "good").tobytes()
    assert (m.path / "good/zarr.json").read_bytes() == (root / "good/zarr.json").read_bytes()


# --------------------------------------------------------------------------- what the kernel cannot be told


def _v3_doc(shape: list[int], dtype: str) -> dict:
    return {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1 << 20]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "attributes": {}}


def _zip_of_huge_members(path: Path, count: int, size: int) -> None:
    """A zip whose central directory declares ``count`` empty stored members of ``size`` bytes
    each (zip64 extra fields): the sizes a hostile archive may claim, at no cost to it."""
    import struct

    local, central = b"", b""
    for i in range(count):
        name = f"m{i}".encode()
        offset = len(local)
        local += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 45, 0, 0, 0, 0x21, 0, 0, 0, len(name), 0) + name
        extra = struct.pack("<HHQ", 1, 8, size)
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 0, 0, 0, 0x21, 0, 0,
                               0xFFFFFFFF, len(name), len(extra), 0, 0, 0, 0, offset) + name + extra
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(central), len(local), 0)
    path.write_bytes(local + central + end)


def test_sizes_and_names_the_kernel_cannot_be_told_fail_alone(tmp_path: Path, mount) -> None:
    """Metadata can make a derived file bigger than any file can be (two int64 arrays of
    2**59 elements made root.nc pass 2**63 bytes: now the second is left out of it, named
    in zvfs_left_out), name an array with a lone surrogate
    (valid JSON, but no file name), or 3,000 levels deep (the v2 mirror is built
    recursively: that node is left out). Each made a request handler raise what pyfuse3 does not
    catch, which ended its loop and the mount. Now such an entry is left out (of its
    directory's listing with one log line where it can still be met, a lookup of it failing
    with EIO), and the rest is served. A zip declaring 8,200 members of 2**63-1 bytes did the same to statfs (df, and
    find as it starts): its figures are now capped at what statfs can hold."""
    root = new_store(tmp_path / "store")
    good = json.loads((root / "good/zarr.json").read_text())
    arrays = {"good": good, "huge_a": _v3_doc([1 << 59], "int64"), "huge_b": _v3_doc([1 << 59], "int64"),
              "\ud800": _v3_doc([4], "uint8"),
              # 3,000 levels deep: building the v2 mirror recursed past Python's limit
              "/".join(["d"] * 3000) + "/x": _v3_doc([4], "uint8")}
    for name in ("huge_a", "huge_b"):
        (root / name).mkdir()
        (root / name / "zarr.json").write_text(json.dumps(arrays[name]))
    doc = {"zarr_format": 3, "node_type": "group", "attributes": {},
           "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": arrays}}
    (root / "zarr.json").write_text(json.dumps(doc))  # json writes the surrogate as "\ud800"
    m = mount(root)
    pid = daemon_pid(m)
    netcdf = m.path / ".zvfs/netcdf"
    listed = os.listdir(netcdf)
    for name in listed:
        os.stat(netcdf / name)
    # the group's file leaves out the array that would take it past 2**63 - 1 bytes, not
    # itself (it was EIO, and the group's other variables with it)
    assert "root.nc" in listed, listed
    with netCDF4.Dataset(netcdf / "root.nc") as ds:
        ds.set_auto_mask(False)
        assert ds["good"][:].tolist() == GOOD.tolist() and "huge_a" in ds.variables
        assert "huge_b" not in ds.variables and "huge_b: " in ds.getncattr("zvfs_left_out")
    assert (netcdf / "root.nc").stat().st_size < 2**63
    assert {"good", "huge_a", "huge_b"} <= set(os.listdir(m.path / ".zvfs/arrays"))
    assert "good" in os.listdir(m.path / ".zvfs/v2")
    assert (m.path / ".zvfs/v2/good/.zarray").is_file()
    for family in ("arrays", "v2", "netcdf"):
        run(["ls", "-lR", m.path / ".zvfs" / family], timeout=60)  # whatever it says: no crash
    assert_alive(m, pid)
    assert_good(m, root)

    big = tmp_path / "huge.zip"
    _zip_of_huge_members(big, 8200, (1 << 63) - 1)
    z = mount(big)
    zpid = daemon_pid(z)
    vfs = os.statvfs(z.path)
    assert vfs.f_blocks == ((1 << 63) - 1) // vfs.f_frsize, vfs
    df = run(["df", "-B1", z.path], timeout=60)
    assert df.returncode == 0, df.stderr
    res = run(["find", z.path], timeout=60)
    assert res.returncode == 0 and "m8199" in res.stdout, res.stderr[-2000:]
    assert_alive(z, zpid)


def test_an_array_below_a_thousand_group_levels_leaves_the_mirror_served(tmp_path: Path, mount) -> None:
    """A directory store of 1,000 nested groups with an array at the bottom: discovery left
    out the groups past MAX_PATH_DEPTH (one log line) but walked on below them and kept the
    array 1,000 levels deep, so the v2 mirror was built 1,000 directories deep and its
    building recursed past Python's limit: every readdir and lookup of .zvfs/v2 failed with
    EIO (RecursionError), the healthy array's mirror too. Discovery stops at that depth now:
    the deep array is left out like the groups above it, and the mirror is served."""
    from zvfs.formats.api import MAX_PATH_DEPTH

    root = new_store(tmp_path / "store")
    path = root
    for _ in range(1000):
        path = path / "g"
        path.mkdir()
        (path / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    (path / "a").mkdir()
    (path / "a/zarr.json").write_text(json.dumps(_v3_doc([4], "uint8")))
    try:
        m = mount(root)
        pid = daemon_pid(m)
        v2 = m.path / ".zvfs/v2"
        assert {"good", "g"} <= set(os.listdir(v2))
        assert json.loads((v2 / "good/.zarray").read_text())["shape"] == list(GOOD.shape)
        assert not any(p.count("/") > MAX_PATH_DEPTH for p in os.listdir(m.path / ".zvfs/arrays"))
        assert len(lines_naming(m, f"more than {MAX_PATH_DEPTH} levels deep")) == 1, m.log_text()[-2000:]
        assert_alive(m, pid)
        assert_good(m, root)
    finally:
        # rm(1), not pytest's own clean-up: shutil.rmtree recurses once a level, and 1,000
        # levels passed Python's limit (a RecursionError at the session's exit, the tree left)
        subprocess.run(["rm", "-rf", "--", str(root / "g")], check=True)


def test_the_mirror_s_consolidated_metadata_is_bounded_for_nested_groups(tmp_path: Path, mount) -> None:
    """Each group of the v2 mirror had a .zmetadata repeating every document below it: 100
    nested groups with a 100 KB attribute each (10 MB of metadata) made 100 copies of up to
    10 MB, and the daemon's RSS went from 32 MB to 585 MB when .zvfs/v2 was listed (255 levels
    of it would be 3 GB). The root's .zmetadata is whole; below it, .zmetadata files are written
    while their bytes together stay within ZMETADATA_BUDGET (a group without one opens
    unconsolidated)."""
    from zvfs.views.v2mirror import ZMETADATA_BUDGET

    root = new_store(tmp_path / "store")
    path = root
    for _ in range(100):
        path = path / "g"
        path.mkdir()
        (path / "zarr.json").write_text(json.dumps(
            {"zarr_format": 3, "node_type": "group", "attributes": {"big": "x" * 100_000}}))
    m = mount(root)
    pid = daemon_pid(m)
    v2 = m.path / ".zvfs/v2"
    assert {"good", "g"} <= set(os.listdir(v2))
    whole = json.loads((v2 / ".zmetadata").read_text())["metadata"]
    assert "good/.zarray" in whole and "/".join(["g"] * 100) + "/.zattrs" in whole
    total, level = 0, v2
    for _ in range(100):
        level = level / "g"
        if (level / ".zmetadata").exists():
            total += (level / ".zmetadata").stat().st_size
    assert total <= ZMETADATA_BUDGET
    assert status_kib(pid, "VmHWM") < 300_000
    assert_alive(m, pid)
    assert_good(m, root)


def test_an_envi_header_names_at_most_max_band_names_bands(tmp_path: Path, mount) -> None:
    """data.hdr names each band after the first dimension; metadata may declare 2**40 bands
    (a uint8 array of shape [2**40, 1, 1] is metadata only), and naming each stalled the
    daemon's loop while .zvfs/arrays was listed, then failed it with MemoryError. Past
    MAX_BAND_NAMES bands the header names none; past 2**31 - 1 (GDAL's and ENVI's count)
    there is no header. A dimension name that is no Unicode text (a lone surrogate, valid
    JSON) is escaped in the header, not an error."""
    from zvfs.views.envi import MAX_BAND_NAMES

    root = new_store(tmp_path / "store")
    named = MAX_BAND_NAMES + 1
    for name, bands, dim in (("many", 1 << 40, "band"), ("named", named, "band"), ("few", 3, "\ud800")):
        doc = _v3_doc([bands, 1, 1], "uint8")
        doc["chunk_grid"]["configuration"]["chunk_shape"] = [1 << 20, 1, 1]
        doc["dimension_names"] = [dim, "y", "x"]
        (root / name).mkdir()
        (root / name / "zarr.json").write_text(json.dumps(doc))
    m = mount(root)
    pid = daemon_pid(m)
    assert {"good", "many", "named", "few"} <= set(os.listdir(m.path / ".zvfs/arrays"))
    assert not (m.path / ".zvfs/arrays/many/data.hdr").exists()
    assert (m.path / ".zvfs/arrays/many/data.raw").stat().st_size == 1 << 40
    header = (m.path / ".zvfs/arrays/named/data.hdr").read_text()
    assert f"bands = {named}" in header and "band names" not in header
    few = (m.path / ".zvfs/arrays/few/data.hdr").read_text()
    assert "band names = {\\ud800 0, \\ud800 1, \\ud800 2}" in few, few
    assert_alive(m, pid)
    assert_good(m, root)


def test_an_envi_header_is_bounded_whatever_the_band_dimension_is_called(tmp_path: Path, mount) -> None:
    """A 100 KB metadata document (10,000 bands, the band dimension named with 100,000
    characters) made data.hdr 1,000,069,076 bytes, built in the daemon's memory as
    .zvfs/arrays was listed: its peak RSS went from 32 MB to 2.9 GB and a listing took
    10 s; a few such arrays end the daemon. Band names are written only while they stay
    within MAX_BAND_NAMES_BYTES; past that the header names no band."""
    from zvfs.views.envi import MAX_BAND_NAMES_BYTES

    root = new_store(tmp_path / "store")
    doc = _v3_doc([10_000, 1, 1], "uint8")
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [10_000, 1, 1]
    doc["dimension_names"] = ["B" * 100_000, "y", "x"]
    (root / "bands").mkdir()
    (root / "bands/zarr.json").write_text(json.dumps(doc))
    m = mount(root)
    pid = daemon_pid(m)
    hdr = m.path / ".zvfs/arrays/bands/data.hdr"
    assert hdr.stat().st_size < MAX_BAND_NAMES_BYTES
    text = hdr.read_text()
    assert "bands = 10000" in text and "band names" not in text, text[:500]
    assert status_kib(pid, "VmHWM") < 500_000
    assert_alive(m, pid)
    assert_good(m, root)


def test_names_in_an_envi_header_cannot_set_its_fields(tmp_path: Path, mount) -> None:
    """A dimension name (or an array path) holding "}" and a newline closed the band names and
    added fields GDAL obeyed: "byte order = 1" and "samples = 2" had GDAL read int16 data
    byte-swapped and reshaped, silently. Such characters stand as "_" in the header; GDAL
    reads what zarr-python reads. An array with no elements gets no header (GDAL refuses it)."""
    root = new_store(tmp_path / "store")
    data = np.arange(2 * 2 * 3, dtype="<i2").reshape(2, 2, 3) * 100
    evil = "b}\nbyte order = 1\nsamples = 2\nz = {b, c"
    v3_array(root, "a", data, data.shape, dimension_names=[evil, "y", "x"])
    v3_array(root, "p}\nsamples = 1\nq", data, data.shape)
    v3_array(root, "empty", np.zeros((0, 3), "<i2"), (1, 3))
    m = mount(root)
    for name in ("a", "p}\nsamples = 1\nq"):
        hdr = (m.path / ".zvfs/arrays" / name / "data.hdr").read_text()
        fields = [ln.partition("=")[0].strip() for ln in hdr.splitlines()[1:]]
        assert len(fields) == len(set(fields)) and "z" not in fields, hdr
        out = tmp_path / f"gdal-{len(name)}"
        res = run(["gdal_translate", "-q", "-of", "ENVI", str(m.path / ".zvfs/arrays" / name / "data.raw"),
                   str(out)], timeout=120)
        assert res.returncode == 0, res.stderr
        np.testing.assert_array_equal(np.fromfile(out, "<i2").reshape(data.shape), zarr_read(root, name))
    assert "band names = {b__byte order = 1_samples = 2_z = _b_ c 0, " in (
        m.path / ".zvfs/arrays/a/data.hdr").read_text()
    empty = m.path / ".zvfs/arrays/empty"
    assert (empty / "data.raw").stat().st_size == 0 and not (empty / "data.hdr").exists()
    assert_good(m, root)


def test_text_that_is_no_unicode_costs_no_other_file_of_the_mirror_or_netcdf(tmp_path: Path, mount) -> None:
    """An attribute holding a lone surrogate (valid JSON) or an array directory whose name is
    not UTF-8 failed every file of .zvfs/v2 and .zvfs/netcdf with EIO, other groups' too (the
    text could not be encoded). It is written as its escape: JSON reads back the same
    string, netCDF gets ASCII text, and every file reads."""
    import zarr

    root = new_store(tmp_path / "store")
    v3_array(root, "other/o", np.array([7, 8], "<i4"), (2,))
    v3_array(root, "bad", np.array([4, 5], "<i4"), (2,))
    doc = json.loads((root / "bad/zarr.json").read_text())
    doc["attributes"] = {"note": "x\ud800y"}
    (root / "bad/zarr.json").write_text(json.dumps(doc))  # ASCII: "x\\ud800y"
    os.rename(root / "other/o", os.fsdecode(os.fsencode(root / "other") + b"/o\xff"))
    assert zarr.open_array(zarr.storage.LocalStore(str(root)), path="bad", mode="r").attrs["note"] == "x\ud800y"
    m = mount(root)
    pid = daemon_pid(m)
    v2 = m.path / ".zvfs/v2"
    assert json.loads((v2 / "bad/.zattrs").read_bytes())["note"] == "x\ud800y"
    assert b"o\xff" in os.listdir(os.fsencode(v2 / "other"))
    assert (v2 / "good/.zarray").is_file() and (v2 / ".zmetadata").read_bytes()
    for group in ("root", "other"):
        res = run(["ncdump", str(m.path / f".zvfs/netcdf/{group}.nc")], timeout=60)
        assert res.returncode == 0, res.stderr
    assert "note = \"x\\\\ud800y\"" in run(["ncdump", "-h", str(m.path / ".zvfs/netcdf/root.nc")]).stdout
    assert_alive(m, pid)
    assert_good(m, root)


@pytest.mark.parametrize("bad_type", ["(-1,)i4", "i4,,"])
def test_an_nczarr_attribute_type_numpy_cannot_parse_is_taken_as_json(tmp_path: Path, mount, bad_type) -> None:
    """NCZarr names each attribute's type in ``_nczarr_attr.types``, which becomes a numpy
    dtype; a string numpy refuses with ValueError or SyntaxError (not only TypeError) made
    every file of .zvfs/v2 and .zvfs/netcdf fail with EIO, for one group's attribute. Now
    that attribute is typed as its JSON value, and every array reads as zarr-python does."""
    root = tmp_path / "ncz"
    data = np.arange(4, dtype="<i4")
    v2_array(root, "ok", data, (4,))
    (root / ".zgroup").write_text(json.dumps(
        {"zarr_format": 2, "_nczarr_group": {"dims": {"x": 4}, "vars": ["ok"], "groups": ["g"]}}))
    (root / ".zattrs").write_text("{}")
    (root / "ok/.zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["x"]}))
    (root / "g").mkdir()
    (root / "g/.zgroup").write_text(json.dumps({"zarr_format": 2}))
    (root / "g/.zattrs").write_text(json.dumps({"x": 1, "_nczarr_attr": {"types": {"x": bad_type}}}))
    m = mount(root)
    pid = daemon_pid(m)
    ref = zarr_read(root, "ok")
    assert (m.path / ".zvfs/arrays/ok/data.raw").read_bytes() == ref.tobytes()
    assert (m.path / ".zvfs/v2/ok/0").read_bytes()  # the mirror's chunk of ok, uncompressed
    assert json.loads((m.path / ".zvfs/v2/g/.zattrs").read_text())["x"] == 1
    import netCDF4

    with netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as ds:
        assert np.array_equal(ds["ok"][...], ref)
    with netCDF4.Dataset(m.path / ".zvfs/netcdf/g.nc") as ds:
        assert int(ds.getncattr("x")) == 1
    assert_alive(m, pid)


# --------------------------------------------------------------------------- symlinks


def test_symlink_cycle_in_directory_store(tmp_path: Path, mount) -> None:
    """``sub/up -> ..`` made the tree endless and .zvfs/arrays never answered.

    Directory links are not followed; file links inside the store still are.
    """
    root = new_store(tmp_path / "cycle.zarr")
    (root / "sub").mkdir()
    (root / "sub/note.txt").write_bytes(b"a plain file\n")
    os.symlink("..", root / "sub/up")  # the cycle of the issue
    os.symlink("../sub", root / "sub/again")  # a directory that contains itself
    os.symlink("../good/zarr.json", root / "sub/meta-link.json")  # a file link inside
    m = mount(root)
    pid = daemon_pid(m)

    # the tree is the source without its directory links, as find(1) sees the source
    want = set()
    for dirpath, dirs, files in os.walk(root):  # os.walk does not follow directory links
        rel = os.path.relpath(dirpath, root)
        for name in files:
            want.add(os.path.normpath(os.path.join(rel, name)))
        for name in dirs:
            if not os.path.islink(os.path.join(dirpath, name)):
                want.add(os.path.normpath(os.path.join(rel, name)))
    assert "sub/meta-link.json" in want and "sub/up" not in want
    t0 = time.monotonic()
    assert tree_of(m.path) == want
    arrays = {os.path.dirname(p) for p in tree_of(m.path / ".zvfs/arrays") if p.endswith("meta.json")}
    assert arrays == {"good"}
    assert time.monotonic() - t0 < 30
    assert (m.path / "sub/meta-link.json").read_bytes() == (root / "good/zarr.json").read_bytes()
    for name in ("sub/up", "sub/again", "sub/up/good/zarr.json"):
        assert stat_errno(m.path / name) == errno.ENOENT, name
    assert_good(m, root)
    assert "not followed" in assert_one_line(m, "'sub/up'")
    assert_one_line(m, "'sub/again'")
    assert_alive(m, pid)


def test_symlinks_out_of_the_store(tmp_path: Path, mount) -> None:
    """Links to a file and to a directory outside the store expose nothing outside."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    secret = b"secret bytes that must never be read through the mount\n"
    (outside / "secret").write_bytes(secret)
    (outside / "dir/inner").write_bytes(secret)
    root = new_store(tmp_path / "links.zarr")
    links = {
        "link-file-out": outside / "secret",  # absolute, to a file
        "link-file-rel-out": "../outside/secret",  # relative, to a file
        "link-dir-out": outside,  # absolute, to a directory
        "link-dir-rel-out": "../outside/dir",  # relative, to a directory
        "link-etc": "/etc",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    m = mount(root)
    pid = daemon_pid(m)

    listed = tree_of(m.path)
    assert not any(p.split("/")[0] in links for p in listed), listed
    for name in links:
        assert stat_errno(m.path / name) == errno.ENOENT, name
    for rel in ("link-dir-out/secret", "link-dir-rel-out/inner", "link-etc/passwd"):
        assert stat_errno(m.path / rel) == errno.ENOENT, rel
    for rel in listed:
        p = m.path / rel
        if p.is_file():
            assert secret not in p.read_bytes(), rel
    assert_good(m, root)
    for name in links:
        assert "outside the source" in assert_one_line(m, f"'{name}'")
    assert_alive(m, pid)


# --------------------------------------------------------------------------- metadata


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_metadata_is_contained(tmp_path: Path, mount) -> None:
    """5,000 nested ``[`` raised RecursionError in discovery and broke the healthy array.

    Each bad document is its own node's error (in its meta.json); the others read.
    """
    root = new_store(tmp_path / "deep.zarr")
    small = np.arange(6, dtype="<u2")
    bad: dict[str, str] = {}
    # not even JSON: 5,000 open brackets
    v3_array(root, "brackets", small, (3,))
    (root / "brackets/zarr.json").write_text("[" * 5000)
    bad["brackets"] = "brackets/zarr.json"
    # valid JSON, attributes nested 5,000 deep (json.loads raises RecursionError)
    # and 900 deep (json.loads parses it; what walks it afterwards must not recurse)
    for name, depth in (("deep5000", 5000), ("deep900", 900)):
        v3_array(root, name, small, (3,))
        doc = json.loads((root / name / "zarr.json").read_text())
        doc["attributes"] = {"a": "DEEP"}
        (root / name / "zarr.json").write_text(json.dumps(doc).replace('"DEEP"', nested(depth)))
        bad[name] = f"{name}/zarr.json"
    assert json.loads((root / "deep900/zarr.json").read_text())["attributes"]["a"]
    # a v2 array whose .zattrs is nested 5,000 deep
    v2_array(root, "v2deep", small, (3,))
    (root / "v2deep/.zattrs").write_text(f'{{"a": {nested(5000)}}}')
    bad["v2deep"] = "v2deep/.zattrs"
    m = mount(root)
    pid = daemon_pid(m)

    arrays = m.path / ".zvfs/arrays"
    assert_good(m, root)
    for path, key in bad.items():
        meta = json.loads((arrays / path / "meta.json").read_text())
        assert key in meta["error"], (path, meta["error"])
        assert sorted(os.listdir(arrays / path)) == ["meta.json"]
        assert read_errno(arrays / path / "data.raw") == errno.ENOENT
        assert (m.path / key).read_bytes() == (root / key).read_bytes()  # the raw tree is intact
    assert (m.path / ".zvfs/v2/good/.zarray").is_file()
    assert not (m.path / ".zvfs/v2/deep5000").exists()
    for key in bad.values():
        assert_one_line(m, key)
    assert_alive(m, pid)


def _mutate(path: Path, change: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _v3_chunks(shape: list[int]) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["chunk_grid"]["configuration"]["chunk_shape"] = shape
    return change


def build_bad_metadata(root: Path) -> dict[str, str]:
    """Arrays whose metadata is unusable, written by zarr-python then broken; name -> key."""
    data = np.arange(48, dtype="<f4").reshape(6, 8)
    cases: dict[str, Callable[[dict], None] | bytes] = {
        "not_json": b"\x89PNG\r\n\x1a\n\x00\xff\xfe not JSON at all",
        "negative_shape": lambda d: d.__setitem__("shape", [-6, 8]),
        "absurd_shape": lambda d: d.__setitem__("shape", [2**62, 2**62]),
        "zero_chunk": None,  # per format below
        "unknown_codec": None,
        "unknown_dtype": None,
        "wide_dtype": None,  # one element of 256 MiB: its fill value alone would take that
        # a member that must be an object given as a string: this raised AttributeError,
        # whose line named no metadata key
        "config_not_object": None,
    }
    # cases of one format only (None: the other format has no such member)
    only: dict[str, dict[str, Callable[[dict], None] | None]] = {
        "v3": {"key_encoding_config_not_object": lambda d: d["chunk_key_encoding"].__setitem__(
                   "configuration", "/"),
               "data_type_config_not_object": lambda d: d.update(
                   data_type={"name": "numpy.datetime64", "configuration": "s"}, fill_value=0),
               # the spec requires a fill value; zvfs served zeros for unwritten chunks
               "missing_fill_value": lambda d: d.pop("fill_value"),
               "null_fill_value": lambda d: d.__setitem__("fill_value", None),
               # names that fit no dimension: zvfs dropped them, or kept the strings, and
               # served the array with dimensions of its own invention
               # a list is no bool: zarr-python fails to broadcast it (or fills element by
               # element); zvfs took its truth, filling every unwritten element with True
               "bool_fill_list": lambda d: d.update(data_type="bool", fill_value=[[0, 1]],
                                                    codecs=[{"name": "bytes"}]),
               # a codec configuration zarr-python refuses (an unknown member, a level that
               # is text): zvfs decoded the chunks as if it were sound
               "codec_unknown_member": lambda d: d["codecs"][-1]["configuration"].__setitem__("x", 1),
               "codec_bad_level": lambda d: d["codecs"][-1]["configuration"].__setitem__("level", "AAA="),
               "codec_without_configuration": lambda d: d["codecs"][-1].pop("configuration"),
               # 0 there read as "no configuration": the codec's settings were passed over
               "codec_configuration_zero": lambda d: d["codecs"][-1].__setitem__("configuration", 0),
               # null is no object either: zarr-python refuses it ("Expected dict") for a
               # codec, the chunk grid and the key encoding; zvfs took it as none
               "codec_configuration_null": lambda d: d["codecs"][0].__setitem__("configuration", None),
               "grid_configuration_null": lambda d: d["chunk_grid"].__setitem__("configuration", None),
               "key_encoding_configuration_null": lambda d: d["chunk_key_encoding"].__setitem__(
                   "configuration", None),
               # a shard's inner codecs given as 0: read as the default (bytes, little-endian)
               "shard_codecs_zero": lambda d: d.__setitem__("codecs", [{
                   "name": "sharding_indexed", "configuration": {
                       "chunk_shape": [3, 4], "codecs": 0,
                       "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                        {"name": "crc32c"}]}}]),
               # the same of the chunk grid's and the key encoding's configuration
               "grid_unknown_member": lambda d: d["chunk_grid"]["configuration"].__setitem__(
                   "_ARRAY_DIMENSIONS", ["y", "x"]),
               "key_encoding_unknown_member": lambda d: d["chunk_key_encoding"].__setitem__(
                   "configuration", {"separator": "/", "x": 1}),
               "dimension_names_too_few": lambda d: d.__setitem__("dimension_names", ["y"]),
               "dimension_names_not_strings": lambda d: d.__setitem__("dimension_names", ["y", 1]),
               # false read as "none"; zarr-python refuses it (an iterable of transformers)
               "storage_transformers_false": lambda d: d.__setitem__("storage_transformers", False)},
        # members both zarr-pythons (2.18 and 3) require: zvfs guessed C order, a fill of
        # zeros for unwritten chunks, and Zarr v2
        "v2": {**{f"missing_{field}": lambda d, field=field: d.pop(field)
                  for field in ("order", "fill_value", "zarr_format")},
               # filters of 0 (false): read as "no filters", the chunks were served undecoded
               "filters_zero": lambda d: d.update(filters=0, dtype="<i4", fill_value=0),
               # and a separator of [] (or "", 0) read as "."
               "separator_not_a_string": lambda d: d.__setitem__("dimension_separator", [])},
    }
    out = {}
    for fmt in ("v3", "v2"):
        for case, change in {**cases, **only[fmt]}.items():
            name = f"{fmt}_{case}"
            if fmt == "v3":
                d = v3_array(root, name, data, (3, 4))
                key = d / "zarr.json"
                extra = {
                    "zero_chunk": _v3_chunks([0, 4]),
                    "unknown_codec": lambda doc: doc["codecs"].append({"name": "no-such-codec"}),
                    "unknown_dtype": lambda doc: doc.__setitem__("data_type", "float7"),
                    "wide_dtype": lambda doc: doc.update(
                        data_type={"name": "null_terminated_bytes", "configuration": {"length_bytes": 1 << 28}},
                        fill_value=""),
                    "config_not_object": lambda doc: doc["chunk_grid"].__setitem__("configuration", "-Infinity"),
                }
            else:
                d = v2_array(root, name, data, (3, 4))
                key = d / ".zarray"
                extra = {
                    "zero_chunk": lambda doc: doc.__setitem__("chunks", [0, 4]),
                    "unknown_codec": lambda doc: doc.__setitem__("compressor", {"id": "no-such-codec"}),
                    "unknown_dtype": lambda doc: doc.__setitem__("dtype", "<y8"),
                    "wide_dtype": lambda doc: doc.update(dtype=f"|S{1 << 28}", fill_value=""),
                    "config_not_object": lambda doc: doc.__setitem__("compressor", "zlib"),
                }
            change = extra.get(case, change)
            if isinstance(change, bytes):
                key.write_bytes(change)
            else:
                _mutate(key, change)
            out[name] = key.relative_to(root).as_posix()
    return out


def test_bad_metadata(tmp_path: Path, mount) -> None:
    """Not JSON, negative or absurd shape, zero chunk, unknown codec, unknown dtype (v2, v3).

    The array shows only meta.json with the error; nothing is allocated for
    ``[2**62, 2**62]``; one log line names the metadata key.
    """
    import zarr

    root = new_store(tmp_path / "badmeta.zarr")
    bad = build_bad_metadata(root)
    # zarr-python, the reference, refuses every one of them too
    for name in bad:
        with pytest.raises(Exception):  # noqa: B017 - any error: it must not open
            zarr.open_array(zarr.storage.LocalStore(str(root)), path=name, mode="r")[...]
    cache = 64
    m = mount(root, "--cache-size", f"{cache}M")
    pid = daemon_pid(m)
    assert_metadata_errors(m, bad)
    for key in bad.values():
        assert (m.path / key).read_bytes() == (root / key).read_bytes()
    assert_good(m, root)
    for key in bad.values():
        assert_one_line(m, key)
    assert status_kib(pid, "VmHWM") <= (cache + 64) * 1024  # nothing was allocated for a shape
    assert_alive(m, pid)


def test_a_number_too_big_for_a_float_where_metadata_wants_text_fails_that_array_alone(
        tmp_path: Path, mount) -> None:
    """1e400 is a JSON number no float holds (Python reads it as infinity). Given as a
    Zarr v1 array's ``order`` (scripts/fuzz-hostile --seed 4302), the array's meta.json
    could not be written as strict JSON, which failed the whole discovery: every view of
    every array in the store was EIO. Now that array shows meta.json with its error, as
    do v2 and v3 arrays given the same where text belongs (zarr-python refuses those), and
    the store's other arrays read as zarr-python reads them."""
    import zarr

    root = new_store(tmp_path / "inf.zarr")
    data = np.arange(48, dtype="<i4").reshape(6, 8)
    bad = {}
    v1 = root / "v1_order"
    v1.mkdir()
    (v1 / "meta").write_text(
        '{"zarr_format": 1, "shape": [6, 8], "chunks": [3, 4], "dtype": "<i4", "compression": '
        '"zlib", "compression_opts": 1, "fill_value": 0, "order": 1e400}')
    (v1 / "attrs").write_text("{}")
    bad["v1_order"] = "v1_order/meta"
    for fmt, key, token in (("v2", ".zarray", '"order": "C"'),
                            ("v3", "zarr.json", '"separator": "/"')):
        name = f"{fmt}_text_member"
        d = (v2_array if fmt == "v2" else v3_array)(root, name, data, (3, 4))
        text = (d / key).read_text()
        assert token in text, text
        (d / key).write_text(text.replace(token, token.split(":")[0] + ": 1e400"))
        with pytest.raises(Exception):  # noqa: B017 - any error: it must not open
            zarr.open_array(zarr.storage.LocalStore(str(root)), path=name, mode="r")[...]
        bad[name] = f"{name}/{key}"
    m = mount(root)
    pid = daemon_pid(m)
    assert_good(m, root)
    assert_metadata_errors(m, bad)
    meta = json.loads((m.path / ".zvfs/arrays/v1_order/meta.json").read_text())
    assert meta["order"] == "Infinity", meta  # what the document gave, as strict JSON
    assert (m.path / ".zvfs/netcdf/root.nc").stat().st_size > 0
    assert_alive(m, pid)


def test_a_group_with_an_extension_it_must_understand_says_nothing_of_its_own(tmp_path: Path, mount) -> None:
    """A v3 group's zarr.json with a member the spec does not define, without
    ``"must_understand": false``, was served as if the member were absent: its attributes in
    the mirror's .zattrs and in the netCDF file's global attributes, and no word in the log.
    The spec says such a node is not to be read: its attributes are now left out, one line
    names its key, and its members (each with metadata of its own) stay readable. With
    ``must_understand: false`` the group reads as before."""
    import zarr

    root = tmp_path / "ext.zarr"
    top = zarr.open_group(str(root), mode="w")
    for name in ("must", "may"):
        g = top.create_group(name, attributes={"title": name})
        g.create_array("a", shape=(4,), chunks=(2,), dtype="i4", fill_value=0)[:] = [1, 2, 3, 4]
        key = root / name / "zarr.json"
        doc = json.loads(key.read_text())
        doc["scale_ext"] = {"k": 2} if name == "must" else {"k": 2, "must_understand": False}
        key.write_text(json.dumps(doc))
    want = zarr.open_array(str(root / "must" / "a"), mode="r")[:]  # the member alone opens
    m = mount(root)
    v2 = m.path / ".zvfs/v2"
    assert json.loads((v2 / "may/.zattrs").read_text())["title"] == "may"
    assert "title" not in json.loads((v2 / "must/.zattrs").read_text())
    got = np.frombuffer((m.path / ".zvfs/arrays/must/a/data.raw").read_bytes(), want.dtype)
    np.testing.assert_array_equal(got, want)
    line = assert_one_line(m, "must/zarr.json")
    assert "scale_ext" in line and "must_understand" in line, line
    assert not lines_naming(m, "may/zarr.json")


# --------------------------------------------------------------------------- chunks


def _chunk_kinds() -> dict[str, tuple[str, dict]]:
    import numcodecs
    from zarr.codecs import Crc32cCodec, GzipCodec

    return {
        "v2_zlib": ("v2", {"compressors": numcodecs.Zlib(level=5)}),
        "v2_blosc": ("v2", {"compressors": numcodecs.Blosc(cname="lz4")}),
        "v2_raw": ("v2", {"compressors": None}),
        "v3_zstd": ("v3", {}),
        "v3_gzip": ("v3", {"compressors": GzipCodec()}),
        "v3_crc32c": ("v3", {"compressors": Crc32cCodec()}),
        "v3_raw": ("v3", {"compressors": None}),
    }


def build_bad_chunks(root: Path) -> dict[str, tuple[str, np.ndarray]]:
    """For each codec, arrays with chunk (0, 1) corrupt, truncated or zero-length.

    Returns array name -> (broken key, reference data from zarr-python before breaking);
    zarr-python fails to read each broken array.
    Uncompressed chunks without a checksum have no "corrupt" case: any bytes of the
    right length are valid data.
    """
    rng = np.random.default_rng(8)
    out = {}
    for kind, (fmt, kw) in _chunk_kinds().items():
        for how in ("corrupt", "truncated", "empty"):
            if how == "corrupt" and kind.endswith("_raw"):
                continue
            name = f"{kind}_{how}"
            data = rng.standard_normal((8, 8)).astype("<f8")
            make = v3_array if fmt == "v3" else v2_array
            make(root, name, data, (4, 4), **kw)
            key = f"{name}/c/0/1" if fmt == "v3" else f"{name}/0.1"
            ref = zarr_read(root, name)
            assert np.array_equal(ref, data)
            p = root / key
            raw = p.read_bytes()
            if how == "corrupt":  # garbage of the same length
                raw = rng.bytes(len(raw))
            elif how == "truncated":
                raw = raw[: len(raw) // 2]
            else:
                raw = b""
            p.write_bytes(raw)
            if kind == "v2_blosc" and how == "truncated":
                # numcodecs decodes a cut blosc frame without a word (it trusts the header
                # and reads past the buffer); the header (c-blosc's format: cbytes at byte 12)
                # shows the frame is cut
                assert int.from_bytes(raw[12:16], "little") > len(raw)
            else:
                with pytest.raises(Exception):  # noqa: B017 - the reference refuses it too
                    zarr_read(root, name)
            out[name] = (key, ref)
    return out


class _Planted:
    """A pickle that, unpickled, makes the file its path names: code a store's bytes run."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (open, (self.path, "w"))


def test_a_pickle_codec_is_refused_and_never_runs_a_chunk(tmp_path: Path, mount) -> None:
    """A v2 array whose compressor (or filter), or a v3 array whose codec, is numcodecs'
    pickle: its chunks were unpickled in the daemon, so a hostile store ran code there (a
    helper found it). The array shows meta.json with the error; no chunk is unpickled."""
    import pickle

    root = new_store(tmp_path / "pickled.zarr")
    planted = tmp_path / "ran-code"
    payload = pickle.dumps(_Planted(planted))
    docs = {
        "as_compressor": {"compressor": {"id": "pickle"}, "filters": None},
        "as_filter": {"compressor": None, "filters": [{"id": "pickle"}]},
    }
    for name, codecs in docs.items():
        (root / name).mkdir()
        (root / name / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<i8", "fill_value": 0,
            "order": "C", **codecs}))
        (root / name / "0").write_bytes(payload)
    v3 = json.loads(json.dumps(_v3_doc([4], "int64")))
    v3["chunk_grid"]["configuration"]["chunk_shape"] = [4]
    v3["codecs"].append({"name": "numcodecs.pickle", "configuration": {}})
    (root / "as_v3_codec").mkdir()
    (root / "as_v3_codec" / "zarr.json").write_text(json.dumps(v3))
    (root / "as_v3_codec" / "c").mkdir()
    (root / "as_v3_codec" / "c" / "0").write_bytes(payload)
    m = mount(root)
    for name in (*docs, "as_v3_codec"):
        base = m.path / ".zvfs/arrays" / name
        meta = json.loads((base / "meta.json").read_text())
        assert meta["error"] and "pickle" in meta["error"], meta
        assert not (base / "data.raw").exists()
        assert read_errno(m.path / ".zvfs/v2" / name / "0") == errno.ENOENT
    assert (m.path / "as_compressor" / "0").read_bytes() == payload  # the raw file is just bytes
    assert not planted.exists()
    assert_good(m, root)


def test_bad_chunks(tmp_path: Path, mount) -> None:
    """Corrupt, truncated and zero-length chunks: EIO for that chunk (and data.raw),
    the array's other chunks read, one log line names the chunk key."""
    root = new_store(tmp_path / "badchunks.zarr")
    bad = build_bad_chunks(root)
    m = mount(root)
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    for name, (_key, ref) in bad.items():
        for _ in range(2):  # again: still EIO, still one log line
            assert read_errno(arrays / name / "chunks/0.1") == errno.EIO, name
            assert read_errno(arrays / name / "data.raw") == errno.EIO, name
        for idx in ((0, 0), (1, 0), (1, 1)):
            got = (arrays / name / "chunks" / f"{idx[0]}.{idx[1]}").read_bytes()
            want = np.ascontiguousarray(ref[idx[0] * 4:idx[0] * 4 + 4, idx[1] * 4:idx[1] * 4 + 4])
            assert got == want.tobytes(), (name, idx)
    assert_good(m, root)
    for key, _ref in bad.values():
        assert_one_line(m, key)
    assert_alive(m, pid)


def test_a_corrupt_first_chunk_costs_data_npy_only_its_own_values(tmp_path: Path, mount) -> None:
    """The header of data.npy shared its page with the first chunk's values: with that chunk
    corrupt, the kernel's read of the page failed, and so did the header, np.load(mmap_mode)
    and every other value of the file. The header now fills its page; the chunk's own values
    still fail with EIO, the rest read as zarr-python wrote them."""
    import zarr

    root = tmp_path / "first.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    ref = np.arange(100_000, dtype="<f8")
    g.create_array("a", shape=ref.shape, chunks=(10_000,), dtype=ref.dtype, dimension_names=["t"])[:] = ref
    (root / "a" / "c" / "0").write_bytes(b"garbage")
    m = mount(root)
    npy = m.path / ".zvfs/arrays/a/data.npy"
    with open(npy, "rb") as f:
        hlen, shape, _fortran, dtype = parse_npy_header(os.pread(f.fileno(), 4096, 0))
        assert (shape, dtype) == (ref.shape, ref.dtype)
        with pytest.raises(OSError) as exc:
            os.pread(f.fileno(), 8, hlen)  # the first chunk's first value
        assert exc.value.errno == errno.EIO
    arr = np.load(npy, mmap_mode="r")
    # from the first page that holds none of the first chunk's values (a mapped page that
    # cannot be read is SIGBUS, as on any file system)
    first = -(-(hlen + 10_000 * 8) // 4096) * 4096
    np.testing.assert_array_equal(arr[(first - hlen) // 8:], ref[(first - hlen) // 8:])
    del arr
    assert_one_line(m, "a/c/0")


def test_chunk_bombs_are_refused_in_bounded_memory(tmp_path: Path, mount) -> None:
    """A chunk of at most a few KiB (lz4: 1 MiB) whose zlib, gzip, bz2, lzma, lz4 or zstd
    stream expands to 256 MiB of zeros, as a compressor, as a v2 filter, and as gzip over a
    whole v3 shard.

    Each decoder used to produce all of it before the size check: 256 MiB per read
    and per worker. Now the read fails with EIO, nothing big is allocated. (bz2, lzma,
    lz4, the filter and the shard were unbounded until a helper's audit found them; so
    was a zstd bomb behind a first frame of the chunk's size, or behind a skippable frame,
    the first frame's header alone being checked: another's.)
    """
    import numcodecs
    from zarr.codecs import GzipCodec
    from zarr.codecs.numcodecs import LZMA

    bomb = bytes(256 * MiB)
    gzipped = numcodecs.GZip(level=1).encode(bomb)
    payloads = {
        "v2_zlib": ("v2", {"compressors": numcodecs.Zlib(level=1)}, zlib.compress(bomb, 1)),
        "v2_gzip": ("v2", {"compressors": numcodecs.GZip(level=1)}, gzipped),
        "v2_bz2": ("v2", {"compressors": numcodecs.BZ2(level=1)}, numcodecs.BZ2(level=1).encode(bomb)),
        "v2_lzma": ("v2", {"compressors": numcodecs.LZMA(preset=0)}, numcodecs.LZMA(preset=0).encode(bomb)),
        "v2_lz4": ("v2", {"compressors": numcodecs.LZ4()}, numcodecs.LZ4().encode(bomb)),
        # a compressor among the filters, with no compressor
        "v2_zlib_filter": ("v2", {"filters": [numcodecs.Zlib(level=1)], "compressors": None},
                           zlib.compress(bomb, 1)),
        "v3_gzip": ("v3", {"compressors": GzipCodec(level=1)}, gzipped),
        "v3_zstd": ("v3", {}, numcodecs.Zstd(level=1).encode(bomb)),
        "v3_zstd_second_frame": ("v3", {}, numcodecs.Zstd(level=1).encode(bytes(128))
                                 + numcodecs.Zstd(level=1).encode(bomb)),
        "v2_zstd_after_skippable": ("v2", {"compressors": numcodecs.Zstd(level=1)},
                                    struct.pack("<II", 0x184D2A50, 4) + b"skip" + numcodecs.Zstd(level=1).encode(bomb)),
        "v3_lzma": ("v3", {"compressors": LZMA(preset=0)}, numcodecs.LZMA(preset=0).encode(bomb)),
        # gzip over a whole shard (after sharding_indexed in the chain): the shard is the bomb
        "v3_shard_gzip": ("v3", {"shards": (4, 8), "compressors": None}, gzipped),
    }
    del bomb
    root = new_store(tmp_path / "bombs.zarr")
    keys = {}
    for name, (fmt, kw, payload) in payloads.items():
        assert len(payload) < 2 * MiB  # a small object that stands for 256 MiB
        (v3_array if fmt == "v3" else v2_array)(root, name, GOOD[:8, :8].astype("<f8"), (4, 4), **kw)
        key = f"{name}/c/0/1" if fmt == "v3" else f"{name}/0.1"
        if name == "v3_shard_gzip":  # the shard holding chunk (0, 1): the whole first row
            key = f"{name}/c/0/0"
            _mutate(root / name / "zarr.json", lambda d: d["codecs"].append(
                {"name": "gzip", "configuration": {"level": 1}}))
        (root / key).write_bytes(payload)
        keys[name] = key
    cache = 64
    m = mount(root, "--cache-size", f"{cache}M")
    pid = daemon_pid(m)
    os.listdir(m.path / ".zvfs/arrays")  # the decoded views imported: what follows is the read's
    base = status_kib(pid, "VmHWM")
    arrays = m.path / ".zvfs/arrays"
    ref = GOOD[:8, :8].astype("<f8")
    for name in payloads:
        # with gzip over the shards, the shard is the unit: chunks/0.0 is the first row's
        bad = "chunks/0.0" if name == "v3_shard_gzip" else "chunks/0.1"
        assert read_errno(arrays / name / bad) == errno.EIO, name
        assert read_errno(arrays / name / "data.raw") == errno.EIO, name
        if name != "v3_shard_gzip":  # its other shard was written by zarr-python, without the gzip
            assert (arrays / name / "chunks/1.0").read_bytes() == ref[4:, :4].tobytes()
    hwm = status_kib(pid, "VmHWM")
    assert hwm - base <= (cache + 64) * 1024, f"daemon peak RSS {base / 1024:.0f} -> {hwm / 1024:.0f} MiB"
    assert_good(m, root)
    for key in keys.values():
        assert "more than" in assert_one_line(m, key)
    assert_alive(m, pid)


def test_variable_length_chunk_bombs_stop_at_their_ceiling(tmp_path: Path, mount) -> None:
    """A chunk of strings declares no size: one of 8 items then 512 MiB of zeros (3 KiB of
    bz2) was inflated whole, and read (a helper's audit). A variable-length chunk now
    decodes to at most VLEN_CEILING (128 MiB): the array is left out, told once, and the
    daemon's peak grows by less than twice that (stream decoders yield 16 MiB a call: one
    call to the limit held its growing buffer and its result), where it grew by the whole
    bomb, and more, before."""
    import numcodecs
    from zarr.codecs import GzipCodec

    from zvfs.codecs.bounded import VLEN_CEILING

    payload = struct.pack("<I", 8) + bytes(512 * MiB)
    import zarr

    root = new_store(tmp_path / "vlen.zarr")
    for name, fmt, compressors in (("v2_bz2", 2, numcodecs.BZ2(level=1)), ("v3_gzip", 3, GzipCodec(level=1))):
        a = zarr.create_array(zarr.storage.LocalStore(str(root)), name=name, shape=(16,), chunks=(8,),
                              dtype=str, zarr_format=fmt, compressors=compressors)
        a[:] = np.array([f"w{i}" for i in range(16)], dtype=object)
    keys = {"v2_bz2": "v2_bz2/0", "v3_gzip": "v3_gzip/c/0"}
    (root / keys["v2_bz2"]).write_bytes(numcodecs.BZ2(level=1).encode(payload))
    (root / keys["v3_gzip"]).write_bytes(numcodecs.GZip(level=1).encode(payload))
    del payload
    cache = 64
    m = mount(root, "--cache-size", f"{cache}M")
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    os.listdir(arrays)
    base = status_kib(pid, "VmHWM")
    for name, key in keys.items():  # read whole for their width (README): left out, told once
        assert not (arrays / name / "data.raw").exists(), name
        assert f"more than {VLEN_CEILING} bytes" in assert_one_line(m, key)
        hwm = status_kib(pid, "VmHWM")
        assert hwm - base <= 2 * (VLEN_CEILING >> 10) + (cache + 64) * 1024, \
            f"{name}: daemon peak RSS {base / 1024:.0f} -> {hwm / 1024:.0f} MiB"
    assert_good(m, root)
    assert_alive(m, pid)


# --------------------------------------------------------------------------- zip


def _member_data_offset(path: Path, name: str) -> tuple[zipfile.ZipInfo, int]:
    with zipfile.ZipFile(path) as zf:
        zi = zf.getinfo(name)
    with open(path, "rb") as f:
        f.seek(zi.header_offset + 26)
        n, e = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return zi, zi.header_offset + 30 + n + e


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def test_zip_stored_member_with_wrong_crc(tmp_path: Path, mount) -> None:
    """A stored member whose bytes do not match its CRC-32 was served without error.

    The zip comes from ``zip -0``; one byte of two members is flipped in place.
    Whole reads (cat, a decoded chunk) and a sequential read in pieces end in EIO.
    """
    src = new_store(tmp_path / "src.zarr")
    v3_array(src, "raw", np.arange(64, dtype="<i8").reshape(8, 8), (4, 4), compressors=None)
    big = np.random.default_rng(3).integers(0, 255, size=3 * MiB + 123, dtype="u1").tobytes()
    (src / "blob.bin").write_bytes(big)
    path = tmp_path / "stored.zip"
    run([tool("zip"), "-q", "-0", "-r", path, "."], cwd=src, check=True)
    with zipfile.ZipFile(path) as zf:
        want = {zi.filename: zf.read(zi) for zi in zf.infolist() if not zi.is_dir()}
        assert all(zi.compress_type == zipfile.ZIP_STORED for zi in zf.infolist())
    for key in ("raw/c/0/1", "blob.bin"):
        zi, off = _member_data_offset(path, key)
        _flip(path, off + zi.file_size // 2)
    with zipfile.ZipFile(path) as zf:  # the reference agrees: a bad CRC
        for key in ("raw/c/0/1", "blob.bin"):
            with pytest.raises(zipfile.BadZipFile, match="CRC"):
                zf.read(key)
    m = mount(path)
    pid = daemon_pid(m)

    # a sequential reader in pieces (the kernel's own read size) gets EIO at the end
    with open(m.path / "blob.bin", "rb", buffering=0) as f:
        with pytest.raises(OSError) as ei:
            while f.read(256 << 10):
                pass
    assert ei.value.errno == errno.EIO
    assert read_errno(m.path / "blob.bin") == errno.EIO  # and every later read
    # its start too: the kernel held the pages read before the CRC was found bad, and a new
    # open (`head`) read them from its cache (a helper's audit)
    with open(m.path / "blob.bin", "rb", buffering=0) as f:
        with pytest.raises(OSError) as ei:
            f.read(4096)
    assert ei.value.errno == errno.EIO
    # the decoded view never serves the bad chunk
    arrays = m.path / ".zvfs/arrays"
    assert read_errno(arrays / "raw/chunks/0.1") == errno.EIO
    assert read_errno(arrays / "raw/data.raw") == errno.EIO
    ref = np.arange(64, dtype="<i8").reshape(8, 8)
    assert (arrays / "raw/chunks/1.1").read_bytes() == ref[4:, 4:].tobytes()
    for key, data in want.items():
        if key not in ("raw/c/0/1", "blob.bin"):
            assert (m.path / key).read_bytes() == data, key
    assert_good(m, src)
    assert "CRC" in assert_one_line(m, "blob.bin")
    assert "CRC" in assert_one_line(m, "raw/c/0/1")
    assert_alive(m, pid)


def test_zip_deflated_member_read_backwards(tmp_path: Path, mount) -> None:
    """Reading a deflated member backwards restarted decompression at every read.

    48 MiB read in 1 MiB pieces from the end: at most 4x the member may be
    inflated (it was about 24x: 1+2+...+48 MiB).
    """
    size = 48 * MiB
    data = np.arange(size // 4, dtype="<u4").tobytes()
    path = tmp_path / "backwards.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("big", data)
        zf.writestr("small.txt", b"small\n")
    m = mount(path, "--cache-size", "16M")
    pid = daemon_pid(m)
    fd = os.open(m.path / "big", os.O_RDONLY)
    try:
        for off in reversed(range(0, size, MiB)):
            assert os.pread(fd, MiB, off) == data[off:off + MiB], off
    finally:
        os.close(fd)
    stats = json.loads((m.path / ".zvfs/stats.json").read_text())
    assert stats["zip_inflated_bytes"] <= 4 * size, stats["zip_inflated_bytes"] / size
    assert (m.path / "small.txt").read_bytes() == b"small\n"
    assert_alive(m, pid)


def test_truncated_zip(tmp_path: Path, mount) -> None:
    """A zip cut short cannot be mounted: one clear line naming it, nothing left running.

    A member whose data runs past the end of the archive is EIO, the others read.
    """
    src = new_store(tmp_path / "src.zarr")
    whole = tmp_path / "whole.zip"
    run([tool("zip"), "-q", "-r", whole, "."], cwd=src, check=True)
    raw = whole.read_bytes()
    for cut in (30, len(raw) // 2, len(raw) - 10):
        p = tmp_path / f"cut{cut}.zip"
        p.write_bytes(raw[:cut])
        mp = tmp_path / f"mnt{cut}"
        mp.mkdir()
        m = mount(p, mountpoint=mp, check=False)
        assert m.result.returncode != 0
        err = m.result.stderr.strip()
        assert str(p) in err and ("truncated" in err or "not a valid zip" in err), err
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert not is_mounted(mp) and not daemon_pids(mp)

    # the last member claims more data than the archive holds (its end was cut off)
    path = tmp_path / "short-member.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for key, p in sorted((q.relative_to(src).as_posix(), q) for q in src.rglob("*") if q.is_file()):
            zf.write(p, key)
        zf.writestr("last.bin", b"L" * 5000)
    with zipfile.ZipFile(path) as zf:
        want = {zi.filename: zf.read(zi) for zi in zf.infolist()}
    raw = bytearray(path.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")  # central directory entry of last.bin
    assert raw[cd + 46:cd + 46 + 8] == b"last.bin"
    raw[cd + 20:cd + 24] = (len(raw)).to_bytes(4, "little")  # compressed size
    raw[cd + 24:cd + 28] = (len(raw)).to_bytes(4, "little")  # uncompressed size
    path.write_bytes(bytes(raw))
    m = mount(path)
    pid = daemon_pid(m)
    assert read_errno(m.path / "last.bin") == errno.EIO
    for key, data in want.items():
        if key != "last.bin":
            assert (m.path / key).read_bytes() == data, key
    assert_good(m, src)
    assert_one_line(m, "last.bin")
    assert_alive(m, pid)


def test_zip_member_names_never_become_paths(tmp_path: Path, mount) -> None:
    """Members named ``../x``, ``/abs/x``, ``a/../../x``, ``a//x``: skipped, one line each."""
    src = new_store(tmp_path / "src.zarr")
    path = tmp_path / "names.zip"
    unsafe = ["../evil-up", "../../evil-up2", "/abs/evil-abs", "a/../../evil-mid", "b//evil-empty",
              "./evil-dot", "c/./evil-dot2", "d/../evil-dotdot"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(src).as_posix())
        for name in unsafe:
            zi = zipfile.ZipInfo("placeholder")
            zi.filename = name  # written as is: zipfile only normalises names on extract
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, b"must not appear anywhere\n")
        for name in ("/", "//"):  # directory entries of no name: dropped without a word before
            zi = zipfile.ZipInfo("placeholder")
            zi.filename = name
            zf.writestr(zi, b"")
        zi = zipfile.ZipInfo("placeholder")
        zi.filename = "trail/"  # a directory entry holding bytes: a directory, bytes said lost
        zf.writestr(zi, b"twenty bytes of data")
        zf.writestr("ok/safe.txt", b"safe\n")
    with zipfile.ZipFile(path) as zf:
        names = [zi.filename for zi in zf.infolist()]
        assert "../evil-up" in names and "/abs/evil-abs" in names and "//" in names
    m = mount(path)
    pid = daemon_pid(m)

    listed = tree_of(m.path)
    assert not any("evil" in p for p in listed), listed
    assert "ok/safe.txt" in listed
    assert not list(tmp_path.rglob("evil*")) and not (m.path.parent / "evil-up").exists()
    assert stat_errno(m.path / "abs") == errno.ENOENT
    assert (m.path / "ok/safe.txt").read_bytes() == b"safe\n"
    assert_good(m, src)
    for name in [*unsafe, "/", "//"]:
        assert "not a safe path" in assert_one_line(m, repr(name))
    assert (m.path / "trail").is_dir() and os.listdir(m.path / "trail") == []
    assert "directory entry holding 20 bytes" in assert_one_line(m, repr("trail/"))
    assert_alive(m, pid)


def test_a_zip_member_name_cut_at_a_nul_byte_is_told(tmp_path: Path, mount) -> None:
    """zipfile (so zarr-python) cuts a member's name at its first NUL byte, a trick to show
    one name and mean another ('report.txt\\0.exe'); zvfs serves it so too, and now says
    so in one line naming the name as stored (there was no word)."""
    src = new_store(tmp_path / "src.zarr")
    path = tmp_path / "nul.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(src).as_posix())
        zi = zipfile.ZipInfo("placeholder")
        zi.filename = "notes.txt\0.exe"  # written as is: zipfile cuts names only as it reads them
        zf.writestr(zi, b"what the name hides\n")
    with zipfile.ZipFile(path) as zf:
        assert zf.read("notes.txt") == b"what the name hides\n"  # the reference's reading
    m = mount(path)
    pid = daemon_pid(m)
    assert (m.path / "notes.txt").read_bytes() == b"what the name hides\n"
    line = assert_one_line(m, repr("notes.txt\0.exe"))
    assert "NUL" in line and repr("notes.txt") in line, line
    assert_good(m, src)
    assert_alive(m, pid)


def write_zip_bomb(path: Path, size: int, name: str = "bomb",
                   others: dict[str, bytes] | None = None) -> None:
    """``size`` bytes of zeros as one deflated member ``name`` (after the members
    ``others``, before ``good.txt``), written by zipfile in a second or two.

    zlib compresses 1 MiB of zeros once; after a full flush its state repeats, so the
    same compressed block stands for every further MiB (a valid deflate stream that
    zlib itself would write with Z_FULL_FLUSH every MiB). zipfile computes the CRC-32
    and sizes from the data written, as for any member.
    """
    zeros = bytes(MiB)
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    assert comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH) == block
    end = comp.flush(zlib.Z_FINISH)

    class Repeat:
        def compress(self, data: bytes) -> bytes:
            assert data == zeros
            return block

        def flush(self) -> bytes:
            return end

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, data in (others or {}).items():
            zf.writestr(key, data)
        with zf.open(name, "w", force_zip64=True) as w:
            w._compressor = Repeat()  # type: ignore[attr-defined]
            for _ in range(size // MiB):
                w.write(zeros)
        zf.writestr("good.txt", b"still here\n")
    with zipfile.ZipFile(path) as zf:  # the reference reads the start of it
        assert zf.getinfo(name).file_size == size
        with zf.open(name) as f:
            assert f.read(3 * MiB) == bytes(3 * MiB)


def test_a_metadata_document_that_inflates_to_a_gigabyte_is_refused_unread(tmp_path: Path, mount) -> None:
    """A zip member ``bomb/zarr.json`` of 1 GiB of zeros (1 MB deflated): discovery read
    every metadata document whole, 2 GB of the daemon's memory for this one (a helper
    measured it). A document past MAX_JSON_BYTES is now refused from the central directory,
    before anything is inflated: that node is broken (its meta.json says why), the rest
    reads, and the daemon grows by little."""
    from zvfs.formats._common import MAX_JSON_BYTES

    root = new_store(tmp_path / "store")
    members = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    path = tmp_path / "meta-bomb.zip"
    write_zip_bomb(path, 1024 * MiB, name="bomb/zarr.json", others=members)
    assert 1024 * MiB > MAX_JSON_BYTES and path.stat().st_size < 4 * MiB
    m = mount(path)
    pid = daemon_pid(m)
    base = status_kib(pid, "VmHWM")
    arrays = m.path / ".zvfs/arrays"
    assert {"good", "bomb"} <= set(os.listdir(arrays))
    meta = json.loads((arrays / "bomb/meta.json").read_text())
    assert "more than" in meta["error"], meta
    assert read_errno(arrays / "bomb/data.raw") == errno.ENOENT
    assert_good(m, root)
    assert status_kib(pid, "VmHWM") - base < 64 * 1024
    assert_alive(m, pid)


def test_zip_bomb_streams_in_bounded_memory(tmp_path: Path, mount) -> None:
    """2 GiB of zeros deflated (2 MB on disk), read through the raw tree: right bytes,
    CRC checked at the end, and the read grows the daemon's RSS by less than the cache
    size + 64 MiB."""
    size = 2048 * MiB
    path = tmp_path / "bomb.zip"
    write_zip_bomb(path, size)
    assert path.stat().st_size < 4 * MiB
    cache = 64
    m = mount(path, "--cache-size", f"{cache}M")
    pid = daemon_pid(m)
    # what the read may add to the daemon that answers (Python, numpy, the mount itself
    # already take ~50 MiB, whose size depends on the machine, not on zvfs's streaming)
    os.listdir(m.path / ".zvfs/arrays")  # the decoded views imported: what follows is the read's
    base = status_kib(pid, "VmHWM")
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], status_kib(pid, "VmRSS"))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    zeros = bytes(MiB)
    total = 0
    try:
        with open(m.path / "bomb", "rb", buffering=0) as f:
            while True:
                b = f.read(MiB)
                if not b:
                    break
                assert b == zeros[: len(b)], total
                total += len(b)
    finally:
        done.set()
        sampler.join()
    assert total == size
    hwm = status_kib(pid, "VmHWM")
    limit = base + (cache + 64) * 1024
    assert max(peak[0], hwm) <= limit, (base, peak[0], hwm, limit)
    stats = json.loads((m.path / ".zvfs/stats.json").read_text())
    assert stats["zip_inflated_bytes"] <= 1.5 * size  # streamed once, not restarted
    assert (m.path / "good.txt").read_bytes() == b"still here\n"
    assert_alive(m, pid)
    print(f"zip bomb: {size >> 20} MiB read, daemon peak RSS {max(peak[0], hwm) / 1024:.1f} MiB "
          f"(limit {limit / 1024:.0f} MiB), inflated {stats['zip_inflated_bytes'] / size:.3f}x")


def test_zip_inflater_under_concurrent_readers(tmp_path: Path) -> None:
    """The deflate checkpoints, parked streams and waits stay correct (and never hang)
    under many threads reading one member in order, backwards and at random."""
    import random

    from zvfs.stores.zip import ZipStore

    data = np.random.default_rng(5).integers(0, 4, size=12 * MiB, dtype="u1").tobytes()
    path = tmp_path / "conc.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("m", data)
    st = ZipStore(path)

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        if seed % 3 == 0:
            offsets = list(range(0, len(data), 256 << 10))
        elif seed % 3 == 1:
            offsets = list(reversed(range(0, len(data), 256 << 10)))
        else:
            offsets = [rng.randrange(len(data)) for _ in range(40)]
        for off in offsets:
            n = rng.randrange(1, 600_000)
            assert st.get_range("m", off, n) == data[off:off + n], (seed, off, n)

    errors = in_threads(reader, 12, timeout=120)  # fails the test if a reader hangs
    assert not errors, errors[:3]
    assert st.get("m") == data
    st.close()


def test_zip_bomb_as_a_chunk(tmp_path: Path, mount) -> None:
    """A chunk whose zip member inflates to 512 MiB (its array needs 128 bytes).

    The decoded view read the whole member into memory before any check; now the
    member is refused from the central directory alone: EIO, one log line, and the
    daemon's memory stays within the cache size + 64 MiB.
    """
    import numcodecs

    src = new_store(tmp_path / "src.zarr")
    data = GOOD[:8, :8].astype("<f8")
    v3_array(src, "v3raw", data, (4, 4), compressors=None)
    v2_array(src, "v2zlib", data, (4, 4), compressors=numcodecs.Zlib(level=1))
    members = {p.relative_to(src).as_posix(): p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()}
    bombs = ["v3raw/c/0/1", "v2zlib/0.1"]
    path = tmp_path / "chunkbomb.zip"
    first = {k: v for k, v in members.items() if k not in bombs}
    write_zip_bomb(path, 512 * MiB, bombs[0], first)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as zf:  # a second bomb, appended
        zf.writestr(bombs[1], zlib.compress(bytes(512 * MiB), 9))
    cache = 64
    m = mount(path, "--cache-size", f"{cache}M")
    pid = daemon_pid(m)
    os.listdir(m.path / ".zvfs/arrays")  # the decoded views imported: what follows is the read's
    base = status_kib(pid, "VmHWM")
    arrays = m.path / ".zvfs/arrays"
    for name in ("v3raw", "v2zlib"):
        assert read_errno(arrays / name / "chunks/0.1") == errno.EIO, name
        assert read_errno(arrays / name / "data.raw") == errno.EIO, name
        assert (arrays / name / "chunks/1.1").read_bytes() == data[4:, 4:].tobytes()
    hwm = status_kib(pid, "VmHWM")
    assert hwm - base <= (cache + 64) * 1024, f"daemon peak RSS {base / 1024:.0f} -> {hwm / 1024:.0f} MiB"
    for key in bombs:
        assert "more than" in assert_one_line(m, key)
    assert (m.path / "good.txt").read_bytes() == b"still here\n"
    assert_good(m, src)
    assert_alive(m, pid)


# --------------------------------------------------------------------------- Zarr Vectors discovery


def test_a_node_zarr_vectors_cannot_parse_leaves_the_other_zv_groups_listed(tmp_path: Path, mount) -> None:
    """Finding the ZV groups walks every Zarr group's zarr.json. A sibling node whose
    ``attributes`` is a JSON list (valid JSON, an array zarr-python opens) raised
    AttributeError there, and one whose zarr.json is not an object raised ZVError: either
    failed the listing of .zvfs/vectors as a whole, with a line naming no key (a helper
    found it). Such a node is no ZV group: the ZV group beside it lists and reads."""
    import shutil

    from test_zv import ref, store_dir

    root = new_store(tmp_path / "store")
    shutil.copytree(store_dir("v09/points"), root / "cells")
    v3_array(root, "listattrs", np.arange(4, dtype="<i2"), (2,))
    _mutate(root / "listattrs/zarr.json", lambda d: d.__setitem__("attributes", [1, 2]))
    (root / "notobject").mkdir()
    (root / "notobject/zarr.json").write_text("[1, 2]")
    m = mount(root)
    pid = daemon_pid(m)
    vectors = m.path / ".zvfs/vectors"
    assert "cells" in os.listdir(vectors)
    got = np.load(vectors / "cells/0/vertices.npy", allow_pickle=False)
    np.testing.assert_array_equal(got, ref("v09/points", "L0_positions.npy"))
    assert (m.path / ".zvfs/arrays/listattrs/data.raw").read_bytes() == np.arange(4, dtype="<i2").tobytes()
    assert not lines_naming(m, "finding ZV groups"), m.log_text()[-3000:]
    assert_good(m, root)
    assert_alive(m, pid)


def test_a_subarray_dtype_or_a_field_of_objects_is_a_metadata_error(tmp_path: Path, mount) -> None:
    """A v2 dtype numpy reads as a subarray ("(3,)<i2": int16 with a trailing dimension of 3)
    made each chunk file say 18 bytes and serve 6 (cp kept 6), and a structured dtype with a
    field of Python objects ([["a", "|O"]]) served the daemon's own pointers as a never
    written chunk's bytes (a helper's audit). Each is its array's metadata error now."""
    root = new_store(tmp_path / "store")
    bad: dict[str, str] = {}
    for name, dtype in (("sub", "(3,)<i2"), ("objfield", [["a", "|O"]])):
        (root / name).mkdir()
        (root / name / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [6], "chunks": [3], "dtype": dtype, "compressor": None,
            "fill_value": None, "order": "C", "filters": None}))
        bad[name] = f"{name}/.zarray"
    m = mount(root)
    pid = daemon_pid(m)
    assert_metadata_errors(m, bad)
    for key in bad.values():
        assert_one_line(m, key)
    assert_good(m, root)
    assert_alive(m, pid)


def test_elements_of_no_bytes_and_more_dimensions_than_numpy_has_are_metadata_errors(tmp_path: Path, mount) -> None:
    """``|S0``, ``|V0``, ``<U0`` (v2), a structured type of no field and a 3-byte UTF-32
    string (v3) declare elements of 0 bytes: data.npy failed every read with
    ZeroDivisionError, twice per read and naming no key. Shapes of 65 and of 1,000
    dimensions (numpy holds 64) failed data.raw with RecursionError or ValueError the same
    way. Each is now its array's metadata error: meta.json says why, one line names the key,
    and nothing else is offered."""
    root = new_store(tmp_path / "store")
    bad: dict[str, str] = {}
    for name, dtype, fill in (("S0", "|S0", ""), ("V0", "|V0", None), ("U0", "<U0", "")):
        (root / name).mkdir()
        (root / name / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [4], "chunks": [2], "dtype": dtype, "compressor": None,
            "fill_value": fill, "order": "C", "filters": None}))
        bad[name] = f"{name}/.zarray"
    for name, dtype, fill in (
            ("nofields", {"name": "structured", "configuration": {"fields": []}}, None),
            ("utf32_3", {"name": "fixed_length_utf32", "configuration": {"length_bytes": 3}}, "")):
        doc = _v3_doc([4], "uint8")
        doc.update(data_type=dtype, fill_value=fill)
        (root / name).mkdir()
        (root / name / "zarr.json").write_text(json.dumps(doc))
        bad[name] = f"{name}/zarr.json"
    for ndim in (65, 1000):
        doc = _v3_doc([1] * ndim, "uint8")
        doc["chunk_grid"]["configuration"]["chunk_shape"] = [1] * ndim
        (root / f"dims{ndim}").mkdir()
        (root / f"dims{ndim}/zarr.json").write_text(json.dumps(doc))
        bad[f"dims{ndim}"] = f"dims{ndim}/zarr.json"
    doc = _v3_doc([1] * 64, "uint8")  # numpy's most: served
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [1] * 64
    doc["fill_value"] = 7
    (root / "dims64").mkdir()
    (root / "dims64/zarr.json").write_text(json.dumps(doc))
    m = mount(root)
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    assert_metadata_errors(m, bad)
    for key in bad.values():
        assert_one_line(m, key)
    assert (arrays / "dims64/data.raw").read_bytes() == b"\x07"
    assert np.load(arrays / "dims64/data.npy").shape == (1,) * 64
    assert_good(m, root)
    assert_alive(m, pid)


# --------------------------------------------------------------------------- special files


class _OpenWatch:
    """inotify IN_OPEN on some paths: whether anything opened them (a device node's open has
    effects of its own, whatever is read after)."""

    IN_OPEN = 0x20

    def __init__(self, paths: list[Path]) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, ctypes.get_errno()
        self.names = {}
        for p in paths:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(p), self.IN_OPEN)
            assert wd >= 0, (p, ctypes.get_errno())
            self.names[wd] = p

    def opened(self) -> list[Path]:
        import struct

        out = []
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return out
        at = 0
        while at < len(data):
            wd, mask, _cookie, n = struct.unpack_from("iIII", data, at)
            at += 16 + n
            if mask & self.IN_OPEN:
                out.append(self.names[wd])
        return out

    def close(self) -> None:
        os.close(self.fd)


def test_sockets_and_device_nodes_in_a_directory_store_are_absent_and_never_opened(tmp_path: Path, mount) -> None:
    """A UNIX socket named zarr.json (its open fails with ENXIO) was a store *error*: discovery
    counted the hierarchy as failed, so every lookup of a name it did not hold under .zvfs/
    (``stat .zvfs/arrays/nothere``) was EIO for as long as the mount lived, and discovery ran
    again every second. And device nodes named as keys were opened before their type was
    looked at: an open of a device has effects of its own (a watchdog arms, a tape rewinds),
    whatever zvfs read after. Both are now absent keys, and a device node is never opened
    (inotify sees no open). A tar of a store unpacked as root can hold any of them."""
    import socket

    root = new_store(tmp_path / "store")
    data = np.arange(16, dtype="<i2").reshape(4, 4)
    v3_array(root, "sock", data, (2, 2))
    os.remove(root / "sock/zarr.json")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock/zarr.json"))
    v3_array(root, "devmeta", data, (2, 2))
    os.remove(root / "devmeta/zarr.json")
    os.mknod(root / "devmeta/zarr.json", 0o644 | 0o020000, os.makedev(1, 3))  # /dev/null's
    v3_array(root, "devchunk", data, (2, 2))
    os.remove(root / "devchunk/c/0/1")
    os.mknod(root / "devchunk/c/0/1", 0o644 | 0o020000, os.makedev(1, 5))  # /dev/zero's
    os.mknod(root / "devzero", 0o644 | 0o020000, os.makedev(1, 5))
    devices = [root / "devmeta/zarr.json", root / "devchunk/c/0/1", root / "devzero"]
    watch = _OpenWatch(devices)
    try:
        m = mount(root)
        pid = daemon_pid(m)
        arrays = m.path / ".zvfs/arrays"
        assert "devchunk" in os.listdir(arrays)
        time.sleep(1.5)  # past the second after which a failed discovery is tried again
        for name in ("nothere", "sock", "devmeta"):
            assert stat_errno(arrays / name) == errno.ENOENT, name
            assert stat_errno(m.path / ".zvfs/v2" / name) == errno.ENOENT, name
        want = data.copy()
        want[0:2, 2:4] = 0  # the device is no chunk: fill
        assert (arrays / "devchunk/data.raw").read_bytes() == want.tobytes()
        for rel in ("devzero", "devchunk/c/0/1", "devmeta/zarr.json", "sock/zarr.json"):
            assert stat_errno(m.path / rel) == errno.ENOENT, rel
            assert read_errno(m.path / rel) == errno.ENOENT, rel
        assert run(["find", m.path], timeout=60).returncode == 0
        assert watch.opened() == []
        assert not lines_naming(m, "sock/zarr.json"), m.log_text()[-3000:]
        assert_good(m, root)
        assert_alive(m, pid)
        # a writable mount: a create of a device's name (absent in the mount, so the
        # kernel asks for a create) is refused without opening it, as is a rewrite
        w = mount(root, "--writable")
        for rel in ("devzero", "devchunk/c/0/1"):
            with pytest.raises(OSError) as err:
                os.close(os.open(w.path / rel, os.O_WRONLY | os.O_CREAT, 0o644))
            assert err.value.errno == errno.EPERM, (rel, err.value)
        assert watch.opened() == []
        assert os.path.exists(root / "devzero") and not (root / "devzero").is_file()
    finally:
        watch.close()
        sock.close()


# --------------------------------------------------------------------------- consolidated metadata


def test_consolidated_metadata_naming_unsafe_paths_leaves_those_nodes_out(tmp_path: Path, mount) -> None:
    """Consolidated metadata names its nodes by path, and a hostile one may name "/abs",
    "a//b", "./c", "../up" or "x<NUL>y". The store refuses such keys (no path escapes), and
    it did so as "no such key", so "/abs" and "a//b" showed as arrays under .zvfs/arrays
    (as abs and a/b) whose every chunk read as fill, silently, whatever the store holds at
    abs/0, for a key no store can have. Such a node is now left out of every view, with one
    line naming it, as the walk of the store would leave it out; the others read."""
    import zarr

    root = tmp_path / "store"
    st = zarr.storage.LocalStore(str(root))
    g = zarr.open_group(st, mode="w", zarr_format=2)
    g.create_array("good", shape=GOOD.shape, chunks=(8, 8), dtype=GOOD.dtype)[:] = GOOD
    g.create_array("abs", shape=(4,), chunks=(2,), dtype="<i2")[:] = [1, 2, 3, 4]
    zarr.consolidate_metadata(st)
    zm = json.loads((root / ".zmetadata").read_text())
    doc = zm["metadata"]["abs/.zarray"]
    unsafe = ["/abs", "a//b", "./c", "../up", "d/./e", "x\x00y", "f/"]
    for path in unsafe:
        zm["metadata"][path + "/.zarray"] = doc
    (root / ".zmetadata").write_text(json.dumps(zm))
    m = mount(root)
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    assert sorted(os.listdir(arrays)) == ["abs", "good"]
    assert json.loads((arrays / "abs/meta.json").read_text())["path"] == "abs"
    assert (arrays / "abs/data.raw").read_bytes() == np.array([1, 2, 3, 4], "<i2").tobytes()
    assert sorted(os.listdir(m.path / ".zvfs/v2")) == [".zattrs", ".zgroup", ".zmetadata", "abs", "good"]
    assert sorted(json.loads((m.path / ".zvfs/v2/.zmetadata").read_bytes())["metadata"]) == [
        ".zattrs", ".zgroup", "abs/.zarray", "abs/.zattrs", "good/.zarray", "good/.zattrs"]
    for path in unsafe:
        assert "not a safe path" in assert_one_line(m, repr(path + "/.zarray")), path
    assert (arrays / "good/data.raw").read_bytes() == zarr_read(root, "good").tobytes()

    # the same in a v3 root group's consolidated_metadata
    v3root = new_store(tmp_path / "v3")
    top = json.loads((v3root / "zarr.json").read_text())
    node = json.loads((v3root / "good/zarr.json").read_text())
    top["consolidated_metadata"] = {"kind": "inline", "must_understand": False,
                                    "metadata": {"good": node, **{p: node for p in unsafe}}}
    (v3root / "zarr.json").write_text(json.dumps(top))
    m3 = mount(v3root)
    assert sorted(os.listdir(m3.path / ".zvfs/arrays")) == ["good"]
    for path in unsafe:
        assert "not a safe path" in assert_one_line(m3, repr(path)), path
    assert_good(m3, v3root)
    assert_alive(m, pid)


def test_a_metadata_document_of_millions_of_tiny_values_is_refused_before_parsing(tmp_path: Path, mount) -> None:
    """A zarr.json within MAX_JSON_BYTES whose attributes hold millions of ``{}`` (3 bytes
    each, 64 once parsed, and walked again for its depth): a 200 KiB zip of a 200 MiB one
    took the daemon to 14 GiB and stalled discovery for minutes (a helper measured it). A
    document of more than MAX_JSON_VALUES values is now refused before a value is made:
    that node shows its error, the rest reads, and the daemon grows by little."""
    from zvfs.formats._common import MAX_JSON_BYTES, MAX_JSON_VALUES

    root = new_store(tmp_path / "store")
    n = MAX_JSON_VALUES + 1000
    doc = json.loads((root / "good/zarr.json").read_text())
    doc["attributes"] = {"a": "BOMB"}
    text = json.dumps(doc).encode().replace(b'"BOMB"', b"[" + b"{}," * n + b"{}]")
    assert len(text) < MAX_JSON_BYTES
    path = tmp_path / "values.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(root).as_posix())
        zf.writestr("bomb/zarr.json", text)
        zf.writestr("bomb/c/0/0", (root / "good/c/0/0").read_bytes())
    assert path.stat().st_size < 1 * MiB
    m = mount(path)
    pid = daemon_pid(m)
    base = status_kib(pid, "VmHWM")
    arrays = m.path / ".zvfs/arrays"
    t0 = time.monotonic()
    assert {"good", "bomb"} <= set(os.listdir(arrays))
    assert time.monotonic() - t0 < 20
    meta = json.loads((arrays / "bomb/meta.json").read_text())
    assert "values" in meta["error"] and "bomb/zarr.json" in meta["error"], meta["error"]
    assert read_errno(arrays / "bomb/data.raw") == errno.ENOENT
    assert_good(m, root)
    assert status_kib(pid, "VmHWM") - base < 128 * 1024
    assert_one_line(m, "bomb/zarr.json")
    assert_alive(m, pid)


# --------------------------------------------------------------------------- shard indexes


def _sharded_doc(shape: int, shard: int, inner: int) -> dict:
    doc = _v3_doc([shape], "uint8")
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [shard]
    doc["fill_value"] = 7
    doc["codecs"] = [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [inner], "codecs": [{"name": "bytes"}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end"}}]
    return doc


def test_a_shard_index_is_bounded_and_read_once_by_concurrent_readers(tmp_path: Path, mount) -> None:
    """A shard's index is 16 bytes an inner chunk, read and decoded whole, and metadata alone
    sets its size: a shard of 2**26 one-byte chunks has an index of 1 GiB, which a 116 KiB
    store of sparse files provides. Each thread decoding one of its chunks fetched, checked
    and decoded its own copy at once; the daemon went to 24 GiB and the kernel killed it
    (a helper measured it, on a machine of 24). A shard of more than MAX_INDEX_ENTRIES inner
    chunks is now the array's metadata error; an index within it is loaded once however many
    readers want it, and the indexes kept are bounded in bytes too."""
    from numcodecs import CRC32C

    from zvfs.codecs.sharding import MAX_INDEX_ENTRIES

    root = new_store(tmp_path / "store")
    (root / "huge").mkdir()  # metadata only: never read
    (root / "huge/zarr.json").write_text(json.dumps(_sharded_doc(4 << 26, 1 << 26, 1)))
    n = MAX_INDEX_ENTRIES
    (root / "wide/c").mkdir(parents=True)
    (root / "wide/zarr.json").write_text(json.dumps(_sharded_doc(2 * n, n, 1)))
    empty = b"\xff" * (16 * n)  # every inner chunk unwritten: fill
    (root / "wide/c/0").write_bytes(bytes(CRC32C().encode(np.frombuffer(empty, "u1"))))
    del empty
    m = mount(root, "--cache-size", "64M")
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    meta = json.loads((arrays / "huge/meta.json").read_text())
    assert "inner chunks a shard" in meta["error"] and "huge/zarr.json" in meta["error"], meta["error"]
    assert sorted(os.listdir(arrays / "huge")) == ["meta.json"]
    assert_one_line(m, "huge/zarr.json")
    os.listdir(arrays / "wide")
    base = status_kib(pid, "VmHWM")

    def reader(i: int) -> None:
        fd = os.open(arrays / "wide/data.raw", os.O_RDONLY)
        try:
            assert os.pread(fd, 256, i * 65536) == b"\x07" * 256
        finally:
            os.close(fd)

    errors = in_threads(reader, 8, timeout=120)
    assert not errors, errors[:3]
    grew = status_kib(pid, "VmHWM") - base  # about 36 MiB, 105 when each thread loaded it
    assert grew < 72 * 1024, f"the daemon grew by {grew / 1024:.0f} MiB reading one 16 MiB index"
    assert (arrays / "wide/chunks/5").read_bytes() == b"\x07"
    assert_good(m, root)
    assert_alive(m, pid)


@pytest.mark.parametrize("offset", [2**63, 2**64 - 2])
def test_a_shard_index_pointing_past_any_file_offset_fails_that_chunk(tmp_path: Path, mount, offset: int) -> None:
    """An index at the shard's start leaves the shard's size unknown when an inner chunk is
    located, so an offset of 2**63 or more went to the read as it was: the chunk failed with
    "Python int too large to convert to C long", a message that names no cause. Now it is the
    shard's error, which says where the index points; the chunks beside it read."""
    from numcodecs import CRC32C

    root = new_store(tmp_path / "store")
    (root / "far/c").mkdir(parents=True)
    doc = _sharded_doc(8, 4, 2)
    doc["codecs"][0]["configuration"]["index_location"] = "start"
    (root / "far/zarr.json").write_text(json.dumps(doc))
    index = np.array([[offset, 2], [2**64 - 1, 2**64 - 1]], dtype="<u8")  # chunk 0 far; chunk 1 unwritten
    (root / "far/c/0").write_bytes(bytes(CRC32C().encode(index.view("u1"))))
    m = mount(root)
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    with pytest.raises(OSError) as err:
        (arrays / "far/chunks/0").read_bytes()
    assert err.value.errno == errno.EIO
    line = assert_one_line(m, "far/c/0")
    assert "past" in line and "too large" not in line, line
    assert (arrays / "far/chunks/1").read_bytes() == b"\x07\x07"  # unwritten: fill
    assert (arrays / "far/chunks/2").read_bytes() == b"\x07\x07"  # another shard, never written
    assert_good(m, root)
    assert_alive(m, pid)


# --------------------------------------------------------------------------- chunks decoded at once


def test_chunks_of_a_quarter_gib_decode_one_at_a_time_not_one_per_thread(tmp_path: Path, mount) -> None:
    """A chunk may decode to up to 4 GiB (MAX_CHUNK_NBYTES) from a few MiB of gzip, and the
    cache bounds only what is kept: each of the 16 worker threads decoded one at once. Two
    readers of two 1 GiB chunks took a daemon with a 64 MiB cache to 3.1 GiB (a helper
    measured it); eight such readers would have ended it. The bytes of chunks being decoded
    at once are now bounded (half the cache, at least 256 MiB; a bigger chunk goes alone):
    four readers of four 256 MiB chunks cost about one chunk's decode, and read right."""
    import gzip

    import zarr
    from zarr.codecs import GzipCodec

    root = new_store(tmp_path / "store")
    n = 256 * MiB
    a = zarr.create_array(zarr.storage.LocalStore(str(root)), name="big", shape=(4 * n,), chunks=(n,),
                          dtype="u1", zarr_format=3, compressors=GzipCodec(level=1), fill_value=0)
    del a
    (root / "big/c").mkdir()
    block = np.zeros(n, "u1")
    for k in range(4):
        block[:16] = k + 1  # each chunk its own first bytes
        (root / f"big/c/{k}").write_bytes(gzip.compress(block.tobytes(), 1))
    del block
    assert sum((root / f"big/c/{k}").stat().st_size for k in range(4)) < 8 * MiB
    m = mount(root, "--cache-size", "64M")
    pid = daemon_pid(m)
    os.listdir(m.path / ".zvfs/arrays/big")
    base = status_kib(pid, "VmHWM")

    def reader(k: int) -> None:
        fd = os.open(m.path / ".zvfs/arrays/big/data.raw", os.O_RDONLY)
        try:
            assert os.pread(fd, 32, k * n) == bytes([k + 1]) * 16 + bytes(16)
        finally:
            os.close(fd)

    errors = in_threads(reader, 4, timeout=120)
    assert not errors, errors[:3]
    grew = status_kib(pid, "VmHWM") - base  # 512 MiB; 1266 when each thread decoded one
    assert grew < 800 * 1024, f"the daemon grew by {grew / 1024:.0f} MiB decoding four 256 MiB chunks"
    assert_good(m, root)
    assert_alive(m, pid)


def test_chunk_file_listings_number_a_bounded_number_of_files_in_all(tmp_path: Path, mount) -> None:
    """Each chunks/ listing numbers its grid's files, and each keeps its number (about 180
    bytes) while its array lasts: metadata of a few kilobytes declaring large grids of
    unwritten chunks grew the daemon 185 MB an ``ls -f`` of a 10^6-cell grid, with no bound
    and no word (a helper's audit: 1.16 GB after six). The listings of a mount number at
    most --cache-size's worth (100,000 files at least, whatever the cache size): a grid
    past that lists nothing, with one line saying why, and its files open by name."""
    import zarr

    root = new_store(tmp_path / "store")
    for name in ("a1", "a2", "a3"):
        zarr.create_array(zarr.storage.LocalStore(str(root)), name=name, shape=(40_000,), chunks=(1,),
                          dtype="u1", fill_value=3)  # metadata alone: every chunk unwritten
    m = mount(root, "--cache-size", "0", "--metadata-ttl", "1")  # the floor: 100,000 files
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    assert len(os.listdir(arrays / "a1/chunks")) == 40_000
    assert len(os.listdir(arrays / "a2/chunks")) == 40_000
    assert os.listdir(arrays / "a3/chunks") == []  # 120,000 in all: past the bound
    line = assert_one_line(m, "a3")
    assert "not listed" in line and "--cache-size" in line, line
    assert (arrays / "a3/chunks/39999").read_bytes() == b"\x03"  # by its name
    assert len(os.listdir(arrays / "a1/chunks")) == 40_000  # numbered already: listed again
    # a grid grown since it was counted counts anew (counted at its old size, an array
    # listed at 1 cell and grown to 600,000 listed them all: a review)
    zarr.open_array(zarr.storage.LocalStore(str(root)), path="a2", mode="r+").resize((70_000,))
    time.sleep(1.5)  # past the metadata TTL
    assert os.listdir(arrays / "a2/chunks") == []  # 40,000 + 70,000: past the bound
    assert "its 70,000 chunk files are not listed" in m.log_text()
    assert_good(m, root)
    assert_alive(m, pid)


def test_the_metadata_of_a_whole_discovery_holds_a_bounded_number_of_values(tmp_path: Path, mount) -> None:
    """MAX_JSON_VALUES bounds one document; a store of many documents just under it was
    bound by nothing: 20 zarr.json of 8 million numbers each (a 335 KiB zip) kept 2.8 GiB
    in the daemon after a 225 s listing (a helper measured it). The values of all the
    documents one discovery reads are now bounded together (MAX_DISCOVERY_VALUES): a
    document past the rest is its node's error, one line names it, the others read.
    (Counted from the separators, so an attribute of millions of ":" stands for the
    millions of values it costs to count: cheap to build here.)"""
    from zvfs.formats._common import MAX_DISCOVERY_VALUES, MAX_JSON_VALUES

    root = new_store(tmp_path / "store")
    each = MAX_JSON_VALUES - 1000
    count = MAX_DISCOVERY_VALUES // each + 1
    for k in range(count):
        v3_array(root, f"a{k}", np.arange(4, dtype="<i2"), (2,), attributes={"note": ":" * each})
    m = mount(root)
    pid = daemon_pid(m)
    arrays = m.path / ".zvfs/arrays"
    refused = []
    for k in range(count):
        meta = json.loads((arrays / f"a{k}/meta.json").read_text())
        if meta["error"]:
            assert "a discovery reads" in meta["error"] and f"a{k}/zarr.json" in meta["error"], meta["error"]
            refused.append(k)
        else:
            assert (arrays / f"a{k}/data.raw").read_bytes() == np.arange(4, dtype="<i2").tobytes()
    assert len(refused) == 1, refused
    assert_one_line(m, f"a{refused[0]}/zarr.json")
    assert_good(m, root)
    assert_alive(m, pid)


# --------------------------------------------------------------------------- the fuzz


#: cases of tests/hostile_fuzz.py the suite draws (derandomized: the same every run);
#: scripts/fuzz-hostile draws as many as asked, from any seed
FUZZ_CASES = 25


def test_hostile_metadata_and_chunks_drawn_by_hypothesis(tmp_path: Path, mount) -> None:
    """Arrays zarr-python wrote, then their metadata documents (array's, attributes', group's)
    and chunk bytes mutated as hypothesis draws (tests/hostile_fuzz.py), each in a group of its
    own in one store mounted once. Every file of every case's views reads zarr-python's bytes
    or fails alone with EIO or ENOENT (no hang); an array zarr-python refuses serves no data;
    a refused document is named in the log; the daemon stays up within its memory."""
    import hostile_fuzz as hf
    from hypothesis import HealthCheck, Phase, given, settings

    drawn: list[dict] = []

    @settings(max_examples=FUZZ_CASES, derandomize=True, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(hf.cases())
    def collect(case: dict) -> None:
        drawn.append(json.loads(json.dumps(case)))

    collect()
    root = new_store(tmp_path / "fuzz.zarr")
    changed = [hf.build(root, f"c{i}", case) for i, case in enumerate(drawn)]
    cache = 64
    m = mount(root, "--cache-size", f"{cache}M")
    pid = daemon_pid(m)
    found = []
    for i, ch in enumerate(changed):
        found += [f"c{i} {json.dumps(drawn[i])}: {p}" for p in hf.check(m.path, root, ch["array"], ch, m.log_text)]
    assert not found, "\n".join(found)
    assert status_kib(pid, "VmHWM") <= (cache + 96) * 1024
    assert_good(m, root)
    assert_alive(m, pid)


@pytest.mark.parametrize("fmt", [3, 2])
def test_consolidated_metadata_of_a_kind_zvfs_does_not_know_is_not_trusted(tmp_path: Path, mount, fmt: int) -> None:
    """A root zarr.json whose consolidated_metadata says a "kind" other than "inline" (the
    only one the spec and zarr-python define), or a .zmetadata whose
    zarr_consolidated_format is not 1, was taken as the whole hierarchy: its metadata,
    empty or stale, hid every array of the store (the mount showed none, with no word).
    zarr-python refuses such a group (3: "kind='x' is not supported"; 2.18: "unsupported
    zarr consolidated metadata format"); its members, opened one by one, read. zvfs now
    walks the store instead, as for consolidated metadata it cannot use."""
    import zarr

    root = tmp_path / "kind.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    g.create_array("a", shape=(4,), chunks=(2,), dtype="<i4", fill_value=0)[:] = [1, 2, 3, 4]
    if fmt == 3:
        doc = json.loads((root / "zarr.json").read_text())
        doc["consolidated_metadata"] = {"kind": "x", "must_understand": False, "metadata": {}}
        (root / "zarr.json").write_text(json.dumps(doc))
        with pytest.raises(ValueError, match="kind"):
            zarr.open_group(str(root), mode="r")
        said = "consolidated_metadata of kind"
    else:
        (root / ".zmetadata").write_text(json.dumps({
            "zarr_consolidated_format": 2, "metadata": {".zgroup": {"zarr_format": 2}}}))
        said = "zarr_consolidated_format"
    m = mount(root)
    got = (m.path / ".zvfs/arrays/a/data.raw").read_bytes()
    assert got == zarr.open_array(str(root / "a"), mode="r")[...].astype("<i4").tobytes()
    assert_one_line(m, said)

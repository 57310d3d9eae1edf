"""``.zvfs/netcdf/``: every group as a classic netCDF file, read by independent readers.

The fixtures of every format (tests/fixtures/zarr: zarr-python 3 and 2.18,
ncgen's NCZarr, v1 by hand and by zarr 2.18's meta_v1; tests/fixtures/cf: ncgen, nccopy and xarray)
are mounted from a directory, a zip and S3 (moto). Each variable is read with
netCDF4-python, scipy.io.netcdf_file, ncdump, xarray (scipy and netcdf4
engines) and GDAL, and compared with the library that wrote the data:
zarr-python's reference arrays and attributes, ncgen's own cf.nc, and
xarray.open_zarr of the source.
"""

from __future__ import annotations

import base64
import errno
import io
import json
import math
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import nc_sweep
import netCDF4
import numpy as np
import pytest
import scipy.io
import xarray as xr
import zarr
from conftest import Mounted, run, s3_client, tool, upload_tree, wait_until, zip_with_cmd
from test_hostile import assert_one_line, lines_naming
from test_mount_decoded import ncdump_values, parse_ncdump

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFEST = json.loads((FIXTURES / "zarr" / "manifest.json").read_text())
STORES = ["zarr3_v3.zarr", "zarr3_v2.zarr", "zarr2_v2.zarr", "v1.zarr", "v1spec.zarr", "nczarr.file",
          "zarr3_consolidated.zarr"]
#: Zarr v1 stores: zarr-python 3 reads no v1, so their attributes have no reference reader here
V1_STORES = {"v1.zarr", "v1spec.zarr"}
CF_STORES = ["xarray_v2.zarr", "xarray_v3.zarr", "nczarr.file"]
BACKENDS = ["dir", "zip", "s3"]
BUCKET = "zvfs-netcdf"
LEFT_OUT = "zvfs_left_out"


@dataclass(frozen=True)
class Var:
    store: str
    path: str  # array path in the store
    info: dict

    @property
    def group(self) -> str:
        return self.path.rpartition("/")[0]

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2] or "data"

    def nc_file(self, top: Path) -> Path:
        group = f"{self.store}/{self.group}" if self.group else self.store
        return top / f"{group}.nc"

    def ref(self) -> np.ndarray:
        return np.load(FIXTURES / "zarr" / self.info["ref"])


def nccopy_mirror(m, tmp_path: Path) -> Path:
    """nccopy of the whole v2 mirror into one netCDF-4 file (netCDF-C opens the mirror, or fails)."""
    out = tmp_path / "copy.nc"
    res = run([tool("nccopy"), f"file://{m.path}/.zvfs/v2#mode=zarr,file", str(out)])
    assert res.returncode == 0, res.stderr
    return out


def _vars() -> list[Var]:
    out = []
    for store in STORES:
        for path, info in sorted(MANIFEST["stores"][store]["arrays"].items()):
            out.append(Var(store, path, info))
    return out


VARS = _vars()
#: what the netCDF view cannot hold (complex, variable-length, structured)
LEFT_OUT_KINDS = set("cOV")


#: variable-length kinds served as char through _Encoding (zarr-python's values kept as JSON)
TEXT_VLEN = {"vlen-utf8"}


def is_text_vlen(v: Var) -> bool:
    return v.info.get("vlen") in TEXT_VLEN and "ref_json" in v.info


def vlen_ref(v: Var) -> list[str]:
    """zarr-python's values of a variable-length text array, flattened."""
    return json.loads((FIXTURES / "zarr" / v.info["ref_json"]).read_text())["values"]


def vlen_served(chars: np.ndarray) -> list[str]:
    """A text array's values from its char variable read as chars (no _Encoding decoding):
    each row's bytes without the NUL padding, UTF-8 decoded."""
    rows = np.ascontiguousarray(chars).reshape(-1, chars.shape[-1])
    return [bytes(r).rstrip(b"\0").decode("utf-8") for r in rows]


def is_left_out(v: Var) -> bool:
    if is_text_vlen(v):
        return False
    dt = v.info.get("dtype")
    return "ref" not in v.info or dt is None or np.dtype(dt).kind in LEFT_OUT_KINDS


# --------------------------------------------------------------------------- mounts


@pytest.fixture(scope="session")
def nc_corpus(tmp_path_factory) -> Path:
    """Every fixture store below one directory: zarr fixtures at the top, the CF ones below cf/."""
    root = tmp_path_factory.mktemp("netcdf") / "corpus"
    root.mkdir()
    for store in STORES:
        shutil.copytree(FIXTURES / "zarr" / store, root / store)
    for store in CF_STORES:
        shutil.copytree(FIXTURES / "cf" / store, root / "cf" / store)
    return root


@dataclass
class NcMount:
    backend: str
    mnt: Mounted

    @property
    def top(self) -> Path:
        return self.mnt.path / ".zvfs" / "netcdf"


@pytest.fixture(scope="session", params=BACKENDS)
def ncm(request, nc_corpus, session_mount) -> NcMount:
    """The corpus mounted once per backend and session."""
    if request.param == "dir":
        return NcMount("dir", session_mount(nc_corpus))
    if request.param == "zip":
        dest = nc_corpus.parent / "corpus.zip"
        if not dest.exists():
            zip_with_cmd(nc_corpus, dest)
        return NcMount("zip", session_mount(dest))
    moto = request.getfixturevalue("moto")
    env = request.getfixturevalue("s3_env")
    client = s3_client(moto.endpoint)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
        upload_tree(client, nc_corpus, BUCKET, "corpus")
    m = session_mount(f"s3://{BUCKET}/corpus", "--endpoint-url", moto.endpoint, env=env)
    return NcMount("s3", m)


# --------------------------------------------------------------------------- expectations


@dataclass
class Source:
    """An array's attributes and fill value as the writer's reader sees them."""

    attrs: dict
    fill_value: object
    dtype: np.dtype
    zarr_format: int
    dimension_names: object
    ndim: int


def zarr_node(store: Path, path: str) -> Source:
    """zarr-python's view of the array; its own metadata documents where zarr-python refuses it
    (NCZarr's '<u1' byte dtype), since those are then the writer's (netCDF-C's) bytes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            a = zarr.open_array(store=str(store), path=path, mode="r")
            return Source(dict(a.attrs), a.fill_value, a.dtype, a.metadata.zarr_format,
                          getattr(a.metadata, "dimension_names", None), a.ndim)
        except ValueError:
            zarray = json.loads((store / path / ".zarray").read_text())
            attrs = json.loads((store / path / ".zattrs").read_text()) if (store / path / ".zattrs").exists() else {}
            fill = zarray["fill_value"]
            return Source(attrs, np.nan if fill == "NaN" else fill, np.dtype(zarray["dtype"]), 2, None,
                          len(zarray["shape"]))


def served(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """netCDF values read without masking, turned back into the reference's dtype by the documented mapping."""
    got = np.asarray(got)
    kind = ref.dtype.kind
    if kind == "S":  # char with a strlen dimension
        return np.ascontiguousarray(got).view(f"S{ref.dtype.itemsize}").reshape(ref.shape)
    if kind == "U" and got.dtype.kind == "S":  # UTF-8 in char, read by a reader blind to _Encoding
        assert got.shape == (*ref.shape, ref.dtype.itemsize), got.shape  # 4 bytes a code point
        utf8 = np.ascontiguousarray(got).view(f"S{got.shape[-1]}").reshape(ref.shape)
        return np.char.decode(utf8, "utf-8").astype(ref.dtype.newbyteorder("="))
    if kind == "u" and got.dtype.kind == "i":  # _Unsigned: the same bits
        return got.view(got.dtype.str.replace("i", "u"))
    if kind in "mM":
        return got.astype("i8").view(ref.dtype.newbyteorder("="))
    if kind == "b":
        return got.astype(bool)
    return got.astype(ref.dtype.newbyteorder("="))


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "mM":  # NaT == NaT, bit for bit
        a, b = a.view("i8"), np.asarray(b).astype(a.dtype).view("i8")
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def expected_fill(v: Var, node) -> object | None:
    """The documented _FillValue rule, with every value taken from zarr-python."""
    attrs = node.attrs
    if "_FillValue" in attrs:
        raw = attrs["_FillValue"]
        if isinstance(raw, str) and node.zarr_format == 3:
            data = base64.b64decode(raw)
            kind = "i" if node.dtype.kind == "b" else node.dtype.kind
            return np.frombuffer(data, f"<{kind}{len(data)}")[0]
        if raw == "NaN":
            return np.nan
        return raw
    if node.zarr_format == 3 and (node.dimension_names or node.ndim == 0):
        return None  # xarray never masks with a v3 fill_value, and opens every 0-d array
    if v.store.startswith("nczarr"):
        return None  # NCZarr's fill_value alone is the type's default fill: netCDF-C shows no attribute
    if node.dtype.kind == "b":
        return None
    return node.fill_value


def nc_format(ds: netCDF4.Dataset) -> str:
    return ds.data_model


# --------------------------------------------------------------------------- netCDF4-python


@pytest.mark.parametrize("store", STORES)
def test_netcdf4_every_variable(ncm: NcMount, nc_corpus: Path, store: str) -> None:
    """Every variable equals zarr-python's reference; attributes and _FillValue as zarr-python reads them."""
    checked = 0
    for v in [v for v in VARS if v.store == store]:
        f = v.nc_file(ncm.top)
        with netCDF4.Dataset(f) as ds:
            ds.set_auto_maskandscale(False)
            if is_left_out(v):
                assert v.name not in ds.variables
                if "ref" in v.info or v.info.get("dtype") is None:
                    assert re.search(rf"^{re.escape(v.name)}: ", ds.getncattr(LEFT_OUT), re.M), v.path
                continue
            var = ds.variables[v.name]
            if is_text_vlen(v):
                assert var.getncattr("_Encoding") == "utf-8"
                assert np.asarray(var[...]).reshape(-1).tolist() == vlen_ref(v), v.path
                var.set_auto_chartostring(False)
                assert vlen_served(var[...]) == vlen_ref(v), v.path
                checked += 1
                continue
            ref = v.ref()
            assert same_values(served(ref, var[...]), ref.astype(ref.dtype.newbyteorder("="))), v.path
            kind = ref.dtype.kind
            if kind in "iu" and ref.dtype.itemsize == 8 or kind in "mM":
                assert nc_format(ds) == "NETCDF3_64BIT_DATA", (v.path, "int64 needs CDF-5")
            if kind == "u" and ref.dtype.itemsize < 8 and nc_format(ds) != "NETCDF3_64BIT_DATA":
                assert var.getncattr("_Unsigned") == "true"
            if store not in V1_STORES:
                node = zarr_node(nc_corpus / store, v.path)
                for name, value in node.attrs.items():
                    if name.lower().startswith("_nczarr") or name in ("_ARRAY_DIMENSIONS", "_FillValue"):
                        continue
                    got = var.getncattr(name)
                    if isinstance(value, str):
                        assert got == value or (value in ("NaN", "Infinity") and kind == "f"), (v.path, name)
                    elif isinstance(value, dict | list) and not all(isinstance(x, int | float) for x in value):
                        assert json.loads(got) == value, (v.path, name)
                    else:
                        assert np.allclose(got, value), (v.path, name, got, value)
                fill = expected_fill(v, node)
                if fill is None or kind in "SU":
                    assert "_FillValue" not in var.ncattrs(), v.path
                else:
                    got = served(ref, np.array([var.getncattr("_FillValue")]))[0]
                    want = np.array(fill).astype(ref.dtype.newbyteorder("="))
                    assert same_values(np.array([got]), np.array([want])), (v.path, got, fill)
            checked += 1
    assert checked > 0


def test_formats_chosen_oldest(ncm: NcMount) -> None:
    """CDF-1 unless a type needs CDF-5: every file's magic matches its variables' types."""
    seen = set()
    for f in sorted(ncm.top.rglob("*.nc")):
        with open(f, "rb") as fh:
            magic = fh.read(4)
        with netCDF4.Dataset(f) as ds:
            wide = [n for n, v in ds.variables.items() if v.dtype.kind in "iu" and v.dtype.itemsize == 8
                    or v.dtype.kind == "u"]
        assert magic == (b"CDF\x05" if wide else b"CDF\x01"), (f, wide)
        seen.add(magic)
    assert seen == {b"CDF\x01", b"CDF\x05"}


# --------------------------------------------------------------------------- scipy, ncdump


def test_scipy_reads_classic_files(ncm: NcMount) -> None:
    """scipy.io.netcdf_file (CDF-1/2 only) reads every non-CDF-5 file; values equal the references."""
    refs = {(str(v.nc_file(ncm.top)), v.name): v for v in VARS if not is_left_out(v)}
    checked = 0
    for f in sorted(ncm.top.rglob("*.nc")):
        with open(f, "rb") as fh:
            if fh.read(4) == b"CDF\x05":
                continue
        with scipy.io.netcdf_file(f, mmap=False, maskandscale=False) as nc:
            for name, var in nc.variables.items():
                v = refs.get((str(f), name))
                if v is None:
                    continue
                if is_text_vlen(v):
                    assert vlen_served(var[...].copy()) == vlen_ref(v), v.path
                    checked += 1
                    continue
                ref = v.ref()
                assert same_values(served(ref, var[...].copy()), ref.astype(ref.dtype.newbyteorder("="))), v.path
                checked += 1
    assert checked > 40


def test_ncdump_values(ncm: NcMount, nc_corpus: Path) -> None:
    """``ncdump -h`` opens every file; ``ncdump -v`` prints each numeric variable's reference values."""
    ncdump = tool("ncdump")
    for f in sorted(ncm.top.rglob("*.nc")):
        res = run([ncdump, "-h", str(f)])
        assert res.returncode == 0, (f, res.stderr)
    checked = 0
    for v in VARS:
        if is_left_out(v) or is_text_vlen(v) or np.dtype(v.info["dtype"]).kind not in "iuf" or v.store in V1_STORES:
            continue
        res = run([ncdump, "-p", "9,17", "-v", v.name, str(v.nc_file(ncm.top))])
        assert res.returncode == 0, res.stderr
        tokens = parse_ncdump(res.stdout)[v.name]
        ref = v.ref().astype(v.ref().dtype.newbyteorder("="))
        fill = expected_fill(v, zarr_node(nc_corpus / v.store, v.path))
        fill = None if fill is None else ref.dtype.type(fill)
        if ref.dtype == np.float16:
            ref = ref.astype("f4")
        if ref.dtype.kind == "u" and ref.dtype.itemsize < 8 and b"CDF\x05" != v.nc_file(ncm.top).open("rb").read(4):
            # ncdump prints _Unsigned data as the signed type it is stored in
            ref = ref.view(ref.dtype.str.replace("u", "i"))
            fill = None if fill is None else np.array(fill).view(ref.dtype)[()]
        ncdump_values(tokens, ref, fill)
        checked += 1
    assert checked > 40


# --------------------------------------------------------------------------- CF data: ncdump, xarray, GDAL


def _cf_file(ncm: NcMount, store: str) -> Path:
    return ncm.top / "cf" / f"{store}.nc"


def _data_section(text: str) -> dict[str, list[str]]:
    return parse_ncdump(text)


@pytest.mark.parametrize("store", CF_STORES)
def test_cf_ncdump_matches_ncgen(ncm: NcMount, store: str) -> None:
    """ncdump of the served file prints the values and _FillValue of ncdump of ncgen's cf.nc."""
    ncdump = tool("ncdump")
    want = run([ncdump, str(FIXTURES / "cf" / "cf.nc")], check=True).stdout
    got = run([ncdump, str(_cf_file(ncm, store))], check=True).stdout
    assert _data_section(got) == _data_section(want)
    fills = re.compile(r"^\s*(\w+):_FillValue = (.*) ;$", re.M)
    want_fills = dict(fills.findall(want))
    got_fills = dict(fills.findall(got))
    for name, value in want_fills.items():
        assert got_fills[name] == value, (name, got_fills.get(name), value)


@pytest.mark.parametrize("engine", ["netcdf4", "scipy"])
@pytest.mark.parametrize("store", CF_STORES)
def test_cf_xarray(ncm: NcMount, nc_corpus: Path, store: str, engine: str) -> None:
    """xarray with CF decoding (masking, scale_factor, time units) sees what it sees in the source."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = xr.open_zarr(nc_corpus / "cf" / store).load()
        served_ds = xr.open_dataset(_cf_file(ncm, store), engine=engine).load()
        original = xr.open_dataset(FIXTURES / "cf" / "cf.nc", engine=engine).load()
    for name in original.variables:
        xr.testing.assert_identical(served_ds[name].variable, original[name].variable)
        assert np.array_equal(served_ds[name].values, source[name].values, equal_nan=served_ds[name].dtype.kind == "f")
    assert served_ds["time"].values[0] == np.datetime64("2000-01-01")
    assert int(np.isnan(served_ds["temp"].values).sum()) == int(np.isnan(original["temp"].values).sum()) == 24
    assert served_ds.attrs == original.attrs


def _gdal_stats(target: str, tmp: Path) -> tuple[str | None, list[int]]:
    """(NoData, per-band checksums) of a GDAL dataset, via gdalinfo and gdal_translate to GeoTIFF."""
    info = run([tool("gdalinfo"), "-checksum", target], check=True).stdout
    nodata = re.findall(r"NoData Value=(\S+)", info)
    out = tmp / "out.tif"
    out.unlink(missing_ok=True)
    run([tool("gdal_translate"), "-q", "-of", "GTiff", target, str(out)], check=True)
    checks = [int(c) for c in re.findall(r"Checksum=(\d+)", run([tool("gdalinfo"), "-checksum", str(out)], check=True).stdout)]
    return (nodata[0] if nodata else None), checks


@pytest.mark.parametrize("store", CF_STORES)
def test_cf_gdal(ncm: NcMount, store: str, tmp_path: Path) -> None:
    """GDAL's netCDF driver on the 3-D variable: the NoData and checksums of ncgen's cf.nc."""
    want = _gdal_stats(f'NETCDF:"{FIXTURES / "cf" / "cf.nc"}":temp', tmp_path)
    got = _gdal_stats(f'NETCDF:"{_cf_file(ncm, store)}":temp', tmp_path)
    assert want[0] == "-999"
    assert got == want


# --------------------------------------------------------------------------- behaviour


def test_sizes_from_metadata(mount, nc_corpus: Path) -> None:
    """Listing and stat-ing every file decodes nothing; the root array alone still gets a file."""
    m = mount(nc_corpus)
    sizes = {p: p.stat().st_size for p in (m.path / ".zvfs" / "netcdf").rglob("*.nc")}
    assert len(sizes) > 10 and all(s > 0 for s in sizes.values())
    stats = json.loads((m.path / ".zvfs" / "stats.json").read_text())
    assert stats.get("chunks_decoded", 0) == 0, stats
    for store in ("zarr3_root_array.zarr", "v1spec_root.zarr"):  # the v1 spec's usual store
        root = mount(FIXTURES / "zarr" / store)
        assert sorted(os.listdir(root.path / ".zvfs" / "netcdf")) == ["root.nc"]
        with netCDF4.Dataset(root.path / ".zvfs" / "netcdf" / "root.nc") as ds:
            ref = np.load(FIXTURES / "zarr" / f"{store}.ref" / "__root__.npy")
            ds.set_auto_maskandscale(False)
            assert same_values(served(ref, ds["data"][...]), ref.astype(ref.dtype.newbyteorder("=")))


def test_corrupt_chunk_eio_and_left_out(mount) -> None:
    """A corrupt chunk fails the reads of its bytes with EIO and one log line per key; the header and
    the good variable read fine (ncdump); arrays with unusable metadata are named with the reason.

    (netCDF-C 4.10, in the netCDF4 wheel, opens a file with one 4 MiB read, so it cannot open a
    small file with a corrupt chunk at all; ncdump 4.9 reads pages and is the reader here.)
    """
    m = mount(FIXTURES / "zarr" / "bad.zarr")
    f = m.path / ".zvfs" / "netcdf" / "root.nc"
    ncdump = tool("ncdump")
    header = run([ncdump, "-h", str(f)], check=True).stdout
    for name, info in MANIFEST["stores"]["bad.zarr"]["arrays"].items():
        if info.get("error") == "meta":
            assert re.search(rf'"{name}: unusable metadata: ', header), (name, header)
    good = run([ncdump, "-v", "good", str(f)], check=True).stdout
    ref = np.load(FIXTURES / "zarr" / "bad.zarr.ref" / "good.npy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fill = zarr.open_array(str(FIXTURES / "zarr" / "bad.zarr"), path="good", mode="r").fill_value
    ncdump_values(parse_ncdump(good)["good"], ref, fill)
    bad = run([ncdump, "-v", "corrupt_chunk", str(f)])
    assert bad.returncode != 0 and "Input/output error" in bad.stderr + bad.stdout
    with open(f, "rb") as fh:  # page by page, twice: the corrupt variable's pages fail with EIO
        fd = fh.fileno()
        failed = []
        for _ in range(2):
            for page in range(0, f.stat().st_size, 4096):
                try:
                    os.pread(fd, 4096, page)
                except OSError as exc:
                    assert exc.errno == errno.EIO
                    failed.append(page)
        assert failed and 0 not in failed
    assert wait_until(lambda: "corrupt_chunk" in m.log_text(), 5)
    for key in ("corrupt_chunk/0.1", "corrupt_chunk/1.0"):
        lines = [ln for ln in m.log_text().splitlines() if key in ln]
        assert len(lines) <= 1, lines
    assert any("corrupt_chunk/" in ln for ln in m.log_text().splitlines())


def test_header_follows_metadata_change(mount, tmp_path: Path) -> None:
    """After the metadata TTL, a changed attribute and a grown array show in the header and size."""
    store = tmp_path / "live.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(str(store), name="v", shape=(4,), chunks=(2,), dtype="i4", dimension_names=["x"])
        a[:] = np.arange(4)
        a.attrs["note"] = "before"
    m = mount(store, "--metadata-ttl", "1")
    f = m.path / ".zvfs" / "netcdf" / "root.nc"
    with netCDF4.Dataset(f) as ds:
        assert ds["v"].getncattr("note") == "before" and ds["v"].shape == (4,)
    size0 = f.stat().st_size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.open_array(str(store) + "/v", mode="a")
        a.resize((6,))
        a[4:] = [40, 50]
        a.attrs["note"] = "after"

    def changed() -> bool:
        return f.stat().st_size != size0

    assert wait_until(changed, 10)
    with netCDF4.Dataset(f) as ds:
        assert ds["v"].getncattr("note") == "after"
        assert list(ds["v"][...]) == list(zarr.open_array(str(store) + "/v", mode="r")[...])


def _strings_in_netcdf(f: Path) -> list[str]:
    with netCDF4.Dataset(f) as ds:
        return ds["s"][:].tolist()


def _strings_in_npy(f: Path) -> list[str]:
    # read whole first: np.load of a file whose header reads and whose data fail says
    # ValueError ("could only read 0 elements"), where the read itself is EIO
    return np.load(io.BytesIO(f.read_bytes())).tolist()


@pytest.mark.parametrize("view", ["netcdf/root.nc", "arrays/s/data.npy"])
def test_a_string_rewritten_longer_behind_the_mount_shows_whole_after_the_ttl(
        mount, tmp_path: Path, view: str) -> None:
    """The width of a variable-length string array is measured from the data, when the
    views are made. A value rewritten longer behind the mount (the metadata unchanged, so a
    rediscovery keeps the views) is never served cut to the old width: once the chunk is
    read again (past the TTL) that read fails EIO, logged once, and the views are made
    again, so the next open reads the file widened, each value whole. So for the netCDF
    variable (UTF-8 bytes wide) and for data.npy (characters wide)."""
    store = tmp_path / "grow.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(str(store), name="s", shape=(4,), chunks=(2,), dtype=str, dimension_names=["n"])
        a[:] = np.array(["a", "bb", "c", "d"], dtype=object)
    past = time.time() - 3600  # metadata older than a racily clean key: a rediscovery trusts it
    for p in store.rglob("*"):
        os.utime(p, (past, past))
    m = mount(store, "--metadata-ttl", "1")
    f = m.path / ".zvfs" / view
    strings = _strings_in_netcdf if view.startswith("netcdf") else _strings_in_npy
    old = ["a", "bb", "c", "d"]
    assert strings(f) == old
    size0 = f.stat().st_size
    longer = "ünïcode, and longer"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_array(str(store), path="s", mode="r+")[2:] = np.array([longer, "x"], dtype=object)
    want = zarr.open_array(str(store), path="s", mode="r")[:].tolist()
    seen, failed = [], 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            seen.append(strings(f))
        except OSError:
            failed += 1
        if seen and seen[-1] == want:
            break
        time.sleep(0.2)
    print(f"{failed} opens failed EIO before the widened file; {len(seen)} read")
    assert seen and seen[-1] == want, (seen[-3:], failed)
    assert all(got in (old, want) for got in seen), seen  # never a value cut to the old width
    assert f.stat().st_size > size0
    if view.startswith("netcdf"):
        with netCDF4.Dataset(f) as ds:
            assert ds.dimensions[ds["s"].dimensions[1]].size == len(longer.encode())
    else:
        assert np.load(f).dtype == np.dtype(f"<U{len(longer)}")
    assert len(lines_naming(m, "s/c/1")) <= 1, m.log_text()[-2000:]


def test_a_text_value_wider_than_its_served_width_is_an_error_not_cut() -> None:
    """numpy's cast to S<n> cuts a longer value without a word (and encodes only ASCII): the
    conversion the netCDF view serves text with refuses both, so a stale width is an EIO
    of that read, never a wrong value."""
    from zvfs.views.values import convert_chunk

    text = np.array(["ab", "ünï"], dtype=object)
    assert convert_chunk(text, np.dtype("S5")).tolist() == [b"ab", "ünï".encode()]
    with pytest.raises(ValueError, match="a value of 5 bytes, wider than the 4"):
        convert_chunk(text, np.dtype("S4"))
    fixed = np.array(["ab", "日本"], dtype=">U2")
    assert convert_chunk(fixed, np.dtype("S8")).tolist() == [b"ab", "日本".encode()]
    fill = np.broadcast_to(np.array("é", dtype=object), (3, 2))
    out = convert_chunk(fill, np.dtype("S2"))
    assert out.shape == (3, 2) and not any(out.strides) and out[0, 0] == "é".encode()
    # data.npy's form, U<n>, is as wide as the longest value's characters: numpy's cast to
    # U2 would cut "ünï" to "ün"
    assert convert_chunk(text, np.dtype("<U3")).tolist() == ["ab", "ünï"]
    assert np.array(["ünï"], dtype=object).astype("<U2").tolist() == ["ün"]
    with pytest.raises(ValueError, match="a value of 3 characters, wider than the 2"):
        convert_chunk(text, np.dtype("<U2"))
    out = convert_chunk(fill, np.dtype("<U1"))
    assert out.shape == (3, 2) and not any(out.strides) and out[0, 0] == "é"


# --------------------------------------------------------------------------- past 4 GiB


BIG_SHAPE = (1100, 1024, 1024)  # float32: 4.3 GiB; int64: 8.6 GiB
BIG_CHUNKS = (16, 256, 256)


@pytest.fixture(scope="session")
def big_store(tmp_path_factory) -> Path:
    """Two groups, each with a sparse variable past 4 GiB (a few written chunks) and a small one."""
    root = tmp_path_factory.mktemp("big") / "big.zarr"
    rng = np.random.default_rng(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(root), mode="w")
        for name, dtype in (("f32", "f4"), ("i64", "i8")):
            sub = g.create_group(name)
            big = sub.create_array("big", shape=BIG_SHAPE, chunks=BIG_CHUNKS, dtype=dtype, fill_value=-7,
                                   dimension_names=["t", "y", "x"])
            for t0, y0, x0 in ((0, 0, 0), (1024, 512, 256), (1088, 768, 768), (512, 256, 512)):
                big[t0 : t0 + 16, y0 : y0 + 256, x0 : x0 + 256] = rng.integers(-1000, 1000, (16, 256, 256)).astype(dtype)
            small = sub.create_array("small", shape=(16,), chunks=(8,), dtype="i2", dimension_names=["t16"])
            small[:] = np.arange(16)
    return root


def test_big_variable_slabs(mount, big_store: Path) -> None:
    """float32 past 4 GiB -> CDF-2 (the big variable last); int64 -> CDF-5; deep slabs equal zarr-python's."""
    m = mount(big_store)
    top = m.path / ".zvfs" / "netcdf"
    rng = np.random.default_rng(11)
    for name, magic in (("f32", b"CDF\x02"), ("i64", b"CDF\x05")):
        f = top / f"{name}.nc"
        with open(f, "rb") as fh:
            assert fh.read(4) == magic
        assert f.stat().st_size > 4 << 30
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = zarr.open_array(str(big_store), path=f"{name}/big", mode="r")
        with netCDF4.Dataset(f) as ds:
            ds.set_auto_maskandscale(False)
            assert list(ds.variables) == ["small", "big"] or magic == b"CDF\x05"
            assert np.array_equal(ds["small"][...], np.arange(16))
            var = ds["big"]
            slabs = [(1024, 512, 256), (1090, 770, 770), (1099, 1000, 1000)]
            slabs += [tuple(int(rng.integers(0, s - 40)) for s in BIG_SHAPE) for _ in range(3)]
            for t, y, x in slabs:
                sel = (slice(t, min(t + 5, BIG_SHAPE[0])), slice(y, y + 40), slice(x, x + 33))
                assert np.array_equal(var[sel], ref[sel]), (name, sel)
        if magic == b"CDF\x02":  # scipy reads CDF-2 too: memory-mapped, only the touched pages
            with scipy.io.netcdf_file(f, mmap=True, maskandscale=False) as nc:
                sel = (slice(1090, 1094), slice(770, 800), slice(760, 790))
                assert np.array_equal(nc.variables["big"][sel], ref[sel])
                assert np.array_equal(nc.variables["small"][:], np.arange(16))


def test_a_dimension_past_32_bits_makes_the_file_cdf5(mount, tmp_path: Path) -> None:
    """A dimension longer than 2**32 - 1 (here 2**33 bytes of uint8, two chunks written)
    cannot be written in CDF-1 or CDF-2, whose dimension lengths are 32-bit: the file is
    CDF-5 (it was CDF-2, its header could not be packed, and the family failed with EIO).
    netCDF-C reads it, and a slab equals zarr-python's."""
    root = tmp_path / "long.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    a = group.create_array("long", shape=(2**33,), chunks=(1 << 20,), dtype="u1", dimension_names=["n"])
    a[: 1 << 20] = np.arange(1 << 20, dtype=np.uint64).astype("u1")
    a[2**33 - 10:] = np.arange(10, dtype="u1") + 100
    m = mount(root)
    f = m.path / ".zvfs/netcdf/root.nc"
    with open(f, "rb") as fh:
        assert fh.read(4) == b"CDF\x05"
    with netCDF4.Dataset(f) as ds:
        ds.set_auto_maskandscale(False)
        assert ds.dimensions["n"].size == 2**33
        ref = zarr.open_array(str(root), path="long", mode="r")
        for sel in (slice(1000, 1100), slice(2**33 - 20, 2**33)):
            assert np.array_equal(ds["long"][sel], ref[sel]), sel


def test_a_cdf2_group_whose_last_variable_begins_past_4_gib_is_served(mount, tmp_path: Path) -> None:
    """Three uint8 arrays of 2**31 elements (6 GiB, each under the CDF-2 variable bound):
    CDF-2. Every such group is first tried as CDF-1, whose header was packed before its
    size was checked: the third begin, past 4 GiB, failed the packing with struct.error,
    and with it the listing of every group's file (here the other group's too; a helper's
    audit). netCDF-C reads the file, and a slab of the last variable equals zarr-python's."""
    root = tmp_path / "wide.zarr"
    top = zarr.open_group(str(root), mode="w", zarr_format=3)
    wide = top.create_group("wide")
    for name in ("a", "b", "c"):
        wide.create_array(name, shape=(2**31,), chunks=(1 << 20,), dtype="u1", dimension_names=[f"n_{name}"])
    wide["c"][2**31 - 10:] = np.arange(10, dtype="u1") + 100
    top.create_array("small", shape=(4,), chunks=(4,), dtype="i2", dimension_names=["s"])[:] = [1, 2, 3, 4]
    m = mount(root)
    netcdf = m.path / ".zvfs/netcdf"
    assert {"root.nc", "wide.nc"} <= {p.name for p in netcdf.iterdir()}
    with open(netcdf / "wide.nc", "rb") as fh:
        assert fh.read(4) == b"CDF\x02"
    with netCDF4.Dataset(netcdf / "wide.nc") as ds:
        ds.set_auto_maskandscale(False)
        ref = zarr.open_array(str(root), path="wide/c", mode="r")
        sel = slice(2**31 - 20, 2**31)
        assert np.array_equal(ds["c"][sel], ref[sel])
    with netCDF4.Dataset(netcdf / "root.nc") as ds:
        assert list(ds["small"][:]) == [1, 2, 3, 4]


def test_attribute_names_netcdf_cannot_hold_twice_or_at_all_leave_a_valid_file(mount, tmp_path: Path) -> None:
    """Two attribute names that become one netCDF name ('a/b' and 'a_b'), a name past
    NC_MAX_NAME, a name not in NFC, and a _FillValue its variable's type cannot hold: the
    file had two attributes of one name (netCDF-C reads the first twice, scipy the last),
    a name ncdump could not find, and a fill of 300 served as 44 on a uint8 variable (a
    helper's audit). Now ncdump reads it, each name is there once, and what could not be
    kept is in zvfs_left_out. Of two names for one netCDF name the one that is that name
    already is kept: 'a_b' read the value of the 'a/b' before it."""
    store = tmp_path / "names.zarr"
    long = "L" * 300
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    group.attrs.update({"a/b": "first", "a_b": "second", long: "long", "cafe\u0301": "nfd"})
    a = group.create_array("v", shape=(4,), chunks=(4,), dtype="u1", fill_value=0, dimension_names=["x"])
    a[:] = [1, 2, 3, 4]
    a.attrs.update({"_FillValue": 300, "u/v": 1, "u_v": 2})
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    res = run([tool("ncdump"), "-h", str(f)])
    assert res.returncode == 0, res.stderr
    with netCDF4.Dataset(f) as ds:
        names = ds.ncattrs()
        assert len(names) == len(set(names)), names
        assert ds.getncattr("a_b") == "second"
        assert "caf\u00e9" in names and all(len(n.encode()) <= 255 for n in names), names
        var = ds["v"]
        assert "_FillValue" not in var.ncattrs(), var.getncattr("_FillValue")
        assert var.getncattr("u_v") == 2 and var.ncattrs().count("u_v") == 1
        left = ds.getncattr("zvfs_left_out")
        assert "attribute a/b" in left and "v: _FillValue" in left and "v: attribute u/v" in left, left
        var.set_auto_maskandscale(False)
        assert var[:].tolist() == zarr.open_array(str(store), path="v", mode="r")[:].tolist()


# --------------------------------------------------------------------------- the v2 mirror tells the same truth


def _mirror(ncm: NcMount, store: str) -> Path:
    return ncm.mnt.path / ".zvfs" / "v2" / "cf" / store


@pytest.mark.parametrize("store", CF_STORES)
def test_mirror_xarray_identical(ncm: NcMount, nc_corpus: Path, store: str) -> None:
    """xarray.open_zarr of the mirror is identical() to xarray.open_zarr of the source, and warns nothing
    (the mirror has consolidated metadata in every group)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = xr.open_zarr(nc_corpus / "cf" / store).load()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mirror = xr.open_zarr(_mirror(ncm, store)).load()
    assert [str(w.message) for w in caught] == []
    xr.testing.assert_identical(mirror, source)
    assert mirror["time"].values[0] == np.datetime64("2000-01-01")  # not NaT
    assert int(np.isnan(mirror["temp"].values).sum()) == int(np.isnan(source["temp"].values).sum()) == 24


@pytest.mark.parametrize("store", CF_STORES)
def test_mirror_netcdf_c(ncm: NcMount, store: str, tmp_path: Path) -> None:
    """nccopy from the mirror succeeds; ncdump prints the values and _FillValue of ncdump of ncgen's cf.nc;
    the copy equals cf.nc variable by variable."""
    url = f"file://{_mirror(ncm, store)}#mode=zarr,file"
    out = tmp_path / "copy.nc"
    res = run([tool("nccopy"), url, str(out)])
    assert res.returncode == 0, res.stderr
    want = run([tool("ncdump"), str(FIXTURES / "cf" / "cf.nc")], check=True).stdout
    got = run([tool("ncdump"), url], check=True).stdout
    assert parse_ncdump(got) == parse_ncdump(want)
    fills = re.compile(r"^\s*(\w+):_FillValue = (.*) ;$", re.M)
    got_fills = dict(fills.findall(got))
    for name, value in fills.findall(want):
        assert got_fills.get(name) == value, (name, got_fills.get(name), value)
    assert parse_ncdump(run([tool("ncdump"), str(out)], check=True).stdout) == parse_ncdump(want)


@pytest.mark.parametrize("store", CF_STORES)
def test_mirror_gdal_nodata(ncm: NcMount, store: str) -> None:
    """GDAL's Zarr driver on the mirror reports the NoData and statistics GDAL's netCDF driver gives cf.nc."""
    def stats(target: str) -> tuple[list[str], list[str]]:
        out = run([tool("gdalinfo"), "-stats", target], check=True).stdout
        return re.findall(r"NoData Value=(\S+)", out), re.findall(r"Minimum=\S+, Maximum=\S+", out)

    want = stats(f'NETCDF:"{FIXTURES / "cf" / "cf.nc"}":temp')
    got = stats(f'ZARR:"{_mirror(ncm, store)}":/temp:0')
    assert want[0][0] == "-999"
    assert got[0][0] == want[0][0] and got[1][0] == want[1][0]


def test_mirror_awkward_attributes(mount, tmp_path: Path) -> None:
    """Attributes netCDF-C 4.9 chokes on (null, bools, objects, 64-bit ints) leave the mirror openable:
    nccopy copies it, and the copy's attributes are zarr-python's (null left out, objects as JSON)."""
    store = tmp_path / "awkward.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=2)
        a = g.create_array("a", shape=(4,), chunks=(2,), dtype="f4", fill_value=-1.5)
        a[:] = np.arange(4)
        a.attrs.update({"_ARRAY_DIMENSIONS": ["x"], "flag": True, "flags": [True, False],
                        "big": 2**40, "text": "t", "f": 0.1, "nested": {"k": [1, 2]}, "none": None})
        g.attrs.update({"b": False, "n": None, "title": "awkward"})
        want_var = dict(zarr.open_array(str(store), path="a", mode="r").attrs)
        want_group = dict(zarr.open_group(str(store), mode="r").attrs)
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    with netCDF4.Dataset(out) as ds:
        for want, got in ((want_var, {k: ds["a"].getncattr(k) for k in ds["a"].ncattrs()}),
                          (want_group, {k: ds.getncattr(k) for k in ds.ncattrs()})):
            for name, value in want.items():
                if name == "_ARRAY_DIMENSIONS":
                    continue
                if value is None:
                    assert name not in got
                elif isinstance(value, dict):
                    assert json.loads(got[name]) == value
                elif isinstance(value, str):
                    assert got[name] == value
                else:
                    assert np.array_equal(np.atleast_1d(got[name]), np.atleast_1d(np.array(value).astype(np.asarray(got[name]).dtype)))
        assert ds["a"].getncattr("_FillValue") == np.float32(zarr.open_array(str(store), path="a", mode="r").fill_value)


def test_mirror_lists_netcdf_c_cannot_read_are_their_json_text(mount, tmp_path: Path) -> None:
    """One attribute that is a list of strings (["a", "b"]), an empty or mixed list, a list of
    lists or an integer past int64 in a list, on an array of a subgroup, made netCDF-C 4.9
    refuse the whole mirror ("NetCDF: Invalid argument", "internal library error", ...): ncdump
    and nccopy read nothing of any group. Such a list is its JSON text in the mirror now (as in
    the netCDF files), and nccopy copies the store with every other value zarr-python's."""
    store = tmp_path / "lists.zarr"
    lists = {"names": ["a", "b"], "empty": [], "mixed": [1, "a", None], "nested": [[1, 2]],
             "huge": [-1, 2**63]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=2)
        top = g.create_array("top", shape=(3,), chunks=(3,), dtype="i2", fill_value=0)
        top[:] = [1, 2, 3]
        top.attrs.update({"_ARRAY_DIMENSIONS": ["x"], "units": "m", "scale": [1.5, 2]})
        sub = g.create_group("sub").create_array("v", shape=(2,), chunks=(2,), dtype="f4", fill_value=0)
        sub[:] = [0.5, 1.5]
        sub.attrs.update({"_ARRAY_DIMENSIONS": ["y"], **lists})
        g.attrs["tags"] = ["t1", "t2"]
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    ref = zarr.open_group(str(store), mode="r")
    with netCDF4.Dataset(out) as ds:
        assert ds["top"][:].tolist() == ref["top"][:].tolist()
        assert ds["top"].getncattr("units") == "m" and ds["top"].getncattr("scale").tolist() == [1.5, 2]
        var = ds["sub"]["v"]
        assert var[:].tolist() == ref["sub/v"][:].tolist()
        for name, value in lists.items():
            assert json.loads(var.getncattr(name)) == value, name
        assert json.loads(ds.getncattr("tags")) == ["t1", "t2"]


def test_mirror_names_and_text_beyond_ascii_reach_netcdf_c(mount, tmp_path: Path) -> None:
    """The mirror's JSON escaped non-ASCII text (\\u65f6), which netCDF-C 4.10 reads as
    'u65f6' (a helper's audit): a dimension named 时间 came out as u65f6u95f4. It is UTF-8
    now; nccopy's copy has zarr-python's names and text."""
    store = tmp_path / "text.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    group.attrs["title"] = "温度 °C"
    a = group.create_array("t", shape=(3,), chunks=(3,), dtype="i4", dimension_names=["时间"])
    a[:] = [1, 2, 3]
    a.attrs["units"] = "µm"
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    ref = zarr.open_group(str(store), mode="r")
    with netCDF4.Dataset(out) as ds:
        assert list(ds.dimensions) == list(ref["t"].metadata.dimension_names)
        assert ds.getncattr("title") == ref.attrs["title"]
        assert ds["t"].getncattr("units") == ref["t"].attrs["units"]
        assert ds["t"][:].tolist() == ref["t"][:].tolist()


def test_mirror_dimension_names_netcdf_c_cannot_hold_leave_the_store_readable(mount, tmp_path: Path) -> None:
    """One v3 array naming a dimension 'a/b' (netCDF-C looks for a group 'a': "No group found")
    or ' x' (a leading space) made netCDF-C 4.9 refuse the whole mirror: ncdump and nccopy read
    nothing of any variable. Such a name is the netCDF files' legal form in the mirror now
    ('a_b', '_ x'); nccopy copies every variable with zarr-python's values, and names netCDF-C
    holds are unchanged."""
    store = tmp_path / "dims.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    for name, dim, size in (("plain", "time", 2), ("slash", "a/b", 3), ("space", " x", 4)):
        a = group.create_array(name, shape=(size,), chunks=(size,), dtype="i4", dimension_names=[dim])
        a[:] = np.arange(size) + size
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    ref = zarr.open_group(str(store), mode="r")
    with netCDF4.Dataset(out) as ds:
        for name in ("plain", "slash", "space"):
            assert ds[name][:].tolist() == ref[name][:].tolist(), name
        assert ds["plain"].dimensions == ("time",)
        assert ds["slash"].dimensions == ("a_b",) and ds["space"].dimensions == ("_ x",)


def test_long_dimension_names_renamed_for_their_sizes_stay_within_nc_max_name(mount, tmp_path: Path) -> None:
    """Two dimension names of 301 bytes with one 300-byte prefix, of sizes 3 and 4: both are cut
    to 255 bytes, the second is then renamed '<name>_4', and that name was 257 bytes again:
    netCDF4 read it cut to 256 bytes, and netCDF-C refused the mirror ("NC_MAX_NAME exceeded").
    The name is cut before its suffix now: every name fits, and each array reads its values."""
    store = tmp_path / "long.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    for name, dim, size in (("a", "D" * 300 + "x", 3), ("b", "D" * 300 + "y", 4)):
        arr = group.create_array(name, shape=(size,), chunks=(size,), dtype="i2", dimension_names=[dim])
        arr[:] = np.arange(size) + size
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    ref = zarr.open_group(str(store), mode="r")
    for f in (m.path / ".zvfs/netcdf/root.nc", out):
        with netCDF4.Dataset(f) as ds:
            assert sorted(d.size for d in ds.dimensions.values()) == [3, 4], f
            assert all(len(d.encode()) <= 255 for d in ds.dimensions), [len(d.encode()) for d in ds.dimensions]
            for name in ("a", "b"):
                assert ds[name][:].tolist() == ref[name][:].tolist(), (f, name)


def test_mirror_attribute_names_netcdf_c_cannot_hold_leave_the_store_readable(mount, tmp_path: Path) -> None:
    """An attribute named '' or ' lead' (a leading space) or of 300 bytes made nccopy and ncdump
    of the mirror fail ("NetCDF: Attribute not found", "NC_MAX_NAME exceeded"): nothing was
    copied. Attribute names in the mirror are the netCDF files' legal names now; of two that
    become one name ('a/b' and 'a_b') the one named so already is kept, the other left out
    with one log line."""
    store = tmp_path / "attrs.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    group.attrs.update({" g": "group", "title": "t"})
    a = group.create_array("a", shape=(2,), chunks=(2,), dtype="i2", dimension_names=["x"])
    a[:] = [1, 2]
    a.attrs.update({"": "empty", " lead": "sp", "A" * 300: "long", "a/b": "slash", "a_b": "kept", "ok": 1})
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    with netCDF4.Dataset(out) as ds:
        assert ds["a"][:].tolist() == [1, 2]
        got = {k: ds["a"].getncattr(k) for k in ds["a"].ncattrs()}
        assert {k: got.get(k) for k in ("_", "_ lead", "A" * 255, "a_b", "ok")} == {
            "_": "empty", "_ lead": "sp", "A" * 255: "long", "a_b": "kept", "ok": 1}, got
        assert ds.getncattr("_ g") == "group" and ds.getncattr("title") == "t"
    assert_one_line(m, "'a/b'")


def test_an_array_of_no_elements_leaves_the_mirror_readable(mount, tmp_path: Path) -> None:
    """A v3 array of shape (0,) (a dataset with no time steps yet) beside others: its mirror
    .zarray of shape [0] made netCDF-C 4.9 refuse the whole mirror ("NetCDF: NCZarr error"),
    which has no form for a zero-length dimension but the unlimited one. It is left out of
    the mirror (it holds no value), with one log line, as from the netCDF files; nccopy copies
    the rest with zarr-python's values."""
    store = tmp_path / "empty.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    group.create_array("none_yet", shape=(0, 3), chunks=(5, 3), dtype="f4", dimension_names=["time", "k"])
    a = group.create_array("k", shape=(3,), chunks=(3,), dtype="i4", dimension_names=["k"])
    a[:] = [1, 2, 3]
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    with netCDF4.Dataset(out) as ds:
        assert list(ds.variables) == ["k"] and ds["k"][:].tolist() == [1, 2, 3]
    assert_one_line(m, "none_yet")


def test_chunks_longer_than_their_array_leave_the_mirror_readable(mount, tmp_path: Path) -> None:
    """An array whose chunk is longer than the array (shape (5,) in chunks of 100, as
    zarr-python allows and netCDF4-python chunks a short unlimited dimension) made netCDF-C
    4.9 refuse the whole mirror ("NetCDF: NCZarr error"): ncdump and nccopy read nothing.
    The mirror's chunk is cut to the array's length there; nccopy copies every array with
    zarr-python's values, and zarr-python reads the mirror back the same."""
    store = tmp_path / "long.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    arrays = {"short": (np.arange(5, dtype="f4") / 2, (100,), ["t"]),
              "wide": (np.arange(12, dtype="i2").reshape(3, 4), (2, 10), ["y", "x"])}
    for name, (values, chunks, dims) in arrays.items():
        a = group.create_array(name, shape=values.shape, chunks=chunks, dtype=values.dtype,
                               dimension_names=dims)
        a[...] = values
    m = mount(store)
    out = nccopy_mirror(m, tmp_path)
    mirror = zarr.open_group(str(m.path / ".zvfs/v2"), mode="r")
    with netCDF4.Dataset(out) as ds:
        for name, (values, _, _) in arrays.items():
            assert ds[name][:].tolist() == values.tolist(), name
            assert mirror[name][...].tolist() == values.tolist(), name
    assert mirror["wide"].chunks == (2, 4)


def test_a_variable_length_array_left_out_of_the_mirror_is_told(mount, tmp_path: Path) -> None:
    """A variable-length string array has no uncompressed v2 form: it was missing from the
    mirror with nothing said (the netCDF file names it in zvfs_left_out). One log line names
    it now; the other arrays are mirrored."""
    store = tmp_path / "vlen.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    s = group.create_array("labels", shape=(2,), chunks=(2,), dtype=str)
    s[:] = ["a", "bb"]
    a = group.create_array("k", shape=(2,), chunks=(2,), dtype="i4")
    a[:] = [1, 2]
    m = mount(store)
    assert sorted(p.name for p in (m.path / ".zvfs/v2").iterdir() if not p.name.startswith(".")) == ["k"]
    assert "variable-length" in assert_one_line(m, "labels")


def test_non_finite_float_attributes_stay_numbers(mount, tmp_path: Path) -> None:
    """A NaN or Infinity attribute (the literals zarr-python 2 writes, and reads as floats) was
    made the string "NaN" for every view: zarr-python read the mirror's missing_value as text,
    ncdump showed v:missing_value = "NaN", netCDF4 masked nothing with it. They are numbers
    in the mirror and the netCDF file now; the string "NaN" stays a string."""
    store = tmp_path / "nan.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=2)
        a = g.create_array("v", shape=(4,), chunks=(4,), dtype="f4", fill_value=-1.0)
        a[:] = [1.0, np.nan, np.inf, 2.0]
    attrs = {"_ARRAY_DIMENSIONS": ["x"], "missing_value": math.nan, "valid_range": [-math.inf, math.inf],
             "note": "NaN"}
    (store / "v/.zattrs").write_text(json.dumps(attrs))  # NaN, Infinity: JSON literals
    (store / ".zattrs").write_text(json.dumps({"gnan": math.nan}))
    want = dict(zarr.open_array(str(store), path="v", mode="r").attrs)
    assert math.isnan(want["missing_value"]) and want["note"] == "NaN"
    m = mount(store)
    mirror = zarr.open_array(str(m.path / ".zvfs/v2"), path="v", mode="r").attrs
    assert math.isnan(mirror["missing_value"]) and mirror["valid_range"] == [-math.inf, math.inf]
    assert mirror["note"] == "NaN"
    assert math.isnan(zarr.open_group(str(m.path / ".zvfs/v2"), mode="r").attrs["gnan"])
    out = nccopy_mirror(m, tmp_path)
    for f in (m.path / ".zvfs/netcdf/root.nc", out):
        with netCDF4.Dataset(f) as ds:
            var = ds["v"]
            assert np.isnan(var.getncattr("missing_value")), f
            assert np.array_equal(var.getncattr("valid_range"), [-np.inf, np.inf]), f
            assert var.getncattr("note") == "NaN" and np.isnan(ds.getncattr("gnan")), f
            var.set_auto_maskandscale(False)
            raw = var[:]
        assert np.array_equal(raw, zarr.open_array(str(store), path="v", mode="r")[:], equal_nan=True)


def test_times_read_as_numpy_has_them(mount, tmp_path: Path) -> None:
    """datetime64 variables had CF units but no calendar, so readers took CF's default (Julian
    before 1582-10-15): 1500-03-01 read as 1500-02-20 in xarray and ncdump -t. And NaT was
    no _FillValue: netCDF4.num2date failed on the variable. xarray and netCDF4 now read the
    values zarr-python reads."""
    store = tmp_path / "t.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = g.create_array("t", shape=(4,), dtype="M8[s]", chunks=(4,), fill_value=np.datetime64("NaT"),
                           dimension_names=["t"])
        a[:] = np.array(["1500-03-01", "1582-10-04", "NaT", "2001-01-01T12:00:00"], "M8[s]")
        d = g.create_array("dt", shape=(2,), dtype="m8[ms]", chunks=(2,), dimension_names=["n"])
        d[:] = np.array([1500, "NaT"], "m8[ms]")
    want_t = zarr.open_array(str(store), path="t", mode="r")[:]
    want_dt = zarr.open_array(str(store), path="dt", mode="r")[:]
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    with xr.open_dataset(f, decode_times=xr.coders.CFDatetimeCoder(time_unit="s"), decode_timedelta=True) as ds:
        assert ds["t"].dtype == np.dtype("M8[s]")
        np.testing.assert_array_equal(ds["t"].values, want_t)
        np.testing.assert_array_equal(ds["dt"].values.astype("m8[ms]"), want_dt)
    with netCDF4.Dataset(f) as ds:
        var = ds["t"]
        assert var.getncattr("calendar") == "proleptic_gregorian"
        got = netCDF4.num2date(var[:], var.units, var.calendar, only_use_cftime_datetimes=False)
        assert np.ma.getmaskarray(got).tolist() == [False, False, True, False]
        assert [str(x) for x in got[[0, 1, 3]]] == [str(want_t[i].astype(object)) for i in (0, 1, 3)]
    res = run([tool("ncdump"), "-t", "-v", "t", str(f)])
    assert res.returncode == 0 and '"1500-03-01", "1582-10-04", _, "2001-01-01 12"' in res.stdout, res.stdout


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("width", ["fixed", "variable"])
def test_string_labels_xarray_wrote_read_back_as_xarray_reads_them(mount, tmp_path: Path, zarr_format: int,
                                                                   width: str) -> None:
    """xarray writes a str coordinate (station names) as fixed-width Unicode (``<U10``, v3's
    fixed_length_utf32), and an object one (pandas labels: ``DataFrame.to_xarray``) as
    variable-length strings (v3 "string", v2 vlen-utf8). The netCDF view left both out
    ("classic netCDF has no string type"): a dataset read through it lost its labels. They
    are now UTF-8 in char with ``_Encoding``, as xarray writes str to a classic file
    itself: xarray (both engines) and netCDF4 read the labels back, and ncdump prints what
    it prints of xarray's own NETCDF3 file of the same dataset. The char dimension is 4
    bytes a character for fixed width (known from metadata), the longest value's UTF-8
    bytes for variable length (read from the data), as xarray sizes it."""
    names = ["Zürich", "", "日本語", "Genève-Est", "x"]
    labels = np.array(names, dtype=object if width == "variable" else str)
    ds = xr.Dataset({"t": (("station", "time"), np.arange(15, dtype="f4").reshape(5, 3))},
                    coords={"station": labels, "time": np.arange(3, dtype="i4")})
    store = tmp_path / "s.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(store, mode="w", zarr_format=zarr_format, consolidated=False)
        source = xr.open_zarr(store, consolidated=False).load()
    # what this test is about: the two forms
    assert source["station"].dtype.kind == ("U" if width == "fixed" else "T")
    reference = tmp_path / "xarray.nc"
    source.to_netcdf(reference, format="NETCDF3_64BIT")
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    for engine in ("netcdf4", "scipy"):
        with xr.open_dataset(f, engine=engine) as got:
            assert got["station"].values.tolist() == source["station"].values.tolist() == names, engine
            np.testing.assert_array_equal(got["t"].values, source["t"].values)
            assert "zvfs_left_out" not in got.attrs, got.attrs
    with netCDF4.Dataset(f) as nc, netCDF4.Dataset(reference) as ref:
        assert nc["station"].getncattr("_Encoding") == "utf-8"
        assert nc["station"][:].tolist() == names
        strlen = nc.dimensions[nc["station"].dimensions[1]].size
        assert strlen == (4 * 10 if width == "fixed" else ref.dimensions["string11"].size), strlen
    ncdump = tool("ncdump")
    want = _data_section(run([ncdump, "-v", "station", str(reference)], check=True).stdout)["station"]
    assert _data_section(run([ncdump, "-v", "station", str(f)], check=True).stdout)["station"] == want

    def subdatasets(path: Path) -> set[str]:  # GDAL counts a string variable among them, as in xarray's
        out = run([tool("gdalinfo"), str(path)], check=True).stdout
        return set(re.findall(r"SUBDATASET_\d+_NAME=NETCDF:\"[^\"]+\":(\w+)", out))

    assert subdatasets(f) == subdatasets(reference) == {"station", "t"}


def test_fixed_width_unicode_never_written_reads_as_its_fill(mount, tmp_path: Path) -> None:
    """A fixed-width Unicode array of which only some chunks were written: the netCDF view's
    values are zarr-python's, written, fill and non-ASCII alike, through netCDF4 and scipy."""
    store = tmp_path / "u.zarr"
    a = zarr.create_array(str(store), shape=(9,), chunks=(2,), dtype="<U4", fill_value="ñ?",
                          dimension_names=["n"])
    a[2:5] = np.array(["ab", "ÄÖÜß", ""])
    want = zarr.open_array(str(store), mode="r")[:]
    assert want.tolist() == ["ñ?", "ñ?", "ab", "ÄÖÜß", "", "ñ?", "ñ?", "ñ?", "ñ?"]
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    with netCDF4.Dataset(f) as nc:
        assert nc["data"][:].tolist() == want.tolist()
    with scipy.io.netcdf_file(f, mmap=False) as nc:
        assert served(want, nc.variables["data"][:].copy()).tolist() == want.tolist()


def test_variable_length_text_reads_as_zarr_python_reads_it(mount, tmp_path: Path) -> None:
    """zarr-python's variable-length str, written in part (the rest is its fill): each value
    as zarr-python reads it. An array whose every value is empty still holds one char a
    value. Variable-length bytes stay out: a value ending in NUL bytes (b"\\x01\\x00")
    could not be told from its padding."""
    store = tmp_path / "v.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = g.create_array("text", shape=(3, 4), chunks=(2, 2), dtype=str, fill_value="–",
                           dimension_names=["y", "x"])
        t[0, :] = np.array(["a", "ÄÖÜ", "", "long value here"], dtype=object)
        b = g.create_array("blobs", shape=(3,), chunks=(2,), dtype=zarr.dtype.VariableLengthBytes(),
                           dimension_names=["n"])
        b[:] = np.array([b"\x01\x00", b"", b"xyz"], dtype=object)
        e = g.create_array("empty", shape=(2,), chunks=(2,), dtype=str, dimension_names=["m"])
        e[:] = np.array(["", ""], dtype=object)
    want = {n: zarr.open_array(str(store), path=n, mode="r")[:] for n in ("text", "empty")}
    assert want["text"][2, 3] == "–"  # a never-written chunk: the fill
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    with netCDF4.Dataset(f) as nc:
        assert nc["text"][:].tolist() == want["text"].tolist()
        assert nc["empty"][:].tolist() == want["empty"].tolist() == ["", ""]
        assert nc.dimensions[nc["empty"].dimensions[1]].size == 1
        assert "blobs" not in nc.variables
        assert nc.getncattr(LEFT_OUT) == ("blobs: variable-length elements (vlen-bytes): classic netCDF has "
                                          "no such type (as char, trailing NUL bytes would be lost)\n")


def test_variable_length_text_too_long_to_read_or_corrupt_is_left_out_and_told(mount, tmp_path: Path) -> None:
    """An array of more variable-length values (or chunks) than are read whole for their
    width, and one whose chunk is corrupt, are left out with the reason (the corrupt key logged once); the
    group's other variables read as before."""
    store = tmp_path / "w.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g.create_array("many", shape=((1 << 20) + 1,), chunks=(1 << 16,), dtype=str, dimension_names=["big"])
        g.create_array("tiny_chunks", shape=(5000,), chunks=(1,), dtype=str, dimension_names=["t"])
        bad = g.create_array("bad", shape=(4,), chunks=(2,), dtype=str, compressors=None, dimension_names=["q"])
        bad[:] = np.array(["a", "b", "c", "d"], dtype=object)
        ok = g.create_array("ok", shape=(4,), chunks=(4,), dtype="i2", dimension_names=["q"])
        ok[:] = [1, 2, 3, 4]
    (store / "bad/c/1").write_bytes(b"\xff" * 3)  # shorter than a vlen chunk's header
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    with netCDF4.Dataset(f) as nc:
        told = nc.getncattr(LEFT_OUT)
        assert set(nc.variables) == {"ok"}
        assert nc["ok"][:].tolist() == [1, 2, 3, 4]
    assert re.search(r"^many: 1,048,577 variable-length values \(vlen-utf8\): more than the 1,048,576", told, re.M), told
    assert re.search(r"^tiny_chunks: variable-length values \(vlen-utf8\) in 5,000 chunks: more than the 4,096",
                     told, re.M), told
    assert re.search(r"^bad: unreadable: .*bad/c/1", told, re.M), told
    assert_one_line(m, "bad/c/1")
    # data.npy needs the same width: the same arrays have no data files, told once each
    # (the corrupt key's one line is the netCDF view's too)
    for name in ("many", "tiny_chunks", "bad"):
        assert os.listdir(m.path / ".zvfs/arrays" / name) == ["meta.json"]
        assert not (m.path / ".zvfs/arrays" / name / "data.npy").exists()
    assert np.load(m.path / ".zvfs/arrays/ok/data.npy").tolist() == [1, 2, 3, 4]
    assert_one_line(m, "bad/c/1")
    for name in ("many", "tiny_chunks"):
        assert len(lines_naming(m, f"{name}: no netCDF variable or data.npy")) == 1, m.log_text()


def test_a_time_array_s_own_units_never_label_the_served_counts(mount, tmp_path: Path) -> None:
    """A datetime64[s] array carrying CF attributes of its own (units = "days since
    2000-01-01", calendar = "noleap", as copied from a netCDF file) was served as seconds
    since 1970 under those attributes: xarray failed to decode it ("unable to decode time
    units ... noleap"), or read dates millions of years off without the calendar. The served
    encoding's units and calendar are the file's now, the source's are named in zvfs_left_out,
    and xarray reads the dates zarr-python reads."""
    store = tmp_path / "t.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=2)
        for name, calendar in (("t", "noleap"), ("u", None)):
            a = g.create_array(name, shape=(3,), chunks=(3,), dtype="M8[s]")
            a[:] = np.array(["2000-01-01", "2000-01-02T06:00", "1999-12-31"], "M8[s]")
            a.attrs.update({"_ARRAY_DIMENSIONS": ["n"], "units": "days since 2000-01-01", "long_name": name,
                            **({"calendar": calendar} if calendar else {})})
    m = mount(store)
    ref = zarr.open_group(str(store), mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_dataset(m.path / ".zvfs/netcdf/root.nc", engine="netcdf4").load()
    for name in ("t", "u"):
        assert ds[name].values.astype("M8[s]").tolist() == ref[name][:].tolist(), name
        assert ds[name].attrs["long_name"] == name
    left = ds.attrs[LEFT_OUT]
    assert "t: attribute units" in left and "t: attribute calendar" in left and "u: attribute units" in left, left


def test_times_in_multiples_of_a_unit_read_as_zarr_reads_them(mount, tmp_path: Path) -> None:
    """An M8[10s] element counts tens of seconds: it was served as its raw count under
    "seconds since 1970", so 2000-01-01 read as 1972-12-31, and m8[15m] read 15 times too
    short. Weeks, months and years since 1970 had no units at all. xarray reads the served
    file as zarr-python reads the store."""
    store = tmp_path / "t.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    values = {
        "t10s": np.array(["2000-01-01T00:00:00", "2000-01-01T00:01:40", "NaT"], "M8[10s]"),
        "d15m": np.array([1, 2, "NaT"], "m8[15m]"),
        "tM": np.array(["2000-01", "2001-03", "NaT"], "M8[M]"),
        "tW": np.array(["2000-01-06", "2000-01-13", "NaT"], "M8[W]"),
    }
    for name, v in values.items():
        g.create_array(name, shape=v.shape, dtype=v.dtype, chunks=v.shape, fill_value=np.datetime64("NaT")
                       if v.dtype.kind == "M" else np.timedelta64("NaT"),
                       attributes={"_ARRAY_DIMENSIONS": [f"n_{name}"]})[:] = v
    want = {name: zarr.open_array(str(store), path=name, mode="r")[:] for name in values}
    m = mount(store)
    with xr.open_dataset(m.path / ".zvfs/netcdf/root.nc", decode_timedelta=True) as ds:
        for name, w in want.items():
            got = ds[name].values
            assert got.dtype.kind == w.dtype.kind, (name, got.dtype)
            ns = f"{w.dtype.kind}8[ns]"
            np.testing.assert_array_equal(got.astype(ns), w.astype(ns), err_msg=name)


@pytest.mark.parametrize("fmt", [2, 3])
def test_times_without_a_cf_unit_are_counts_of_the_unit_itself(mount, tmp_path: Path, fmt: int) -> None:
    """Durations in months or years and times in ps, fs or as have no CF unit: they are
    plain int64 counts of that unit. An m8[2M] element of 3 is 6 months; it was served as
    3, its raw count, with nothing to say so. A duration in weeks is a whole number of days
    and is served as days. netCDF4-python's counts are zarr-python's values in the unit."""
    store = tmp_path / "t.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=fmt)
    counts = np.array([3, -5, 0])
    dtypes = {"d2M": "m8[2M]", "d3Y": "m8[3Y]", "t10ps": "M8[10ps]", "t7as": "M8[7as]",
              "d2W": "m8[2W]", "dW": "m8[W]"}
    for name, dt in dtypes.items():
        g.create_array(name, shape=(3,), dtype=dt, chunks=(3,), dimension_names=["n"] if fmt == 3 else None,
                       attributes={} if fmt == 3 else {"_ARRAY_DIMENSIONS": ["n"]})[:] = counts.astype(dt)
    want = {name: zarr.open_array(str(store), path=name, mode="r")[:] for name in dtypes}
    m = mount(store)
    with netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as ds:
        ds.set_auto_maskandscale(False)
        for name, w in want.items():
            var = ds[name]
            unit = np.datetime_data(w.dtype)[0]
            if unit == "W":
                assert var.getncattr("units") == "days", name
                unit = "D"
            else:
                assert "units" not in var.ncattrs(), (name, var.ncattrs())
            expected = w.astype(f"{w.dtype.kind}8[{unit}]").view("i8")
            assert expected.tolist() != counts.tolist() or name == "dW", name  # the multiple counts
            np.testing.assert_array_equal(var[:], expected, err_msg=name)


def test_dimension_names_that_clash_as_netcdf_names_are_renamed_not_left_out(mount, tmp_path: Path) -> None:
    """Dimensions "x" and "x " (one netCDF name) of two sizes, and a string variable beside
    an array's own dimension "strlen2" of another size: the second variable of each pair was
    left out ("dimension has two sizes"); it is served under a renamed dimension. A bool
    variable carries xarray's ``dtype = "bool"`` and reads back as bool."""
    store = tmp_path / "d.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    arrays = {
        "a": np.arange(3, dtype="i4"), "b": np.arange(5, dtype="i4"),
        "g": np.arange(3, dtype="i4"), "s": np.array([b"ab", b"c", b"de"]),
        "flag": np.array([True, False, True]),
    }
    dims = {"a": ["x"], "b": ["x "], "g": ["strlen2"], "s": ["q"], "flag": ["q"]}
    for name, v in arrays.items():
        g.create_array(name, shape=v.shape, dtype=v.dtype, chunks=v.shape,
                       attributes={"_ARRAY_DIMENSIONS": dims[name]})[:] = v
    want = {name: zarr.open_array(str(store), path=name, mode="r")[:] for name in arrays}
    m = mount(store)
    with xr.open_dataset(m.path / ".zvfs/netcdf/root.nc", mask_and_scale=False) as ds:
        assert "zvfs_left_out" not in ds.attrs, ds.attrs["zvfs_left_out"]
        for name, w in want.items():
            got = ds[name].values
            if w.dtype.kind == "S":
                got = got.astype(w.dtype)
            assert got.dtype == w.dtype, (name, got.dtype)
            np.testing.assert_array_equal(got, w, err_msg=name)
        assert ds["a"].dims != ds["b"].dims and ds["g"].dims == ("strlen2",)


def test_random_groups_read_as_xarray_reads_their_source(mount, tmp_path: Path) -> None:
    """25 random datasets a Zarr format (tests/nc_sweep.py: dtypes, names netCDF must change,
    fills, packing, times, strings, coordinates, attributes), each a group written by xarray:
    every group's netCDF file, read by xarray (netcdf4 and scipy) and ncdump, holds what
    xarray reads from the source. Then 25 random CDL groups of every netCDF-4 atomic type
    nccopy writes to NCZarr, each against xarray's read of ncgen's netCDF-4 file.
    ``ZVFS_NC_SEED`` picks another seed; scripts/nc-diff runs a longer hunt."""
    seed = int(os.environ.get("ZVFS_NC_SEED") or 45)
    print(f"ZVFS_NC_SEED={seed}")
    for fmt in (2, 3):
        store = tmp_path / f"v{fmt}.zarr"
        recipes = nc_sweep.build(store, fmt, seed, 25)
        assert len(recipes) >= 20, "the draws xarray writes"
        m = mount(store)
        problems = [f"v{fmt} {p}\n    recipe: {recipe}" for group, recipe in recipes.items()
                    for p in nc_sweep.check_group(m.path, group, nc_sweep.zarr_source(store, group, fmt))]
        assert not problems, "\n".join(problems)
    store, ref, recipes = nc_sweep.build_nczarr(tmp_path / "nczarr", seed, 25)
    m = mount(store)
    problems = [f"nczarr {p}\n    recipe:\n{recipe}" for group, recipe in recipes.items()
                for p in nc_sweep.check_group(m.path, group, nc_sweep.netcdf_source(ref, group))]
    assert not problems, "\n".join(problems)


def test_attributes_readers_take_as_text_or_numbers_leave_the_file_readable(mount, tmp_path: Path) -> None:
    """CF, the NUG and xarray read ``units``, ``calendar``, ``coordinates``, ``_Unsigned``,
    ``_Encoding`` and ``dtype`` as text, and ``scale_factor`` and ``add_offset`` as numbers.
    A list there (``dtype = [2**63, 1]``, ``_Unsigned = [1, 2]``) was served as an array,
    and xarray failed to open the whole file ("truth value of an array ... is ambiguous");
    text to unpack with failed it too, and numbers to unpack text with. Now such a list
    is its JSON text, and a scaling attribute that is no number, or is on text, is left out
    and told; xarray reads what it reads from the
    source, and the variable it cannot unpack there as its values."""
    store = tmp_path / "t.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    attrs = {
        "a": {"dtype": [2**63, 1], "_Unsigned": [1, 2], "calendar": [float("nan"), 1]},
        "b": {"units": 5, "_Unsigned": True},
        "flag": {"add_offset": "text"},
        "c": {"scale_factor": True, "_FillValue": 7},
        # on text served as chars too: xarray failed the file ("invalid literal for int()")
        "s": {"scale_factor": True, "add_offset": "text"},
        # numbers on text: xarray failed the file ("ufunc 'multiply' did not contain a loop")
        "t": {"scale_factor": 3, "add_offset": 0.5},
    }
    values = {"a": np.arange(4, dtype="f8"), "b": np.arange(4, dtype="i2"), "flag": np.array([True, False] * 2),
              "c": np.arange(4, dtype="i4"), "s": np.array([b"a", b"bc", b"", b"def"], "S3"),
              "t": np.array([b"x", b"", b"yz", b"w"], "S2")}
    for name, v in values.items():
        g.create_array(name, shape=v.shape, dtype=v.dtype, chunks=v.shape,
                       attributes={**attrs[name], "_ARRAY_DIMENSIONS": ["x"]})[:] = v
    m = mount(store)
    nc = m.path / ".zvfs/netcdf/root.nc"
    with netCDF4.Dataset(nc) as ds:
        assert ds["a"].getncattr("dtype") == "[9223372036854775808, 1]"
        assert ds["a"].getncattr("_Unsigned") == "[1, 2]"
        assert ds["a"].getncattr("calendar") == "[NaN, 1]"
        # one number stays one: "true", the text, would make the shorts unsigned
        assert ds["b"].getncattr("units") == 5 and ds["b"].getncattr("_Unsigned") == 1
        assert "add_offset" not in ds["flag"].ncattrs()
        assert "flag: attribute add_offset: not a number" in ds.getncattr(LEFT_OUT)
        assert "c: attribute scale_factor: not a number" in ds.getncattr(LEFT_OUT)
        assert not {"scale_factor", "add_offset"} & set(ds["s"].ncattrs())
        assert not {"scale_factor", "add_offset"} & set(ds["t"].ncattrs())
        assert "t: attribute scale_factor: text is not unpacked" in ds.getncattr(LEFT_OUT)
    # xarray cannot unpack the source's "flag" with text; the file's is its bools
    want = xr.open_zarr(store, consolidated=False, decode_times=False, drop_variables=["flag", "c", "s", "t"]).load()
    with xr.open_dataset(nc, decode_times=False) as got:
        for name in ("a", "b"):
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name].values, want[name].values)
        np.testing.assert_array_equal(got["flag"].values, values["flag"])
        # a JSON true to scale with: xarray casts the source's ints to bools by it, and the file
        # holds none; the file's are its values, masked by the _FillValue
        np.testing.assert_array_equal(got["c"].values, values["c"])
        np.testing.assert_array_equal(got["s"].values, values["s"])
        np.testing.assert_array_equal(got["t"].values, values["t"])


def test_a_v3_scalar_reads_as_xarray_reads_it(mount, tmp_path: Path) -> None:
    """xarray writes a 0-d Zarr v3 array without dimension_names, as it writes no dimension,
    and never masks with its fill_value: a uint16 scalar of 54278 with fill_value 0 was served
    with _FillValue 0, and read back as float32."""
    store = tmp_path / "s.zarr"
    src = xr.Dataset({"t": ((), np.uint16(54278)), "u": (("x",), np.array([0, 7], "u2"))})
    src.to_zarr(store, zarr_format=3, consolidated=False)
    assert "dimension_names" not in json.loads((store / "t" / "zarr.json").read_text())
    m = mount(store)
    want = xr.open_zarr(store, zarr_format=3, consolidated=False).load()
    with xr.open_dataset(m.path / ".zvfs/netcdf/root.nc") as got:
        for name in ("t", "u"):
            assert got[name].dtype == want[name].dtype == np.uint16, name
            np.testing.assert_array_equal(got[name].values, want[name].values)


def test_names_made_netcdf_s_give_way_to_a_variable_or_dimension_of_that_name(mount, tmp_path: Path) -> None:
    """NFC and NFD "café" are one netCDF name. A dimension whose name had to change met a
    scalar variable called so, and a variable whose name had to change met a dimension called
    so that is not its own: xarray refused both files ("dimension 'café' already exists as a
    scalar variable"). The changed name gives way (a dimension as ``<name>_<size>``, a variable
    with ``_``), and a coordinate whose name changed keeps its dimension's name, so it stays
    that dimension's coordinate. Read by xarray from the netCDF files (and the v2 mirror,
    where names stay the source's), against xarray's read of the source."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    store = tmp_path / "c.zarr"
    cases = {
        # the dimension changed, the scalar kept its name
        "dim": xr.Dataset({nfc: ((), np.int32(5)), "v": ((nfd,), np.arange(3, dtype="i4"))}),
        # the variable changed, the dimension kept its name
        "var": xr.Dataset({nfd: ((), np.int32(5)), "v": ((nfc,), np.arange(3, dtype="i4"))}),
        # a coordinate (NFD) whose dimension meets another of another size
        "coord": xr.Dataset({"v": ((nfc,), np.arange(7, dtype="i4")), "w": ((nfd,), np.arange(6, dtype="i4"))},
                            coords={nfd: np.arange(6, dtype="i4") * 10}),
    }
    for group, ds in cases.items():
        ds.to_zarr(store, group=group, zarr_format=2, consolidated=False)
    m = mount(store)
    for group in cases:
        want = xr.open_zarr(store, group=group, consolidated=False).load()
        with xr.open_dataset(m.path / f".zvfs/netcdf/{group}.nc") as got:
            assert "zvfs_left_out" not in got.attrs, got.attrs["zvfs_left_out"]
            served = {name: got[name] for name in got.variables}
            assert len(served) == len(want.variables), (group, list(served))
            for name in want.variables:
                w = want[name]
                same = [v for v in served.values() if v.shape == w.shape and np.array_equal(v.values, w.values)]
                assert same, (group, name)
    # the mirror's scalars have shape [1], as netCDF-C writes them, which xarray cannot open
    mirror = xr.open_zarr(m.path / ".zvfs" / "v2" / "coord", consolidated=False).load()
    want = xr.open_zarr(store, group="coord", consolidated=False).load()
    for name in want.variables:  # its dimensions renamed for netCDF-C (README), as in the files
        np.testing.assert_array_equal(mirror[name].values, want[name].values)
    with xr.open_dataset(m.path / ".zvfs/netcdf/dim.nc") as got:
        assert got[nfc].dims == () and got["v"].dims == (f"{nfc}_3",)
    with xr.open_dataset(m.path / ".zvfs/netcdf/var.nc") as got:
        assert got[f"{nfc}_"].dims == () and got["v"].dims == (nfc,)
    with xr.open_dataset(m.path / ".zvfs/netcdf/coord.nc") as got:
        assert got["w"].dims == (f"{nfc}_6",) and f"{nfc}_6" in got.coords
        np.testing.assert_array_equal(got[f"{nfc}_6"].values, np.arange(6) * 10)


def test_uint64_missing_values_past_int64_stay_numbers(mount, tmp_path: Path) -> None:
    """A uint64 array with missing_value = 2**64 - 1 and valid_range = [0, 2**64 - 2] (the
    usual 'all ones' missing value): integers past int64 were no number type of the
    translation, so the netCDF file held them as text ("18446744073709551615") and xarray and
    netCDF4 masked nothing, where xarray on the source reads NaN; the mirror's valid_range was
    text too. They are uint64 numbers now, in the file and the mirror."""
    store = tmp_path / "u64.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=2)
        a = g.create_array("u", shape=(3,), chunks=(3,), dtype="u8", fill_value=0)
        a[:] = [1, 2**64 - 1, 5]
        a.attrs.update({"_ARRAY_DIMENSIONS": ["n"], "missing_value": 2**64 - 1, "valid_range": [0, 2**64 - 2]})
        want = xr.open_zarr(store)["u"].values
    assert np.isnan(want[1])
    m = mount(store)
    f = m.path / ".zvfs/netcdf/root.nc"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = xr.open_dataset(f, engine="netcdf4")["u"].values
    np.testing.assert_array_equal(got, want)
    with netCDF4.Dataset(f) as ds:
        assert ds["u"].getncattr("missing_value") == 2**64 - 1
        assert ds["u"].getncattr("valid_range").tolist() == [0, 2**64 - 2]
        assert np.ma.getmaskarray(ds["u"][:]).tolist() == [False, True, False]
    out = nccopy_mirror(m, tmp_path)
    with netCDF4.Dataset(out) as ds:
        assert ds["u"].getncattr("valid_range").tolist() == [0, 2**64 - 2]


def test_a_missing_value_no_number_type_holds_leaves_the_variable_readable(mount, tmp_path: Path) -> None:
    """missing_value = 2**70 on an int16 array (an integer past every netCDF type) was written
    as its decimal text, and netCDF4 then failed every read of the variable ("OverflowError:
    Python int too large to convert to C long"), where xarray reads the source. Such a
    value-typed attribute is left out now, named in zvfs_left_out; the variable reads."""
    store = tmp_path / "huge.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=2)
        a = g.create_array("v", shape=(3,), chunks=(3,), dtype="i2", fill_value=None)
        a[:] = [1, 2, 3]
        a.attrs.update({"_ARRAY_DIMENSIONS": ["n"], "missing_value": 2**70, "note": 2**70})
    m = mount(store)
    with netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as ds:
        assert ds["v"][:].tolist() == [1, 2, 3]
        assert "missing_value" not in ds["v"].ncattrs() and ds["v"].getncattr("note") == str(2**70)
        assert "v: attribute missing_value" in ds.getncattr(LEFT_OUT)


def test_a_name_netcdf_can_hold_is_never_given_to_another_array(mount, tmp_path: Path) -> None:
    """Arrays 'caf\u00e9' (NFC) and 'cafe\u0301' (NFD, as macOS writes names), and 'v_' and
    'v\t': the NFD and tab names sort first, became 'caf\u00e9' and 'v_' in the file, and the
    arrays really called so were served as 'caf\u00e9_' and 'v__': netCDF4's ds['v_'] read
    another array's values (a dimension 'd_' likewise went to 'd\t'). A name netCDF holds as
    it is keeps it now; the others give way."""
    store = tmp_path / "names.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    arrays = {"caf\u00e9": (3, "x\u00e9"), "cafe\u0301": (4, "xe\u0301"), "v_": (3, "d_"), "v\t": (4, "d\t")}
    for i, (name, (size, dim)) in enumerate(arrays.items()):
        a = group.create_array(name, shape=(size,), chunks=(size,), dtype="i2", dimension_names=[dim])
        a[:] = np.arange(size) + 10 * i
    m = mount(store)
    with netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as ds:
        for name in ("caf\u00e9", "v_"):
            ref = zarr.open_array(str(store), path=name, mode="r")
            assert ds[name][:].tolist() == ref[:].tolist(), name
            assert ds[name].dimensions == tuple(ref.metadata.dimension_names), name
        assert sorted(ds.variables) == ["caf\u00e9", "caf\u00e9_", "v_", "v__"]


def test_unsigned_attributes_of_a_classic_file_keep_their_values(mount, tmp_path: Path) -> None:
    """A CDF-1/2 file has no unsigned types: ubyte 200, ushort 40000 and uint 3000000000 were
    served in the signed type of their width (-56, -25536, -1294967296), flag_masks 128 as -128,
    and a valid_max of 200 on a byte variable as -56 (every value then read as missing).
    They are served in a type that holds the value (short, int, double), as netCDF-C reads the
    NCZarr store ncgen's file was copied into; a uint64 past every type of the file is text."""
    cdl = tmp_path / "u.cdl"
    cdl.write_text("netcdf u {\ndimensions: x = 3 ;\nvariables:\n ubyte flags(x) ;\n"
                   "  flags:flag_masks = 1UB, 2UB, 128UB ;\n  flags:flag_meanings = \"a b c\" ;\n"
                   " float t(x) ;\n  t:ucount = 40000US ;\n  t:big = 3000000000U ;\n"
                   " byte b(x) ;\n  b:valid_max = 200UB ;\n"
                   ":ub = 200UB ;\n:u64 = 18446744073709551615ULL ;\n"
                   "data: flags = 1, 2, 128 ; t = 1, 2, 3 ; b = 1, 2, 3 ;\n}\n")
    nc, store = tmp_path / "u.nc", tmp_path / "uz"
    assert run([tool("ncgen"), "-k", "nc4", "-o", str(nc), str(cdl)]).returncode == 0
    res = run([tool("nccopy"), "-k", "nc4", str(nc), f"file://{store}#mode=nczarr,file"])
    assert res.returncode == 0, res.stderr
    m = mount(store)
    served = m.path / ".zvfs/netcdf/root.nc"
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file") as want, netCDF4.Dataset(served) as got:
        assert got.data_model in ("NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET")  # what this is about
        for var, attr in (("flags", "flag_masks"), ("t", "ucount"), ("t", "big"), ("b", "valid_max"),
                          (None, "ub")):
            w = (want[var] if var else want).getncattr(attr)
            g = (got[var] if var else got).getncattr(attr)
            assert [int(x) for x in np.atleast_1d(g)] == [int(x) for x in np.atleast_1d(w)], attr
        assert int(want.getncattr("u64")) == 2**64 - 1
        assert got.getncattr("u64") == str(2**64 - 1)
        # valid_max 200 on a signed byte variable: as -56 it masked every value (a review)
        assert got["b"][:].tolist() == want["b"][:].tolist() == [1, 2, 3]


def ncgen_nczarr(tmp_path: Path, name: str, body: str) -> str:
    """The NCZarr store ncgen writes of the CDL ``netcdf <name> { <body> }``: its URL."""
    cdl = tmp_path / f"{name}.cdl"
    cdl.write_text(f"netcdf {name} {{ {body} }}\n")
    url = f"file://{tmp_path / name}.zarr#mode=nczarr,file"
    assert run([tool("ncgen"), "-k", "nc4", "-o", url, str(cdl)]).returncode == 0
    return url


def test_an_nczarr_store_s_default_fills_read_as_netcdf_c_reads_them(mount, tmp_path: Path) -> None:
    """NCZarr keeps a fill the writer set as a typed _FillValue attribute; a .zarray's
    fill_value alone is the type's default fill, which netCDF-C shows as no attribute. It
    was served as _FillValue: a byte's -127 then masked real data (ncdump printed `_`,
    xarray made the variable float), and a double's, which NCZarr writes rounded
    (9.96921e+36), masked nothing, so an unwritten value read as 9.97e36. ncdump of the
    served file prints what ncdump of the store prints, and so does netCDF4-python."""
    url = ncgen_nczarr(tmp_path, "fills", "dimensions: x = 3 ;\n"
                       "variables: double d(x) ; int i(x) ; i:_FillValue = -5 ; byte b(x) ; ubyte ub(x) ;\n"
                       "data: d = 1, _, 3 ; i = 1, _, 3 ; b = -127, 0, 1 ; ub = 1, 128, 255 ;")
    want = parse_ncdump(run([tool("ncdump"), url], check=True).stdout)
    m = mount(url)
    served = m.path / ".zvfs/netcdf/root.nc"
    got = parse_ncdump(run([tool("ncdump"), served], check=True).stdout)
    # ub is a byte with _Unsigned in a classic file, which ncdump prints signed: by netCDF4 below
    assert {k: got[k] for k in "dib"} == {k: want[k] for k in "dib"}, (got, want)
    assert want["d"] == ["1", "_", "3"] and want["b"][0] == "-127", want
    with netCDF4.Dataset(url) as ref, netCDF4.Dataset(served) as ds:
        for name in ("d", "i", "b", "ub"):
            assert ("_FillValue" in ds[name].ncattrs()) == ("_FillValue" in ref[name].ncattrs()), name
        for name in ("d", "i", "b"):  # (netCDF4-python masks an _Unsigned byte's 255 as ubyte's default)
            a, b = ref[name][:], ds[name][:]
            assert np.ma.getmaskarray(a).tolist() == np.ma.getmaskarray(b).tolist(), name
            assert np.ma.filled(a, 0).tolist() == np.ma.filled(b, 0).tolist(), name
        ds.set_auto_mask(False)
        assert ds["ub"][:].tolist() == [1, 128, 255]


def test_an_nczarr_group_lists_variables_and_dimensions_in_netcdf_c_s_order(mount, tmp_path: Path) -> None:
    """ncdump lists an NCZarr store's dimensions and variables in the order they were
    defined (``_nczarr_group``'s dims and vars); the served file listed variables by name and
    dimensions by first use, so ncdump's headers of the two differed. (netCDF-C 4.10.1, in
    netCDF4-python's wheel, lists a store's variables by name: the two libraries disagree,
    and the served file keeps the order its writer chose.)"""
    url = ncgen_nczarr(tmp_path, "order", "dimensions: y = 2 ; t = 3 ; x = 1 ;\n"
                       "variables: int alpha(t) ; float zeta(y, x) ; double t(t) ;\n"
                       "data: alpha = 7, 8, 9 ; zeta = 1, 2 ; t = 0, 1, 2 ;")
    m = mount(url)

    def declarations(target: object) -> list[str]:  # ncdump -h's dimension and variable lines
        lines = run([tool("ncdump"), "-h", str(target)], check=True).stdout.splitlines()
        return [x.strip() for x in lines if x.startswith("\t") and not x.startswith("\t\t") and ":" not in x]

    assert declarations(m.path / ".zvfs/netcdf/root.nc") == declarations(url) == [
        "y = 2 ;", "t = 3 ;", "x = 1 ;", "int alpha(t) ;", "float zeta(y, x) ;", "double t(t) ;"]


@pytest.mark.parametrize("writer", ["nccopy", "ncgen"])
def test_an_nczarr_char_variable_reads_as_netcdf_wrote_it(mount, tmp_path: Path, writer: str) -> None:
    """netCDF-C 4.9 stores a char variable as dtype "<U1" with one byte a character: data.raw
    failed with EIO (10 bytes decoded where 40 were expected) and the netCDF file left the
    variable out as Unicode strings. It is char again: ncdump of the view prints what ncdump
    of ncgen's file prints, its _FillValue "z" too (it was left out as "not a value of |S1").
    ncgen writing NCZarr itself puts that character in the .zarray's fill_value ("z", where
    nccopy writes null): the variable was unusable metadata ("bad fill_value 'z' for |S1:
    Invalid base64"), gone from data.raw, the mirror and the netCDF file."""
    cdl = tmp_path / "c.cdl"
    cdl.write_text('netcdf c {\ndimensions: n = 2 ; l = 5 ;\nvariables: char c(n, l) ; c:_FillValue = "z" ;\n'
                   'int k(n) ; k:_FillValue = -1 ;\ndata: c = "hello", "wo" ; k = 1, 2 ;\n}\n')
    nc, store = tmp_path / "c.nc", tmp_path / "cz"
    assert run([tool("ncgen"), "-k", "nc4", "-o", str(nc), str(cdl)]).returncode == 0
    # (k's fill is explicit: ncgen writes netCDF's default one into the .zarray, which the view shows)
    url = f"file://{store}#mode=nczarr,file"
    cmd = [tool("nccopy"), "-k", "nc4", str(nc), url] if writer == "nccopy" else [tool("ncgen"), "-4", "-o", url, str(cdl)]
    res = run(cmd)
    assert res.returncode == 0, res.stderr
    zarray = json.loads((store / "c/.zarray").read_text())
    assert zarray["dtype"] == "<U1"  # what this is about
    assert zarray["fill_value"] == (None if writer == "nccopy" else "z")
    m = mount(store)
    with netCDF4.Dataset(nc) as ds:
        ds.set_auto_chartostring(False)
        ds.set_auto_mask(False)  # the "z"s ncgen filled in are bytes of the data
        want = np.asarray(ds["c"][:])
    assert (m.path / ".zvfs/arrays/c/data.raw").read_bytes() == want.tobytes() == b"hellowozzz"

    def body(path: Path) -> str:
        res = run([tool("ncdump"), str(path)])
        assert res.returncode == 0, res.stderr
        return res.stdout.split("{", 1)[1]

    assert body(m.path / ".zvfs/netcdf/root.nc") == body(nc)


def test_a_group_file_and_a_directory_of_one_name_both_show(mount, tmp_path: Path) -> None:
    """Group ``b`` is the file b.nc; a group ``b.nc`` with a child group needs the directory
    b.nc/: the directory won and group b's file was gone, with nothing said (a helper's
    audit). The file is b_.nc now; every group's file reads, with zarr-python's values."""
    store = tmp_path / "names.zarr"
    root = zarr.open_group(str(store), mode="w", zarr_format=3)
    for path, values in (("b/v", [1, 2]), ("b.nc/c/w", [3, 4, 5])):
        a = root.create_array(path, shape=(len(values),), chunks=(len(values),), dtype="i4")
        a[:] = values
    m = mount(store)
    nc = m.path / ".zvfs/netcdf"
    assert (nc / "b_.nc").is_file() and (nc / "b.nc").is_dir() and (nc / "b.nc/c.nc").is_file()
    for f, var, path in ((nc / "b_.nc", "v", "b/v"), (nc / "b.nc/c.nc", "w", "b.nc/c/w")):
        with netCDF4.Dataset(f) as ds:
            assert ds[var][:].tolist() == zarr.open_array(str(store), path=path, mode="r")[:].tolist()


def test_a_group_keeps_its_own_file_name_when_another_gives_way(mount, tmp_path: Path) -> None:
    """Groups 'root' and 'root_': 'root' gives way to the root's root.nc, sorted first, took
    root_.nc, and the group really called 'root_' was served as root__.nc: root_.nc held
    another group's data. A group whose own name is free keeps it now."""
    store = tmp_path / "names.zarr"
    top = zarr.open_group(str(store), mode="w", zarr_format=3)
    for path, values in (("root/v", [1, 2]), ("root_/v", [3, 4, 5]), ("w", [6])):
        a = top.create_array(path, shape=(len(values),), chunks=(len(values),), dtype="i4")
        a[:] = values
    m = mount(store)
    nc = m.path / ".zvfs/netcdf"
    assert sorted(os.listdir(nc)) == ["root.nc", "root_.nc", "root__.nc"]
    for f, path in (("root_.nc", "root_/v"), ("root__.nc", "root/v"), ("root.nc", "w")):
        with netCDF4.Dataset(nc / f) as ds:
            var = ds[path.rpartition("/")[2]]
            assert var[:].tolist() == zarr.open_array(str(store), path=path, mode="r")[:].tolist(), f


# --------------------------------------------------------------------------- Zarr Vectors stores


def test_zv_store_shows_only_plain_arrays(mount) -> None:
    """A Zarr Vectors store: a level is no netCDF variable; its groups' plain arrays are, equal to
    zarr-python's reading, and its variable-length arrays are named in zvfs_left_out."""
    src = FIXTURES / "zv" / "v09" / "points_pyramid.zarr"
    m = mount(src)
    top = m.path / ".zvfs" / "netcdf"
    files = sorted(top.rglob("*.nc"))
    assert top / "0.nc" in files
    checked = left_out = 0
    for f in files:
        assert run([tool("ncdump"), "-h", str(f)]).returncode == 0, f
        group = f.relative_to(top).with_suffix("").as_posix()
        group = "" if group == "root" else group
        with netCDF4.Dataset(f) as ds:
            ds.set_auto_maskandscale(False)
            for name, var in ds.variables.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ref = np.asarray(zarr.open_array(str(src), path=f"{group}/{name}".strip("/"), mode="r")[...])
                assert same_values(served(ref, var[...]), ref.astype(ref.dtype.newbyteorder("="))), (f, name)
                checked += 1
            if LEFT_OUT in ds.ncattrs():
                left_out += len(re.findall(r"variable-length", ds.getncattr(LEFT_OUT)))
    assert checked > 0 and left_out > 0
    with netCDF4.Dataset(top / "0.nc") as ds:
        assert "vertices" not in ds.variables and "vertices: " in ds.getncattr(LEFT_OUT)


def test_an_nczarr_string_variable_reads_as_text(mount, tmp_path: Path) -> None:
    """netCDF-C (4.10.1, in netCDF4-python's wheel) keeps an NC_STRING variable as
    ``|S<maxstrlen>`` (its char is ``|S1``). It was served as bytes without ``_Encoding``:
    xarray read b'\\xce\\xb1' for 'α'. It is UTF-8 text now, as netCDF-C reads the store."""
    store = tmp_path / "strings"
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file", "w") as ds:
        ds.createDimension("y", 3)
        v = ds.createVariable("s", str, ("y",))
        v[0], v[1], v[2] = "α", "beta gamma", ""
    assert json.loads((store / "s/.zarray").read_text())["dtype"].startswith("|S")  # what this is about
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file") as want:
        ref = [str(x) for x in want["s"][:]]
    m = mount(store)
    with xr.open_dataset(m.path / ".zvfs/netcdf/root.nc") as ds:
        assert [str(x) for x in ds["s"].values.tolist()] == ref == ["α", "beta gamma", ""], ds["s"].values


def test_scalars_of_a_later_netcdf_c_stay_scalars(mount, tmp_path: Path) -> None:
    """netCDF-C after 4.9.0 (4.10.1, in netCDF4-python's wheel) flags a scalar with
    ``"scalar": 1`` in ``_nczarr_array`` and ``_ARRAY_DIMENSIONS: ["_scalar_"]`` (4.9.0 wrote
    ``"storage": "scalar"``): only ``true`` was taken, so every scalar was an array of shape
    (1,) (data.npy, meta.json) and the netCDF file gave it a dimension ``_scalar_``. They are
    0-d again, with netCDF4-python's values; a 1-element array beside them stays one."""
    store = tmp_path / "scalars"
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file", "w") as ds:
        ds.createDimension("one", 1)
        ds.createVariable("n", "i4", ())[...] = 42
        ds.createVariable("d", "f8", (), fill_value=-1.0)[...] = 3.5
        ds.createVariable("g", "i2", ("one",))[:] = [7]
    assert json.loads((store / "n/.zattrs").read_text())["_nczarr_array"]["scalar"] == 1  # what this is about
    m = mount(store)
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file") as want:
        for name in ("n", "d", "g"):
            ref = np.asarray(want[name][...])
            got = np.load(m.path / ".zvfs/arrays" / name / "data.npy")
            assert got.shape == ref.shape and got.tolist() == ref.tolist(), name
        with netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as got:
            assert {n: v.dimensions for n, v in got.variables.items()} == {"n": (), "d": (), "g": ("one",)}
            assert got["n"][...] == 42 and got["d"][...] == 3.5 and got["d"].getncattr("_FillValue") == -1.0


@pytest.mark.parametrize("mode", ["nczarr", "zarr"])
def test_text_fill_values_of_a_later_netcdf_c_are_text(mount, tmp_path: Path, mode: str) -> None:
    """netCDF-C after 4.9.0 writes a char or string variable's fill_value as the text itself
    (">S1" with "#", "|S128" with "N/A"), where v2 keeps bytes as base64: each such variable
    was unusable metadata ("bad fill_value '#' for |S1: Only base64 data is allowed"), gone
    from data.npy and the netCDF file, in NCZarr and pure Zarr (mode=zarr) alike. In NCZarr
    a fill that happens to be base64 ("abcd") was served as other bytes (b'i\\xb7\\x1d'); a
    pure-Zarr store has no mark of its writer, so there such a text keeps v2's meaning. They
    read as netCDF4-python reads the store."""
    store = tmp_path / "fills"
    url = f"file://{store}#mode={mode},file"
    names = ["c", "s", "unwritten"] if mode == "nczarr" else ["c", "s"]
    with netCDF4.Dataset(url, "w") as ds:
        ds.createDimension("x", 3)
        ds.createDimension("l", 2)
        ds.createVariable("c", "S1", ("x", "l"), fill_value=b"#")[0] = [b"a", b"b"]
        ds.createVariable("s", str, ("x",), fill_value="N/A")[0] = "hello"
        if "unwritten" in names:
            ds.createVariable("unwritten", str, ("x",), fill_value="abcd")
    assert json.loads((store / "c/.zarray").read_text())["fill_value"] == "#"  # what this is about
    m = mount(store)
    with netCDF4.Dataset(url) as want:
        want.set_auto_mask(False)
        want.set_auto_chartostring(False)
        for name in names:
            ref = np.asarray(want[name][:])
            ref = ref.astype("S") if ref.dtype == object else ref
            got = np.load(m.path / ".zvfs/arrays" / name / "data.npy")
            assert got.tolist() == ref.tolist(), name
    with netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as got:
        assert sorted(got.variables) == names and "zvfs_left_out" not in got.ncattrs()
        assert got["c"].getncattr("_FillValue") == b"#"
    if mode == "nczarr":
        assert np.load(m.path / ".zvfs/arrays/unwritten/data.npy").tolist() == [b"abcd"] * 3


def test_string_attributes_of_several_values_keep_them_apart(mount, tmp_path: Path) -> None:
    """netCDF-C after 4.9.0 writes an NC_STRING attribute of several values as a JSON list
    typed "|S128" (["a", "bb", ""]): it was joined as if split into characters, "abb" in
    the netCDF file and the mirror. It is the list's JSON text there now, as any list of
    strings is, with netCDF4-python's values; one string stays that string."""
    store = tmp_path / "strattrs"
    url = f"file://{store}#mode=nczarr,file"
    with netCDF4.Dataset(url, "w") as ds:
        ds.createDimension("x", 2)
        v = ds.createVariable("v", "i2", ("x",))
        v[:] = [1, 2]
        v.setncattr_string("strs", ["a", "bb", ""])
        v.setncattr_string("one", ["only"])
        ds.setncattr_string("tags", ["p", "qq"])
    assert json.loads((store / ".zattrs").read_text())["_nczarr_attr"]["types"]["tags"] == "|S128"  # the case
    m = mount(store)
    with netCDF4.Dataset(url) as want, netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as got:
        assert json.loads(got["v"].getncattr("strs")) == list(want["v"].getncattr("strs")) == ["a", "bb", ""]
        assert json.loads(got.getncattr("tags")) == list(want.getncattr("tags")) == ["p", "qq"]
        assert got["v"].getncattr("one") == want["v"].getncattr("one") == "only"
    mirror = json.loads((m.path / ".zvfs/v2/v/.zattrs").read_text())
    assert json.loads(mirror["strs"]) == ["a", "bb", ""] and mirror["one"] == "only"
    assert json.loads(json.loads((m.path / ".zvfs/v2/.zattrs").read_text())["tags"]) == ["p", "qq"]


@pytest.mark.parametrize("mode", ["nczarr", "zarr"])
def test_shuffled_variables_of_netcdf_c_read_as_it_wrote_them(mount, tmp_path: Path, mode: str) -> None:
    """netCDF4-python's zlib=True shuffles by default, and netCDF-C writes that filter as
    {"id": "shuffle", "elementsize": 0} (0: the type's size), in NCZarr and in pure Zarr
    (mode=zarr) alike; numcodecs' shuffle of element size 0 does nothing, so every such
    variable was served as its shuffled bytes, wrong numbers with nothing said (0, 0.333 read
    as 7.8e-39, -4.6e-13). They read as netCDF4-python, the writer, reads them."""
    store = tmp_path / "shuffled"
    url = f"file://{store}#mode={mode},file"
    values = {"f": np.arange(70, dtype="f4").reshape(10, 7) / 3,
              "i": np.arange(-5, 5, dtype="i8").reshape(10, 1) * 10**12}
    with netCDF4.Dataset(url, "w") as ds:
        ds.createDimension("x", 10)
        ds.createDimension("y", 7)
        ds.createDimension("one", 1)
        for name, dims in (("f", ("x", "y")), ("i", ("x", "one"))):
            ds.createVariable(name, values[name].dtype, dims, zlib=True, chunksizes=(4, 1))[:] = values[name]
    assert json.loads((store / "f/.zarray").read_text())["filters"] == [{"id": "shuffle", "elementsize": 0}]
    m = mount(store)
    with netCDF4.Dataset(url) as want, netCDF4.Dataset(m.path / ".zvfs/netcdf/root.nc") as served:
        for name, ref in values.items():
            assert want[name][:].tolist() == ref.tolist()  # what netCDF-C reads back
            assert np.load(m.path / ".zvfs/arrays" / name / "data.npy").tolist() == ref.tolist(), name
            assert served[name][:].tolist() == ref.tolist(), name


def test_a_pure_zarr_char_variable_of_netcdf_c_4_9_reads_as_it_wrote_it(mount, tmp_path: Path) -> None:
    """nccopy (netCDF-C 4.9) into '#mode=zarr,file' writes a char variable as "<U1" with one
    byte a character, and reads it back so (zarr-python cannot read it at all): every read of
    its data.raw and data.npy failed with EIO ("decoded 10 bytes, expected 40"). Each byte
    is its character now, as netCDF-C reads the store; the other variables are unchanged."""
    cdl = tmp_path / "c.cdl"
    cdl.write_text('netcdf c {\ndimensions: n = 2 ; l = 5 ;\nvariables: char c(n, l) ; int k(n) ;\n'
                   'data: c = "hello", "wo" ; k = 1, 2 ;\n}\n')
    nc, store = tmp_path / "c.nc", tmp_path / "cz"
    assert run([tool("ncgen"), "-k", "nc4", "-o", str(nc), str(cdl)]).returncode == 0
    res = run([tool("nccopy"), "-k", "nc4", str(nc), f"file://{store}#mode=zarr,file"])
    assert res.returncode == 0, res.stderr
    assert json.loads((store / "c/.zarray").read_text())["dtype"] == "<U1"  # what this is about
    assert (store / "c/0.0").stat().st_size == 10
    m = mount(store)
    with netCDF4.Dataset(nc) as ds:
        ds.set_auto_chartostring(False)
        want = np.asarray(ds["c"][:].filled(b""))
        k = ds["k"][:].tolist()
    got = np.load(m.path / ".zvfs/arrays/c/data.npy")
    assert got.dtype == np.dtype("<U1") and got.tolist() == want.astype("U1").tolist()
    assert np.load(m.path / ".zvfs/arrays/k/data.npy").tolist() == k

"""Random datasets as groups of a Zarr store, and their netCDF files read against the source.

Shared by ``scripts/nc-diff`` (a long hunt from any seed) and
``test_netcdf.py::test_random_groups_read_as_xarray_reads_their_source`` (a bounded run).

:func:`build` draws datasets from a seed (dtypes, dimension names, shapes, chunks, fill
values, scale/offset packing, times, strings, coordinates, attribute names and values) and
has xarray write each as one group of a Zarr store. :func:`check_group` reads that group's
``.zvfs/netcdf/<group>.nc`` with xarray's netcdf4 engine, its scipy engine (CDF-1 and -2
only) and ``ncdump -h``: each variable, its values, dimensions and attributes must be what
``xarray.open_zarr`` reads from the source, CF decoding on both sides, but for what the
README's netCDF view changes on purpose. Every expectation here is written from the README,
not taken from zvfs's code (its ``nc_name`` is written again below).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import unicodedata
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from conftest import run, tool

LEFT_OUT = "zvfs_left_out"

#: dimension and variable names: plain, then ones netCDF must rename or normalise
NAMES = ["x", "y", "time", "lat", "lon", "band", "n", "a b", "café", "cafe\u0301", "x/y", "_z", "t-1",
         "Δ", "0lead", "long" * 20]
ATTR_NAMES = ["units", "long_name", "comment", "valid_min", "valid_max", "valid_range", "missing_value",
              "flag_values", "note", "a b", "é", "x/y", "n1", "n2", "n3", "_private", "history",
              # names a reader gives a meaning (xarray's and CF's), with values of any kind
              "_Unsigned", "dtype", "coordinates", "calendar", "scale_factor", "add_offset", "_Encoding"]
DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "bool", "M8[ns]", "M8[s]",
          "m8[s]", "U", "S", "str", "cftime"]


def attr_value(rng: random.Random) -> Any:
    """A JSON attribute value of the kinds zarr stores hold."""
    kind = rng.randrange(30)
    return [
        lambda: rng.randrange(-100, 100), lambda: 2**40 + rng.randrange(9), lambda: 2**70,
        lambda: rng.uniform(-1e6, 1e6), lambda: float("nan"), lambda: float("inf"), lambda: -0.0,
        lambda: "text", lambda: "héllo wörld", lambda: "", lambda: [1, 2, 3], lambda: [1.5, -2.0],
        lambda: [1, 2.5], lambda: ["a", "bc"], lambda: [], lambda: True, lambda: {"k": 1},
        lambda: None, lambda: [2**63, 1], lambda: [True, False], lambda: "a\x00b", lambda: "two\nlines",
        lambda: list(range(300)), lambda: [-(2**63), 2**63 - 1], lambda: [1e300, -1e-300], lambda: 2**64 - 1,
        lambda: "true", lambda: "false", lambda: "bool", lambda: "utf-8",
    ][kind]()


def draw(rng: random.Random, fmt: int) -> tuple[xr.Dataset, dict, str]:
    """One dataset, its to_zarr encoding, and the recipe text that draws it again."""
    nprng = np.random.default_rng(rng.randrange(2**32))
    sizes = {n: rng.randrange(1, 8) if rng.random() < 0.8 else rng.randrange(8, 40)
             for n in rng.sample(NAMES, rng.randrange(1, 5))}
    dims = list(sizes)
    ds = xr.Dataset()
    enc: dict[str, dict] = {}
    used = set(dims)
    for _ in range(rng.randrange(1, 5)):
        dt = rng.choice(DTYPES)
        vdims = tuple(rng.sample(dims, rng.randrange(0, min(3, len(dims)) + 1)))
        shape = tuple(sizes[d] for d in vdims)
        # no variable 'x/y': zarr nests it under 'x', and whether xarray's write of the two then
        # fails depends on the order of a set of names (PYTHONHASHSEED): the draws varied by run
        name = rng.choice([n for n in NAMES + ["v1", "v2", "v3", "temp"] if n not in used and "/" not in n]
                          or ["w"])
        used.add(name)
        data = values(nprng, dt, shape)
        if data.size > 1 and dt[0] in "iufbmM" and rng.random() < 0.25:
            data.reshape(-1)[: data.size // 2] = 0  # chunks of zeros: zarr-python may leave them unwritten
        attrs = {rng.choice(ATTR_NAMES): attr_value(rng) for _ in range(rng.randrange(0, 4))}
        attrs = {k: v for k, v in attrs.items() if k not in ("units", "calendar") or dt[0] not in "Mm"}
        if dt[0] in "iuf" and rng.random() < 0.15:  # a CF time of numbers: both sides decode it
            attrs["units"] = rng.choice(["days since 2000-01-01", "hours since 1970-01-01 00:00:00"])
            attrs["calendar"] = rng.choice(["standard", "proleptic_gregorian"])
            data = nprng.integers(0, 100, shape).astype(dt)
        ds[name] = xr.Variable(vdims, data, attrs)
        e: dict[str, Any] = {}
        if shape and rng.random() < 0.7:
            e["chunks"] = tuple(rng.randrange(1, s + 3) for s in shape)
            if fmt == 3 and rng.random() < 0.3:  # shards of whole chunks
                e["shards"] = tuple(c * rng.randrange(1, 3) for c in e["chunks"])
        if rng.random() < 0.3:
            e["compressors"] = _compressors(rng, fmt)
        if dt[0] in "fiu" and rng.random() < 0.4:
            e["_FillValue"] = fill_for(nprng, dt)
        if dt in ("f4", "f8") and rng.random() < 0.2:
            e.update(dtype="i2", scale_factor=0.5, add_offset=rng.choice([0.0, 10.0]), _FillValue=-999)
        if dt in ("f4", "f8") and rng.random() < 0.1:
            e.update(dtype="u1", scale_factor=2.0, _FillValue=255)
            data = np.where(np.isnan(data), np.nan, np.clip(np.round(data), 0, 400))
            ds[name] = xr.Variable(vdims, data, attrs)
        if dt[0] == "m" and rng.random() < 0.5:
            e["units"] = rng.choice(["seconds", "hours", "days"])
            if e["units"] != "seconds":
                ds[name] = xr.Variable(vdims, (data // np.timedelta64(1, "D")).astype("m8[D]").astype(dt), attrs)
        if dt in ("M8[ns]", "M8[s]") and rng.random() < 0.5:
            e["units"] = rng.choice(["days since 2000-01-01", "seconds since 1970-01-01", "hours since 1900-01-01"])
        enc[name] = e
    if ds.data_vars and rng.random() < 0.2:  # a coordinate of no dimension's name ("coordinates")
        ds = ds.set_coords(rng.choice(list(ds.data_vars)))
    for d in dims:
        if d not in ds.variables and rng.random() < 0.3:
            ds = ds.assign_coords({d: np.arange(sizes[d], dtype=rng.choice(["i4", "f8"]))})
    ds.attrs = {rng.choice(ATTR_NAMES): attr_value(rng) for _ in range(rng.randrange(0, 4))}
    return ds, enc, f"sizes={sizes}"


def _compressors(rng: random.Random, fmt: int) -> Any:
    """A compressor zarr-python writes: numcodecs' for v2, zarr's own codecs for v3."""
    if fmt == 3:
        from zarr import codecs
        return rng.choice([None, [codecs.ZstdCodec(level=3, checksum=True)], [codecs.GzipCodec(level=5)],
                           [codecs.BloscCodec(cname="lz4", shuffle="bitshuffle")]])
    import numcodecs
    return rng.choice([None, [numcodecs.Zlib(level=1)], [numcodecs.GZip(level=5)], [numcodecs.Zstd(level=3)],
                       [numcodecs.LZ4()], [numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE)],
                       [numcodecs.BZ2()], [numcodecs.LZMA()]])


def fill_for(nprng: np.random.Generator, dt: str) -> Any:
    if dt[0] == "f":
        return np.dtype(dt).type([np.nan, np.finfo(dt).max, -1.0][nprng.integers(3)])
    return np.dtype(dt).type([np.iinfo(dt).max, np.iinfo(dt).min, 0, 7][nprng.integers(4)])


def values(nprng: np.random.Generator, dt: str, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    if dt == "bool":
        return nprng.integers(0, 2, shape).astype(bool)
    if dt[0] in "iu":
        info = np.iinfo(dt)
        return nprng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if dt[0] == "f":
        a = nprng.normal(0, 100, shape).astype(dt)
        a.reshape(-1)[nprng.random(n) < 0.1] = np.nan
        return a
    if dt[0] == "M":
        a = (nprng.integers(0, 2_000_000_000, shape) * 10**9).astype("M8[ns]").astype(dt)
        a.reshape(-1)[nprng.random(n) < 0.1] = np.datetime64("NaT")
        return a
    if dt[0] == "m":
        return nprng.integers(-10**6, 10**6, shape).astype(dt)
    if dt == "cftime":  # dates of a calendar numpy has not: xarray writes counts with units and calendar
        import cftime
        cls = [cftime.DatetimeNoLeap, cftime.Datetime360Day, cftime.DatetimeJulian][nprng.integers(3)]
        days = nprng.integers(0, 20000, n)
        return np.array([cls(1990, 1, 1) + np.timedelta64(int(d), "D").item() for d in days],
                        dtype=object).reshape(shape)
    words = ["", "a", "abc", "héllo", "日本語", "x y z", "tab\tin", "long" * 7]
    a = np.array([words[i] for i in nprng.integers(0, len(words), n)], dtype=object).reshape(shape)
    if dt == "U":
        return a.astype("U")
    if dt == "S":
        return np.array([w.encode() for w in a.reshape(-1)], dtype="S").reshape(shape)
    return a


def nc_name(name: str) -> str:
    """The netCDF name the README gives a Zarr name: NFC, '/' and control characters '_'."""
    s = unicodedata.normalize("NFC", name)
    s = "".join("_" if c == "/" or ord(c) < 32 or ord(c) == 127 else c for c in s)
    return s


def name_map(ds: xr.Dataset) -> dict[str, str]:
    """The README's rule: a name netCDF holds keeps it; a changed one that meets another name,
    or a dimension's that is not its own coordinate's, gets '_'."""
    names = [str(n) for n in ds.variables]
    out = {n: n for n in names if nc_name(n) == n}
    taken = set(out.values())
    dims = {nc_name(str(d)) for d in ds.dims}
    for n in names:
        if n not in out:
            m = nc_name(n)
            own = [nc_name(str(d)) for d in ds[n].dims]
            while m in taken or (m in dims and own != [m]):
                m += "_"
            out[n] = m
            taken.add(m)
    return out


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple, np.ndarray)):
        a1 = np.atleast_1d(np.asarray(a))
        b1 = np.atleast_1d(np.asarray(b))
        if a1.shape != b1.shape:
            return False
        if a1.dtype.kind in "fc" or b1.dtype.kind in "fc":
            try:
                return bool(np.array_equal(a1.astype("f8"), b1.astype("f8"), equal_nan=True))
            except (TypeError, ValueError):
                return False
        return bool(np.array_equal(a1, b1))
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def attr_problems(where: str, src: dict, got: dict, left_out: str) -> list[str]:
    out = []
    for k, v in src.items():
        nk = nc_name(k)
        if k == "coordinates":  # xarray takes it as names of coordinates when it reads a netCDF file
            continue
        if v is None:
            if nk in got:
                out.append(f"{where}: attribute {k!r} is null in the source but {got[nk]!r} in the file")
            continue
        if nk not in got:
            if nk not in left_out and k not in left_out:
                out.append(f"{where}: attribute {k!r} = {v!r} missing and not in {LEFT_OUT}")
            continue
        g = got[nk]
        if isinstance(g, str) and not isinstance(v, str):
            # the README: objects, lists of strings, integers no type of the file holds: JSON text
            try:
                if same_value(v, json.loads(g)) or g == str(v):
                    continue
            except ValueError:
                pass
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, str) and g == v.replace("\x00", ""):  # netCDF4-python drops a text's NULs
            continue
        if not same_value(v, g):
            out.append(f"{where}: attribute {k!r}: source {v!r}, file {g!r}")
    return out


def _texts(values: Any) -> np.ndarray:
    """Strings, bytes or dates as str, in their shape."""
    values = np.asarray(values)
    return np.array([x.decode() if isinstance(x, bytes) else str(x) for x in values.reshape(-1)],
                    dtype=object).reshape(values.shape)


def _unpacked_otherwise(dtype: str, raw: dict, left_out: str, nn: str) -> bool:
    """xarray unpacks the source and the file otherwise, by what the README says the file holds.

    A scale_factor or add_offset that is null (no netCDF form: dropped), text, a JSON bool or
    a number the file cannot hold (left out), an integer (xarray picks the float type it
    unpacks into by the attribute's integer type, which JSON has not: a Python int in the
    source, the smallest type that holds it in the file), or either on a float16 (served
    as float, so unpacked in float32, not float16) or a bool (served as bytes: xarray
    unpacks them, then casts to bool)."""
    scaling = [k for k in ("scale_factor", "add_offset") if k in raw]
    return any(f"{nn}: attribute {k}" in left_out or raw[k] is None or isinstance(raw[k], int) for k in scaling
               ) or bool(scaling and dtype in ("float16", "bool"))


def compare(tag: str, src: xr.Dataset, nc: xr.Dataset, raw: dict[str, tuple[str, dict]]) -> list[str]:
    """``raw``: each source variable's dtype and attributes before xarray's CF decoding."""
    out = []
    left_out = str(nc.attrs.get(LEFT_OUT, ""))
    out += attr_problems(f"{tag} global", src.attrs, {k: v for k, v in nc.attrs.items() if k != LEFT_OUT},
                         left_out)
    names = name_map(src)
    for name, var in src.variables.items():
        nn = names[str(name)]
        if nn not in nc.variables and var.dims == (name,):  # a coordinate follows its dimension
            nn = next((str(v) for v in nc.variables if nc.variables[v].dims == (v,)
                       and str(v).startswith(nc_name(str(name)))), nn)
        if nn not in nc.variables:
            out.append(f"{tag}: variable {name!r} ({var.dtype}, {var.dims}) missing"
                       + ("" if nn in left_out else f", not in {LEFT_OUT}"))
            continue
        got = nc.variables[nn]
        want_dims = tuple(nc_name(str(d)) for d in var.dims)
        if tuple(d.rsplit("_", 1)[0] if d not in want_dims else d for d in got.dims) != want_dims:
            out.append(f"{tag}: {name!r} dims {got.dims} for the source's {var.dims}")
        a, b = var.values, got.values
        # a missing_value or _FillValue left out (README: no number of a type of the file)
        # leaves xarray no mask, so no float to widen into
        masks_left = any(f"{n}: attribute {k}" in left_out or f"{n}: {k}" in left_out
                         for k in ("missing_value", "_FillValue") for n in (nn, str(name)))
        unpacked_otherwise = any(_unpacked_otherwise(*raw[str(name)], left_out, n) for n in (nn, str(name)))
        # the source's own _Unsigned replaced by what the served type implies (README): xarray
        # reads a uint32 with _Unsigned "false" as int32, the file's as the uint32 it is
        unpacked_otherwise = unpacked_otherwise or any(
            f"{n}: attribute _Unsigned: the data served are" in left_out for n in (nn, str(name)))
        if unpacked_otherwise:
            pass
        elif got.encoding.get("dtype") == "bool" and a.dtype.kind == "O":
            # a bool masked by its missing_value or _FillValue: xarray makes the source's masked
            # values NaN in an object array, and a netCDF bool's True (it masks, then casts to bool)
            pass
        elif a.dtype.kind in "OUST":
            if str(got.encoding.get("missing_value", "")).startswith("["):
                # a list of strings as missing_value: xarray masks the source's strings of it (NaN);
                # a classic file holds no list of strings, so the file has its JSON text (README)
                keep = np.array([not (isinstance(x, float) and math.isnan(x)) for x in a.reshape(-1)])
                a, b = a.reshape(-1)[keep], np.asarray(b).reshape(-1)[keep]
            a, b = _texts(a), _texts(b)
            if a.shape != b.shape or not all(x == y for x, y in zip(a.reshape(-1), b.reshape(-1), strict=True)):
                out.append(f"{tag}: {name!r} strings differ: {a.reshape(-1)[:6]} / {b.reshape(-1)[:6]}")
        elif a.shape != b.shape:
            out.append(f"{tag}: {name!r} shape {b.shape} for {a.shape}")
        elif a.dtype.kind in "Mm":
            if b.dtype.kind != a.dtype.kind or not np.array_equal(a.astype("M8[ns]" if a.dtype.kind == "M" else
                                                                           "m8[ns]"), b, equal_nan=True):
                out.append(f"{tag}: {name!r} times differ: {a.reshape(-1)[:4]} / {b.reshape(-1)[:4]}")
        else:
            if a.dtype != b.dtype and not (a.dtype == np.float16 and b.dtype == np.float32) and not masks_left:
                out.append(f"{tag}: {name!r} dtype {b.dtype} for {a.dtype}")
            if not np.array_equal(a.astype("f8") if a.dtype.kind == "f" else a,
                                    b.astype("f8") if b.dtype.kind == "f" else b,
                                    equal_nan=a.dtype.kind == "f"):
                out.append(f"{tag}: {name!r} values differ: {a.reshape(-1)[:6]} / {b.reshape(-1)[:6]}")
        out += attr_problems(f"{tag} {name!r}", dict(var.attrs), dict(got.attrs), left_out)
    return out


def utf8_names(ds: xr.Dataset) -> xr.Dataset:
    def fix(n: object) -> object:
        try:
            return str(n).encode("latin-1").decode("utf-8")
        except UnicodeError:
            return n
    ds = ds.rename_dims({d: fix(d) for d in ds.dims if fix(d) != d})
    ds = ds.rename_vars({v: fix(v) for v in ds.variables if fix(v) != v})
    ds.attrs = {fix(k): v for k, v in ds.attrs.items()}
    for v in ds.variables.values():
        v.attrs = {fix(k): x for k, x in v.attrs.items()}
    return ds


def zarr_source(store: Path, group: str, fmt: int) -> Callable[[bool], xr.Dataset]:
    """xarray's read of one group of a Zarr store, CF-decoded or not."""
    return lambda decode: xr.open_zarr(store, group=group, zarr_format=fmt, consolidated=False, decode_cf=decode)


def check_group(mnt: Path, group: str, source: Callable[[bool], xr.Dataset]) -> list[str]:
    """The group's netCDF file against ``source`` (an opener: decode CF or not)."""
    nc = mnt / ".zvfs" / "netcdf" / f"{group}.nc"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = []
        try:
            src = source(True).load()
            with source(False) as undecoded:
                raw = {str(k): (str(v.dtype), dict(v.attrs)) for k, v in undecoded.variables.items()}
        except Exception:  # noqa: BLE001 - xarray cannot CF-decode the source: the file must still open
            with xr.open_dataset(nc, engine="netcdf4", decode_cf=False) as got:
                got.load()
            src = None
        # scipy reads only CDF-1 and CDF-2, and decodes names as Latin-1 where netCDF says UTF-8
        with nc.open("rb") as f:
            magic = f.read(4)
        engines = ["netcdf4"] + (["scipy"] if magic in (b"CDF\x01", b"CDF\x02") else [])
        for engine in engines if src is not None else []:
            try:
                with xr.open_dataset(nc, engine=engine) as got:
                    got = got.load()
                    if engine == "scipy":
                        got = utf8_names(got)
                    out += compare(f"{group} ({engine})", src, got, raw)
            except Exception as e:  # noqa: BLE001 - every failure to read is a finding
                out.append(f"{group} ({engine}): cannot read: {type(e).__name__}: {e}")
    res = run([tool("ncdump"), "-h", nc])
    if res.returncode != 0:
        out.append(f"{group}: ncdump -h failed: {res.stderr.strip()[:300]}")
    return out


def build(store: Path, fmt: int, seed: int, groups: int) -> dict[str, str]:
    """Write ``groups`` datasets drawn from ``seed`` as groups of one Zarr store; group -> recipe.

    A draw xarray refuses to write (a variable whose name holds '/', an attribute it
    will not encode) is skipped."""
    rng = random.Random(f"{seed}-{fmt}")
    shutil.rmtree(store, ignore_errors=True)
    recipes = {}
    for i in range(groups):
        ds, enc, recipe = draw(rng, fmt)
        group = f"g{i}/sub" if rng.random() < 0.15 else f"g{i}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ds.to_zarr(store, group=group, zarr_format=fmt, encoding=enc, consolidated=False, mode="w")
            except Exception:  # noqa: BLE001 - a draw the writer refuses ('x/y' as a name) is no case
                continue
        recipes[group] = f"{recipe} {ds!r} encoding={enc}"
    return recipes


# -- NCZarr, written by netCDF-C from random CDL --------------------------------------------

#: CDL type -> (numpy dtype, the CDL suffix of a constant)
CDL_TYPES = {"byte": ("i1", "b"), "ubyte": ("u1", "ub"), "short": ("i2", "s"), "ushort": ("u2", "us"),
             "int": ("i4", ""), "uint": ("u4", "u"), "int64": ("i8", "ll"), "uint64": ("u8", "ull"),
             "float": ("f4", "f"), "double": ("f8", ""), "char": (None, None)}
# no "string": netCDF-C 4.10's nccopy writes no NC_STRING variable or attribute to NCZarr


def _cdl_number(rng: random.Random, cdl_type: str) -> str:
    dt, suffix = CDL_TYPES[cdl_type]
    if dt[0] == "f":
        v = rng.choice(["NaN", "Infinity", "-Infinity", "0.0", "1.5", "-2.25", "1e30", f"{rng.uniform(-1e3, 1e3):.3f}"])
        return v + suffix  # NaNf, 1.5f: a float; NaN, 1.5: a double
    info = np.iinfo(dt)
    return f"{rng.choice([int(info.min), int(info.max), 0, 1, rng.randrange(int(info.min), int(info.max))])}{suffix}"


def _cdl_text(rng: random.Random) -> str:
    return json.dumps(rng.choice(["", "a", "text", "h\u00e9llo", "two words", "x" * 40]), ensure_ascii=False)


def _cdl_attr(rng: random.Random, target: str) -> str:
    """One attribute line: ``target`` is ``v:name`` or ``:name``."""
    t = rng.choice([*CDL_TYPES, "text"])
    if t in ("text", "char"):
        return f"  {target} = {_cdl_text(rng)} ;"
    return f"  {target} = {', '.join(_cdl_number(rng, t) for _ in range(rng.randrange(1, 4)))} ;"


def draw_cdl_group(rng: random.Random, name: str, outer: dict[str, int] | None = None) -> str:
    """One CDL group: dimensions, variables of every netCDF-4 atomic type, data and attributes,
    and sometimes a child group ``sub`` whose variables use its parent's dimensions too
    (NCZarr refers to them by path)."""
    own = {f"{'e' if outer else 'd'}{i}": rng.randrange(1, 9) for i in range(rng.randrange(1, 4))}
    dims = {**(outer or {}), **own}
    lines = [f"group: {name} {{", "dimensions:"] + [f"  {d} = {n} ;" for d, n in own.items()]
    lines.append("variables:")
    data = []
    for j in range(rng.randrange(1, 5)):
        t = rng.choice(list(CDL_TYPES))
        vdims = rng.sample(list(dims), rng.randrange(0, min(2, len(dims)) + 1))
        v = f"v{j}_{t}"
        lines.append(f"  {t} {v}({', '.join(vdims)}) ;" if vdims else f"  {t} {v} ;")
        for k in rng.sample(range(9), rng.randrange(0, 3)):  # one name twice: ncgen 4.10 crashed
            lines.append("  " + _cdl_attr(rng, f"{v}:a{k}"))
        if t != "char" and rng.random() < 0.3:
            lines.append(f"    {v}:_FillValue = {_cdl_number(rng, t)} ;")
        n = int(np.prod([dims[d] for d in vdims])) if vdims else 1
        if t == "char":
            # one string: a 2-d char array's data as strings a character each crashed ncgen 4.10
            values = [json.dumps("".join(rng.choice("abcxyz") for _ in range(n)))]
        else:
            values = [_cdl_number(rng, t) for _ in range(n)]
        if rng.random() < 0.8:  # else never written: the fill value
            data.append(f"  {v} = {', '.join(values)} ;")
    for k in rng.sample(range(9), rng.randrange(0, 3)):
        lines.append(_cdl_attr(rng, f":g{k}"))
    if data:
        lines += ["data:", *data]
    if outer is None and rng.random() < 0.25:
        lines.append(draw_cdl_group(rng, "sub", dims))
    lines.append("}")
    return "\n".join(lines)


def build_nczarr(work: Path, seed: int, groups: int) -> tuple[Path, Path, dict[str, str]]:
    """Random CDL groups: ncgen writes them as netCDF-4 (the reference), nccopy copies that into
    an NCZarr directory store. (store, reference file, group -> its CDL)."""
    rng = random.Random(f"{seed}-nczarr")
    texts = [draw_cdl_group(rng, f"g{i}") for i in range(groups)]
    cdl = "netcdf sweep {\n" + "\n".join(texts) + "\n}\n"
    recipes = {f"g{i}": text for i, text in enumerate(texts)}
    recipes.update({f"g{i}/sub": text for i, text in enumerate(texts) if "group: sub {" in text})
    work.mkdir(parents=True, exist_ok=True)
    (work / "sweep.cdl").write_text(cdl)
    ref, store = work / "sweep.nc", work / "sweep.file"
    shutil.rmtree(store, ignore_errors=True)
    run([tool("ncgen"), "-k", "nc4", "-o", ref, work / "sweep.cdl"], check=True)
    run([tool("nccopy"), ref, f"file://{store}#mode=nczarr,file"], check=True)
    return store, ref, recipes


def netcdf_source(ref: Path, group: str) -> Callable[[bool], xr.Dataset]:
    """xarray's read of one group of the netCDF-4 reference file, CF-decoded or not."""
    return lambda decode: xr.open_dataset(ref, group=group, engine="netcdf4", decode_cf=decode)

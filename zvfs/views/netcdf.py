"""``.zvfs/netcdf/``: every group as a classic netCDF file (CDF-1, -2 or -5), computed on the fly.

A classic netCDF file is a header (dimensions, attributes, and per variable
its type, shape and the offset where its data begins) followed by each
variable's data, contiguous, C order, big-endian. Everything in the header
comes from metadata, so the size is known without decoding; a read maps its
byte range to the variables it touches and each of those to the array's
decoded chunks, through the same cache, read-ahead and worker pool as
``data.raw``, converting to the served type and byte order on the way.

Which format: the oldest one that holds the group, so the oldest readers work.
CDF-1 when the file is under 2 GiB and every type is classic; CDF-2 for larger
files (one variable may pass 4 GiB when it is the last one: it is moved last
and its header ``vsize`` is clamped to 2**32-1, as the format says); CDF-5
when a type has no lossless classic form (int64, uint64, datetime64) or two
variables pass 4 GiB.

Type mapping (see :func:`var_type`): bool -> byte, float16 -> float,
uint8/16/32 -> byte/short/int with ``_Unsigned = "true"`` (the netCDF
convention; native ubyte/ushort/uint in a CDF-5 file), int64/uint64 -> CDF-5
int64/uint64, datetime64/timedelta64 -> int64 with CF ``units`` (datetime64 with
``calendar = "proleptic_gregorian"``, numpy's; NaT is the ``_FillValue`` of
both when the array names no other), fixed-width
bytes ``S<n>`` -> char with a ``strlen<n>`` dimension (``S1``: char, no extra dimension),
fixed-width Unicode ``U<n>`` -> char with a ``strlen<4n>`` dimension holding UTF-8 and
``_Encoding = "utf-8"`` (as xarray writes str to a classic file), variable-length str
-> the same char, as wide as the longest value (:func:`text_widths` reads the array
for it: the one thing here not from metadata). Complex, structured and other
variable-length arrays are left out, named in the global attribute ``zvfs_left_out``
with the reason.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zvfs.formats.meta import ArrayMeta, strict_json
from zvfs.formats.nczarr import BY_NAME, DefinitionOrder
from zvfs.views.arrays import DecodedArray, served_text_width
from zvfs.views.cfattrs import (
    SCALING,
    TEXT_MEANT,
    VALUE_TYPED,
    Typed,
    VarAttributes,
    array_attributes,
    cast_exactly,
    nc_name,
    translate,
    with_suffix,
)
from zvfs.views.node import FileNode
from zvfs.views.readahead import ReadAhead
from zvfs.views.v2mirror import consistent_dimensions, dimension_names
from zvfs.views.values import TEXT_CHUNK_LIMIT, TEXT_VLEN_KINDS, is_text_vlen
from zvfs.workers import gather

log = logging.getLogger(__name__)

NC_BYTE, NC_CHAR, NC_SHORT, NC_INT, NC_FLOAT, NC_DOUBLE = 1, 2, 3, 4, 5, 6
NC_UBYTE, NC_USHORT, NC_UINT, NC_INT64, NC_UINT64 = 7, 8, 9, 10, 11
NC_DIMENSION, NC_VARIABLE, NC_ATTRIBUTE = 10, 11, 12

#: the big-endian element of each netCDF type
NC_DTYPE = {
    NC_BYTE: np.dtype(">i1"), NC_CHAR: np.dtype("S1"), NC_SHORT: np.dtype(">i2"),
    NC_INT: np.dtype(">i4"), NC_FLOAT: np.dtype(">f4"), NC_DOUBLE: np.dtype(">f8"),
    NC_UBYTE: np.dtype(">u1"), NC_USHORT: np.dtype(">u2"), NC_UINT: np.dtype(">u4"),
    NC_INT64: np.dtype(">i8"), NC_UINT64: np.dtype(">u8"),
}  # fmt: skip

#: a classic-format (CDF-1/2) variable larger than this is "large": only the last may be
CDF2_VAR_LIMIT = 2**32 - 4
#: CDF-1 offsets are signed 32-bit
CDF1_FILE_LIMIT = 2**31 - 1
#: what a file's size may be (st_size is signed 64-bit), less room for the header
FILE_LIMIT = 2**63 - 1 - 2**32
#: each variable's data begins on its own page: a corrupt chunk's EIO (which fails
#: the kernel's whole page read) then never spills onto the header or another
#: variable, and every element is aligned. The gaps hold zeros; begins are explicit.
VAR_ALIGN = 4096
LEFT_OUT_ATTR = "zvfs_left_out"
#: netCDF-4 bookkeeping NCZarr keeps in .zattrs; a classic file has no such thing
NC4_RESERVED = ("_NCProperties", "_IsNetcdf4", "_SuperblockVersion")
ROOT_FILE = "root.nc"
ROOT_ARRAY_NAME = "data"

_TIME_UNITS = {"D": "days", "h": "hours", "m": "minutes", "s": "seconds",
               "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}  # fmt: skip
_CALENDAR_UNITS = ("W", "M", "Y")


class LeftOut(Exception):
    """An array with no classic netCDF form; the message is the reason shown to users."""


@dataclass(slots=True)
class VarType:
    """How one dtype is served: the netCDF type, the bytes' dtype, and the attributes it implies."""

    nc_type: int
    #: big-endian; same bytes as nc_type's element (unsigned stays unsigned here, times are
    #: datetime64/timedelta64 in the unit their ``units`` attribute names)
    served: np.dtype
    needs_cdf5: bool = False
    extra_attrs: dict[str, str] = field(default_factory=dict)
    strlen: int = 0  # fixed-width bytes: a trailing char dimension of this length


def var_type(dtype: np.dtype, cdf5: bool) -> VarType:
    """The closest netCDF type for ``dtype``; raises LeftOut with the reason when there is none."""
    kind, size = dtype.kind, dtype.itemsize
    if dtype.fields is not None:
        raise LeftOut("structured dtype: classic netCDF has no compound type")
    if kind == "b":  # xarray's mark: it reads such a variable back as bool
        return VarType(NC_BYTE, np.dtype(">i1"), extra_attrs={"dtype": "bool"})
    if kind == "i":
        code = {1: NC_BYTE, 2: NC_SHORT, 4: NC_INT, 8: NC_INT64}[size]
        return VarType(code, NC_DTYPE[code], needs_cdf5=code == NC_INT64)
    if kind == "u":
        if size == 8:
            return VarType(NC_UINT64, NC_DTYPE[NC_UINT64], needs_cdf5=True)
        served = np.dtype(f">u{size}")
        if cdf5:
            return VarType({1: NC_UBYTE, 2: NC_USHORT, 4: NC_UINT}[size], served)
        return VarType({1: NC_BYTE, 2: NC_SHORT, 4: NC_INT}[size], served, extra_attrs={"_Unsigned": "true"})
    if kind == "f":
        if size == 8:
            return VarType(NC_DOUBLE, NC_DTYPE[NC_DOUBLE])
        if size in (2, 4):
            return VarType(NC_FLOAT, NC_DTYPE[NC_FLOAT])
        raise LeftOut(f"float{size * 8}: no netCDF type holds it")
    if kind in "mM":
        unit = np.datetime_data(dtype)[0]
        if unit == "W" or (kind == "M" and unit in _CALENDAR_UNITS):
            # a week is seven days either way; months and years since 1970 are whole days,
            # but as durations they have no length in days
            unit = "D"
        # counts of the unit itself: an M8[10s] element holds tens of seconds, served as seconds
        # (its raw count labelled "seconds" read ten times too early); NaT stays NaT
        served = np.dtype(f">{kind}8[{unit}]")
        if unit not in _TIME_UNITS:  # ps, fs, as, and durations in months or years: no CF unit
            # still counts of the unit itself: an m8[2M] of 3 is served as 6 (months)
            return VarType(NC_INT64, served, needs_cdf5=True)
        name = _TIME_UNITS[unit]
        # numpy's calendar is the proleptic Gregorian one; CF's default mixes in the Julian
        # calendar before 1582-10-15, and moved such dates 10 days earlier
        extra = ({"units": f"{name} since 1970-01-01 00:00:00", "calendar": "proleptic_gregorian"}
                 if kind == "M" else {"units": name})
        return VarType(NC_INT64, served, needs_cdf5=True, extra_attrs=extra)
    if kind == "S" and size > 0:
        # one byte an element is netCDF's own char array (NCZarr's char variables): no strlen
        return VarType(NC_CHAR, np.dtype(f"S{size}"), strlen=size if size > 1 else 0)
    if kind == "c":
        raise LeftOut("complex numbers: classic netCDF has no complex type")
    if kind == "U" and size > 0:
        # as xarray writes a str variable to a classic file: UTF-8 in a char array, marked by
        # _Encoding (netCDF4-python and xarray read str back). The width is known from metadata
        # alone: UTF-8 never needs more bytes than UTF-32's 4 a code point; NULs pad each value
        return VarType(NC_CHAR, np.dtype(f"S{size}"), strlen=size, extra_attrs={"_Encoding": "utf-8"})
    raise LeftOut(f"dtype {dtype.str}: no classic netCDF type")


#: the variable-length text kinds, and the attributes their char variables carry
TEXT_VLEN = {kind: {"_Encoding": "utf-8"} for kind in TEXT_VLEN_KINDS}


def served_type(array: DecodedArray, cdf5: bool, width: int | str | None = None) -> VarType:
    """How ``array`` is served: :func:`var_type` of its dtype, or for variable-length text
    char of the ``width`` :func:`text_widths` measured (a str there is why none was)."""
    meta = array.meta
    if meta.vlen is None:
        vtype = var_type(meta.dtype, cdf5)
        if meta.format == "nczarr" and meta.dtype.kind == "S" and meta.dtype.itemsize > 1:
            # NCZarr's NC_STRING (|S<maxstrlen>; its char is |S1): UTF-8 text, as netCDF-C reads it
            vtype.extra_attrs = {**vtype.extra_attrs, "_Encoding": "utf-8"}
        return vtype
    if meta.vlen not in TEXT_VLEN:
        raise LeftOut(f"variable-length elements ({meta.vlen}): classic netCDF has no such type"
                      + (" (as char, trailing NUL bytes would be lost)" if meta.vlen == "vlen-bytes" else ""))
    if not isinstance(width, int):
        raise LeftOut(width or f"variable-length elements ({meta.vlen}): not measured")
    width = max(1, width)  # all empty: one NUL each (a zero-length dimension reads as unlimited)
    return VarType(NC_CHAR, np.dtype(f"S{width}"), strlen=width, extra_attrs=dict(TEXT_VLEN[meta.vlen]))


async def text_widths(arrays: dict[str, DecodedArray]) -> dict[str, int | str]:
    """Variable name -> width in bytes of the longest value (UTF-8), for each variable-length
    text array (or the reason it has none: too many values, a corrupt chunk). Each is read whole
    here: the width is in no metadata, and the file's size needs it. A store failure is
    raised (it fails this listing, and the next one tries again): it is no property of
    the array, to be left out for."""
    out: dict[str, int | str] = {}
    for name, array in sorted(arrays.items()):
        if not is_text_vlen(array.meta):
            continue
        got = await served_text_width(array)
        if isinstance(got, str):
            out[name] = got
        elif max(1, got.utf8) * math.prod(array.meta.chunks) > TEXT_CHUNK_LIMIT:
            out[name] = (f"its longest value holds {got.utf8:,} bytes: a chunk of fixed-width text "
                         f"would pass {TEXT_CHUNK_LIMIT:,} bytes")
        else:
            out[name] = got.utf8
    return out


def _unique(attrs: list[tuple[str, NcAttr]], where: str, left_out: dict[str, str]) -> list[NcAttr]:
    """``attrs`` ((source name, attribute) pairs) without a second attribute of one name (two
    source names that become one netCDF name, 'a/b' and 'a_b'): a header with both is not
    netCDF (netCDF-C reads the first twice, scipy the last). The one whose source name is its
    netCDF name is kept (the first kept, and 'a_b' read the value of an 'a/b' before it), else
    the first; the others are told in zvfs_left_out by their source names."""
    exact = {a.name for source, a in attrs if source == a.name}
    seen: set[str] = set()
    out = []
    for source, a in attrs:
        if a.name in seen or (a.name in exact and source != a.name):
            left_out[f"{where}attribute {source}"] = "another attribute has the same netCDF name"
            continue
        seen.add(a.name)
        out.append(a)
    return out


# -- header encoding -----------------------------------------------------------------


def _pad4(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


class HeaderWriter:
    """The classic-format header grammar; ``version`` 1, 2 or 5 sets the integer widths."""

    def __init__(self, version: int) -> None:
        self.version = version

    def non_neg(self, n: int) -> bytes:
        return struct.pack(">Q" if self.version == 5 else ">I", n)

    def offset(self, n: int) -> bytes:
        return struct.pack(">I" if self.version == 1 else ">Q", n)

    def name(self, text: str) -> bytes:
        raw = text.encode("utf-8")
        return self.non_neg(len(raw)) + _pad4(raw)

    def tagged(self, tag: int, items: Sequence[bytes]) -> bytes:
        if not items:
            return b"\0\0\0\0" + self.non_neg(0)  # ABSENT
        return struct.pack(">I", tag) + self.non_neg(len(items)) + b"".join(items)

    def attr(self, name: str, nc_type: int, values: bytes, nelems: int) -> bytes:
        return self.name(name) + struct.pack(">I", nc_type) + self.non_neg(nelems) + _pad4(values)


@dataclass(slots=True)
class NcAttr:
    name: str
    nc_type: int
    data: bytes  # big-endian values (or UTF-8 text)
    nelems: int


def text_attr(name: str, text: str) -> NcAttr:
    raw = text.encode("utf-8", "backslashreplace")  # see nc_name
    return NcAttr(name, NC_CHAR, raw, len(raw))


def _values_type(values: np.ndarray, cdf5: bool) -> np.ndarray | None:
    """``values`` in a dtype the file can hold without changing them, or None."""
    kind, size = values.dtype.kind, values.dtype.itemsize
    if kind == "b":
        return values.astype("i1")
    if kind == "f":
        return values.astype("f4" if size <= 4 else "f8")
    if kind in "iu":
        if kind == "i" and size <= 4 or kind == "u" and cdf5:
            return values
        if kind == "i" and cdf5:
            return values
        for cand in ("i1", "i2", "i4") if kind == "u" else ("i4",):
            conv = cast_exactly(values, np.dtype(cand))  # by range (uint8 200 was served as -56)
            if conv is not None:
                return conv
        # Python's ints: a cast of 2**64 - 1 to float and back is undefined
        if all(int(float(v)) == v for v in values.reshape(-1).tolist()):
            return values.astype("f8")
    return None


_NP_TO_NC = {
    ("i", 1): NC_BYTE, ("i", 2): NC_SHORT, ("i", 4): NC_INT, ("i", 8): NC_INT64,
    ("u", 1): NC_UBYTE, ("u", 2): NC_USHORT, ("u", 4): NC_UINT, ("u", 8): NC_UINT64,
    ("f", 4): NC_FLOAT, ("f", 8): NC_DOUBLE,
}  # fmt: skip


def typed_attr(name: str, typed: Typed, cdf5: bool, served: VarType | None = None) -> NcAttr | None:
    """One translated attribute as netCDF: text as char, numbers typed, anything else as JSON text.

    ``_FillValue``-like attributes (valid_min, ...) take the variable's own type
    when that keeps their values, as CF asks.
    """
    if typed.text is not None:
        return text_attr(name, typed.text)
    if typed.values is not None and typed.values.size > 1 and name in TEXT_MEANT:  # JSON's spelling: [1, 2]
        return text_attr(name, json.dumps(typed.json))
    if typed.values is None:
        if typed.json is None:
            return None  # null has no netCDF form
        return text_attr(name, json.dumps(strict_json(typed.json), allow_nan=False))
    values = typed.values
    if served is not None and name in VALUE_TYPED and served.nc_type != NC_CHAR:
        conv = cast_exactly(values, served.served)
        if conv is not None:
            return NcAttr(name, served.nc_type, conv.tobytes(), conv.size)
    fitted = _values_type(values, cdf5)
    if fitted is None:  # an integer no netCDF type of this file holds exactly
        listed = values.reshape(-1).tolist()
        return text_attr(name, json.dumps(listed[0] if len(listed) == 1 else listed))
    code = _NP_TO_NC[(fitted.dtype.kind, fitted.dtype.itemsize)]
    return NcAttr(name, code, fitted.astype(NC_DTYPE[code]).tobytes(), fitted.size)


# -- the file model ------------------------------------------------------------------


@dataclass(slots=True)
class NcVar:
    name: str
    array: DecodedArray
    vtype: VarType
    dims: list[str]
    attrs: list[NcAttr]
    nbytes: int
    begin: int = 0

    @property
    def vsize(self) -> int:
        return self.nbytes + (-self.nbytes % 4)


@dataclass
class NcLayout:
    """Everything a classic netCDF file of one group is, from metadata alone."""

    version: int
    header: bytes
    variables: list[NcVar]
    size: int


def _fill_attr(vattrs: VarAttributes, vtype: VarType, meta: ArrayMeta) -> NcAttr | None:
    """The variable's _FillValue in its served type; None when it has none, or when the
    value does not fit that type (300 for a uint8 array was served as 44: the wrong
    values would have read as missing)."""
    if vattrs.fill is None or meta.dtype.kind == "b":
        return None  # False is data, not "missing", in a bool array
    fill = np.asarray(vattrs.fill)
    if vtype.nc_type == NC_CHAR:  # one character; a string variable's fill has no char form
        return NcAttr("_FillValue", NC_CHAR, fill.tobytes(), 1) if fill.dtype.itemsize == 1 else None
    data = cast_exactly(fill.reshape(1), vtype.served)
    return None if data is None else NcAttr("_FillValue", vtype.nc_type, data.tobytes(), 1)


def build_layout(
    group_attrs: dict[str, Any],
    arrays: dict[str, DecodedArray],
    group_types: dict[str, str] | None = None,
    widths: dict[str, int | str] | None = None,
    order: DefinitionOrder = BY_NAME,
) -> NcLayout:
    """The header and variable offsets for one group; ``arrays`` maps variable name -> array,
    ``widths`` (:func:`text_widths`) gives each variable-length text array its width, and
    ``order`` the order of the variables and dimensions (NCZarr's definition order); the
    others follow, variables by name and dimensions by first use."""
    widths = widths or {}
    left_out: dict[str, str] = {}
    usable: dict[str, DecodedArray] = {}
    for name, array in sorted(arrays.items()):
        reason = _unusable(array)
        if reason is None:
            try:
                served_type(array, False, widths.get(name))
            except LeftOut as exc:
                reason = str(exc)
        if reason is not None:
            left_out[name] = reason
        else:
            usable[name] = array
    cdf5 = any(served_type(a, False, widths.get(n)).needs_cdf5 for n, a in usable.items())
    # CDF-1 and CDF-2 write a dimension's length in 32 bits: a longer one needs CDF-5 (and
    # then its types: unsigned bytes are NC_UBYTE there)
    cdf5 = cdf5 or any(n > 2**32 - 1 for a in usable.values() for n in a.meta.shape)
    dims_by_name = consistent_dimensions({n: a.meta for n, a in usable.items()}, generate=True, legal=nc_name)
    source_dims = {d for names in dims_by_name.values() for d in names or []}

    variables: list[NcVar] = []
    dim_sizes: dict[str, int] = {}
    # a name netCDF holds as it is stays that array's: 'cafe\u0301' (NFD, sorted first) took
    # 'caf\u00e9' and 'v\t' took 'v_', and the arrays of those names were served as 'caf\u00e9_'
    # and 'v__' (ds['v_'] read another array's values). The changed names give way.
    taken: set[str] = {name for name in usable if nc_name(name) == name}
    for name, array in usable.items():
        meta = array.meta
        vtype = served_type(array, cdf5, widths.get(name))
        dims = list(dims_by_name[name] or [])
        if vtype.strlen:  # a name no array's own dimension has
            strlen = f"strlen{vtype.strlen}"
            while strlen in source_dims:
                strlen += "_"
            dims.append(strlen)
        for d, n in zip(dims, [*meta.shape, *([vtype.strlen] if vtype.strlen else [])], strict=True):
            if dim_sizes.setdefault(d, n) != n:  # a name still clashing after the rename rule
                left_out[name] = f"dimension {d!r} has two sizes ({dim_sizes[d]} and {n})"
                break
        else:
            vattrs = array_attributes(meta)
            if vattrs.fill is None and meta.dtype.kind in "mM":  # NaT is numpy's missing time
                vattrs.fill = np.array("NaT", meta.dtype)
            if "_FillValue" in vattrs.attrs:  # not a value of the variable's type
                del vattrs.attrs["_FillValue"]
                left_out[f"{name}: _FillValue"] = f"not a value of {meta.dtype}"
            # what the served bytes are (units of a time's counts, _Unsigned, bool's dtype) wins
            # over the source's attribute of that name: a datetime64 array's own "days since
            # 2000-01-01" labelled the seconds since 1970 served, and dates read millennia off
            for src in [k for k in vattrs.attrs if nc_name(k) in vtype.extra_attrs]:
                typed = vattrs.attrs.pop(src)
                served = vtype.extra_attrs[nc_name(src)]
                if typed.text != served:
                    left_out[f"{name}: attribute {src}"] = f"the data served are {nc_name(src)} = {served!r}"
            named = [(k, text_attr(k, v)) for k, v in vtype.extra_attrs.items()]
            for k, t in vattrs.attrs.items():
                a = typed_attr(nc_name(k), t, cdf5, vtype)
                if a is None:
                    continue
                if a.name in VALUE_TYPED and t.text is None and a.nc_type == NC_CHAR != vtype.nc_type:
                    # a number no type holds (missing_value 2**70), as text: netCDF4 then
                    # failed every read of the variable ("Python int too large")
                    left_out[f"{name}: attribute {k}"] = "no number of a netCDF type of this file"
                    continue
                if a.name in SCALING and (a.nc_type == NC_CHAR or isinstance(t.json, bool)):
                    # text or a JSON bool (a byte 1 here) to unpack numbers with: xarray failed
                    # to open the file ("cannot convert float NaN to integer"; on text served
                    # as char: "invalid literal for int()")
                    left_out[f"{name}: attribute {k}"] = "not a number"
                    continue
                if a.name in SCALING and vtype.nc_type == NC_CHAR:
                    # numbers to unpack text with: xarray failed to open the file ("ufunc
                    # 'multiply' did not contain a loop"), where open_zarr of the source got
                    # by numpy repeating its bytes an integer number of times
                    left_out[f"{name}: attribute {k}"] = "text is not unpacked"
                    continue
                named.append((k, a))
            fill = _fill_attr(vattrs, vtype, meta)
            if fill is not None:
                named.insert(0, ("_FillValue", fill))  # first: a user attribute of its name gives way
            elif vattrs.fill is not None and vtype.nc_type != NC_CHAR and meta.dtype.kind != "b":
                left_out[f"{name}: _FillValue"] = f"{vattrs.fill!r} is not a value of {vtype.served}"
            nc_attrs = _unique(named, f"{name}: ", left_out)
            vname = nc_name(name)
            if vname != name:
                # nor a dimension's name, but for its own coordinate: xarray refuses a file whose
                # variable 'caf\u00e9' (once NFD) is no coordinate of the dimension 'caf\u00e9'
                own = dims_by_name[name] or []
                if dimension_names(meta) == [name] and own[0] not in taken:
                    vname = own[0]  # a coordinate keeps its dimension's name ('x/y' is 'x_y', or 'x_y_4')
                stem, n = vname, 0
                while vname in taken or (vname in source_dims and own != [vname]):
                    n += 1
                    vname = with_suffix(stem, "_" * n)
                taken.add(vname)
            nbytes = meta.size * vtype.served.itemsize
            variables.append(NcVar(vname, array, vtype, dims, nc_attrs, nbytes))
    # names are given in sorted order (which name gives way does not hang on the store's
    # order); the file lists them in the store's: netCDF-C's ncdump of an NCZarr store
    # and of its served file then list variables and dimensions alike
    rank = {n: i for i, n in enumerate(order.variables)}
    source = {id(a): n for n, a in usable.items()}
    variables.sort(key=lambda v: rank.get(source[id(v.array)], len(rank)))
    # no file holds more than 2**63 - 1 bytes (st_size): the largest variables give way, not
    # the group's file (it was EIO, and every other variable of the group with it)
    total = sum(v.vsize + VAR_ALIGN for v in variables)
    for _, v in sorted(((v.vsize, i), v) for i, v in enumerate(variables))[::-1]:  # the largest, the last
        if total <= FILE_LIMIT:
            break
        variables.remove(v)
        total -= v.vsize + VAR_ALIGN
        left_out[source[id(v.array)]] = (
            f"{v.vsize} bytes of data: the file would pass {FILE_LIMIT} bytes")
    # dimensions in the store's order, then in order of first use by the remaining variables
    used = {d for v in variables for d in v.dims}
    dim_order = {d: dim_sizes[d] for d in order.dimensions if d in used}
    for v in variables:
        for d in v.dims:
            dim_order.setdefault(d, dim_sizes[d])

    gattrs = _unique([
        (k, a)
        for k, t in translate(group_attrs, group_types).items()
        if k not in NC4_RESERVED and (a := typed_attr(nc_name(k), t, cdf5))
    ], "", left_out)
    if left_out:  # in place of a group attribute of that name, if it has one
        gattrs = [a for a in gattrs if a.name != LEFT_OUT_ATTR]
        gattrs.append(text_attr(LEFT_OUT_ATTR, "".join(f"{n}: {r}\n" for n, r in sorted(left_out.items()))))

    big = [v for v in variables if v.vsize > CDF2_VAR_LIMIT]
    version = 5 if cdf5 or len(big) > 1 else 2
    if version == 2 and big:
        variables.remove(big[0])
        variables.append(big[0])  # the one large variable must be the last (CDF-2)
    if version == 2:
        trial = _assemble(1, dim_order, gattrs, variables)
        if trial is not None:
            return trial
    layout = _assemble(version, dim_order, gattrs, variables)
    assert layout is not None  # only CDF-1 has a size bound
    return layout


def _unusable(array: DecodedArray) -> str | None:
    meta = array.meta
    if meta.error:
        return f"unusable metadata: {meta.error}"
    if meta.vlen is None and not array.readable:
        return "shape unknown"
    if 0 in meta.shape:
        return "zero-length dimension: classic netCDF reads it as the unlimited one"
    return None


def _assemble(version: int, dims: dict[str, int], gattrs: list[NcAttr], variables: list[NcVar]) -> NcLayout | None:
    """Header bytes and variable begins for ``version`` (the header's size depends on them);
    None for CDF-1 when the file would pass its 2 GiB. (Its header was packed first, and a
    begin past 4 GiB failed that with struct.error: a group of three 2 GiB arrays, a CDF-2
    file, failed the listing of every group's file.)"""
    w = HeaderWriter(version)
    dim_ids = {name: i for i, name in enumerate(dims)}

    def header(begins: list[int]) -> bytes:
        out = [b"CDF" + bytes([version]), w.non_neg(0)]
        out.append(w.tagged(NC_DIMENSION, [w.name(n) + w.non_neg(s) for n, s in dims.items()]))
        out.append(w.tagged(NC_ATTRIBUTE, [w.attr(a.name, a.nc_type, a.data, a.nelems) for a in gattrs]))
        entries = []
        for v, begin in zip(variables, begins, strict=True):
            vsize = v.vsize if version == 5 or v.vsize <= CDF2_VAR_LIMIT else 2**32 - 1
            entries.append(
                w.name(v.name)
                + w.non_neg(len(v.dims))
                + b"".join(w.non_neg(dim_ids[d]) for d in v.dims)
                + w.tagged(NC_ATTRIBUTE, [w.attr(a.name, a.nc_type, a.data, a.nelems) for a in v.attrs])
                + struct.pack(">I", v.vtype.nc_type)
                + w.non_neg(vsize)
                + w.offset(begin)
            )
        out.append(w.tagged(NC_VARIABLE, entries))
        return b"".join(out)

    hlen = len(header([0] * len(variables)))  # offsets have a fixed width: the length is known now
    pos = hlen
    begins = []
    for v in variables:
        pos += -pos % VAR_ALIGN
        begins.append(pos)
        pos += v.vsize
    if version == 1 and pos > CDF1_FILE_LIMIT:
        return None
    placed = [NcVar(v.name, v.array, v.vtype, v.dims, v.attrs, v.nbytes, b) for v, b in zip(variables, begins, strict=True)]
    data = header(begins)
    assert len(data) == hlen
    return NcLayout(version, data, placed, pos)


# -- the file node -------------------------------------------------------------------


async def read_var(var: NcVar, offset: int, length: int, ahead: ReadAhead | None = None) -> bytes | memoryview:
    """Bytes [offset, offset+length) of one variable's data as served (big-endian, netCDF type).

    The array's decoded chunks (those data.raw reads, read ahead by ``ahead``) are converted
    to the served type as the read copies them out: one pass over the read's bytes.
    """
    end = min(offset + length, var.nbytes)
    if offset >= end:
        return b""
    return await var.array.read_bytes(offset, end - offset, ahead, var.vtype.served)


class NetcdfFile(FileNode):
    """One group as a classic netCDF file: the header, then each variable's data at its begin."""

    def __init__(self, layout: NcLayout, mtime_ns: int, aheads: dict[str, ReadAhead] | None = None) -> None:
        self.layout = layout
        self.mtime_ns = mtime_ns
        # the header never changes while mounted; the data does unless the store is immutable
        self.immutable = all(v.array.ctx.immutable for v in layout.variables)
        #: one open's sequential detector per variable (None: the node in the tree, no read-ahead)
        self._aheads = aheads

    async def reader(self) -> FileNode:
        return NetcdfFile(self.layout, self.mtime_ns, {})

    @property
    def size(self) -> int:
        return self.layout.size

    def version(self) -> object:
        return (self.layout.size, tuple(v.array.content for v in self.layout.variables))

    def outdated(self) -> bool:
        return any(v.array.stale() for v in self.layout.variables)

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        """Header bytes, then each touched variable's slice (all variables fetched at once), zeros between."""
        end = min(offset + length, self.layout.size)
        if offset >= end:
            return b""
        header = self.layout.header
        pieces: list[tuple[int, int, NcVar | None]] = []  # (start, stop, variable or None for zeros)
        pos = offset
        if pos < len(header):
            pieces.append((pos, min(end, len(header)), None))
            pos = min(end, len(header))
        for var in self.layout.variables:
            stop = var.begin + var.vsize
            if pos >= end:
                break
            if stop <= pos:
                continue
            if pos < var.begin:
                pieces.append((pos, min(var.begin, end), None))
                pos = min(var.begin, end)
                if pos >= end:
                    break
            pieces.append((pos, min(end, stop), var))
            pos = min(end, stop)
        if pos < end:
            pieces.append((pos, end, None))

        async def one(i: int) -> bytes | memoryview:
            start, stop, var = pieces[i]
            if var is None:
                return header[start:stop] if start < len(header) else b"\0" * (stop - start)
            ahead = None
            if self._aheads is not None:
                ahead = self._aheads.get(var.name)
                if ahead is None:
                    ahead = self._aheads[var.name] = var.array.read_ahead()
            data = await read_var(var, start - var.begin, stop - start, ahead)
            if len(data) < stop - start:  # the padding to 4 bytes
                return bytes(data) + b"\0" * (stop - start - len(data))
            return data

        if len(pieces) == 1:  # a read inside one variable (streaming): no join, no copy
            return await one(0)
        wanted = [i for i, p in enumerate(pieces) if p[2] is not None]
        fetched = await gather(wanted, one) if wanted else {}
        parts = [fetched[i] if i in fetched else await one(i) for i in range(len(pieces))]
        return b"".join(parts)


def group_file_names(groups: Sequence[str]) -> dict[str, tuple[str, str]]:
    """group path -> (directory below netcdf/, file name): ``a/b`` -> ('a', 'b.nc'), root -> ('', 'root.nc').

    A name already taken, by the root's file (a top-level group called ``root``), by another
    group's file (``root_``), or by the directory of a group's children (group ``b`` beside a
    group ``b.nc`` with children: the directory hid the file), gets ``_`` before ``.nc``
    until it is free: ``root_.nc``, ``b_.nc``.
    """
    dirs = {"/".join(parts[:i]) for g in groups if g for parts in [g.split("/")] for i in range(1, len(parts))}
    taken = {("", ROOT_FILE)}
    out: dict[str, tuple[str, str]] = {"": ("", ROOT_FILE)} if "" in groups else {}

    def free(parent: str, stem: str) -> bool:
        return (parent, f"{stem}.nc") not in taken and f"{parent}/{stem}.nc".lstrip("/") not in dirs

    # a group whose own name is free keeps it first: 'root' (giving way to root.nc) took
    # root_.nc, sorted before the group really called 'root_', which became root__.nc
    named = sorted(x for x in groups if x)
    for g in named:
        parent, _, base = g.rpartition("/")
        if free(parent, base):
            taken.add((parent, f"{base}.nc"))
            out[g] = (parent, f"{base}.nc")
    for g in (x for x in named if x not in out):
        parent, _, base = g.rpartition("/")
        stem = base
        while not free(parent, stem):
            stem += "_"
        taken.add((parent, f"{stem}.nc"))
        out[g] = (parent, f"{stem}.nc")
    return out


def group_members(group_paths: Sequence[str], array_paths: Sequence[str]) -> dict[str, dict[str, str]]:
    """group path -> {variable name: array path} for every group, including the parents of arrays.

    A hierarchy that is one root array is one group (the root) with one variable, ``data``.
    """
    groups: dict[str, dict[str, str]] = {g: {} for g in group_paths}
    groups.setdefault("", {})
    for path in array_paths:
        if path == "":
            groups[""][ROOT_ARRAY_NAME] = ""
            continue
        parent, _, base = path.rpartition("/")
        groups.setdefault(parent, {})[base] = path
        while parent:  # bare prefixes between arrays and the root are groups too
            parent = parent.rpartition("/")[0]
            groups.setdefault(parent, {})
    return groups


async def netcdf_file(
    group_attrs: dict[str, Any],
    arrays: dict[str, DecodedArray],
    mtime_ns: int,
    group_types: dict[str, str] | None = None,
    order: DefinitionOrder = BY_NAME,
) -> NetcdfFile:
    """One group's file; its variable-length text arrays are read here for their width."""
    widths = await text_widths(arrays)
    return NetcdfFile(build_layout(group_attrs, arrays, group_types, widths, order), mtime_ns)



"""One CF-aware attribute translation, shared by the v2 mirror and the netCDF files.

Zarr attributes are JSON, but the readers that matter (xarray, netCDF-C, GDAL)
give some of them a type and a meaning:

- ``_FillValue`` is the CF missing value. Zarr v2 keeps it in the array's
  ``fill_value``, NCZarr in a typed attribute (its ``fill_value`` alone is the
  type's default fill); xarray writing Zarr v3 keeps it in the attributes,
  base64-encoded for floats, and leaves the v3 ``fill_value`` as a plain
  "unwritten chunk" value that no reader masks with (0 for a time variable).
- NCZarr types its attributes in ``_nczarr_attr.types`` ("<f4", ">i2",
  "|S1"...), so a float attribute stays float and "NaN" is a number.
- Strict JSON spells a non-finite float "NaN" / "Infinity" / "-Infinity"; the
  source's JSON may have the literals, which stay floats (numbers to every view).

:func:`array_attributes` turns one array's attributes into :class:`Typed`
values and finds its CF fill value once; the mirror renders them back as JSON
(:func:`json_attributes`), the netCDF writer as typed netCDF attributes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zvfs.formats.meta import ArrayMeta, strict_json
from zvfs.formats.nczarr import attribute_types

#: strict-JSON spellings of non-finite floats (meta.strict_json writes these; NCZarr types them)
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: attributes whose value has the variable's type in CF (and netCDF) conventions
VALUE_TYPED = ("_FillValue", "missing_value", "valid_min", "valid_max", "valid_range")
#: attributes that are numbers in CF: the variable is unpacked with them
SCALING = ("scale_factor", "add_offset")
#: attributes that are text in CF, the NUG or xarray: readers compare them with text ("true",
#: "bool", "... since ..."), and xarray failed to open a file where one was an array of several
#: numbers. A single number compares (unequal) as the source's JSON number does: it stays one
TEXT_MEANT = ("units", "calendar", "coordinates", "_Unsigned", "_Encoding", "dtype")


_BAD_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f/]")


#: the longest name every netCDF-C tool reads, in bytes of UTF-8: NC_MAX_NAME is 256,
#: and netCDF-C writes such a name, but ncdump fails on it ("Attribute not found")
NC_MAX_NAME = 255


def nc_name(name: str) -> str:
    """A valid netCDF name: NFC-normalized UTF-8 (netCDF-C looks names up so), no '/' or
    control characters, no trailing space, a legal first character, at most NC_MAX_NAME
    bytes (cut at a character's end). Two names may come out the same: the callers keep
    the one whose name it is already, else the first."""
    # what is no Unicode text (a lone surrogate from JSON, a name's byte that is not UTF-8)
    # as its escape, in ASCII: encoding the name failed every file of the view
    name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    name = unicodedata.normalize("NFC", name)
    name = _BAD_NAME_CHARS.sub("_", name).rstrip(" ") or "_"
    if not (name[0].isalnum() or name[0] == "_" or ord(name[0]) > 127):
        name = "_" + name
    raw = name.encode("utf-8")
    if len(raw) > NC_MAX_NAME:
        name = raw[:NC_MAX_NAME].decode("utf-8", "ignore").rstrip(" ")
    return name


def with_suffix(name: str, suffix: str) -> str:
    """``name + suffix`` within NC_MAX_NAME bytes, ``name`` cut at a character's end to make
    room: a rename of a 255-byte name ('<name>_4') was past it again."""
    room = NC_MAX_NAME - len(suffix.encode("utf-8"))
    return name.encode("utf-8")[:room].decode("utf-8", "ignore") + suffix


@dataclass(slots=True)
class Typed:
    """One attribute: ``text`` (a string) or ``values`` (1-d numbers with a dtype), and always
    the source's ``json`` value (what a JSON reader must keep seeing, e.g. in the mirror)."""

    text: str | None = None
    values: np.ndarray | None = None
    json: Any = None
    #: the JSON value was a list (a one-element list stays a list in the mirror)
    is_list: bool = False


@dataclass(slots=True)
class VarAttributes:
    """An array's attributes as readers should see them, plus its CF fill value."""

    attrs: dict[str, Typed] = field(default_factory=dict)
    #: the CF ``_FillValue`` as a 0-d array of the array's dtype, or None (no masking)
    fill: np.ndarray | None = None


def _numbers(value: Any, dtype: np.dtype | None = None) -> np.ndarray | None:
    """``value`` (a number, or a list of numbers / non-finite spellings) as a 1-d array, else None."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    out: list[Any] = []
    for v in items:
        if isinstance(v, str) and v in NONFINITE and (dtype is None or dtype.kind == "f"):
            out.append(NONFINITE[v])
        elif isinstance(v, bool | int | float) and not isinstance(v, str):
            out.append(v)
        else:
            return None
    if dtype is not None:
        try:
            return np.array(out, dtype=dtype).reshape(-1)
        except (OverflowError, ValueError, TypeError):
            return None
    if all(isinstance(v, bool) for v in out):
        return np.array(out, dtype="i1")
    if any(isinstance(v, bool) for v in out):
        return None
    if all(isinstance(v, int) for v in out):
        lo, hi = min(out), max(out)
        if -(2**31) <= lo and hi < 2**31:
            return np.array(out, dtype="i4")
        if -(2**63) <= lo and hi < 2**63:
            return np.array(out, dtype="i8")
        if 0 <= lo and hi < 2**64:  # uint64's "all ones" missing value was text, masking nothing
            return np.array(out, dtype="u8")
        return None
    return np.array(out, dtype="f8")


def translate_value(value: Any, type_str: str | None = None) -> Typed:
    """One JSON attribute value, typed by NCZarr's ``type_str`` when given."""
    if value is None:
        return Typed(json=None)
    dtype = None
    if isinstance(type_str, str):
        try:
            dtype = np.dtype(type_str)
        except Exception:  # noqa: BLE001 - numpy parses the string: TypeError, ValueError, SyntaxError...
            dtype = None  # an unknown type: the value is taken as JSON says
    if isinstance(value, str) and not (dtype is not None and dtype.kind in "iuf" and value in NONFINITE):
        return Typed(text=value, json=value)
    if dtype is not None and dtype.kind in "SU" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) == 1 or dtype.itemsize == np.dtype(f"{dtype.kind}1").itemsize:
            return Typed(text="".join(value), json=value)  # NCZarr char attributes may be split into characters
        # netCDF-C's NC_STRING values ("|S128": ["a", "bb", ""]) are strings, not characters:
        # joined, they were "abb"; their JSON text, as any list of strings
        return Typed(json=value)
    if dtype is not None and dtype.kind not in "biuf":
        dtype = None
    nums = _numbers(value, dtype.newbyteorder("=") if dtype is not None else None)
    if nums is not None:
        return Typed(values=nums, json=value, is_list=isinstance(value, list))
    return Typed(json=value)


def translate(attrs: dict[str, Any], types: dict[str, str] | None = None) -> dict[str, Typed]:
    """Every attribute but NCZarr's bookkeeping and ``_ARRAY_DIMENSIONS``, typed."""
    types = {**attribute_types(attrs), **(types or {})}
    out: dict[str, Typed] = {}
    for name, value in attrs.items():
        if name.lower().startswith("_nczarr") or name == "_ARRAY_DIMENSIONS":
            continue
        out[name] = translate_value(value, types.get(name))
    return out


def _base64_fill(text: str, dtype: np.dtype) -> np.ndarray | None:
    """xarray's Zarr v3 encoding of a fill value: base64 of the element's little-endian bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if dtype.kind not in "iufb":
        return None
    try:  # the element's own size, or (xarray's choice for floats) a float64
        stored = np.dtype(f"<{'i' if dtype.kind == 'b' else dtype.kind}{len(raw)}")
    except TypeError:
        return None
    return np.frombuffer(raw, dtype=stored).astype(dtype).reshape(())


def cast_exactly(values: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``values`` as ``dtype`` when every one comes through unchanged, else None. Integers
    are checked by range: a cast there and back wraps both ways (uint8 200 went to int8 -56
    and back to 200, and a valid_max of 200 was served as -56, masking every value)."""
    dtype = np.dtype(dtype)
    try:
        with np.errstate(all="ignore"):
            conv = values.astype(dtype)
            if dtype.kind in "iu" and values.dtype.kind in "iub":
                info = np.iinfo(dtype)
                fits = not values.size or info.min <= int(values.min()) and int(values.max()) <= info.max
                return conv if fits else None
            back = conv.astype(values.dtype)
    except (OverflowError, ValueError, TypeError):
        return None
    # 300 as uint8 is 44, 2.5 as int 2: a value of another type; NaN and NaT stay themselves
    return conv if np.array_equal(back, values, equal_nan=values.dtype.kind in "fcmM") else None


def _as_fill(typed: Typed, dtype: np.dtype) -> np.ndarray | None:
    """A ``_FillValue`` attribute as one element of ``dtype``."""
    if typed.text is not None:
        if typed.text in NONFINITE and dtype.kind in "fc":
            return np.array(NONFINITE[typed.text], dtype=dtype)
        if dtype.kind == "S":  # netCDF's char fill is the character itself ("z"), as NCZarr keeps it
            raw = typed.text.encode("utf-8")
            return np.array(raw, dtype=dtype) if 0 < len(raw) <= dtype.itemsize else None
        return _base64_fill(typed.text, dtype)
    if typed.values is not None and typed.values.size == 1:
        return cast_exactly(np.array(typed.values[0]), dtype)  # a value of another type is no fill
    return None


def _meta_fill(meta: ArrayMeta) -> np.ndarray | None:
    if meta.fill_value is None or meta.dtype.kind not in "biufcmM":
        return None
    try:
        return np.array(meta.fill_value, dtype=meta.dtype).reshape(())
    except (OverflowError, ValueError, TypeError):
        return None


def array_attributes(meta: ArrayMeta) -> VarAttributes:
    """The array's attributes and CF fill value, by the rules of the module doc.

    The CF fill is the ``_FillValue`` attribute when there is one; else, for v1
    and v2, the array's ``fill_value`` (xarray and netCDF-C read it so), and for
    NCZarr none (netCDF-C reads that ``fill_value`` as the type's default fill);
    for v3, the ``fill_value`` only when the array has dimensions and names none
    of them: xarray never masks with the v3 ``fill_value``, and it opens any
    array that names its dimensions, and every 0-d array (which has none to
    name; xarray writes one without ``dimension_names``).
    """
    source = meta.source if isinstance(meta.source, dict) else {}
    attrs = translate(meta.attributes, source.get("nczarr_attr_types"))
    for name in VALUE_TYPED[1:]:  # CF: these have the variable's type (when that keeps the values)
        typed = attrs.get(name)
        if typed is not None and typed.values is not None and meta.dtype.kind in "iuf":
            conv = cast_exactly(typed.values, meta.dtype.newbyteorder("="))
            if conv is not None:
                typed.values = conv
    typed_fill = attrs.pop("_FillValue", None)
    fill = _as_fill(typed_fill, meta.dtype) if typed_fill is not None else None
    if fill is None and typed_fill is None:
        # NCZarr keeps a fill set by the writer as a typed _FillValue attribute; its
        # fill_value alone is netCDF's default fill, which netCDF-C shows as no attribute
        # (a default masks by type in every netCDF reader, and NCZarr rounds the double's:
        # as _FillValue, 9.96921e+36 masked nothing, and a byte's -127 masked real data)
        if meta.format in ("zarr_v1", "zarr_v2") or (
                meta.format == "zarr_v3" and meta.shape and not meta.dimension_names):
            fill = _meta_fill(meta)
    elif fill is None:  # a _FillValue we cannot read as the array's type: keep it as it was
        attrs["_FillValue"] = typed_fill
    return VarAttributes(attrs, fill)


def json_value(typed: Typed) -> Any:
    """A translated attribute as a v2 ``.zattrs`` holds it: the source's JSON, but for what
    netCDF-C 4.9 cannot read. It fails the whole store's open on a list that is not all
    numbers (["a", "b"]: "Invalid argument"; [[1]], [{}]: "internal library error"; []) or
    holds an integer past int64, and reads NCZarr's text split into characters only as
    one string: those are their text (a list as its JSON, as the netCDF files hold it)."""
    if typed.text is not None:
        return typed.text
    if isinstance(typed.json, list) and typed.values is None:
        return json.dumps(strict_json(typed.json), allow_nan=False)
    return typed.json


def json_attributes(attrs: dict[str, Typed]) -> dict[str, Any]:
    """The attributes for a v2 ``.zattrs``; null ones are left out (netCDF-C 4.9 cannot open a
    store that has one, and null has no netCDF form)."""
    return {name: json_value(t) for name, t in attrs.items() if t.json is not None}


def legal_attributes(attrs: dict[str, Typed]) -> tuple[dict[str, Typed], list[str]]:
    """``attrs`` under their netCDF names (:func:`nc_name`), and the source names left out.

    netCDF-C fails on a name it cannot hold ('', ' lead', past NC_MAX_NAME: nccopy of the
    mirror copied nothing). Of two names that become one ('a/b' and 'a_b') the one named so
    already is kept, else the first, as in the netCDF files.
    """
    exact = {k for k in attrs if nc_name(k) == k}
    out: dict[str, Typed] = {}
    dropped: list[str] = []
    for k, typed in attrs.items():
        name = nc_name(k)
        if name in out or (name in exact and name != k):
            dropped.append(k)
            continue
        out[name] = typed
    return out, dropped


def nczarr_type(typed: Typed) -> str | None:
    """NCZarr's type string for an attribute ("<f4", "<U1" for text), or None (left to inference).

    netCDF-C 4.9 reads these types from ``_NCZARR_ATTR`` even in pure-Zarr mode, so the
    mirror keeps a float a float and a ``_FillValue`` the variable's type.
    """
    if typed.text is not None:
        return "<U1"
    if typed.values is not None:
        return typed.values.dtype.newbyteorder("<").str
    return None

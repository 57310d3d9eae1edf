"""Helpers shared by the format modules: JSON loading, key joining, fill values."""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from ..codecs import CodecError
from ..stores.base import KeyNotFound, Store, StoreError, TooLarge
from .meta import FormatError


def join(path: str, name: str) -> str:
    """Key of ``name`` inside array/group ``path`` ('' is the root; an empty ``name`` is ``path``)."""
    return f"{path}/{name}" if path and name else path or name


def attributes_of(doc: dict[str, Any] | None) -> dict[str, Any]:
    """A node's ``attributes``, or {} when it has none, or none that is a JSON object (a list
    is valid JSON, and zarr-python opens the array, but it holds no attribute by name)."""
    attrs = (doc or {}).get("attributes")
    return attrs if isinstance(attrs, dict) else {}


#: metadata nested deeper than this is refused: Zarr documents need a handful of levels, and
#: every later step (attribute cleaning, meta.json, the v2 mirror) may walk it recursively
MAX_JSON_DEPTH = 100
#: values a metadata document may hold. Parsed, a value costs far more than its text: "{},"
#: is 3 bytes and an empty dict 64 (and discovery walks each container once more), so a
#: document within MAX_JSON_BYTES of them took 14 GiB of the daemon (a 200 KiB zip of it).
#: This many take at most about 600 MiB; consolidated metadata of 100,000 arrays holds
#: about 5 million (a root's that holds more is passed over: the store is walked instead)
MAX_JSON_VALUES = 1 << 23
#: values all the documents one discovery reads may hold together: the bound of one
#: document times the documents of a store is no bound (20 documents of 8 million numbers, a
#: 335 KiB zip, kept 2.8 GiB). Past it, each further document is its node's error
MAX_DISCOVERY_VALUES = 1 << 24
#: bytes all the documents one discovery reads may hold together: one document is bounded
#: (MAX_JSON_BYTES), but groups of one 200 MB attribute each took the daemon past 1.6 GiB
#: (kept about 4 times: parsed, as meta.json, in the v2 mirror's documents and netCDF
#: headers; a helper's audit). Past it, each further document is its node's error
MAX_DISCOVERY_BYTES = 512 << 20

#: what the running discovery may still parse ([values, bytes], mutable), or None outside one
_values_left: ContextVar[list[int] | None] = ContextVar("zvfs_json_values_left", default=None)
#: a discovery may parse in several threads at once (its probes of a remote store), each
#: with a copy of its context and so the same [count]
_values_lock = threading.Lock()


@contextmanager
def values_budget() -> Iterator[None]:
    """Within this block (one thread's discovery), the documents parse_json reads hold at
    most MAX_DISCOVERY_VALUES values and MAX_DISCOVERY_BYTES bytes together."""
    token = _values_left.set([MAX_DISCOVERY_VALUES, MAX_DISCOVERY_BYTES])
    try:
        yield
    finally:
        _values_left.reset(token)


def parse_json(raw: bytes, key: str) -> Any:
    """Parse a metadata document; FormatError naming ``key`` if it is not JSON or is absurdly deep.

    ``json.loads`` raises RecursionError (not ValueError) on deep nesting; that must stay a
    problem of this one document, never escape into discovery and break other arrays.
    """
    data = raw if isinstance(raw, bytes | bytearray) else bytes(raw)
    # every value but the first follows a ",", a ":" or an opening bracket: counted in C,
    # before a single object is made (the count includes those inside strings: a bound)
    values = data.count(b",") + data.count(b":") + data.count(b"[") + data.count(b"{")
    if values > MAX_JSON_VALUES:
        raise FormatError(f"{key}: JSON of more than {MAX_JSON_VALUES} values ({values} separators); "
                          "not metadata zvfs reads")
    left = _values_left.get()
    if left is not None:
        with _values_lock:
            if values > left[0]:
                raise FormatError(f"{key}: the metadata read before it holds so many values that its "
                                  f"{values} more pass the {MAX_DISCOVERY_VALUES} a discovery reads")
            if len(data) > left[1]:
                raise FormatError(f"{key}: the metadata read before it holds so many bytes that its "
                                  f"{len(data)} more pass the {MAX_DISCOVERY_BYTES} a discovery reads")
            left[0] -= values
            left[1] -= len(data)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{key}: malformed JSON ({exc})") from exc
    except RecursionError:
        raise FormatError(f"{key}: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    depth = json_depth(doc, MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise FormatError(f"{key}: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    return doc


def json_depth(doc: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), counted without recursion;
    stops early once it is beyond ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((v, depth) for v in value if isinstance(v, dict | list))
    return deepest


#: bytes a metadata document may hold: consolidated metadata of a large hierarchy runs to
#: tens of MiB; a bigger one (a zip member inflating to gigabytes, a sparse file) is refused
#: before it is read, as a broken node
MAX_JSON_BYTES = 256 << 20


def get_metadata(store: Store, key: str) -> bytes:
    """``key``'s bytes, at most MAX_JSON_BYTES (FormatError past that); KeyNotFound and the
    store's other errors pass through."""
    try:
        return store.get_at_most(key, MAX_JSON_BYTES)
    except TooLarge as exc:
        raise FormatError(str(exc)) from None


def load_json(store: Store, key: str, missing_ok: bool = False) -> Any:
    """Fetch and parse ``key``; None if missing and ``missing_ok``."""
    try:
        raw = get_metadata(store, key)
    except KeyNotFound:
        if missing_ok:
            return None
        raise
    except StoreError as exc:
        raise FormatError(f"{key}: {exc}") from exc
    return parse_json(raw, key)


def fetch_and_decode(
    store: Store, key: str, decode: Callable[[bytes], np.ndarray], limit: int | None = None
) -> np.ndarray | None:
    """``decode(store[key])``; None when the key was never written. Any store or codec
    failure becomes a FormatError that names the key. With ``limit``, a stored chunk
    bigger than that is refused before it is read (a zip member that inflates to
    gigabytes)."""
    try:
        data = store.get(key) if limit is None else store.get_at_most(key, limit)
    except KeyNotFound:
        return None
    except StoreError as exc:
        raise FormatError(f"{key}: {exc}") from exc
    try:
        return decode(data)
    except CodecError as exc:
        raise FormatError(f"{key}: {exc}") from exc


def load_object(store: Store, key: str, missing_ok: bool = False) -> dict[str, Any] | None:
    """Like load_json but the document must be a JSON object."""
    doc = load_json(store, key, missing_ok)
    if doc is None and missing_ok:
        return None
    if not isinstance(doc, dict):
        raise FormatError(f"{key}: expected a JSON object")
    return doc


def int_tuple(value: Any, what: str, key: str) -> tuple[int, ...]:
    """A list of non-negative ints (shape, chunks) or FormatError."""
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise FormatError(f"{key}: {what} must be a list of non-negative integers, got {value!r}")
    return tuple(value)


_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def float_value(value: Any, key: str, floatish: bool = True) -> float:
    """A JSON float fill as zarr-python 3 reads one: a number (true and false among them),
    "NaN", "Infinity" or "-Infinity", or, where ``floatish``, any other string Python's
    float() reads ("1e3", " 2.5"). A "0x..." bit pattern is :func:`_float_bits`'s: as a
    Python float a signalling NaN would be quieted."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        if value in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value]
        if floatish:
            try:
                return float(value)
            except ValueError:
                pass
    raise FormatError(f"{key}: bad float fill_value {value!r}")


_FLOAT_CODES = {2: ">e", 4: ">f", 8: ">d"}


def _float_bits(value: Any, itemsize: int, key: str, zarr_format: int, floatish: bool = True) -> bytes:
    """A JSON float fill's big-endian bytes. In Zarr v3 a "0x..." bit pattern of the
    dtype's width is taken as given (NaN payloads and signalling NaNs kept, as the spec
    has it); one of another float width (4, 8 or 16 hex digits) is that float's value, as
    zarr-python reads it. Zarr v2 has no bit patterns: zarr-python refuses them there.
    Anything else goes through :func:`float_value`."""
    if isinstance(value, str) and value.startswith("0x") and zarr_format == 3:
        try:
            raw = bytes.fromhex(value[2:])
        except ValueError as exc:
            raise FormatError(f"{key}: bad hex fill_value {value!r}") from exc
        if len(value) - 2 != 2 * len(raw) or len(raw) not in _FLOAT_CODES:
            raise FormatError(f"{key}: bad hex fill_value {value!r}: expected 4, 8 or 16 hex digits")
        if len(raw) == itemsize:
            return raw
        value = struct.unpack(_FLOAT_CODES[len(raw)], raw)[0]  # as zarr-python reads it
    with np.errstate(over="ignore"):  # 1e300 in a float16 is inf, as in zarr-python: no warning
        return np.array(float_value(value, key, floatish), dtype=f">f{itemsize}").tobytes()


def _int_value(value: Any, key: str) -> int:
    """A JSON integer fill as zarr-python 3 reads one: an int (true and false among them),
    a float with no fraction, or a string Python's int() reads ("42", " -7", "1_000")."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise FormatError(f"{key}: bad integer fill_value {value!r}")


def fill_scalar(value: Any, dtype: np.dtype, key: str, zarr_format: int = 3) -> Any:
    """Decode a JSON fill value of Zarr ``zarr_format`` (1, 2 or 3) into a numpy scalar of
    ``dtype``, taking what zarr-python 3 takes and refusing what it refuses.

    Floats keep their exact bit pattern when given in hex (NaN payloads matter for
    byte-exact output), so the result is built through the bytes where needed. A complex
    fill is [re, im]; one number alone is its real part only in Zarr v1, whose fill numpy
    takes as it is.
    """
    if value is None:
        return None
    kind = dtype.kind
    try:
        if kind == "O":
            return value
        if kind == "b":
            if isinstance(value, list | dict):
                # truthy as Python sees it, but no bool: zarr-python fails on it (or
                # broadcasts a list over the chunk, element by element)
                raise FormatError(f"{key}: bad bool fill_value {value!r}")
            return np.array(bool(value), dtype=dtype)[()]
        if kind in "iu":
            value = _int_value(value, key)
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max:
                raise FormatError(f"{key}: fill_value {value} out of range for {dtype}")
            return np.array(value, dtype=dtype)[()]
        if kind == "f":
            raw = _float_bits(value, dtype.itemsize, key, zarr_format)
            return np.frombuffer(raw, dtype=dtype.newbyteorder(">"))[0].astype(dtype)
        if kind == "c":
            # [re, im], each part through its bits: a Python float of a float32 signalling
            # NaN is quieted (0x7f800001 became 0x7fc00001). One number alone zarr-python
            # (3.1, v2 and v3) refuses: zvfs served it as the real part
            if isinstance(value, list | tuple) and len(value) == 2:
                parts = value
            elif zarr_format == 1:
                parts = (value, 0.0)
            else:
                raise FormatError(f"{key}: bad complex fill_value {value!r}: expected [real, imaginary]")
            half = dtype.itemsize // 2
            out = np.zeros(1, dtype=dtype.newbyteorder("="))
            bits = out.view(f"u{half}")
            for i, part in enumerate(parts):
                # each part a number or a special string: zarr-python reads no "1.5" here
                raw = _float_bits(part, half, key, zarr_format, floatish=False)
                bits[i] = np.frombuffer(raw, dtype=f">u{half}")[0]
            return out.astype(dtype)[0]
        if kind in "Mm":
            if isinstance(value, str) and value == "NaT":
                return np.array("NaT", dtype=dtype)[()]
            if not isinstance(value, int):  # zarr-python reads no 1.0 or "1" here
                raise FormatError(f"{key}: bad time fill_value {value!r}: an integer or \"NaT\"")
            return np.array(value, dtype="i8").view(dtype.newbyteorder("="))[()].astype(dtype)
        if kind == "U":
            if not isinstance(value, str):
                raise FormatError(f"{key}: bad string fill_value {value!r}")
            return np.array(value, dtype=dtype)[()]
        if kind in "SV":
            if isinstance(value, int) and value == 0:
                raw = b""
            elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                raw = bytes(value)
            elif isinstance(value, str):
                raw = base64.b64decode(value.encode("ascii"), validate=True)
            else:
                raise FormatError(f"{key}: bad bytes fill_value {value!r}")
            if kind == "S":
                return np.array(raw, dtype=dtype)[()]
            raw = raw.ljust(dtype.itemsize, b"\0")[: dtype.itemsize]
            return np.frombuffer(raw, dtype=dtype)[0]
    except FormatError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise FormatError(f"{key}: bad fill_value {value!r} for {dtype}: {exc}") from exc
    raise FormatError(f"{key}: unsupported dtype {dtype} for fill_value")


def vlen_fill(value: Any, vlen: str, key: str) -> Any:
    """The fill of a variable-length array as zarr-python 3 reads it (null: none). Text
    takes a string, or a number as its text (5 is "5", true "True"); bytes take base64.
    Any other JSON is the array's metadata error, as zarr-python refuses it: kept as it
    was, a list or object was served as the fill of every unwritten element, and a
    number as no text at all."""
    if value is None or vlen not in ("vlen-utf8", "vlen-bytes"):
        return value
    if vlen == "vlen-utf8":
        if isinstance(value, str):
            return value
        if isinstance(value, int | float):  # bool among them, as Python's str() spells it
            return str(value)
        raise FormatError(f"{key}: bad fill_value {value!r} for variable-length text: a string or a number")
    if not isinstance(value, str):
        raise FormatError(f"{key}: bad fill_value {value!r} for variable-length bytes: base64 text")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except ValueError as exc:  # binascii.Error, and text beyond ASCII
        raise FormatError(f"{key}: bad fill_value {value!r} for variable-length bytes: {exc}") from exc


def split_dimension_names(attrs: dict[str, Any], ndim: int) -> tuple[str | None, ...] | None:
    """Pop the xarray convention ``_ARRAY_DIMENSIONS`` from ``attrs``; names if they fit ndim."""
    dims = attrs.pop("_ARRAY_DIMENSIONS", None)
    if isinstance(dims, list) and len(dims) == ndim and ndim > 0:
        return tuple(d if isinstance(d, str) else None for d in dims)
    return None

"""Byte encoders for the output formats legacy tools open: NPY, PLY, TrackVis .trk, SWC.

Pure functions from numpy arrays to bytes, plus the size formulas the views use
to give a file its length before anything is decoded. Each size function and
its encoder agree by construction (same header bytes, fixed row widths).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from zvfs.views.npy import npy_header

# --- NPY -------------------------------------------------------------------------------------


def npy_bytes(arr: np.ndarray) -> bytes:
    """A whole small array as an NPY file (the header is data.npy's)."""
    arr = np.ascontiguousarray(arr)
    return npy_header(arr.dtype, arr.shape) + arr.tobytes()


def npy_size(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return len(npy_header(dtype, shape)) + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


# --- PLY -------------------------------------------------------------------------------------

_PLY_TYPES = {
    "i1": "char", "u1": "uchar", "b1": "uchar", "i2": "short", "u2": "ushort", "i4": "int",
    "u4": "uint", "i8": "double", "u8": "double", "f2": "float", "f4": "float", "f8": "double",
}
_PLY_NP = {"char": "i1", "uchar": "u1", "short": "<i2", "ushort": "<u2", "int": "<i4",
           "uint": "<u4", "float": "<f4", "double": "<f8"}
AXES = ("x", "y", "z")


def ply_type(dtype: np.dtype) -> str:
    """PLY scalar type for a numpy dtype. PLY has no 64-bit integer: those are doubles, exact
    to 2**53, where narrowing them to 32 bits served 10**10 as 1410065408 (and 3e9 as a
    negative coordinate)."""
    return _PLY_TYPES.get(np.dtype(dtype).str[1:], "double")


def ply_name(name: str) -> str:
    """``name`` as a PLY property name: a header line is ``property <type> <name>`` split on
    whitespace, so every character that is not printable ASCII other than space (whitespace,
    newlines, control and non-ASCII characters) becomes ``_``, one per character. A name left
    as it was (``my attr`` read as two tokens, a newline started a header line of its own)
    made the file unreadable, and ``.encode("ascii")`` of a non-ASCII one failed the header."""
    return "".join(ch if "!" <= ch <= "~" else "_" for ch in name) or "_"


def ply_channels(dtype: np.dtype, ncols: int) -> tuple[np.dtype, int]:
    """(dtype, channels) an attribute takes in a PLY file. PLY has no complex type: a complex
    column is two channels, its real then its imaginary part (cast to one float, the imaginary
    part was lost without a word)."""
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return np.dtype(f"{dt.byteorder if dt.byteorder != '|' else '<'}f{dt.itemsize // 2}"), 2 * ncols
    return dt, ncols


def ply_channel_values(a: np.ndarray) -> np.ndarray:
    """An attribute's rows as its PLY channels (``ply_channels``): complex as real, imaginary."""
    if a.dtype.kind == "c":
        a = np.ascontiguousarray(a)
        return a.view(a.real.dtype).reshape(len(a), -1)
    return a.reshape(len(a), -1)


def vertex_columns(ndim: int, pos_dtype: np.dtype,
                   attrs: Sequence[tuple[str, np.dtype, int]]) -> list[tuple[str, str]]:
    """(property name, PLY type) for positions and attribute channels, names made unique."""
    names = [AXES[i] if i < 3 else f"axis{i}" for i in range(ndim)]
    cols = [(n, ply_type(pos_dtype)) for n in names]
    for prop_names, (_name, dt, ncols) in zip(attribute_properties(names, attrs), attrs, strict=True):
        cols.extend((s, ply_type(ply_channels(dt, ncols)[0])) for s in prop_names)
    return cols


def attribute_properties(axes: Sequence[str],
                         attrs: Sequence[tuple[str, np.dtype, int]]) -> list[list[str]]:
    """The PLY property names of each attribute: ``ply_name(name)``, ``<that>_<j>`` per
    channel of a multi-column one. Where one of them is taken (by an axis, an earlier
    attribute or channel, or another name that sanitises the same), ``attr_<that>``, then
    ``attr_<that>_2``, ``_3``, ... until all are free: ``x`` and ``attr_x`` together made
    the second ``attr_x`` twice (plyfile: duplicate field), failing the whole file."""
    taken = set(axes)
    out = []
    for name, dt, ncols in attrs:
        ncols = ply_channels(dt, ncols)[1]
        safe = ply_name(name)
        k = 0
        while True:
            base = safe if k == 0 else f"attr_{safe}" if k == 1 else f"attr_{safe}_{k}"
            props = [base] if ncols == 1 else [f"{base}_{i}" for i in range(ncols)]
            if taken.isdisjoint(props):
                break
            k += 1
        taken.update(props)
        out.append(props)
    return out


def ply_header(n_vertices: int, columns: list[tuple[str, str]], n_faces: int, face_width: int,
               n_edges: int, comment: str) -> bytes:
    """The header; ``columns`` named by ``vertex_columns``, the comment (it carries the store's
    geometry type) kept to one line of printable ASCII."""
    comment = "".join(ch if " " <= ch <= "~" else "_" for ch in comment)
    lines = ["ply", "format binary_little_endian 1.0", f"comment {comment}", f"element vertex {n_vertices}"]
    lines += [f"property {t} {n}" for n, t in columns]
    if n_faces:
        lines += [f"element face {n_faces}", "property list uchar int vertex_indices"]
    if n_edges:
        lines += [f"element edge {n_edges}", "property int vertex1", "property int vertex2"]
    lines.append("end_header")
    return ("\n".join(lines) + "\n").encode("ascii")


def ply_size(n_vertices: int, columns: list[tuple[str, str]], n_faces: int, face_width: int,
             n_edges: int, comment: str) -> int:
    row = ply_row_bytes(columns)
    return (len(ply_header(n_vertices, columns, n_faces, face_width, n_edges, comment))
            + n_vertices * row + n_faces * (1 + 4 * face_width) + n_edges * 8)


def ply_vertex_records(positions: np.ndarray, attrs: Sequence[np.ndarray],
                       columns: list[tuple[str, str]]) -> bytes:
    """The binary vertex rows for ``columns`` (positions first, then attribute channels)."""
    n, ndim = positions.shape
    rec = np.empty(n, dtype=[(c, _PLY_NP[t]) for c, t in columns])
    for i in range(ndim):
        rec[columns[i][0]] = positions[:, i]
    k = ndim
    for a in attrs:
        flat = ply_channel_values(a)
        for j in range(flat.shape[1]):
            rec[columns[k][0]] = flat[:, j]
            k += 1
    return rec.tobytes()


def ply_face_bytes(faces: np.ndarray) -> bytes:
    if not len(faces):
        return b""
    width = faces.shape[1]
    f = np.empty(len(faces), dtype=[("n", "u1"), ("v", "<i4", (width,))])
    f["n"] = width
    f["v"] = faces
    return f.tobytes()


def ply_edge_bytes(edges: np.ndarray) -> bytes:
    return np.ascontiguousarray(edges, dtype="<i4").tobytes() if len(edges) else b""


def ply_bytes(positions: np.ndarray, attrs: Sequence[tuple[str, np.ndarray]], faces: np.ndarray,
              edges: np.ndarray, comment: str) -> bytes:
    """Binary little-endian PLY: vertices (+ attribute properties), faces, edges."""
    n, ndim = positions.shape
    specs = [(name, a.dtype, 1 if a.ndim == 1 else int(np.prod(a.shape[1:]))) for name, a in attrs]
    columns = vertex_columns(ndim, positions.dtype, specs)
    width = faces.shape[1] if faces.ndim == 2 and len(faces) else 3
    return b"".join([
        ply_header(n, columns, len(faces), width, len(edges), comment),
        ply_vertex_records(positions, [a for _, a in attrs], columns),
        ply_face_bytes(faces),
        ply_edge_bytes(edges),
    ])


def ply_row_bytes(columns: list[tuple[str, str]]) -> int:
    return sum(np.dtype(_PLY_NP[t]).itemsize for _, t in columns)


# --- TrackVis .trk ------------------------------------------------------------------------------

TRK_HEADER_SIZE = 1000
#: float32, TrackVis's only property type, holds integers exactly up to here
_F4_EXACT = 2**24


def trk_id_properties(ids: Sequence[int]) -> tuple[str, ...]:
    """The per-streamline properties naming each streamline's object.

    Readers drop a streamline of no points (nibabel does), so a level's objects
    and a file's streamlines cannot be matched by position once one is empty:
    the view leaves empty objects out and tells each streamline's object id.
    Ids past float32's exact range ride in 24-bit parts, high to low: two (``_hi``,
    ``_lo``) up to 2**48, three (``_hi``, ``_mid``, ``_lo``) past it (uint64 segment ids).
    A negative id's sign rides in the high part (the others are 0..2**24-1), so the same
    sum gives it back; the range is checked on both sides (only the largest id was, and
    -2**30 went out as 0).
    """
    top = max(ids, default=0)
    low = min(ids, default=0)
    if -_F4_EXACT <= low and top < _F4_EXACT:
        return ("object_id",)
    if -(_F4_EXACT**2) <= low and top < _F4_EXACT**2:
        return ("object_id_hi", "object_id_lo")
    return ("object_id_hi", "object_id_mid", "object_id_lo")


def _id_values(oid: int, properties: Sequence[str]) -> list[int]:
    """``oid`` in 24-bit parts, high first, one a property: the lower parts are 0..2**24-1
    (floor division), the high one what is left, signed (-5 went out as 16777211)."""
    parts = []
    for _ in properties[1:]:
        oid, part = divmod(oid, _F4_EXACT)
        parts.append(part)
    parts.append(oid)
    return parts[::-1]


def trk_header(n_streamlines: int, properties: Sequence[str] = ()) -> bytes:
    """A TrackVis v2 header whose voxmm -> RAS+mm mapping is the identity.

    nibabel shifts voxmm by half a voxel; the +0.5 translation in vox_to_ras
    cancels it exactly, so points come back bit-for-bit as written.
    """
    vox_to_ras = np.eye(4, dtype="<f4")
    vox_to_ras[:3, 3] = 0.5
    names = b"".join(n.encode("ascii").ljust(20, b"\x00") for n in properties).ljust(200, b"\x00")
    h = b"".join([
        b"TRACK\x00",
        struct.pack("<3h", 1, 1, 1),
        struct.pack("<3f", 1.0, 1.0, 1.0),
        struct.pack("<3f", 0.0, 0.0, 0.0),
        struct.pack("<h", 0), b"\x00" * 200,
        struct.pack("<h", len(properties)), names,
        vox_to_ras.tobytes(),
        b"\x00" * 444,
        b"RAS\x00", b"\x00" * 4,
        struct.pack("<6f", 1.0, 0.0, 0.0, 0.0, 1.0, 0.0),
        b"\x00" * 2,
        bytes(6),
        struct.pack("<iii", n_streamlines, 2, TRK_HEADER_SIZE),
    ])
    assert len(h) == TRK_HEADER_SIZE
    return h


def trk_record_size(n_points: int, properties: Sequence[str]) -> int:
    return 4 + 12 * n_points + 4 * len(properties)


def trk_records(streamlines: Sequence[tuple[int, np.ndarray]], properties: Sequence[str]) -> bytes:
    """One record per (object id, points): int32 count, float32 xyz (2-D data gets
    z = 0), then the id properties."""
    out = []
    for oid, s in streamlines:
        pts = np.zeros((len(s), 3), "<f4")
        d = min(3, s.shape[1] if s.ndim == 2 else 0)
        pts[:, :d] = s[:, :d]
        out.append(struct.pack("<i", len(s)))
        out.append(pts.tobytes())
        out.append(np.asarray(_id_values(oid, properties), "<f4").tobytes())
    return b"".join(out)


# --- SWC ---------------------------------------------------------------------------------------


def swc_float_width(*dtypes: np.dtype | None) -> int:
    """Characters of each number column: 17 significant digits where any of the columns'
    dtypes (positions, radius) needs more than float32's 9 (float64, and integers of 32 bits
    or more), else 9. One width for all: a float64 radius beside float32 positions was cut
    to 9 digits (2.000000000001 written 2.00000000)."""
    for dt in dtypes:
        if dt is None:
            continue
        dt = np.dtype(dt)
        if (dt.kind == "f" and dt.itemsize > 4) or (dt.kind in "iu" and dt.itemsize >= 4):
            return 25
    return 16


def _fmt_float(v: float, width: int) -> str:
    digits = 16 if width > 16 else 8
    return f"{v: .{digits}e}".rjust(width)[:width]


def swc_header(oid: int, n: int) -> bytes:
    return (f"# SWC written by zvfs from a Zarr Vectors skeleton\n# object {oid}, {n} nodes\n"
            "# id type x y z radius parent\n").encode("ascii")


def swc_type_width(dtype: np.dtype | None) -> int:
    """Characters of the type column: wide enough for any value of the type attribute's
    dtype (a file's size is known before its values are read), at least SWC's usual 2.
    Floats are whole numbers of any int64 (``swc_types`` refuses the others)."""
    if dtype is None or np.dtype(dtype).kind == "b":
        return 2
    dt = np.dtype(dtype)
    info = np.iinfo(dt if dt.kind in "iu" else np.int64)
    return max(2, len(str(info.min)), len(str(info.max)))


def swc_types(values: np.ndarray) -> np.ndarray:
    """A type attribute as int64, or ValueError naming the first value SWC cannot hold."""
    if values.dtype.kind not in "biuf":
        raise ValueError(f"types of dtype {values.dtype} are not numbers")
    if values.dtype.kind in "biu":
        if values.dtype == np.uint64 and len(values) and values.max() > np.iinfo(np.int64).max:
            raise ValueError(f"type {int(values.max())} is past int64")
        return values.astype(np.int64)
    bad = ~np.isfinite(values) | (values != np.round(values)) | (np.abs(values) >= 2.0**63)
    if bad.any():
        raise ValueError(f"type {values[np.flatnonzero(bad)[0]]!r} is not an integer")
    return values.astype(np.int64)


def swc_line_width(n: int, dtype: np.dtype, type_width: int = 2, radius_dtype: np.dtype | None = None) -> int:
    idw = len(str(max(n, 1)))
    fw = swc_float_width(dtype, radius_dtype)
    # id type x y z radius parent, single spaces, newline
    return idw + 1 + type_width + 1 + 4 * fw + 4 + max(idw, 2) + 1


def swc_size(oid: int, n: int, dtype: np.dtype, type_width: int = 2, radius_dtype: np.dtype | None = None) -> int:
    return len(swc_header(oid, n)) + n * swc_line_width(n, dtype, type_width, radius_dtype)


def swc_bytes(oid: int, positions: np.ndarray, parents: np.ndarray, radius: np.ndarray | None,
              types: np.ndarray | None, type_width: int = 2) -> bytes:
    """Fixed-width SWC so its size is known up front; ``parents`` are 0-based (-1 = root)
    and every parent precedes its children; ``types`` as ``swc_types`` gives them."""
    n = len(positions)
    idw = len(str(max(n, 1)))
    pw = max(idw, 2)
    fw = swc_float_width(positions.dtype, radius.dtype if radius is not None else None)
    lines = [swc_header(oid, n).decode("ascii")]
    pos = np.zeros((n, 3), np.float64)
    pos[:, : min(3, positions.shape[1])] = positions[:, :3]
    for i in range(n):
        x, y, z = (_fmt_float(float(v), fw) for v in pos[i])
        r = _fmt_float(float(radius[i]) if radius is not None else 1.0, fw)
        t = int(types[i]) if types is not None else 0
        p = int(parents[i]) + 1 if parents[i] >= 0 else -1
        lines.append(f"{i + 1:>{idw}} {t:>{type_width}} {x} {y} {z} {r} {p:>{pw}}\n")
    return "".join(lines).encode("ascii")


def tree_order(parents: np.ndarray) -> np.ndarray:
    """A permutation listing every node after its parent (roots first, depth-first)."""
    n = len(parents)
    kids: dict[int, list[int]] = {}
    roots = []
    for i, p in enumerate(parents.tolist()):
        if p < 0 or p >= n or p == i:
            roots.append(i)
        else:
            kids.setdefault(p, []).append(i)
    order: list[int] = []
    seen = np.zeros(n, bool)
    for r in roots:
        stack = [r]
        while stack:
            v = stack.pop()
            if seen[v]:
                continue
            seen[v] = True
            order.append(v)
            stack.extend(reversed(kids.get(v, [])))
    order.extend(int(i) for i in np.flatnonzero(~seen))  # cycles: keep the nodes anyway
    return np.asarray(order, np.int64)

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


def vertex_columns(ndim: int, pos_dtype: np.dtype,
                   attrs: Sequence[tuple[str, np.dtype, int]]) -> list[tuple[str, str]]:
    """(property name, PLY type) for positions and attribute channels, names made unique."""
    names = [AXES[i] if i < 3 else f"axis{i}" for i in range(ndim)]
    cols = [(n, ply_type(pos_dtype)) for n in names]
    taken = set(names)
    for name, dt, ncols in attrs:
        base = name if name not in taken else f"attr_{name}"
        subs = [base] if ncols == 1 else [f"{base}_{i}" for i in range(ncols)]
        for s in subs:
            taken.add(s)
            cols.append((s, ply_type(dt)))
    return cols


def ply_header(n_vertices: int, columns: list[tuple[str, str]], n_faces: int, face_width: int,
               n_edges: int, comment: str) -> bytes:
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
        flat = a.reshape(n, -1)
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


def trk_header(n_streamlines: int) -> bytes:
    """A TrackVis v2 header whose voxmm -> RAS+mm mapping is the identity.

    nibabel shifts voxmm by half a voxel; the +0.5 translation in vox_to_ras
    cancels it exactly, so points come back bit-for-bit as written.
    """
    vox_to_ras = np.eye(4, dtype="<f4")
    vox_to_ras[:3, 3] = 0.5
    h = b"".join([
        b"TRACK\x00",
        struct.pack("<3h", 1, 1, 1),
        struct.pack("<3f", 1.0, 1.0, 1.0),
        struct.pack("<3f", 0.0, 0.0, 0.0),
        struct.pack("<h", 0), b"\x00" * 200,
        struct.pack("<h", 0), b"\x00" * 200,
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


def trk_size(lengths: Sequence[int]) -> int:
    return TRK_HEADER_SIZE + sum(4 + 12 * int(n) for n in lengths)


def trk_records(streamlines: Sequence[np.ndarray]) -> bytes:
    """One record per streamline: int32 count, then float32 xyz (2-D data gets z = 0)."""
    out = []
    for s in streamlines:
        pts = np.zeros((len(s), 3), "<f4")
        d = min(3, s.shape[1] if s.ndim == 2 else 0)
        pts[:, :d] = s[:, :d]
        out.append(struct.pack("<i", len(s)))
        out.append(pts.tobytes())
    return b"".join(out)


def trk_bytes(streamlines: Sequence[np.ndarray]) -> bytes:
    return trk_header(len(streamlines)) + trk_records(streamlines)


# --- SWC ---------------------------------------------------------------------------------------


def swc_float_width(dtype: np.dtype) -> int:
    return 25 if np.dtype(dtype).itemsize > 4 else 16


def _fmt_float(v: float, width: int) -> str:
    digits = 16 if width > 16 else 8
    return f"{v: .{digits}e}".rjust(width)[:width]


def swc_header(oid: int, n: int) -> bytes:
    return (f"# SWC written by zvfs from a Zarr Vectors skeleton\n# object {oid}, {n} nodes\n"
            "# id type x y z radius parent\n").encode("ascii")


def swc_line_width(n: int, dtype: np.dtype) -> int:
    idw = len(str(max(n, 1)))
    fw = swc_float_width(dtype)
    # id type x y z radius parent, single spaces, newline
    return idw + 1 + 2 + 1 + 4 * fw + 4 + max(idw, 2) + 1


def swc_size(oid: int, n: int, dtype: np.dtype) -> int:
    return len(swc_header(oid, n)) + n * swc_line_width(n, dtype)


def swc_bytes(oid: int, positions: np.ndarray, parents: np.ndarray, radius: np.ndarray | None,
              types: np.ndarray | None) -> bytes:
    """Fixed-width SWC so its size is known up front; ``parents`` are 0-based (-1 = root)
    and every parent precedes its children."""
    n = len(positions)
    idw = len(str(max(n, 1)))
    pw = max(idw, 2)
    fw = swc_float_width(positions.dtype)
    lines = [swc_header(oid, n).decode("ascii")]
    pos = np.zeros((n, 3), np.float64)
    pos[:, : min(3, positions.shape[1])] = positions[:, :3]
    for i in range(n):
        x, y, z = (_fmt_float(float(v), fw) for v in pos[i])
        r = _fmt_float(float(radius[i]) if radius is not None else 1.0, fw)
        t = int(types[i]) if types is not None else 0
        p = int(parents[i]) + 1 if parents[i] >= 0 else -1
        lines.append(f"{i + 1:>{idw}} {t:>2} {x} {y} {z} {r} {p:>{pw}}\n")
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

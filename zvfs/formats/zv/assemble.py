"""Level-wide results built from per-chunk decodes: what the views serve.

Row numbering is shared by everything here: chunks in sorted coordinate order,
rows in stored order within a chunk (``Level.offsets``). Links, objects, faces,
edges and skeleton parents are all expressed in those row numbers, so they index
``vertices.npy`` directly. Blocking.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blobs import MAX_TABLE_BYTES, chunk_name
from .errors import ZVError
from .level import Chunk, Level


def level_vertices(level: Level) -> np.ndarray:
    """(N, D) every vertex of the level in the store's dtype."""
    parts = [level.vertices(c) for c in level.chunks()]
    _check_counts(level, parts)
    return np.concatenate(parts) if parts else np.empty((0, level.ndim), level.dtype)


def _check_counts(level: Level, parts: list[np.ndarray]) -> None:
    for c, p in zip(level.chunks(), parts, strict=False):
        if len(p) != level.vertex_count(c):
            raise ZVError(level.key(f"vertices/{chunk_name(c)}"),
                          f"decoded {len(p)} vertices, the fragment index says {level.vertex_count(c)}")


def vertex_count(level: Level) -> int:
    return sum(level.vertex_count(c) for c in level.chunks())


def level_table_rows(level: Level, what: str) -> int:
    """The level's vertex count, for a table of one int64 a vertex (skeleton parents, the
    owner of each vertex), or ZVError naming the vertices when that table passes
    MAX_TABLE_BYTES, as whole tables read from the store do. The count is the fragment
    indexes' word: four of 44 bytes claiming 2**24 rows each had the daemon build tables of
    2**26 vertices (3.2 GB peak RSS) as a skeleton level was listed."""
    n = vertex_count(level)
    if n * 8 > MAX_TABLE_BYTES:
        raise ZVError(level.key("vertices"), f"{n:,} vertices: {what} would take {n * 8:,} bytes; zvfs "
                                             f"builds level-wide tables of at most {MAX_TABLE_BYTES >> 20} MiB")
    return n


def level_vertex_attribute(level: Level, name: str) -> np.ndarray:
    info = level.vertex_attribute_info(name)
    parts = [level.vertex_attribute(name, c) for c in level.chunks()]
    if not parts:
        return np.empty((0, *info.row_shape), info.dtype)
    return np.concatenate(parts)


@dataclass(slots=True)
class Links:
    """Level-wide link records of one delta, as row numbers, plus where each came from."""

    rows: np.ndarray  # (M, L) int64, -1 where an endpoint's chunk has no vertices
    cells: list[tuple[str, Chunk, int]]  # (part, source chunk, record count) in row order


def _target_level(level: Level, delta: str) -> Level | None:
    """The level that endpoints k>0 of ``delta`` live in; None if the store has none."""
    if delta == "0":
        return level
    name = str(int(level.name) + int(delta))
    return level.group.level(name) if name in level.group.level_names else None


def _rows(ends: np.ndarray, vi: np.ndarray, offsets: dict[Chunk, int] | None,
          counts: dict[Chunk, int] | None = None, key: str = "") -> np.ndarray:
    """Level-wide rows of link endpoints (chunk coordinates ``ends``, local index ``vi``);
    -1 where the chunk has no vertices. A local index outside its chunk is refused: it
    would name a vertex of another chunk (or none), and go out so in every view."""
    out = np.full(vi.shape, -1, np.int64)
    if offsets is None or vi.size == 0:
        return out
    flat = ends.reshape(-1, ends.shape[-1])
    uniq, inv = np.unique(flat, axis=0, return_inverse=True)
    where = np.asarray(inv).reshape(-1)
    names = [tuple(int(x) for x in u) for u in uniq]
    base = np.array([offsets.get(c, -1) for c in names], np.int64)[where].reshape(vi.shape)
    if counts is not None:
        n = np.array([counts.get(c, 0) for c in names], np.int64)[where].reshape(vi.shape)
        bad = (base >= 0) & ((vi < 0) | (vi >= n))
        if bad.any():
            i = tuple(int(x) for x in np.argwhere(bad)[0])
            raise ZVError(key, f"link record {i[0]}: endpoint {i[1]} is vertex {int(vi[i])} of a "
                               f"chunk of {int(n[i])} vertices")
    return np.where(base >= 0, base + vi, -1)


def _counts(level: Level | None) -> dict[Chunk, int] | None:
    if level is None:
        return None
    return dict(zip(level.chunks(), level.vertex_counts(), strict=True))


def level_links(level: Level, delta: str = "0") -> Links:
    """Every link record of ``links/<delta>`` (and 0.7 cross-chunk records), written order restored."""
    fam = level.link_family(delta)
    target = _target_level(level, delta)
    own, other = level.offsets(), target.offsets() if target is not None else None
    own_counts = _counts(level)
    other_counts = own_counts if target is level else _counts(target)
    parts: list[np.ndarray] = []
    cells: list[tuple[str, Chunk, int]] = []
    # A Draco level's stored links (the faces across chunks) index each chunk's rows as
    # written; Draco reorders those rows and drops the unused ones, keeping no map back
    # (as for the vertex attributes): mapped onto the decoded rows, their corners landed
    # on other vertices. They are left out; the level's meta.json says so
    draco = delta == "0" and level.encoding == "draco"
    for part, chunk in () if draco else level.link_parts(delta):
        ends, vi = level.link_cell(delta, part, chunk)
        if len(vi) == 0:
            continue
        key = level.key(f"links/{delta}/{chunk_name(chunk)}")
        if delta == "0":
            rows = _rows(ends, vi, other, other_counts, key)
        else:  # endpoint 0 is a row of this level, the others of the level ``delta`` away
            rows = np.empty(vi.shape, np.int64)
            rows[:, 1:] = _rows(ends[:, 1:], vi[:, 1:], other, other_counts, key)
            rows[:, :1] = _rows(ends[:, :1], vi[:, :1], own, own_counts, key)
        parts.append(rows)
        cells.append((part, chunk, len(vi)))
    rows = np.concatenate(parts) if parts else np.empty((0, fam.width), np.int64)
    if draco:
        # Draco keeps each chunk's intra-chunk faces inside its own bitstream
        extra = []
        own = level.offsets()
        for c in level.chunks():
            f = level.draco_faces(c)
            if len(f):
                extra.append(f + own[c])
                cells.append(("draco", c, len(f)))
        if extra:
            rows = np.concatenate([rows, *extra]) if len(rows) else np.concatenate(extra)
    return Links(rows, cells)


def level_link_attribute(level: Level, name: str, delta: str, links: Links) -> np.ndarray:
    """Attribute rows aligned with ``links.rows``."""
    info = level.link_attribute_info(name, delta)
    parts = []
    for part, chunk, n in links.cells:
        if part == "draco":
            parts.append(np.full((n, *info.row_shape), np.nan if info.dtype.kind == "f" else 0, info.dtype))
        else:
            parts.append(level.link_attribute_cell(name, delta, part, chunk, n))
    return np.concatenate(parts) if parts else np.empty((0, *info.row_shape), info.dtype)


def fragment_starts(level: Level) -> np.ndarray:
    """Level-wide row where each non-empty vertex fragment starts (implicit chains break there)."""
    out = []
    offsets = level.offsets()
    for c in level.chunks():
        fi = level.fragments(c)
        if fi is None:
            out.append(offsets[c])
            continue
        for f in range(fi.count):
            first = fi.first(f)
            if first is not None:
                out.append(offsets[c] + first)
    return np.asarray(sorted(set(out)), np.int64)


def skeleton_parents(level: Level) -> np.ndarray:
    """parent[i] for every vertex (-1 at roots): implicit chains, then explicit (child, parent) links."""
    n = level_table_rows(level, "the skeleton's parent table")
    parent = np.arange(-1, n - 1, dtype=np.int64)
    starts = fragment_starts(level)
    if len(starts):
        parent[starts] = -1
    if "0" in level.link_deltas():
        links = level_links(level, "0").rows
        if links.shape[1] == 2 and len(links):
            ok = (links[:, 0] >= 0) & (links[:, 0] < n)
            parent[links[ok, 0]] = links[ok, 1]
    return parent


def graph_edges(level: Level) -> np.ndarray:
    """(M, 2) edges for PLY: explicit links, or implicit chains for skeletons and polylines."""
    conv = level.group.links_convention
    if conv == "implicit_sequential_with_branches":
        parent = skeleton_parents(level)
        child = np.flatnonzero(parent >= 0)
        return np.stack([child, parent[child]], axis=1).astype(np.int64)
    if conv == "implicit_sequential":
        if level.group.geometry == "point_cloud":
            return np.empty((0, 2), np.int64)
        level_table_rows(level, "the polylines' edge table")
        edges = []
        offsets = level.offsets()
        manifests = level.manifests()
        _check_edge_rows(level, manifests, offsets)
        for oid, blocks in manifests.items():
            rows = level.object_rows(blocks, offsets, oid)
            if len(rows) > 1:
                edges.append(np.stack([rows[:-1], rows[1:]], axis=1))
        return np.concatenate(edges).astype(np.int64) if edges else np.empty((0, 2), np.int64)
    if "0" not in level.link_deltas():
        return np.empty((0, 2), np.int64)
    rows = level_links(level, "0").rows
    if rows.shape[1] != 2:
        return np.empty((0, 2), np.int64)
    return rows[(rows >= 0).all(axis=1)]


def _check_edge_rows(level: Level, manifests: dict, offsets: dict[Chunk, int]) -> None:
    """Refuse, from the counts alone, polylines whose edges pass MAX_TABLE_BYTES: objects
    may name rows again, so the edges are not bounded by the vertices, and three 70-byte
    manifests naming two indexes of 2**24 rows had 6.4 GiB built as the level was listed."""
    total = 0
    for oid, blocks in manifests.items():
        total += max(level.object_size(blocks, offsets, oid) - 1, 0)
        if total * 16 > MAX_TABLE_BYTES:
            raise ZVError(level.key("object_index/manifests"),
                          f"the polylines have over {total:,} edges; zvfs builds level-wide tables "
                          f"of at most {MAX_TABLE_BYTES >> 20} MiB")


def mesh_faces(level: Level) -> np.ndarray:
    """(F, L) faces for meshes (link width >= 3), written winding."""
    if "0" not in level.link_deltas() and level.encoding != "draco":
        return np.empty((0, 3), np.int64)
    rows = level_links(level, "0").rows
    if rows.ndim != 2 or rows.shape[1] < 3:
        return np.empty((0, 3), np.int64)
    return rows[(rows >= 0).all(axis=1)]


def object_vertices(level: Level, oid: int, blocks: list | None = None,
                    cache: dict[Chunk, np.ndarray] | None = None) -> np.ndarray:
    """One object's vertices in manifest order (reads only the chunks it touches).

    ``cache`` (chunk -> vertices) lets a caller building many objects decode each chunk once.
    """
    if blocks is None:
        blocks = level.manifests().get(oid)
        if blocks is None:
            raise ZVError(level.key("object_index"), f"no object {oid}")
    offsets = level.offsets()
    total = level.object_size(blocks, offsets, oid)
    cache = {} if cache is None else cache
    for b in blocks:  # every chunk decoded and checked before the result is made
        if b.chunk not in cache:
            verts = level.vertices(b.chunk)
            if len(verts) != level.vertex_count(b.chunk):
                # the size was the fragment index's word: an object of 2**26 rows claimed by
                # four 44-byte indexes was made (1.7 GB) before its chunks were found short
                raise ZVError(level.key(f"vertices/{chunk_name(b.chunk)}"),
                              f"decoded {len(verts)} vertices, the fragment index says {level.vertex_count(b.chunk)}")
            cache[b.chunk] = verts
        if level.encoding != "draco" and (fi := level.fragments(b.chunk)) is not None:
            for f in b.fragments:  # before the result is made: its size is the index's word
                fi.check(int(f), len(cache[b.chunk]))
    out = np.empty((total, level.ndim), level.dtype)
    pos = 0
    for b in blocks:
        verts = cache[b.chunk]
        fi = None if level.encoding == "draco" else level.fragments(b.chunk)
        for f in b.fragments:  # each checked against its chunk above
            local = fi.rows(int(f)) if fi is not None else np.arange(len(verts))
            out[pos : pos + len(local)] = verts[local]
            pos += len(local)
    return out

"""One level of a ZV group as a directory: vertices.npy, attributes, links, objects, level.ply, ...

The level directory is built in one worker hop: it lists chunks and reads the
fragment indexes for the row counts (never the vertices), and, for geometry
that has them, decodes the link cells so PLY/TRK sizes are exact. Subdirectories
(links, objects, chunks/<i.j.k>, ...) are built on first access, one hop each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

import zvfs.views.vectors.encoders as enc
from zvfs.formats import zv
from zvfs.formats.meta import json_scalar, strict_json
from zvfs.formats.zv import Level, ZVGroup
from zvfs.stores.base import is_store_failure
from zvfs.views.context import MountContext
from zvfs.views.node import Node
from zvfs.views.npy import PAGE_ALIGN, npy_header
from zvfs.views.vectors.nodes import (
    BuiltDir,
    BuiltFile,
    ErrorFile,
    MemFile,
    SegmentedFile,
    VDir,
    detached,
    rows_file,
)

LINE_GEOMETRIES = ("streamline", "polyline", "line", "lines")
#: faces or edges per level.ply part, and bytes per streamlines.trk part
PART_ROWS = 1 << 16
PART_BYTES = 1 << 20
#: rows a chunk's fragments.json lists at most (about 8 MB of JSON, built with the chunk's
#: directory): a fragment index of a few bytes can name 2**24 rows a range, and a mutated
#: one took the daemon from 70 to 286 MiB (scripts/fuzz-hostile, seed 4105)
FRAGMENTS_JSON_ROWS = 1 << 20
TREE_CONVENTION = "implicit_sequential_with_branches"
#: levels with at most this many objects have every manifest checked when sized
OBJECT_CHECK_LIMIT = 100_000


def level_dir(ctx: MountContext, key: Hashable, group: ZVGroup, name: str) -> BuiltDir:
    what = group.level_path(name)
    return BuiltDir(ctx, key, what, lambda: LevelTree(ctx, key, group, name).entries())


def _npy_file(ctx: MountContext, arr: np.ndarray) -> MemFile:
    return MemFile(enc.npy_bytes(arr), ctx)


class LevelTree:
    """Blocking builder of one level's entries (runs in a worker thread)."""

    def __init__(self, ctx: MountContext, key: Hashable, group: ZVGroup, name: str) -> None:
        self.ctx = ctx
        self.key = key
        self.group = group
        self.level: Level = group.level(name)
        self.what = self.level.path
        self.errors: dict[str, str] = {}
        #: each vertex attribute's property names in level.ply (``enc.attribute_properties``)
        self.ply_properties: dict[str, list[str]] = {}

    def _try(self, part: str, fn: Callable[[], Any]) -> Any:
        """Run one part of the build; remember its error so meta.json and the file can say it."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one bad part must not take the level's others
            if is_store_failure(exc):
                # the store may come back: fail the build, which is not kept, rather than keep
                # the error with the directory (a 503 made vertices.npy EIO until rediscovery)
                raise
            kept = detached(exc)
            self.errors[part] = str(kept)
            # the key fail() gives a read of that part: one line, whichever comes first
            tag = f"vectors: {self.what}/{part}"
            self.ctx.warn_once(tag, f"{tag}: {kept}")
            return kept

    # -- the level directory ----------------------------------------------------------------

    def entries(self) -> dict[str, Node]:
        L = self.level
        ctx = self.ctx
        out: dict[str, Node] = {}
        chunks = self._try("vertices.npy", L.chunks)
        counts = self._try("vertices.npy", lambda: L.vertex_counts(chunks)) \
            if not isinstance(chunks, Exception) else chunks
        ok = not isinstance(counts, Exception)
        n = sum(counts) if ok else 0
        D = L.ndim
        if ok:
            out["vertices.npy"] = rows_file(
                ctx, (self.key, "vertices"), f"{self.what}/vertices", npy_header(L.dtype, (n, D), PAGE_ALIGN),
                counts, L.dtype.itemsize * D, lambda i: L.vertices(chunks[i]).astype(L.dtype, copy=False).tobytes())
        else:
            out["vertices.npy"] = ErrorFile(ctx, f"{self.what}/vertices.npy", counts)

        infos = {}
        for name in L.vertex_attribute_names():
            info = self._try(f"vertex_attributes/{name}.npy", lambda name=name: L.vertex_attribute_info(name))
            if not isinstance(info, Exception):
                infos[name] = info
        va: dict[str, Node] = {}
        # Draco drops the vertices no intra-chunk face uses and keeps no index back to the
        # written rows, so attribute rows (one per written vertex) cannot line up with
        # vertices.npy: they are described in meta.json but not served
        for name, info in infos.items() if L.encoding != "draco" else ():
            if not ok:
                va[f"{name}.npy"] = ErrorFile(ctx, f"{self.what}/vertex_attributes/{name}.npy", counts)
                continue
            va[f"{name}.npy"] = rows_file(
                ctx, (self.key, "va", name), f"{self.what}/vertex_attributes/{name}",
                npy_header(info.dtype, (n, *info.row_shape), PAGE_ALIGN), counts,
                info.dtype.itemsize * info.ncols,
                lambda i, name=name: np.ascontiguousarray(L.vertex_attribute(name, chunks[i])).tobytes())
        if va:
            out["vertex_attributes"] = VDir(va, mtime_ns=ctx.stable_time_ns)

        deltas = self._try("links", L.link_deltas) or []
        if isinstance(deltas, Exception):
            deltas = []
        if deltas:
            out["links"] = BuiltDir(ctx, (self.key, "links"), f"{self.what}/links", lambda: self._links(deltas))
            if any(L.link_attribute_names(d) for d in deltas):
                out["link_attributes"] = BuiltDir(ctx, (self.key, "link_attributes"),
                                                  f"{self.what}/link_attributes", lambda: self._link_attrs(deltas))
        if "object_index" in L.members:
            out["objects"] = BuiltDir(ctx, (self.key, "objects"), f"{self.what}/objects", self._objects)
        if L.object_attribute_names():
            out["object_attributes"] = BuiltDir(ctx, (self.key, "oa"), f"{self.what}/object_attributes",
                                                self._object_attrs)
        if "groups" in L.members:
            out["groups"] = BuiltDir(ctx, (self.key, "groups"), f"{self.what}/groups", self._groups)
        if ok:
            out["chunks"] = BuiltDir(ctx, (self.key, "chunks"), f"{self.what}/chunks",
                                     lambda: self._chunks(chunks, infos))
            self._level_ply(out, chunks, counts, infos)
            self._trk(out)
        if ok and "object_index" in L.members:
            self._check_objects()
        out["meta.json"] = MemFile(self._meta(n if ok else None, chunks, infos, deltas), ctx)
        return out

    def _check_objects(self) -> None:
        """Resolve every manifest against the fragment indexes, so meta.json lists bad objects.

        This reads no vertices (the fragment indexes were read for the sizes); levels
        with more than OBJECT_CHECK_LIMIT objects are left to fail on access.
        """
        L = self.level
        manifests = self._try("objects", L.manifests)
        if isinstance(manifests, Exception) or len(manifests) > OBJECT_CHECK_LIMIT:
            return
        offsets = self._try("objects", L.offsets)
        if isinstance(offsets, Exception):
            return
        for oid, blocks in sorted(manifests.items()):
            self._try(f"objects/{oid}", lambda oid=oid, blocks=blocks: L.object_size(blocks, offsets, oid))

    # -- geometry files ----------------------------------------------------------------------

    def _connectivity(self) -> tuple[np.ndarray, np.ndarray]:
        """(faces, edges) for the level: faces for meshes, edges for graphs, skeletons, lines."""
        L = self.level
        geom = self.group.geometry
        empty_f, empty_e = np.empty((0, 3), np.int64), np.empty((0, 2), np.int64)
        if geom == "point_cloud":
            return empty_f, empty_e
        if geom == "mesh":
            return zv.mesh_faces(L), empty_e
        return empty_f, zv.graph_edges(L)

    def _level_ply(self, out: dict[str, Node], chunks: list, counts: list[int], infos: dict) -> None:
        """level.ply streamed in parts: header, each chunk's vertex rows, faces, edges."""
        conn = self._try("level.ply", self._connectivity)
        if isinstance(conn, Exception):
            out["level.ply"] = ErrorFile(self.ctx, f"{self.what}/level.ply", conn)
            return
        # a header that cannot be built (or any other surprise here) fails level.ply alone:
        # it failed the level's whole directory, meta.json and vertices.npy included
        ply = self._try("level.ply", lambda: self._level_ply_file(conn, chunks, counts, infos))
        out["level.ply"] = ErrorFile(self.ctx, f"{self.what}/level.ply", ply) if isinstance(ply, Exception) else ply

    def _level_ply_file(self, conn: tuple[np.ndarray, np.ndarray], chunks: list, counts: list[int],
                        infos: dict) -> SegmentedFile:
        L = self.level
        faces, edges = conn
        n = sum(counts)
        if L.encoding == "draco":
            infos = {}  # Draco drops unused vertices, so attribute rows need not line up
        names = list(infos)
        specs = [(k, i.dtype, i.ncols) for k, i in infos.items()]
        cols = enc.vertex_columns(L.ndim, L.dtype, specs)
        axes = [c for c, _t in cols[: L.ndim]]
        self.ply_properties = dict(zip(names, enc.attribute_properties(axes, specs), strict=True))
        width = faces.shape[1] if len(faces) else 3
        comment = f"zvfs {self.group.geometry} level {L.name}"
        header = enc.ply_header(n, cols, len(faces), width, len(edges), comment)
        row = enc.ply_row_bytes(cols)
        fsteps = range(0, len(faces), PART_ROWS)
        esteps = range(0, len(edges), PART_ROWS)
        sizes = [len(header), *(c * row for c in counts),
                 *(len(faces[s : s + PART_ROWS]) * (1 + 4 * width) for s in fsteps),
                 *(len(edges[s : s + PART_ROWS]) * 8 for s in esteps)]
        nc, nf = len(chunks), len(fsteps)

        def load(i: int) -> bytes:
            if 1 <= i <= nc:
                c = chunks[i - 1]
                return enc.ply_vertex_records(L.vertices(c), [L.vertex_attribute(k, c) for k in names], cols)
            if i <= nc + nf:
                s = fsteps[i - 1 - nc]
                return enc.ply_face_bytes(faces[s : s + PART_ROWS])
            s = esteps[i - 1 - nc - nf]
            return enc.ply_edge_bytes(edges[s : s + PART_ROWS])

        return SegmentedFile(self.ctx, (self.key, "level.ply"), f"{self.what}/level.ply",
                             sizes, load, literal={0: header})

    def _trk(self, out: dict[str, Node]) -> None:
        """streamlines.trk streamed in batches of whole streamlines, one per object with
        vertices; each names its object (``enc.trk_id_properties``)."""
        L = self.level
        if self.group.geometry not in LINE_GEOMETRIES:
            return

        def plan() -> list[tuple[int, list, int]]:
            offsets = L.offsets()
            return [(oid, b, n) for oid, b in sorted(L.manifests().items())
                    if (n := L.object_size(b, offsets, oid))]

        objs = self._try("streamlines.trk", plan)
        if isinstance(objs, Exception):
            out["streamlines.trk"] = ErrorFile(self.ctx, f"{self.what}/streamlines.trk", objs)
            return
        props = enc.trk_id_properties([oid for oid, _b, _n in objs])
        batches: list[list[tuple[int, list, int]]] = [[]]
        sizes = [enc.TRK_HEADER_SIZE, 0]
        for o in objs:
            if sizes[-1] >= PART_BYTES:
                batches.append([])
                sizes.append(0)
            batches[-1].append(o)
            sizes[-1] += enc.trk_record_size(o[2], props)

        def load(i: int) -> bytes:
            cache: dict = {}
            return enc.trk_records([(oid, zv.object_vertices(L, oid, b, cache)) for oid, b, _n in batches[i - 1]],
                                   props)

        out["streamlines.trk"] = SegmentedFile(self.ctx, (self.key, "trk"), f"{self.what}/streamlines.trk",
                                               sizes, load, literal={0: enc.trk_header(len(objs), props)})

    # -- links ---------------------------------------------------------------------------------

    def _links(self, deltas: list[str]) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for d in deltas:
            res = self._try(f"links/{d}.npy", lambda d=d: zv.level_links(self.level, d))
            if isinstance(res, Exception):
                out[f"{d}.npy"] = ErrorFile(self.ctx, f"{self.what}/links/{d}.npy", res)
            else:
                out[f"{d}.npy"] = _npy_file(self.ctx, res.rows)
        return out

    def _link_attrs(self, deltas: list[str]) -> dict[str, Node]:
        out: dict[str, Node] = {}
        L = self.level
        for d in deltas:
            names = L.link_attribute_names(d)
            if not names:
                continue
            links = self._try(f"links/{d}.npy", lambda d=d: zv.level_links(L, d))
            target: dict[str, Node] = out if d == "0" else {}
            for name in names:
                what = f"{self.what}/link_attributes/{name}.npy"
                if isinstance(links, Exception):
                    target[f"{name}.npy"] = ErrorFile(self.ctx, what, links)
                    continue
                arr = self._try(f"link_attributes/{name}",
                                lambda d=d, name=name, links=links: zv.level_link_attribute(L, name, d, links))
                target[f"{name}.npy"] = ErrorFile(self.ctx, what, arr) if isinstance(arr, Exception) \
                    else _npy_file(self.ctx, arr)
            if d != "0" and target:
                out[d] = VDir(target, mtime_ns=self.ctx.stable_time_ns)
        return out

    # -- objects, object attributes, groups --------------------------------------------------------

    def _objects(self) -> dict[str, Node]:
        L = self.level
        ctx = self.ctx
        manifests = L.manifests()
        offsets = L.offsets()
        geom = self.group.geometry
        tree = self.group.links_convention == TREE_CONVENTION
        out: dict[str, Node] = {}
        parents: list[np.ndarray] = []  # computed once, on the first SWC build
        # a bad link cell fails the objects' .ply files only (it failed the whole directory)
        faces = self._try("objects/*.ply", lambda: zv.mesh_faces(L)) if geom == "mesh" else None
        attr_names = set(L.vertex_attribute_names())
        types = self._swc_types(attr_names) if tree else None
        swc_width = enc.swc_type_width(types[1] if isinstance(types, tuple) else None)
        radius = self._try("objects/*.swc", lambda: L.vertex_attribute_info("radius").dtype) \
            if tree and "radius" in attr_names else None
        radius_dtype = None if isinstance(radius, Exception) else radius
        # sized from the fragment indexes: rows are built by the files that need them
        sizes: dict[int, Any] = {
            oid: self._try(f"objects/{oid}", lambda oid=oid, blocks=blocks: L.object_size(blocks, offsets, oid))
            for oid, blocks in sorted(manifests.items())
        }
        per_object_faces: Any = {}
        if faces is not None and not isinstance(faces, Exception):
            per_object_faces = self._try("objects/*.ply", lambda: self._faces_by_object(faces, manifests, sizes))
            if isinstance(per_object_faces, Exception):  # the objects' .ply files fail, no more
                faces = per_object_faces
        for oid, blocks in sorted(manifests.items()):
            base = f"{self.what}/objects/{oid}"
            n = sizes[oid]
            if isinstance(n, Exception):  # one bad manifest fails that object's files only
                for ext in (".npy", ".swc" if tree else "", ".ply" if faces is not None else ""):
                    if ext:
                        out[f"{oid}{ext}"] = ErrorFile(ctx, base + ext, n)
                continue
            out[f"{oid}.npy"] = self._object_npy(oid, blocks, n, base + ".npy")
            if isinstance(types, Exception):
                out[f"{oid}.swc"] = ErrorFile(ctx, base + ".swc", types)
            elif tree:
                out[f"{oid}.swc"] = BuiltFile(
                    ctx, (self.key, "swc", oid), base + ".swc", enc.swc_size(oid, n, L.dtype, swc_width, radius_dtype),
                    lambda oid=oid, blocks=blocks:
                        self._swc(oid, blocks, parents, attr_names, types, swc_width))
            if isinstance(faces, Exception):
                out[f"{oid}.ply"] = ErrorFile(ctx, base + ".ply", faces)
            elif faces is not None:
                ofaces = per_object_faces.get(oid, np.empty((0, 3), np.int64))
                width = ofaces.shape[1] if len(ofaces) else 3
                comment = f"zvfs mesh object {oid}"
                size = enc.ply_size(n, enc.vertex_columns(L.ndim, L.dtype, []), len(ofaces), width, 0, comment)
                out[f"{oid}.ply"] = BuiltFile(
                    ctx, (self.key, "oply", oid), base + ".ply", size,
                    lambda oid=oid, blocks=blocks, ofaces=ofaces, comment=comment: enc.ply_bytes(
                        zv.object_vertices(L, oid, blocks), [], ofaces, np.empty((0, 2), np.int64), comment))
        return out

    def _object_npy(self, oid: int, blocks: list, n: int, what: str) -> SegmentedFile:
        """objects/<id>.npy streamed in parts of whole manifest blocks (at most PART_BYTES, or
        one block, which is of one chunk), as vertices.npy is by chunk. Built whole, a
        file larger than the cache was never kept, and each read decoded the object again:
        50 reads of 4 KiB of a 1.9 MB object under a 1 MiB cache fetched 96 MB."""
        L = self.level
        row = L.dtype.itemsize * L.ndim
        parts: list[list] = []
        sizes: list[int] = []
        for b in blocks:
            k = L.block_rows(b, oid) * row
            if not parts or (parts[-1] and sizes[-1] + k > PART_BYTES):
                parts.append([])
                sizes.append(0)
            parts[-1].append(b)
            sizes[-1] += k
        header = npy_header(L.dtype, (n, L.ndim), PAGE_ALIGN)

        def load(i: int) -> bytes:
            got = zv.object_vertices(L, oid, parts[i - 1])
            return np.ascontiguousarray(got.astype(L.dtype, copy=False)).tobytes()

        return SegmentedFile(self.ctx, (self.key, "obj", oid), what, [len(header), *sizes], load,
                             literal={0: header})

    def _faces_by_object(self, faces: np.ndarray, manifests: dict[int, list],
                         sizes: dict[int, Any]) -> dict[int, np.ndarray]:
        """Each object's faces (all corners among its vertices) in its own local numbering."""
        L = self.level
        n = zv.level_table_rows(L, "the owner of each vertex")
        owner = np.full(n, -1, np.int64)
        local = np.full(n, -1, np.int64)
        offsets = L.offsets()
        for oid, blocks in manifests.items():
            if not isinstance(sizes[oid], Exception) and sizes[oid]:
                try:
                    rows = L.object_rows(blocks, offsets, oid)
                except zv.ZVError:
                    continue  # that object's own files say why (its vertices cannot be read)
                owner[rows] = oid
                local[rows] = np.arange(len(rows))
        if not len(faces):
            return {}
        fo = owner[faces]
        keep = (fo >= 0).all(axis=1) & (fo == fo[:, :1]).all(axis=1)
        out: dict[int, np.ndarray] = {}
        for oid in np.unique(fo[keep, 0]):
            out[int(oid)] = local[faces[keep & (fo[:, 0] == oid)]]
        return out

    def _object_rows_attr(self, name: str, rows: np.ndarray) -> np.ndarray:
        """One vertex attribute at level rows ``rows``, decoding only the chunks they touch."""
        L = self.level
        offsets = L.offsets()
        chunks = L.chunks()
        starts = np.array([offsets[c] for c in chunks], np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        out = None
        for ci in np.unique(which):
            vals = L.vertex_attribute(name, chunks[ci])
            if out is None:
                out = np.empty((len(rows), *vals.shape[1:]), vals.dtype)
            sel = which == ci
            out[sel] = vals[rows[sel] - starts[ci]]
        return out if out is not None else np.empty(0)

    def _swc_types(self, attr_names: set[str]) -> tuple[str, np.dtype] | Exception | None:
        """The vertex attribute holding SWC node types, and its dtype (which sets the type
        column's width), or None when there is none (every type 0)."""
        name = next((t for t in ("swc_type", "type") if t in attr_names), None)
        if name is None:
            return None
        info = self._try("objects/*.swc", lambda: self.level.vertex_attribute_info(name))
        return info if isinstance(info, Exception) else (name, info.dtype)

    def _swc(self, oid: int, blocks: list, parents: list[np.ndarray],
             attr_names: set[str], type_attr: tuple[str, np.dtype] | None, type_width: int) -> bytes:
        L = self.level
        if not parents:
            parents.append(zv.skeleton_parents(L))
        rows = L.object_rows(blocks, L.offsets(), oid)
        pos = zv.object_vertices(L, oid, blocks)
        local = {int(r): i for i, r in enumerate(rows.tolist())}
        par = np.array([local.get(int(p), -1) for p in parents[0][rows]], np.int64)
        radius = self._object_rows_attr("radius", rows).reshape(len(rows), -1)[:, 0] \
            if "radius" in attr_names and len(rows) else None
        types = None
        if type_attr is not None and len(rows):
            values = self._object_rows_attr(type_attr[0], rows).reshape(len(rows), -1)[:, 0]
            try:
                types = enc.swc_types(values)
            except ValueError as exc:
                raise zv.ZVError(L.key(f"vertex_attributes/{type_attr[0]}"), f"object {oid}: {exc}") from None
        order = enc.tree_order(par)
        new_of = np.empty(len(order), np.int64)
        new_of[order] = np.arange(len(order))
        par_new = np.where(par[order] >= 0, new_of[np.maximum(par[order], 0)], -1)
        late = np.flatnonzero(par_new >= np.arange(len(par_new)))
        if len(late):  # SWC lists a parent before its children: a cycle has no such order
            node = int(rows[order[late[0]]])
            raise zv.ZVError(L.key("links/0"), f"object {oid}: the skeleton's parent links form a "
                                               f"cycle through vertex {node}; SWC cannot hold it")
        return enc.swc_bytes(oid, pos[order], par_new,
                             radius[order] if radius is not None else None,
                             types[order] if types is not None else None, type_width)

    def _object_attrs(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for name in self.level.object_attribute_names():
            arr = self._try(f"object_attributes/{name}.npy", lambda name=name: self.level.object_attribute(name))
            out[f"{name}.npy"] = ErrorFile(self.ctx, f"{self.what}/object_attributes/{name}.npy", arr) \
                if isinstance(arr, Exception) else _npy_file(self.ctx, arr)
        return out

    def _groups(self) -> dict[str, Node]:
        return {f"{gid}.npy": _npy_file(self.ctx, members) for gid, members in self.level.groups().items()}

    # -- chunks/<i.j.k>/ --------------------------------------------------------------------------------

    def _chunks(self, chunks: list, infos: dict) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for c in chunks:
            name = zv.chunk_name(c)
            out[name] = BuiltDir(self.ctx, (self.key, "chunk", c), f"{self.what}/chunks/{name}",
                                 lambda c=c: self._chunk(c, infos))
        return out

    def _chunk(self, c: tuple[int, ...], infos: dict) -> dict[str, Node]:
        L = self.level
        ctx = self.ctx
        base = f"{self.what}/chunks/{zv.chunk_name(c)}"
        # sized from the fragment index (or metadata), so listing a chunk decodes no vertices
        n = L.vertex_count(c)
        out: dict[str, Node] = {"vertices.npy": BuiltFile(
            ctx, (self.key, "cv", c), f"{base}/vertices.npy", enc.npy_size(L.dtype, (n, L.ndim)),
            lambda: enc.npy_bytes(L.vertices(c).astype(L.dtype, copy=False)))}
        if infos and L.encoding != "draco":
            out["vertex_attributes"] = VDir({
                f"{name}.npy": BuiltFile(
                    ctx, (self.key, "cva", c, name), f"{base}/vertex_attributes/{name}.npy",
                    enc.npy_size(info.dtype, (n, *info.row_shape)),
                    lambda name=name: enc.npy_bytes(L.vertex_attribute(name, c)))
                for name, info in infos.items()}, mtime_ns=ctx.stable_time_ns)
        fi = L.fragments(c)
        if fi is not None:
            named = int(fi.sizes().sum())  # counted without expanding a range
            if named > FRAGMENTS_JSON_ROWS:
                out["fragments.json"] = ErrorFile(ctx, f"{base}/fragments.json", zv.ZVError(
                    fi.key, f"its fragments name {named:,} rows; fragments.json lists at most "
                    f"{FRAGMENTS_JSON_ROWS:,}"))
            else:
                out["fragments.json"] = MemFile(json.dumps(
                    [fi.rows(f).tolist() for f in range(fi.count)]).encode() + b"\n", ctx)
        links: dict[str, Node] = {}
        for d in L.link_deltas():
            parts = []
            for part, src in L.link_parts(d):
                if src != c and part != "cross":
                    continue
                ends, vi = L.link_cell(d, part, src)
                if part == "cross":  # 0.7 cross-chunk records: keep those whose endpoint 0 is here
                    keep = (ends[:, 0, :] == np.asarray(c)).all(axis=1)
                    ends, vi = ends[keep], vi[keep]
                if len(vi):
                    parts.append((ends, vi))
            if parts:
                ends = np.concatenate([p[0] for p in parts])
                vi = np.concatenate([p[1] for p in parts])
                # one row per record: for each endpoint, its chunk coordinates then its local index
                rec = np.concatenate([ends, vi[:, :, None]], axis=2).reshape(len(vi), -1)
                links[f"{d}.npy"] = _npy_file(ctx, rec)
        if links:
            out["links"] = VDir(links, mtime_ns=ctx.stable_time_ns)
        return out

    # -- meta.json --------------------------------------------------------------------------------------

    def _meta(self, n: int | None, chunks: Any, infos: dict, deltas: list[str]) -> bytes:
        L = self.level
        g = self.group
        meta: dict[str, Any] = {
            "format": "zarr_vectors",
            "layout": g.layout,
            "zv_version": g.zv_version,
            "geometry_type": g.geometry,
            "geometry_types": g.geometry_types,
            "links_convention": g.links_convention,
            "level": L.name,
            "level_attributes": L.meta,
            "vertex_count": n,
            "chunk_count": None if isinstance(chunks, Exception) else len(chunks),
            "dtype": L.dtype.str,
            "ndim": L.ndim,
            "axes": [a.get("name") for a in g.space_axes] or None,
            "units": [a.get("unit") for a in g.space_axes] or None,
            "chunk_shape": g.zv.get("chunk_shape"),
            "bounds": g.zv.get("bounds"),
            "vertex_encoding": L.encoding,
            "vertex_attributes": {
                name: {"dtype": i.dtype.str,
                       "shape": [n, *i.row_shape] if n is not None and L.encoding != "draco" else None,
                       **({"categories": i.categories} if i.categories is not None else {}),
                       **({"channel_names": i.channel_names} if i.channel_names else {}),
                       **({"columns": "from the data (the metadata gives one)"} if i.columns_from_data else {}),
                       **({"ply_properties": self.ply_properties[name]} if name in self.ply_properties else {})}
                for name, i in infos.items()
            },
            "link_deltas": deltas,
            "link_widths": {},
            "link_attributes": {},
            "object_count": None,
            "object_attributes": L.object_attribute_names(),
            "group_count": None,
        }
        if any(d != "0" for d in deltas):
            meta["cross_level_links"] = ("links/<delta>.npy: endpoint 0 is a row of this level's "
                                         "vertices.npy, the others rows of level <level + delta>")
        for d in deltas:
            fam = self._try(f"links/{d}.npy", lambda d=d: L.link_family(d))
            if not isinstance(fam, Exception):
                meta["link_widths"][d] = fam.width
            meta["link_attributes"][d] = L.link_attribute_names(d)
        ids = self._try("objects", L.object_ids)
        if not isinstance(ids, Exception):
            meta["object_count"] = len(ids)
        if "groups" in L.members:
            meta["group_count"] = L.attrs("groups").get("num_groups")
        if L.encoding == "draco":
            meta["draco"] = {"decoder": "DracoPy", "available": zv.draco_available()}
            if not zv.draco_available():
                meta["draco"]["error"] = "DracoPy is not installed: pip install 'zvfs[draco]'"
            meta["draco"]["note"] = ("Draco keeps only vertices used by intra-chunk faces and "
                                     "quantizes positions; counts come from decoding")
            meta["draco"]["cross_chunk_faces"] = (
                "stored as links that index each chunk's rows as written; Draco reorders and "
                "drops those rows and keeps no map back to them, so faces across chunks are "
                "not served (links/0.npy and the .ply files hold the intra-chunk faces)")
            if infos:
                meta["draco"]["vertex_attributes"] = (
                    "written one row per input vertex; Draco keeps no map back to those rows, "
                    "so they cannot line up with vertices.npy and are not served")
        if self.errors:
            meta["errors"] = self.errors
        return (json.dumps(strict_json(meta), indent=1, default=_json_default) + "\n").encode()


def _json_default(o: Any) -> Any:
    """numpy values as strict JSON, as the rest of meta.json is (strict_json): the store's
    own attributes are copied into it, and an -Infinity among them made the whole file
    something no strict JSON reader (jq, JavaScript's JSON.parse) takes."""
    if isinstance(o, np.generic):
        return json_scalar(o)
    if isinstance(o, np.ndarray):
        return strict_json(o.tolist())
    return str(o)

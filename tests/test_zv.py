"""Zarr Vectors views, in process: every decoded file against what zarr-vectors itself returns.

The stores and the reference reads in tests/fixtures/zv/ were written by
zarr-vectors 0.2.0 (0.7 layout) and 0.9.2 (0.9 layout) in throwaway venvs
(scripts/make_zv_fixtures). Here the views are driven directly with trio over a
DirectoryStore; the mounted (FUSE, zip, S3) runs live in the mount tests.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from zvfs.formats import zv
from zvfs.formats.zv import cells
from zvfs.stores.base import KeyInfo, Listing, Store
from zvfs.stores.directory import DirectoryStore
from zvfs.views.context import MountContext
from zvfs.views.node import DirNode, FileNode, NodeError
from zvfs.views.vectors import build_vectors_dir

#: the corpus: the committed one, or one that ``scripts/make_zv_fixtures --vary SEED`` wrote
FIX = Path(os.environ.get("ZVFS_ZV_FIXTURES") or Path(__file__).resolve().parent / "fixtures" / "zv")
MANIFEST = json.loads((FIX / "manifest.json").read_text())["stores"]
#: a test tied to the committed corpus (hand-made damage to a chunk it has, counts it
#: holds): deselected (-m "not committed_corpus") where ZVFS_ZV_FIXTURES names another
committed_corpus = pytest.mark.committed_corpus


# --------------------------------------------------------------------------- helpers


def store_dir(name: str) -> Path:
    tag = name.split("/")[0]
    return FIX / tag / MANIFEST[name]["store"]


def ref(name: str, fname: str) -> np.ndarray:
    tag = name.split("/")[0]
    return np.load(FIX / tag / MANIFEST[name]["ref"] / fname)


async def vectors(store: Store) -> DirNode | None:
    """The vectors view of ``store``, as a mount of it would build it."""
    return await build_vectors_dir(store, MountContext(store=store))


async def _node(root: DirNode, path: str) -> Any:
    node: Any = root
    for seg in path.split("/"):
        if not isinstance(node, DirNode):
            raise FileNotFoundError(path)
        node = await node.lookup(seg)
        if node is None:
            raise FileNotFoundError(path)
    return node


async def _read(node: FileNode) -> bytes:
    """Read in odd-sized pieces, as the kernel would, and check the size matches."""
    out = []
    off = 0
    while True:
        piece = await node.read(off, 4093)
        if not piece:
            break
        out.append(bytes(piece))
        off += len(piece)
    data = b"".join(out)
    assert len(data) == node.size
    return data


def read_file(store: Store | Path, path: str) -> bytes:
    """Bytes of ``vectors/<path>`` for a store."""
    st = store if isinstance(store, Store) else DirectoryStore(store)

    async def main() -> bytes:
        root = await vectors(st)
        assert root is not None
        return await _read(await _node(root, path))

    return trio.run(main)


def load_npy(store: Store | Path, path: str) -> np.ndarray:
    return np.load(io.BytesIO(read_file(store, path)), allow_pickle=False)


def listing(store: Path, path: str) -> list[str]:
    async def main() -> list[str]:
        root = await vectors(DirectoryStore(store))
        assert root is not None
        node = await _node(root, path) if path else root
        return [n for n, _ in await node.children()]

    return trio.run(main)


def level_cases(pred=lambda e, le: True, draco: bool = False) -> list[tuple[str, str]]:
    """(store, level) pairs the predicate picks; Draco stores only when asked for."""
    return [(n, lv) for n, e in sorted(MANIFEST.items()) for lv, le in sorted(e["levels"].items())
            if (draco or e.get("encoding") != "draco") and pred(e, le)]


def canon_faces(faces: np.ndarray) -> set[tuple[int, ...]]:
    """Faces as rotation-normalized tuples: same set means same faces with the same winding."""
    out = set()
    for f in np.asarray(faces).tolist():
        i = f.index(min(f))
        out.add(tuple(f[i:] + f[:i]))
    return out


def edge_set(edges: np.ndarray) -> list[tuple[int, int]]:
    return sorted(map(tuple, np.asarray(edges).reshape(-1, 2).tolist()))


def coord_edges(pos: np.ndarray, edges: np.ndarray, undirected: bool = False) -> list:
    out = []
    for a, b in np.asarray(edges).reshape(-1, 2).tolist():
        pa, pb = tuple(np.round(pos[a].astype(float), 4)), tuple(np.round(pos[b].astype(float), 4))
        out.append(tuple(sorted((pa, pb))) if undirected else (pa, pb))
    return sorted(out)


# --------------------------------------------------------------------------- fixtures present


def test_fixture_set_covers_the_issue() -> None:
    kinds = {(n.split("/")[0], e["kind"]) for n, e in MANIFEST.items()}
    for tag in ("v07", "v09"):
        for kind in ("points", "streamline", "polyline", "mesh", "graph", "skeleton"):
            assert (tag, kind) in kinds
    assert any(len(e["levels"]) > 1 for e in MANIFEST.values())  # build_pyramid
    assert MANIFEST["v09/mesh_draco"]["encoding"] == "draco"
    doc = json.loads((store_dir("v09/points_sharded_blosc") / "0" / "vertices" / "zarr.json").read_text())
    assert doc["codecs"][0]["name"] == "sharding_indexed"
    assert "blosc" in json.dumps(doc["codecs"])


# --------------------------------------------------------------------------- decoded npy vs reference


@pytest.mark.parametrize("name,lv", level_cases(lambda e, le: "positions" in le or "vertices" in le))
def test_vertices_equal_reference(name: str, lv: str) -> None:
    le = MANIFEST[name]["levels"][lv]
    want = ref(name, le.get("positions") or le["vertices"])
    got = load_npy(store_dir(name), f"{lv}/vertices.npy")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def assert_vertex_attributes_match(name: str, lv: str, meta: dict[str, Any],
                                   load: Callable[[str], np.ndarray]) -> None:
    """vertex_attributes/<attr>.npy of level ``lv`` (``load`` reads a file below the level)
    equal what zarr-vectors wrote; categorical ones through the categories in ``meta``."""
    for attr, fname in MANIFEST[name]["levels"][lv]["vertex_attributes"].items():
        want = ref(name, fname)
        got = load(f"vertex_attributes/{attr}.npy")
        cats = meta["vertex_attributes"][attr].get("categories")
        if cats is not None:  # categorical: codes in the file, categories in meta.json
            assert got.dtype.kind in "ui"
            got = np.asarray(cats)[got]
        assert got.shape == want.shape, attr
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name,lv", level_cases(lambda e, le: bool(le.get("vertex_attributes"))))
def test_vertex_attributes_equal_reference(name: str, lv: str) -> None:
    meta = json.loads(read_file(store_dir(name), f"{lv}/meta.json"))
    assert_vertex_attributes_match(name, lv, meta, lambda rel: load_npy(store_dir(name), f"{lv}/{rel}"))
    assert any("categories" in v for v in meta["vertex_attributes"].values())
    assert meta["vertex_attributes"]["rgb"]["shape"][1:] == [3]


@pytest.mark.parametrize("name,lv", level_cases(lambda e, le: bool(le.get("objects"))))
def test_objects_equal_reference(name: str, lv: str) -> None:
    le = MANIFEST[name]["levels"][lv]
    names = listing(store_dir(name), f"{lv}/objects")
    for oid, fname in le["objects"].items():
        assert f"{oid}.npy" in names
        np.testing.assert_array_equal(load_npy(store_dir(name), f"{lv}/objects/{oid}.npy"), ref(name, fname))
    for oid, fname in le.get("polylines", {}).items():
        np.testing.assert_array_equal(load_npy(store_dir(name), f"{lv}/objects/{oid}.npy"), ref(name, fname))


@pytest.mark.parametrize("name,lv", level_cases(lambda e, le: bool(le.get("object_attributes") or le.get("groups"))))
def test_object_attributes_and_groups(name: str, lv: str) -> None:
    le = MANIFEST[name]["levels"][lv]
    for attr, fname in le.get("object_attributes", {}).items():
        got = load_npy(store_dir(name), f"{lv}/object_attributes/{attr}.npy")
        np.testing.assert_array_equal(got, ref(name, fname))
    for gid, fname in le.get("groups", {}).items():
        got = load_npy(store_dir(name), f"{lv}/groups/{gid}.npy")
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, ref(name, fname))


def assert_graph_links_match(name: str, load: Callable[[str], np.ndarray]) -> None:
    """Level 0's links/0.npy and link_attributes/weight.npy of graph store ``name`` (``load``
    reads a file below the level) are the edges and weights zarr-vectors wrote."""
    links = load("links/0.npy")
    assert links.dtype == np.int64 and links.shape[1] == 2
    assert edge_set(links) == edge_set(ref(name, "L0_edges.npy"))
    w = load("link_attributes/weight.npy")
    assert len(w) == len(links)
    # the written weights were edge_index + 0.5, per input edge; check them by endpoints
    pos = load("vertices.npy")
    inp_pos, inp_edges = ref(name, "input_positions.npy"), ref(name, "input_edges.npy")
    key = {coord_edges(inp_pos, inp_edges[i : i + 1])[0]: i + 0.5 for i in range(len(inp_edges))}
    seen = 0
    for row, weight in zip(links, w, strict=True):
        if np.isnan(weight):  # 0.2.0 writes no attributes for cross-chunk edges
            assert name.startswith("v07")
            continue
        assert key[coord_edges(pos, row[None])[0]] == weight
        seen += 1
    assert seen >= 1


@committed_corpus
@pytest.mark.parametrize("name", ["v07/graph", "v09/graph"])
def test_graph_links_and_link_attributes(name: str) -> None:
    assert_graph_links_match(name, lambda rel: load_npy(store_dir(name), f"0/{rel}"))


@pytest.mark.parametrize("name", ["v07/mesh", "v09/mesh"])
def test_mesh_faces_keep_winding(name: str) -> None:
    faces = load_npy(store_dir(name), "0/links/0.npy")
    assert faces.shape[1] == 3
    assert canon_faces(faces) == canon_faces(ref(name, "L0_faces.npy"))


@pytest.mark.parametrize("name", ["v07/skeleton", "v09/skeleton"])
def test_skeleton_edges(name: str) -> None:
    """level.ply edges = the tree that was written. (0.2.0's read_graph adds an edge the
    writer never stored, fixed in 0.9; so v07 is checked against the written input.)"""
    from plyfile import PlyData

    ply = PlyData.read(io.BytesIO(read_file(store_dir(name), "0/level.ply")))
    pos = np.stack([ply["vertex"][a] for a in "xyz"], axis=1)
    edges = np.stack([ply["edge"]["vertex1"], ply["edge"]["vertex2"]], axis=1)
    assert coord_edges(pos, edges) == coord_edges(ref(name, "input_positions.npy"), ref(name, "input_edges.npy"))
    if name.startswith("v09"):
        assert edge_set(edges) == edge_set(ref(name, "L0_edges.npy"))


def test_ply_keeps_64_bit_integers_exact_as_doubles() -> None:
    """PLY has no 64-bit integer type; such positions and attributes went out as 32-bit
    ints, so 10**10 read as 1410065408 and 3e9 as -1294967296 (a helper's audit, with
    plyfile). They are doubles now: plyfile reads back the values written."""
    from plyfile import PlyData

    from zvfs.views.vectors.encoders import ply_bytes

    pos = np.array([[3_000_000_000, 0, -5], [1, 2, 2**53]], dtype=np.int64)
    big = np.array([10**10, 7], dtype=np.uint64)
    ply = PlyData.read(io.BytesIO(ply_bytes(pos, [("big", big)], np.empty((0, 3), np.int64),
                                            np.empty((0, 2), np.int64), "test")))
    got = np.stack([ply["vertex"][a] for a in "xyz"], axis=1)
    assert got.astype(np.int64).tolist() == pos.tolist()
    assert ply["vertex"]["big"].astype(np.uint64).tolist() == big.tolist()


# --------------------------------------------------------------------------- legacy formats


def assert_ply_vertex_attributes(ply: Any, name: str, lv: str, load: Callable[[str], np.ndarray]) -> None:
    """level.ply holds each vertex attribute of level ``lv`` (``load`` reads a file below the
    level) as vertex properties: one named after it, or one per channel (<name>_<j>)."""
    props = {p.name for p in ply["vertex"].properties}
    for attr in MANIFEST[name]["levels"][lv].get("vertex_attributes", {}):
        a = load(f"vertex_attributes/{attr}.npy")
        if a.ndim == 1:
            np.testing.assert_array_equal(ply["vertex"][attr], a)
        else:
            for j in range(a.shape[1]):
                assert f"{attr}_{j}" in props
                np.testing.assert_array_equal(ply["vertex"][f"{attr}_{j}"], a[:, j])


@pytest.mark.parametrize("name", [n for n, e in sorted(MANIFEST.items()) if e.get("encoding") != "draco"])
def test_level_ply_loads_with_plyfile(name: str) -> None:
    from plyfile import PlyData

    d = store_dir(name)
    for lv in MANIFEST[name]["levels"]:
        ply = PlyData.read(io.BytesIO(read_file(d, f"{lv}/level.ply")))
        verts = load_npy(d, f"{lv}/vertices.npy")
        got = np.stack([ply["vertex"][a] for a in "xyz"], axis=1)
        np.testing.assert_array_equal(got, verts)
        assert_ply_vertex_attributes(ply, name, lv, lambda rel, lv=lv: load_npy(d, f"{lv}/{rel}"))
        kind = MANIFEST[name]["kind"]
        if kind == "mesh":
            faces = np.stack(ply["face"]["vertex_indices"])
            assert canon_faces(faces) == canon_faces(ref(name, "L0_faces.npy"))
        if kind == "graph":
            edges = np.stack([ply["edge"]["vertex1"], ply["edge"]["vertex2"]], axis=1)
            assert edge_set(edges) == edge_set(ref(name, "L0_edges.npy"))


@pytest.mark.parametrize("name", [n for n, e in sorted(MANIFEST.items()) if e["kind"] in ("streamline", "polyline")])
def test_streamlines_trk_loads_with_nibabel(name: str, tmp_path: Path) -> None:
    import nibabel as nib

    p = tmp_path / "s.trk"
    p.write_bytes(read_file(store_dir(name), "0/streamlines.trk"))
    trk = nib.streamlines.load(str(p))
    want = MANIFEST[name]["levels"]["0"]["polylines"]
    assert len(trk.streamlines) == len(want)
    for i, oid in enumerate(sorted(want, key=int)):
        np.testing.assert_array_equal(np.asarray(trk.streamlines[i], np.float32), ref(name, want[oid]))


def manifest_items(cell: Path) -> list[bytes]:
    """The per-object manifests of a 0.9 level (one zstd vlen-bytes cell)."""
    from numcodecs import Zstd

    body = Zstd().decode(cell.read_bytes())
    count, off, items = struct.unpack("<I", body[:4])[0], 4, []
    for _ in range(count):
        ln = struct.unpack("<I", body[off : off + 4])[0]
        items.append(bytes(body[off + 4 : off + 4 + ln]))
        off += 4 + ln
    return items


def write_manifest_items(cell: Path, items: list[bytes]) -> None:
    from numcodecs import Zstd

    body = struct.pack("<I", len(items)) + b"".join(struct.pack("<I", len(b)) + b for b in items)
    cell.write_bytes(Zstd().encode(body))


@committed_corpus
def test_trk_leaves_out_empty_objects_and_names_each_streamlines_object(tmp_path: Path) -> None:
    """nibabel drops a streamline of no points, which moved every later streamline onto the
    object before it; empty objects are left out, and each streamline carries its object id."""
    import nibabel as nib

    name = "v09/streamlines"
    want = MANIFEST[name]["levels"]["0"]["polylines"]
    d = _copy(tmp_path, name)
    cell = d / "0/object_index/manifests/c/0"
    items = manifest_items(cell)
    assert len(items) == len(want) == 3
    for emptied in (None, 1):
        if emptied is not None:
            items[emptied] = struct.pack("<I", 0)  # a manifest of no blocks: no vertices
            write_manifest_items(cell, items)
        p = tmp_path / f"s{emptied}.trk"
        p.write_bytes(read_file(d, "0/streamlines.trk"))
        trk = nib.streamlines.load(str(p))
        kept = [oid for oid in sorted(want, key=int) if int(oid) != emptied]
        assert trk.header["nb_streamlines"] == len(trk.streamlines) == len(kept)
        ids = trk.tractogram.data_per_streamline["object_id"][:, 0]
        assert ids.tolist() == [float(oid) for oid in kept]
        for i, oid in enumerate(kept):
            np.testing.assert_array_equal(np.asarray(trk.streamlines[i], np.float32), ref(name, want[oid]))


def test_trk_object_ids_past_float32_exactness_ride_in_two_properties(tmp_path: Path) -> None:
    import nibabel as nib

    from zvfs.views.vectors import encoders as enc

    for ids in ([3, 2**24 + 1, 2**40 + 12345], [5, 2**48 + 7, 864691135000000123]):  # uint64 segment ids
        lines = [(oid, np.full((k + 1, 3), k, np.float32)) for k, oid in enumerate(ids)]
        props = enc.trk_id_properties(ids)
        p = tmp_path / "big.trk"
        p.write_bytes(enc.trk_header(len(lines), props) + enc.trk_records(lines, props))
        assert p.stat().st_size == enc.TRK_HEADER_SIZE + sum(enc.trk_record_size(k + 1, props) for k in range(3))
        trk = nib.streamlines.load(str(p))
        per = trk.tractogram.data_per_streamline
        got = np.zeros(3, np.int64)
        for name in props:  # high part first
            got = got * 2**24 + per[name][:, 0].astype(np.int64)
        assert len(props) == (2 if ids[-1] < 2**48 else 3) and got.tolist() == ids, props
        assert [len(s) for s in trk.streamlines] == [1, 2, 3]


def parse_swc(text: str) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray]:
    """A plain SWC reader: (positions, (child, parent) edges as 0-based rows, radius)."""
    rows = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    ids = [int(r[0]) for r in rows]
    index = {i: k for k, i in enumerate(ids)}
    pos = np.array([[float(v) for v in r[2:5]] for r in rows])
    radius = np.array([float(r[5]) for r in rows])
    edges = [(index[int(r[0])], index[int(r[6])]) for r in rows if int(r[6]) != -1]
    for c, p in edges:
        assert p < c  # parents come first
    return pos, edges, radius


@pytest.mark.parametrize("name", ["v07/skeleton", "v09/skeleton"])
def test_swc_per_skeleton_object(name: str) -> None:
    d = store_dir(name)
    inp_pos, inp_edges = ref(name, "input_positions.npy"), ref(name, "input_edges.npy")
    want = coord_edges(inp_pos, inp_edges)
    got_all = []
    objects = [n for n in listing(d, "0/objects") if n.endswith(".swc")]
    assert len(objects) == 2
    for fn in objects:
        pos, edges, radius = parse_swc(read_file(d, f"0/objects/{fn}").decode())
        obj = load_npy(d, f"0/objects/{fn[:-4]}.npy")
        assert sorted(map(tuple, pos.round(4).tolist())) == sorted(map(tuple, obj.astype(float).round(4).tolist()))
        got_all += coord_edges(pos, np.array(edges).reshape(-1, 2))
        assert np.all(radius >= 1.0)  # the radius attribute (1..2) is carried over
    assert sorted(got_all) == want


def _swc_type_store(tmp_path: Path, dtype: str, type_of: Callable[[np.ndarray], np.ndarray]) -> Path:
    """v09/skeleton with a vertex attribute ``swc_type`` of ``dtype``, each vertex's value a
    function of its position (so a test can check an SWC line by its own coordinates)."""
    d = _copy(tmp_path, "v09/skeleton")
    lv = d / "0"
    src, dst = lv / "vertex_attributes/radius", lv / "vertex_attributes/swc_type"
    shutil.copytree(src, dst)
    doc = json.loads((dst / "zarr.json").read_text())
    doc["attributes"].update(name="swc_type", dtype=dtype)
    (dst / "zarr.json").write_text(json.dumps(doc))
    for cell in (dst / "c").rglob("*"):
        if cell.is_file():
            vert = (lv / "vertices/c" / cell.relative_to(dst / "c")).read_bytes()
            pos = np.frombuffer(vert[8:], "<f4").reshape(-1, 3)
            cell.write_bytes(_vlen_cell(type_of(pos).astype(dtype).tobytes()))
    return d


def _type_of(pos: np.ndarray) -> np.ndarray:
    """Types past SWC's usual two characters: 100-1099, negative for some vertices."""
    k = np.round(pos @ np.array([7.0, 31.0, 113.0]) * 2).astype(np.int64)
    return np.where(k >= 0, 100 + k, k - 100)


@committed_corpus
@pytest.mark.parametrize("dtype", ["int16", "int64", "float32", "uint8"])
def test_swc_types_of_any_width_are_written_whole(tmp_path: Path, dtype: str) -> None:
    """A type of 100 or more failed the file (its line was wider than the size it was given)."""
    type_of = (lambda pos: np.abs(_type_of(pos)) % 256) if dtype == "uint8" else _type_of
    d = _swc_type_store(tmp_path, dtype, type_of)
    objects = [n for n in listing(d, "0/objects") if n.endswith(".swc")]
    assert len(objects) == 2
    seen = set()
    for fn in objects:
        text = read_file(d, f"0/objects/{fn}").decode()  # its length is checked against its size
        rows = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        pos = np.array([[float(v) for v in r[2:5]] for r in rows], np.float32)
        assert [int(r[1]) for r in rows] == type_of(pos).astype(dtype).astype(np.int64).tolist()
        seen |= {int(r[1]) for r in rows}
    assert max(seen) >= 100 and (dtype == "uint8" or min(seen) < 0), seen
    parse_swc(text)  # still a plain SWC: parents first


def test_a_swc_type_that_is_no_integer_fails_that_file_naming_the_key(tmp_path: Path) -> None:
    d = _swc_type_store(tmp_path, "float32", lambda pos: pos[:, 0] + 0.5)
    fn = next(n for n in listing(d, "0/objects") if n.endswith(".swc"))
    with pytest.raises(NodeError) as err:
        read_file(d, f"0/objects/{fn}")
    assert "0/vertex_attributes/swc_type" in str(err.value) and "not an integer" in str(err.value)
    assert len(load_npy(d, f"0/objects/{fn[:-4]}.npy"))  # the object's vertices still read


def draco_chunk_shape(name: str) -> np.ndarray:
    """The chunk edge of a 0.9 store, from its root zarr.json (metadata, not decoded data)."""
    doc = json.loads((store_dir(name) / "zarr.json").read_text())
    return np.asarray(doc["attributes"]["zarr_vectors"]["chunk_shape"], np.float64)


def intra_chunk_faces(verts: np.ndarray, faces: np.ndarray, chunk_shape: np.ndarray) -> np.ndarray:
    """The faces whose corners all lie in one chunk (what a Draco level serves)."""
    cells = np.floor(verts / chunk_shape).astype(np.int64)
    return np.asarray([f for f in faces.tolist() if len({tuple(cells[k]) for k in f}) == 1], np.int64)


def served_mesh_faces(name: str) -> int:
    """Faces of a corpus mesh's object: the octahedron's 8; a Draco one's inside one chunk."""
    if not name.endswith("draco"):
        return 8
    return len(intra_chunk_faces(ref(name, "input_vertices.npy"), ref(name, "input_faces.npy"),
                                 draco_chunk_shape(name)))


def assert_same_draco_mesh(pos: np.ndarray, faces: np.ndarray, verts_in: np.ndarray,
                           faces_in: np.ndarray, chunk_shape: np.ndarray) -> None:
    """The decoded mesh has the written triangles whose corners share a chunk, each vertex
    within Draco's quantization error (faces compared by coordinates, rotated to start at
    their smallest vertex). A face across chunks is stored as a link to rows as written,
    which Draco reorders and drops: those are not served (mapped onto the decoded rows,
    their corners landed on other vertices: a helper's varied corpus, seed 2)."""
    faces_in = intra_chunk_faces(verts_in, faces_in, chunk_shape)
    assert len(faces_in) > 0, "no face inside one chunk: nothing to compare"
    tol = 10.0 / (2**11) * 2  # extent / 2^quantization_bits, twice for safety

    def tri(p: np.ndarray, f: np.ndarray) -> list[np.ndarray]:
        out = []
        for row in f.tolist():
            i = row.index(min(row, key=lambda k: tuple(p[k])))
            out.append(p[row[i:] + row[:i]])
        return sorted(out, key=lambda t: tuple(t.ravel().round(2)))

    got, want = tri(pos, faces), tri(verts_in, faces_in)
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want, strict=True):
        assert np.abs(a - b).max() <= tol


@committed_corpus
def test_draco_mesh_within_quantization() -> None:
    """The reference for a Draco mesh is the mesh that was written (zarr-vectors 0.9.2's own
    read_mesh cannot read it back). Draco keeps only vertices that intra-chunk faces use."""
    from plyfile import PlyData

    name = "v09/mesh_draco"
    d = store_dir(name)
    verts_in, faces_in = ref(name, "input_vertices.npy"), ref(name, "input_faces.npy")
    ply = PlyData.read(io.BytesIO(read_file(d, "0/level.ply")))
    pos = np.stack([ply["vertex"][a] for a in "xyz"], axis=1)
    np.testing.assert_array_equal(pos, load_npy(d, "0/vertices.npy"))
    faces = np.stack(ply["face"]["vertex_indices"])
    assert_same_draco_mesh(pos, faces, verts_in, faces_in, draco_chunk_shape(name))
    meta = json.loads(read_file(d, "0/meta.json"))
    assert meta["vertex_encoding"] == "draco" and meta["draco"]["available"] is True


@committed_corpus
def test_missing_dracopy_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from zvfs.formats.zv import level as zvlevel

    monkeypatch.setitem(sys.modules, "DracoPy", None)
    monkeypatch.setattr(zvlevel, "_draco", None)
    d = store_dir("v09/mesh_draco")
    with pytest.raises(NodeError) as err:
        read_file(d, "0/vertices.npy")
    assert "DracoPy" in str(err.value)
    meta = json.loads(read_file(d, "0/meta.json"))
    assert meta["draco"]["available"] is False and "DracoPy" in meta["draco"]["error"]
    group = zv.open_group(DirectoryStore(d))
    assert group is not None
    with pytest.raises(zv.MissingDependency, match="DracoPy"):
        group.level("0").vertices((0, 0, 0))


# --------------------------------------------------------------------------- tree, meta, chunks


@committed_corpus
def test_meta_json_describes_the_level() -> None:
    d = store_dir("v09/points")
    meta = json.loads(read_file(d, "0/meta.json"))
    assert meta["layout"] == "0.9" and meta["zv_version"] == "0.9.2"
    assert meta["geometry_type"] == "point_cloud"
    assert meta["vertex_count"] == 14 and meta["ndim"] == 3 and meta["dtype"] == "<f4"
    assert meta["axes"] == ["x", "y", "z"]
    assert meta["vertex_attributes"]["cls"]["categories"] == ["axon", "dend", "soma"]
    assert meta["object_count"] == 4 and meta["group_count"] == 3
    old = json.loads(read_file(store_dir("v07/mesh"), "0/meta.json"))
    assert old["layout"] == "0.7" and old["geometry_type"] == "mesh" and old["link_widths"]["0"] == 3


@committed_corpus
def test_meta_json_is_strict_json_whatever_the_level_attributes_hold(tmp_path: Path) -> None:
    """The level's attributes are copied into meta.json: an -Infinity among them (or NaN)
    was written as that literal, which jq and JSON.parse refuse, so the whole file was
    unreadable to them. Non-finite numbers are Zarr's strings there, as in the arrays view."""
    d = tmp_path / "s"
    shutil.copytree(store_dir("v09/points"), d)
    doc = json.loads((d / "0" / "zarr.json").read_text())
    doc["attributes"]["zarr_vectors_level"]["extra"] = [float("-inf"), float("nan"), {"x": float("inf")}]
    (d / "0" / "zarr.json").write_text(json.dumps(doc))
    text = read_file(d, "0/meta.json").decode()
    meta = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in meta.json"))
    assert meta["level_attributes"]["extra"] == ["-Infinity", "NaN", {"x": "Infinity"}]
    assert meta["vertex_count"] == 14


@pytest.mark.parametrize("name", ["v07/points", "v09/points", "v09/points_sharded_blosc", "v09/mesh"])
def test_chunks_keep_sign_and_concatenate_to_vertices(name: str) -> None:
    d = store_dir(name)
    names = listing(d, "0/chunks")
    assert any(n.startswith("-") or ".-" in n for n in names)
    keys = sorted(names, key=lambda n: tuple(int(c) for c in n.split(".")))
    parts = [load_npy(d, f"0/chunks/{n}/vertices.npy") for n in keys]
    np.testing.assert_array_equal(np.concatenate(parts), load_npy(d, "0/vertices.npy"))


def test_level_listing() -> None:
    d = store_dir("v09/points_pyramid")
    assert listing(d, "") == ["0", "1"]
    top = listing(d, "0")
    for want in ("vertices.npy", "vertex_attributes", "objects", "object_attributes", "groups",
                 "chunks", "level.ply", "meta.json"):
        assert want in top
    assert "streamlines.trk" in listing(store_dir("v09/streamlines"), "0")
    assert any(n.endswith(".ply") for n in listing(store_dir("v09/mesh"), "0/objects"))


class CountingStore(Store):
    """Records every key whose bytes were fetched."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.fetched: list[str] = []

    def get(self, key: str) -> bytes:
        self.fetched.append(key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.fetched.append(key)
        return self.inner.get_range(key, start, length)

    def info(self, key: str) -> KeyInfo:
        return self.inner.info(key)

    def list_dir(self, prefix: str) -> Listing:
        return self.inner.list_dir(prefix)


@pytest.mark.parametrize("name", ["v07/points", "v09/points", "v09/points_sharded_blosc"])
def test_sizes_come_without_reading_vertices(name: str) -> None:
    st = CountingStore(DirectoryStore(store_dir(name)))

    async def main() -> int:
        root = await vectors(st)
        assert root is not None
        lv = await root.lookup("0")
        size = (await lv.lookup("vertices.npy")).size
        for _n, child in await (await lv.lookup("vertex_attributes")).children():
            assert child.size > 0
        return size

    size = trio.run(main)
    assert size == len(read_file(store_dir(name), "0/vertices.npy"))
    data_keys = [k for k in st.fetched if "/vertices/" in k and not k.endswith("zarr.json")]
    if name != "v09/points_sharded_blosc":  # a shard holds vertices and nothing else
        assert data_keys == []
    # an attribute whose metadata gives no width has it measured on one cell: zarr-vectors
    # stamps multi-column ones one column (0.7: the child array's shape says it, no read)
    cells_read = [k for k in st.fetched if "/vertex_attributes/" in k and not k.endswith("zarr.json")]
    if name.startswith("v07"):
        assert cells_read == []
    else:
        assert len(set(cells_read)) <= 2 and {k.split("/")[2] for k in cells_read} <= {"intensity", "cls"}, cells_read


def test_no_zv_group_gives_none(tmp_path: Path) -> None:
    (tmp_path / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    assert trio.run(vectors, DirectoryStore(tmp_path)) is None


def test_nested_zv_group_appears_under_its_path(tmp_path: Path) -> None:
    (tmp_path / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    shutil.copytree(store_dir("v09/points"), tmp_path / "sub" / "cells")
    got = load_npy(tmp_path, "sub/cells/0/vertices.npy")
    np.testing.assert_array_equal(got, ref("v09/points", "L0_positions.npy"))


# --------------------------------------------------------------------------- bad input


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / "s.zarr"
    shutil.copytree(store_dir(name), dst)
    return dst


def _vlen_cell(payload: bytes) -> bytes:
    return struct.pack("<II", 1, len(payload)) + payload


@committed_corpus
def test_wrong_fragment_magic(tmp_path: Path) -> None:
    d = _copy(tmp_path, "v09/points")
    cell = d / "0" / "vertex_fragments" / "c" / "1" / "1" / "1"
    raw = bytearray(cell.read_bytes())
    raw[8:12] = b"XXXX"
    cell.write_bytes(bytes(raw))
    with pytest.raises(NodeError) as err:
        read_file(d, "0/vertices.npy")
    assert "0/vertex_fragments/0.0.0" in str(err.value) and "magic" in str(err.value)
    # the rest of the level still answers
    assert json.loads(read_file(d, "0/meta.json"))["errors"]
    with pytest.raises(zv.ZVError, match="magic"):
        zv.parse_fragment_index(b"\x00" * 40, "k")


@committed_corpus
def test_a_fragment_index_naming_millions_of_rows_fails_fragments_json_alone(tmp_path: Path) -> None:
    """A fragment index of 41 bytes can name 2**24 rows in one range: its fragments.json,
    built with the chunk's directory, took a hostile-fuzz daemon from 70 to 286 MiB. Past
    FRAGMENTS_JSON_ROWS that one file fails, naming the key; the chunk's other files and
    the other chunks still answer."""
    from zvfs.views.vectors.level import FRAGMENTS_JSON_ROWS

    d = _copy(tmp_path, "v09/points")
    cell = d / "0" / "vertex_fragments" / "c" / "1" / "1" / "1"
    rows = FRAGMENTS_JSON_ROWS + 1
    index = (struct.pack("<IHHII", zv.FRAGMENT_MAGIC, 1, 0, 1, 1) + b"\x01" + b"\x00" * 7
             + struct.pack("<qq", 0, rows) + struct.pack("<I", 0))
    assert zv.parse_fragment_index(index, "k").sizes().tolist() == [rows]
    cell.write_bytes(_vlen_cell(index))
    with pytest.raises(NodeError) as err:
        read_file(d, "0/chunks/0.0.0/fragments.json")
    assert "0/vertex_fragments/0.0.0" in str(err.value) and f"{rows:,} rows" in str(err.value)
    assert json.loads(read_file(d, "0/chunks/-1.0.0/fragments.json"))  # another chunk's
    np.testing.assert_array_equal(load_npy(d, "0/chunks/-1.0.0/vertices.npy"),
                                  load_npy(store_dir("v09/points"), "0/chunks/-1.0.0/vertices.npy"))


@committed_corpus
def test_a_fragment_range_past_its_chunk_is_refused_before_its_rows_are_made(tmp_path: Path) -> None:
    """A flipped fragment index of a ZV 0.7 skeleton (scripts/fuzz-hostile --seed 4307)
    named millions of rows of a chunk of one: an object's .npy and .swc made them, 32 MB a
    time, before they were found past the chunk's end (the daemon went from 48 to 181 MiB).
    The range is checked against the chunk first now: an object that names it fails naming
    a key of the chunk, in a few MiB; the others still read."""
    import tracemalloc

    d = _copy(tmp_path, "v07/skeleton")
    cell = d / "0" / "vertex_fragments" / "0.0.0" / "c" / "0"
    index = (struct.pack("<IHHII", zv.FRAGMENT_MAGIC, 1, 0, 1, 1) + b"\x01" + b"\x00" * 7
             + struct.pack("<qq", 0, 1 << 22) + struct.pack("<I", 0))
    assert len(index) == len(cell.read_bytes())  # the array's shape holds it
    cell.write_bytes(index)
    failed, served = [], 0
    tracemalloc.start()
    try:
        for f in sorted(n for n in listing(d, "0/objects") if n.endswith((".npy", ".swc"))):
            try:
                read_file(d, f"0/objects/{f}")
                served += 1
            except NodeError as exc:
                failed.append((f, str(exc)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert failed and served, (failed, served)
    assert all("0.0.0" in why for _, why in failed), failed
    assert peak < 8 << 20, (peak, failed)


def test_fragment_ranges_whose_ends_wrap_past_int64_are_refused() -> None:
    """Ranges are (start, count) int64 pairs, each checked non-negative and their sum
    checked against MAX_CHUNK_ROWS; two of (2**62, 2**62) sum to -2**63 in int64 and
    passed, so four ranges of 2**24 rows before them were made when the chunk's directory
    was listed (a 124-byte blob; 64 such ranges would have been 4 GB; a helper's audit)."""
    ranges = [(0, 1 << 24)] * 4 + [(2**62, 2**62)] * 2
    n = len(ranges)
    blob = (struct.pack("<IHHII", zv.FRAGMENT_MAGIC, 1, 0, n, n) + bytes([(1 << n) - 1]) + b"\x00" * 7
            + b"".join(struct.pack("<qq", s, c) for s, c in ranges) + struct.pack("<I", 0))
    with pytest.raises(zv.ZVError, match="rows past"):
        zv.parse_fragment_index(blob, "k")


def _claiming_index(rows: int) -> bytes:
    """A fragment index of one fragment, a range of ``rows`` rows: 41 bytes claiming them."""
    return (struct.pack("<IHHII", zv.FRAGMENT_MAGIC, 1, 0, 1, 1) + b"\x01" + b"\x00" * 7
            + struct.pack("<qq", 0, rows) + struct.pack("<I", 0))


def _traced_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@committed_corpus
def test_a_manifest_counting_millions_of_fragments_is_refused_before_they_are_made(tmp_path: Path) -> None:
    """A mode-1 manifest block is (start, count): 40 blocks of 2**24 fragments in 1,644 bytes
    had the daemon build 5 GiB of fragment numbers as the level was listed, before any was
    checked against its chunk (a helper's audit). A run is kept as a range now, checked
    against the chunk's fragment index before a number is made, and a level's manifests
    name at most MAX_TABLE_BYTES / 8 fragments together: the object fails naming the
    manifests, in a few MiB, and the level's other files still answer."""
    d = _copy(tmp_path, "v09/streamlines")
    cell = d / "0" / "object_index" / "manifests" / "c" / "0"
    items = manifest_items(cell)
    chunk = zv.parse_manifest(items[0], 3, "m")[0].chunk
    block = np.asarray(chunk, "<i8").tobytes() + b"\x01" + struct.pack("<qq", 0, 1 << 24)
    write_manifest_items(cell, [struct.pack("<I", 1) + block, *items[1:]])
    level = zv.open_group(DirectoryStore(d), "").level("0")
    blocks, peak = _traced_peak(level.manifests)
    assert peak < 8 << 20 and len(blocks[0][0].fragments) == 1 << 24, peak
    with pytest.raises(NodeError) as err:
        _, peak = _traced_peak(lambda: read_file(d, "0/objects/0.npy"))
    assert "object_index/manifests" in str(err.value) and "out of range" in str(err.value)
    write_manifest_items(cell, [struct.pack("<I", 40) + block * 40, *items[1:]])
    with pytest.raises(zv.ZVError, match=r"manifests\[0\]: the level's manifests name more than 33,554,432 fragments"):
        _traced_peak(zv.open_group(DirectoryStore(d), "").level("0").manifests)
    names, peak = _traced_peak(lambda: listing(d, "0"))
    assert peak < 8 << 20 and "vertices.npy" in names, (peak, names)
    np.testing.assert_array_equal(load_npy(d, "0/vertices.npy"), load_npy(store_dir("v09/streamlines"), "0/vertices.npy"))


@committed_corpus
def test_polyline_edges_past_the_table_bound_are_refused_from_their_counts(tmp_path: Path) -> None:
    """Objects may name rows again, so a polyline level's edges are not bounded by its
    vertices: two fragment indexes claiming 2**24 rows each (under the vertex bound) and
    every manifest naming both had 6.4 GiB of edges built as the level was listed (a
    helper's audit). The edges are counted first now: level.ply fails alone naming the
    manifests, in a few MiB, and the level's other files are listed."""
    d = _copy(tmp_path, "v09/streamlines")
    rows = (1 << 24) - 4096  # the two under the vertices' bound with the level's others
    for cell in sorted(p for p in (d / "0" / "vertex_fragments" / "c").rglob("*") if p.is_file())[:2]:
        cell.write_bytes(_vlen_cell(_claiming_index(rows)))
    level = zv.open_group(DirectoryStore(d), "").level("0")
    big = [c for c in level.chunks() if level.vertex_count(c) == rows]
    assert len(big) == 2, big
    man = struct.pack("<I", 2) + b"".join(np.asarray(c, "<i8").tobytes() + b"\x00" + struct.pack("<q", 0) for c in big)
    cell = d / "0" / "object_index" / "manifests" / "c" / "0"
    write_manifest_items(cell, [man] * len(manifest_items(cell)))
    level = zv.open_group(DirectoryStore(d), "").level("0")
    with pytest.raises(zv.ZVError, match="the polylines have over .* edges") as err:
        _, peak = _traced_peak(lambda: zv.graph_edges(level))
    assert "object_index/manifests" in str(err.value)
    names, peak = _traced_peak(lambda: listing(d, "0"))
    assert peak < 8 << 20 and "level.ply" not in names and "vertices.npy" in names, (peak, names)


@committed_corpus
def test_an_absent_attribute_cell_is_zeros_only_for_the_vertices_stored(tmp_path: Path, monkeypatch) -> None:
    """A chunk's absent attribute cell is served as zeros, one row a vertex. The count was
    the fragment index's word alone, and the columns the metadata's: an index of 41 bytes
    claiming 2**24 rows had a 4 KiB read build 2 GiB of zeros (a helper's audit). The
    vertices cell must hold them now, and the zeros are bounded as a level-wide table is."""
    d = _copy(tmp_path, "v09/points")
    (d / "0" / "vertex_attributes" / "intensity" / "c" / "1" / "1" / "1").unlink()  # chunk 0.0.0's
    want = load_npy(store_dir("v09/points"), "0/vertex_attributes/intensity.npy")
    got = load_npy(d, "0/vertex_attributes/intensity.npy")
    last = zv.open_group(DirectoryStore(d), "").level("0").chunks()[-1]
    assert last == (0, 0, 0)  # the file's last row
    np.testing.assert_array_equal(got[:-1], want[:-1])
    assert got[-1] == 0 and want[-1] != 0
    (d / "0" / "vertex_fragments" / "c" / "1" / "1" / "1").write_bytes(_vlen_cell(_claiming_index(1 << 24)))
    level = zv.open_group(DirectoryStore(d), "").level("0")
    with pytest.raises(zv.ZVError, match="the fragment index says 16777216") as err:
        _, peak = _traced_peak(lambda: level.vertex_attribute("intensity", (0, 0, 0)))
    assert "0/vertices/0.0.0" in str(err.value)
    _, peak = _traced_peak(lambda: pytest.raises(zv.ZVError, level.vertex_attribute, "intensity", (0, 0, 0)))
    assert peak < 8 << 20, peak
    monkeypatch.setattr(cells, "MAX_TABLE_BYTES", 2)  # the zeros' bound: one f4 row is 4
    d2 = _copy(tmp_path / "b", "v09/points")
    (d2 / "0" / "vertex_attributes" / "intensity" / "c" / "1" / "1" / "1").unlink()
    with pytest.raises(zv.ZVError, match="absent: 1 rows of 1 float32 zeros") as err:
        zv.open_group(DirectoryStore(d2), "").level("0").vertex_attribute("intensity", (0, 0, 0))
    assert "0/vertex_attributes/intensity/0.0.0" in str(err.value)


@committed_corpus
def test_a_vertex_blob_of_a_negative_shape_is_an_error_not_a_short_file(tmp_path: Path) -> None:
    """A ZV 0.7 level counts each chunk's vertices from its blob's shape: one of -12 bytes
    counted -1, and vertices.npy said 12 vertices where the level holds 14, served short
    with no error (a helper's audit). It fails naming the blob now."""
    d = _copy(tmp_path, "v07/points")
    meta = d / "0" / "vertices" / "0.0.0" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = [-12]
    meta.write_text(json.dumps(doc))
    with pytest.raises(NodeError) as err:
        read_file(d, "0/vertices.npy")
    assert "0/vertices/0.0.0" in str(err.value) and "-12" in str(err.value)


@committed_corpus
def test_manifest_past_end_of_chunk(tmp_path: Path) -> None:
    from numcodecs import Zstd

    d = _copy(tmp_path, "v07/points")
    mdir = d / "0" / "object_index" / "manifests"
    arr = cells.open_array(DirectoryStore(d), "0/object_index/manifests")
    blobs = cells.read_all(DirectoryStore(d), arr)
    first = zv.parse_manifest(blobs[0], 3, "m")[0]
    # object 0 now asks for fragments 0..4 of a chunk that has one
    bad = struct.pack("<I", 1) + np.asarray(first.chunk, "<i8").tobytes() + b"\x01" + struct.pack("<qq", 0, 5)
    items = [bad, *(bytes(b) for b in blobs[1:])]
    body = struct.pack("<I", len(items)) + b"".join(struct.pack("<I", len(b)) + b for b in items)
    (mdir / "c" / "0").write_bytes(Zstd().encode(body))
    with pytest.raises(NodeError) as err:
        read_file(d, "0/objects/0.npy")
    assert "object_index/manifests" in str(err.value) and "object 0" in str(err.value)
    np.testing.assert_array_equal(load_npy(d, "0/objects/1.npy"), ref("v07/points", "L0_object_1.npy"))


@committed_corpus
@pytest.mark.parametrize("name", ["v07/points", "v09/points"])
def test_truncated_vertex_blob(tmp_path: Path, name: str) -> None:
    d = _copy(tmp_path, name)
    if name.startswith("v09"):
        cell = d / "0" / "vertices" / "c" / "1" / "1" / "1"
        payload = cell.read_bytes()[8:]
        cell.write_bytes(_vlen_cell(payload[:-2]))
        key = "0/vertices/0.0.0"
    else:
        cell = d / "0" / "vertices" / "0.0.0" / "c" / "0"
        cell.write_bytes(cell.read_bytes()[:-2])
        key = "0/vertices/0.0.0"
    with pytest.raises(NodeError) as err:
        read_file(d, "0/vertices.npy")
    assert key in str(err.value)
    assert read_file(d, "0/meta.json")  # the mount keeps answering


def test_unknown_zv_version(tmp_path: Path) -> None:
    d = _copy(tmp_path, "v09/streamlines")
    doc = json.loads((d / "zarr.json").read_text())
    doc["attributes"]["zarr_vectors"]["zv_version"] = "7.0.0"
    (d / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(zv.ZVError, match="unknown zv_version '7.0.0'"):
        zv.open_group(DirectoryStore(d))

    async def main() -> None:
        root = await vectors(DirectoryStore(d))
        assert root is not None
        with pytest.raises(NodeError) as err:
            await root.children()
        assert "zv_version" in str(err.value)

    trio.run(main)


def test_lehmer_unpermute_restores_written_order() -> None:
    from zvfs.formats.zv.blobs import lehmer_decode, unpermute_gather

    for width in (2, 3, 4):
        import math

        for code in range(math.factorial(width)):
            perm = lehmer_decode(code, width)
            written = np.arange(10, 10 + width)
            stored = np.empty(width, np.int64)
            stored[np.arange(width)] = written[perm]  # the writer places input[perm[i]] at slot i
            gather = unpermute_gather(np.array([code]), width, "k")[0]
            np.testing.assert_array_equal(stored[gather], written)


def test_permutations_of_links_wider_than_max_perm_width_are_refused() -> None:
    """The table of a link width's permutations has width! rows: metadata declaring 20
    would have the daemon build 20! of them (10 took a helper 16 s and 1.1 GB). Past
    MAX_PERM_WIDTH the links are refused, naming the key; up to it they are undone."""
    from zvfs.formats.zv.blobs import MAX_PERM_WIDTH, unpermute_gather
    from zvfs.formats.zv.errors import ZVError

    assert unpermute_gather(np.array([0]), MAX_PERM_WIDTH, "k").shape == (1, MAX_PERM_WIDTH)
    with pytest.raises(ZVError, match="links of 20 endpoints"):
        unpermute_gather(np.array([0]), 20, "some/links/0.0.0")


def test_cross_level_links_equal_reference() -> None:
    """links/<delta>.npy of a pyramid: endpoint 0 is a row of this level, the others rows of
    level + delta, as zarr-vectors 0.9.2's read_link_arrays places them: its link cells in
    the order of their keys' text, which for negative chunks ("-2.0.2" before "-3.-2.-4",
    points_pyramid_fine) is not their numbers' order, as zvfs had them."""
    for name in ("v09/points_pyramid", "v09/points_pyramid_fine"):
        for lv, le in MANIFEST[name]["levels"].items():
            for delta, fname in le["links"].items():
                got = load_npy(store_dir(name), f"{lv}/links/{delta}.npy")
                np.testing.assert_array_equal(got, ref(name, fname))


@committed_corpus
def test_v07_and_v09_pyramids_link_alike() -> None:
    """The 0.7 pyramid (written from the same draws) links the same rows in the same order."""
    name = "v09/points_pyramid"
    old = load_npy(store_dir("v07/points_pyramid"), "0/links/+1.npy")
    np.testing.assert_array_equal(old, ref(name, MANIFEST[name]["levels"]["0"]["links"]["+1"]))


@pytest.mark.parametrize("name", ["v07/mesh", "v09/mesh", "v09/mesh_draco"])
def test_mesh_object_ply(name: str) -> None:
    from plyfile import PlyData

    d = store_dir(name)
    objs = [n for n in listing(d, "0/objects") if n.endswith(".ply")]
    assert objs == ["0.ply"]
    ply = PlyData.read(io.BytesIO(read_file(d, "0/objects/0.ply")))
    pos = np.stack([ply["vertex"][a] for a in "xyz"], axis=1)
    np.testing.assert_array_equal(pos, load_npy(d, "0/objects/0.npy"))
    want = served_mesh_faces(name)
    faces = np.stack(ply["face"]["vertex_indices"]) if want else np.empty((0, 3), np.int64)
    assert len(faces) == want and (not want or faces.max() < len(pos))


# --------------------------------------------------------------------------- attribute names in level.ply


def _names_ply(d: Path) -> tuple[Any, dict[str, Any]]:
    from plyfile import PlyData

    return PlyData.read(io.BytesIO(read_file(d, "0/level.ply"))), json.loads(read_file(d, "0/meta.json"))


def test_attribute_names_a_ply_header_cannot_take_are_made_safe_and_unique() -> None:
    """zarr-vectors writes ``my attr`` and ``dichte_é``: the first went into the header as
    it was (plyfile: PlyHeaderParseError, nothing logged), the second failed the whole
    level directory (UnicodeEncodeError); ``x`` with ``attr_x`` renamed the axis clash to
    a name taken already (plyfile: duplicate field). Each now has a property of its own,
    named in meta.json, holding the values the writer was given."""
    name = "v09/points_names"
    d = store_dir(name)
    ply, meta = _names_ply(d)
    props = [p.name for p in ply["vertex"].properties]
    assert len(props) == len(set(props))
    np.testing.assert_array_equal(np.stack([ply["vertex"][a] for a in "xyz"], axis=1),
                                  ref(name, MANIFEST[name]["levels"]["0"]["positions"]))
    want = {"my attr": ["my_attr"], "dichte_é": ["dichte__"], "attr_x": ["attr_x"], "x": ["attr_x_2"]}
    for attr, ply_props in want.items():
        assert meta["vertex_attributes"][attr]["ply_properties"] == ply_props
        values = ref(name, MANIFEST[name]["levels"]["0"]["attributes"][attr])
        np.testing.assert_array_equal(ply["vertex"][ply_props[0]], values)
        np.testing.assert_array_equal(load_npy(d, f"0/vertex_attributes/{attr}.npy"), values)


def test_a_newline_in_an_attribute_name_injects_no_header_line(tmp_path: Path) -> None:
    """A newline in a name started a header line of its own (here ``lines``, which plyfile
    refuses; ``end_header`` would have ended the header there)."""
    d = _copy(tmp_path, "v09/points_names")
    va = d / "0/vertex_attributes"
    (va / "my attr").rename(va / "end_header\nlines")
    doc = json.loads((va / "end_header\nlines/zarr.json").read_text())
    doc["attributes"]["name"] = "end_header\nlines"
    (va / "end_header\nlines/zarr.json").write_text(json.dumps(doc))
    ply, meta = _names_ply(d)
    assert meta["vertex_attributes"]["end_header\nlines"]["ply_properties"] == ["end_header_lines"]
    np.testing.assert_array_equal(ply["vertex"]["end_header_lines"],
                                  load_npy(d, "0/vertex_attributes/end_header\nlines.npy"))
    header = read_file(d, "0/level.ply").split(b"\nend_header\n", 1)[0].decode("ascii").split("\n")
    assert {ln.split()[0] for ln in header[1:]} == {"format", "comment", "element", "property"}


def test_a_level_ply_that_cannot_be_built_fails_only_level_ply(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The PLY header was built outside the per-file guard: its failure was the whole level
    directory's (listing, meta.json, vertices.npy EIO), logged naming no file. Now level.ply
    alone fails (left out of the listing, EIO naming it), with one log line naming it."""
    from zvfs.views.vectors import encoders as enc

    def broken(*args: Any, **kw: Any) -> bytes:
        raise UnicodeEncodeError("ascii", "é", 0, 1, "ordinal not in range(128)")

    monkeypatch.setattr(enc, "ply_header", broken)
    name = "v09/points"
    d = store_dir(name)
    with caplog.at_level("WARNING"):
        assert {"meta.json", "vertices.npy", "vertex_attributes"} <= set(listing(d, "0"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "0/level.ply" in lines[0], lines
    np.testing.assert_array_equal(load_npy(d, "0/vertices.npy"), ref(name, "L0_positions.npy"))
    assert "level.ply" in json.loads(read_file(d, "0/meta.json"))["errors"]
    with pytest.raises(NodeError) as err:
        read_file(d, "0/level.ply")
    assert "0/level.ply" in str(err.value)


def test_an_attribute_named_c_is_served() -> None:
    """``c`` is a chunk directory below an array, but was dropped below groups too: the
    attribute ``c`` zarr-vectors wrote was missing from vertex_attributes/, level.ply and
    meta.json, and nothing said so."""
    from plyfile import PlyData

    name = "v09/points_names"
    d = store_dir(name)
    want = ref(name, MANIFEST[name]["levels"]["0"]["attributes"]["c"])
    assert "c.npy" in listing(d, "0/vertex_attributes")
    np.testing.assert_array_equal(load_npy(d, "0/vertex_attributes/c.npy"), want)
    assert json.loads(read_file(d, "0/meta.json"))["vertex_attributes"]["c"]["ply_properties"] == ["c"]
    ply = PlyData.read(io.BytesIO(read_file(d, "0/level.ply")))
    np.testing.assert_array_equal(ply["vertex"]["c"], want)


def _trk_ids(trk: Any) -> list[int]:
    """Each streamline's object id from its id properties, high part first (README)."""
    per = trk.tractogram.data_per_streamline
    names = [n for n in ("object_id", "object_id_hi", "object_id_mid", "object_id_lo") if n in per]
    got = np.zeros(len(trk.streamlines), np.int64)
    for n in names:
        got = got * 2**24 + per[n][:, 0].astype(np.int64)
    return got.tolist()


@committed_corpus
@pytest.mark.parametrize("ids", [[-5, 7, 2], [-5, 7, -2**30], [2**40, -2**50 - 3, 0]])
def test_trk_negative_object_ids_round_trip(tmp_path: Path, ids: list[int]) -> None:
    """zarr-vectors' object_ids array is int64 and objects/<id>.npy serve negative ids, but
    streamlines.trk sized its id parts by the largest id and split the rest modulo 2**24:
    -5 read 16777211 and -2**30 read 0 (a real object's id). nibabel now reads each
    streamline's own id, the one whose objects/<id>.npy holds its points."""
    import nibabel as nib
    import zarr

    d = _copy(tmp_path, "v09/streamlines")
    zarr.open_array(str(d / "0/object_index/object_ids"), mode="r+")[:] = np.array(ids, np.int64)
    p = tmp_path / "s.trk"
    p.write_bytes(read_file(d, "0/streamlines.trk"))
    trk = nib.streamlines.load(str(p))
    got = _trk_ids(trk)
    assert sorted(got) == sorted(ids)
    for oid, pts in zip(got, trk.streamlines, strict=True):
        np.testing.assert_array_equal(np.asarray(pts, np.float32), load_npy(d, f"0/objects/{oid}.npy"))


@committed_corpus
def test_a_bad_mesh_link_cell_fails_the_object_plys_not_the_objects_dir(tmp_path: Path) -> None:
    """objects/ built the mesh's faces outside the per-file guard: one link cell whose
    endpoint is not a vertex of its chunk made the whole directory EIO, the objects'
    .npy files (which need no faces) too. Only the .ply files fail now, naming the cell."""
    d = _copy(tmp_path, "v09/mesh")  # (a Draco mesh's links are not read: see level_links)
    cell = d / "0/links/0/+1.-1.0_+1.0.0/c/0/1/1"
    rows = np.frombuffer(cell.read_bytes()[8:], "<i8").copy()
    rows[-1] = 999  # ragged header (1 group at offset 0), then perm + three endpoints
    cell.write_bytes(_vlen_cell(rows.tobytes()))
    names = listing(d, "0/objects")
    npys = [n for n in names if n.endswith(".npy")]
    assert npys and not any(n.endswith(".ply") for n in names)
    for n in npys:
        assert len(load_npy(d, f"0/objects/{n}")) > 0
        with pytest.raises(NodeError) as err:
            read_file(d, f"0/objects/{n[:-4]}.ply")
        assert "0/links/0/" in str(err.value) and "vertex 999" in str(err.value)


def test_a_bad_nonempty_chunks_entry_names_its_key(tmp_path: Path) -> None:
    """A chunk name that is no integers raised a bare ValueError: the log line named no key."""
    d = _copy(tmp_path, "v09/points")
    meta = d / "0/vertices/zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["nonempty_chunks"] = ["0.0.0", "x.y.z"]
    meta.write_text(json.dumps(doc))
    with pytest.raises(NodeError) as err:
        read_file(d, "0/vertices.npy")
    assert "0/vertices/zarr.json" in str(err.value) and "nonempty_chunks" in str(err.value)


def _wide_attribute_by_vertex(name: str) -> dict[tuple[float, ...], np.ndarray]:
    """The two-column attribute zarr-vectors was given, keyed by each vertex's position."""
    le = MANIFEST[name]["levels"]["0"]
    out = {}
    for pf, af in zip(le["input_polylines"], le["input_attributes"]["f16"], strict=True):
        for p, a in zip(ref(name, pf), ref(name, af), strict=True):
            out[tuple(p.tolist())] = a
    return out


def test_a_multi_column_attribute_stamped_one_column_is_served_at_its_width() -> None:
    """zarr-vectors 0.9.2's write_polylines stamps a (N, 2) attribute ``row_shape: []``:
    taken at its word, vertex_attributes/f16.npy and all of level.ply (geometry too) were
    EIO ("4 attribute rows for 2 vertices"). The bytes show two columns: both serve them,
    with the values the writer was given (its own reader drops the second column)."""
    from plyfile import PlyData

    name = "v09/polylines_wide_attr"
    d = store_dir(name)
    doc = json.loads((d / "0/vertex_attributes/f16/zarr.json").read_text())
    assert doc["attributes"]["row_shape"] == []  # the writer's stamp this is about
    want = _wide_attribute_by_vertex(name)
    pos = load_npy(d, "0/vertices.npy")
    f16 = load_npy(d, "0/vertex_attributes/f16.npy")
    assert f16.shape == (len(pos), 2) and f16.dtype == np.float16
    for p, a in zip(pos, f16, strict=True):
        np.testing.assert_array_equal(a, want[tuple(p.tolist())])
    meta = json.loads(read_file(d, "0/meta.json"))
    assert meta["vertex_attributes"]["f16"]["shape"] == [len(pos), 2] and "errors" not in meta
    ply = PlyData.read(io.BytesIO(read_file(d, "0/level.ply")))
    np.testing.assert_array_equal(np.stack([ply["vertex"][a] for a in "xyz"], axis=1), pos)
    np.testing.assert_array_equal(np.stack([ply["vertex"]["f16_0"], ply["vertex"]["f16_1"]], axis=1),
                                  f16.astype(np.float32))


@committed_corpus
def test_attribute_bytes_of_no_whole_width_leave_only_that_attribute_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Bytes that are no whole number of columns cannot say the width: that attribute is
    left out of vertex_attributes/ and level.ply (one log line naming its cell), the rest
    of level.ply reads."""
    from plyfile import PlyData

    d = _copy(tmp_path, "v09/polylines_wide_attr")
    cells_dir = d / "0/vertex_attributes/f16/c"
    for cell in sorted(p for p in cells_dir.rglob("*") if p.is_file()):
        cell.write_bytes(_vlen_cell(cell.read_bytes()[8:] + b"\x00\x00"))  # one value more
    with caplog.at_level("WARNING"):
        assert "vertex_attributes" not in listing(d, "0")  # f16 was its only attribute
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "0/vertex_attributes/f16/" in lines[0] and "columns" in lines[0], lines
    ply = PlyData.read(io.BytesIO(read_file(d, "0/level.ply")))
    assert [p.name for p in ply["vertex"].properties] == ["x", "y", "z"]
    np.testing.assert_array_equal(np.stack([ply["vertex"][a] for a in "xyz"], axis=1),
                                  load_npy(d, "0/vertices.npy"))

"""``.zvfs/v2/``: the whole hierarchy as an *uncompressed Zarr v2* store.

netCDF-C 4.9 and GDAL 3.6 read only plain v2; through this mirror they read
v3, compressed, sharded, zip and S3 data. Every array gets compressor null,
filters null, order C, separator '.', an explicit byte order, and one file of
decoded bytes per chunk (edge chunks padded with the fill value, as v2 wants).

Choices made for those readers:

- The byte order is always little-endian ('<'), whatever the source declares (each
  field of a structured dtype too):
  netCDF-C 4.9.0's Zarr reader ignores '>' and returns byte-swapped numbers.
  (``arrays/<path>/data.raw`` keeps the declared order.)
- Every directory of the mirror is a group with ``.zgroup`` and ``.zattrs``,
  also where the source has none (Zarr v1 stores, bare prefixes), so a reader
  can open any level.
- ``_ARRAY_DIMENSIONS`` is written only when the source names every dimension.
  Otherwise it is left out and netCDF-C invents ``_zdim_<size>`` names itself;
  we do not synthesize names. When the same name is used with two sizes
  within a group and its subgroups (v3 does not forbid it, netCDF does), the
  conflicting uses get ``<name>_<size>`` so each dimension has one size.
- Complex arrays get fill_value null: GDAL 3.6 rejects the [re, im] form.
  Every chunk file of the mirror exists (unwritten ones hold the fill), so
  no value is lost.
- A chunk longer than its array (chunks [1024] for shape [5], as netCDF4-python chunks
  a short unlimited dimension, or zarr-python an array smaller than its chunks) is cut
  to the array's length: netCDF-C 4.9 refuses the whole store for one such array
  ("NCZarr error"). That dimension has one chunk either way, so only its files' length
  changes.
- A 0-d array is written as netCDF-C writes a scalar in pure-Zarr mode: shape
  [1], chunks [1], ``_ARRAY_DIMENSIONS: []``. netCDF-C 4.9.0 crashes on shape [].
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from zvfs.formats.meta import ArrayMeta, dtype_str, json_scalar
from zvfs.views.arrays import DecodedArray
from zvfs.views.cfattrs import (
    Typed,
    VarAttributes,
    array_attributes,
    json_attributes,
    legal_attributes,
    nczarr_type,
    translate,
    with_suffix,
)
from zvfs.views.chunk_files import ChunkFile, ChunkGridDir
from zvfs.views.node import BytesFile, Node, StaticDir
from zvfs.views.values import region_bytes


def _dumps(doc: Any) -> bytes:
    """JSON as UTF-8 text, not \\u escapes: netCDF-C 4.10 reads an escaped name such as
    "\\u65f6" as "u65f6" (zarr-python reads both). What UTF-8 cannot hold (a lone surrogate
    from the source's JSON, a name's byte that is not UTF-8) is written as its JSON escape,
    which reads back as the same string (it failed every file of the mirror). A non-finite
    float attribute is the literal NaN / Infinity its source has, which zarr-python,
    netCDF-C and GDAL read as a number (as a string "NaN" it was text to them)."""
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    return text.encode("utf-8", "backslashreplace")


class DocFile(BytesFile):
    """A metadata document of the mirror, as its JSON text and, until the consolidation
    (``.zmetadata``) takes it, as the document: it parsed every file's text back (an eighth
    of the build of a mirror of thousands of arrays). Held no longer than that: the text
    says it all, and a mirror of 100,000 arrays would keep every document twice."""

    def __init__(self, doc: dict[str, Any], mtime_ns: int = 0) -> None:
        super().__init__(_dumps(doc), mtime_ns)
        self._doc: dict[str, Any] | None = doc

    async def document(self) -> Any:
        """The document, once (given up then); parsed from the text after that."""
        doc, self._doc = self._doc, None
        return doc if doc is not None else json.loads(await self.read(0, self.size))


def mirror_dtype(dt: np.dtype) -> np.dtype:
    """The dtype the mirror serves: the source's, made little-endian (see the module doc)."""
    little = dt.newbyteorder("<")  # a structured dtype's fields too
    return dt if little == dt else little


def zarray_doc(meta: ArrayMeta, translated: VarAttributes | None = None) -> dict[str, Any]:
    """The v2 ``.zarray``; ``fill_value`` is the CF fill (see views.cfattrs), which is what v2
    readers (xarray, netCDF-C, GDAL) mask with. Every chunk file exists, so no value depends on it.
    ``translated``: the array's ``array_attributes``, when already at hand.

    A v1 or v2 array of fixed-width bytes or text keeps its own ``fill_value`` (the CF fill
    has none of that type: the netCDF files have no form for a fill of several characters),
    which xarray masks with on the source: dropped, the mirror's values were not masked
    where the source's were (a helper's audit)."""
    translated = translated or array_attributes(meta)
    cf = translated.fill
    if (cf is None and meta.dtype.kind in "SU" and meta.format in ("zarr_v1", "zarr_v2")
            and meta.fill_value is not None and "_FillValue" not in translated.attrs):
        cf = np.array(meta.fill_value, dtype=meta.dtype)
    return {
        "zarr_format": 2,
        "shape": list(meta.shape) or [1],  # 0-d: see the module doc
        "chunks": mirror_chunks(meta),
        "dtype": dtype_str(mirror_dtype(meta.dtype)),
        "compressor": None,
        "filters": None,
        "fill_value": None if meta.dtype.kind == "c" or cf is None else json_scalar(
            np.asarray(cf).astype(mirror_dtype(meta.dtype))),
        "order": "C",
        "dimension_separator": ".",
    }


def mirror_chunks(meta: ArrayMeta) -> list[int]:
    """The mirror's chunk shape: the source's, cut to the array's shape where it is longer
    (see the module doc), and [1] for a 0-d array. Such a dimension has one chunk either way."""
    if not meta.shape:
        return [1]
    return [min(c, s) if s else c for c, s in zip(meta.chunks, meta.shape, strict=True)]


def zattrs_doc(
    meta: ArrayMeta, names: list[str] | None = None, dropped: list[str] | None = None,
    translated: VarAttributes | None = None,
) -> dict[str, Any]:
    """User attributes (CF-translated, under netCDF-legal names), ``_FillValue`` and
    ``_ARRAY_DIMENSIONS`` (``names``: as renamed); ``dropped`` gets the source names left out.

    ``_FillValue`` repeats the ``.zarray`` fill as a number (netCDF-C reads it only from
    here); xarray's base64 and NCZarr's "NaN" spellings never reach a v2 reader.
    """
    translated = translated or array_attributes(meta)
    legal, lost = legal_attributes(translated.attrs)
    if dropped is not None:
        dropped.extend(lost)
    attrs = json_attributes(legal)
    types = attribute_types(legal)
    if translated.fill is not None and meta.dtype.kind in "iuf":
        attrs["_FillValue"] = json_scalar(translated.fill)
        types["_FillValue"] = mirror_dtype(meta.dtype).str
    if names is None:
        names = dimension_names(meta)
    if names is not None:
        attrs["_ARRAY_DIMENSIONS"] = names
    if types:
        attrs[NCZARR_ATTR] = {"types": types}
    return attrs


#: netCDF-C 4.9's key for attribute types; it reads it in pure-Zarr mode too, and xarray hides it
NCZARR_ATTR = "_NCZARR_ATTR"


def attribute_types(attrs: dict[str, Typed]) -> dict[str, str]:
    return {name: t for name, typed in attrs.items() if (t := nczarr_type(typed)) is not None}


def dimension_names(meta: ArrayMeta) -> list[str] | None:
    """The source's dimension names when it names every dimension, else None."""
    if meta.ndim == 0:
        return []  # netCDF-C's own spelling of a scalar (with shape [1])
    names = meta.dimension_names
    if names is None:
        dims = meta.attributes.get("_ARRAY_DIMENSIONS")
        if isinstance(dims, list) and all(isinstance(n, str) for n in dims):
            names = tuple(dims)
    if names and len(names) == meta.ndim and all(isinstance(n, str) and n for n in names):
        return list(names)
    return None


def generated_dimension_names(meta: ArrayMeta) -> list[str]:
    """Names for every dimension: the source's where it has one, else ``dim<i>_<size>``.

    Stable (they depend on the shape only), and shared by arrays of one shape.
    """
    given = list(meta.dimension_names or ()) + [None] * meta.ndim
    return [
        n if isinstance(n, str) and n else f"dim{i}_{size}"
        for i, (n, size) in enumerate(zip(given, meta.shape, strict=False))
    ]


def consistent_dimensions(
    metas: dict[str, ArrayMeta], generate: bool = False, legal: Callable[[str], str] | None = None
) -> dict[str, list[str] | None]:
    """path -> ``_ARRAY_DIMENSIONS`` with one size per name across the whole mirror.

    netCDF-C resolves a name in the variable's group and then its ancestors, so a
    name used with two sizes anywhere is ambiguous. The first size seen (by path)
    keeps the plain name; a use with another size is renamed ``<name>_<size>``, or
    ``<name>_<size>_<k>`` when a source's own name is that already (a rename onto a name
    of another size let netCDF-C read the array cut to that size, silently).
    With ``generate`` (the netCDF files), unnamed dimensions get
    :func:`generated_dimension_names` instead of None. ``legal`` makes a name one the
    format can hold before the sizes are compared ("x " and "x" are one netCDF name); a
    name it leaves unchanged has its size first, so a changed one gives way to it, and to
    a sibling array of that name that is not its coordinate (xarray refused a group whose
    dimension 'cafe\u0301', made 'caf\u00e9', met a scalar 'caf\u00e9'): it is renamed as for
    a size.
    """
    def renamed(name: str, suffix: str) -> str:  # a legal name stays one (within NC_MAX_NAME)
        return name + suffix if legal is None else with_suffix(name, suffix)

    def held_by_other(path: str, name: str) -> bool:
        """A sibling array is called ``name`` and is not the coordinate of a dimension ``name``."""
        parent = path.rpartition("/")[0]
        other = metas.get(f"{parent}/{name}" if parent else name)
        if other is None:
            return False
        dims = dimension_names(other) or []
        return [legal(d) if legal else d for d in dims] != [name]

    sizes: dict[str, int] = {}
    if legal is not None:  # a name the format holds as it is keeps its size first: 'd\t' took 'd_'
        for path in sorted(metas):
            meta = metas[path]
            names = dimension_names(meta) or (generated_dimension_names(meta) if generate else [])
            for name, size in zip(names, meta.shape, strict=False):
                if legal(name) == name:
                    sizes.setdefault(name, size)
    out: dict[str, list[str] | None] = {}
    for path in sorted(metas):
        meta = metas[path]
        names = dimension_names(meta)
        if names is None and generate:
            names = generated_dimension_names(meta)
        if names is None:
            out[path] = None
            continue
        fixed = []
        for source, size in zip(names, meta.shape, strict=True):
            name = source if legal is None else legal(source)
            if (name != source and held_by_other(path, name)) or sizes.setdefault(name, size) != size:
                name = base = renamed(name, f"_{size}")
                k = 1
                while sizes.setdefault(name, size) != size:
                    k += 1
                    name = renamed(base, f"_{k}")
            fixed.append(name)
        out[path] = fixed
    return out


class V2ChunkFile(ChunkFile):
    """One full decoded chunk (C order, padded at the edges), as v2 stores it uncompressed."""

    __slots__ = ()

    @property
    def size(self) -> int:
        meta = self.array.meta
        return math.prod(mirror_chunks(meta)) * meta.dtype.itemsize

    async def read(self, offset: int, length: int) -> bytes:
        await self.array.current()
        meta = self.array.meta
        chunk = await self.array.chunk_as(self.idx, mirror_dtype(meta.dtype))
        cut = mirror_chunks(meta)
        if meta.shape and list(chunk.shape) != cut:  # a chunk longer than the array
            chunk = chunk[tuple(slice(0, c) for c in cut)]
        return region_bytes(chunk, offset, length)


def _tell_dropped(warn: Callable[[str, str], None] | None, path: str, dropped: list[str]) -> None:
    for name in dropped if warn is not None else ():
        warn(f"v2 attribute {path}:{name}", f"v2 mirror: attribute {name!r} of {path or '/'} left out: "
             "another attribute has the same netCDF name")


def mirror_array_dir(
    array: DecodedArray, extra: dict[str, Node] | None = None, dims: list[str] | None = None
) -> ChunkGridDir:
    mtime = array.ctx.node_mtime_ns(array.meta.path)
    meta = array.meta
    dropped: list[str] = []
    translated = array_attributes(meta)  # once for both documents (a tenth of a big mirror's build)
    entries: dict[str, Node] = {
        ".zarray": DocFile(zarray_doc(meta, translated), mtime),
        ".zattrs": DocFile(zattrs_doc(meta, dims, dropped, translated), mtime),
    }
    _tell_dropped(array.ctx.warn_once, meta.path, dropped)
    entries.update(extra or {})
    return ChunkGridDir(array, V2ChunkFile, entries)


def mirror_group_files(
    attrs: dict[str, Any],
    mtime_ns: int,
    types: dict[str, str] | None = None,
    path: str = "",
    warn: Callable[[str, str], None] | None = None,
) -> dict[str, Node]:
    """``.zgroup`` and the group's CF-translated ``.zattrs`` (``types``: NCZarr's attribute
    types); ``warn`` is told of each attribute left out (see legal_attributes)."""
    dropped: list[str] = []
    doc = group_zattrs(translate(attrs, types), dropped)
    _tell_dropped(warn, path, dropped)
    return {
        ".zgroup": DocFile({"zarr_format": 2}, mtime_ns),
        ".zattrs": DocFile(doc, mtime_ns),
    }


def group_zattrs(attrs: dict[str, Typed], dropped: list[str] | None = None) -> dict[str, Any]:
    """A group's ``.zattrs`` under netCDF-legal names; ``dropped`` gets the source names left out."""
    attrs, lost = legal_attributes(attrs)
    if dropped is not None:
        dropped.extend(lost)
    doc = json_attributes(attrs)
    types = attribute_types(attrs)
    if types:
        doc[NCZARR_ATTR] = {"types": types}
    return doc


#: bytes of .zmetadata the mirror holds below its root's: each group's repeats every document
#: below it, so nested groups cost depth x metadata (100 levels of one 100 KB attribute each
#: made 500 MB of them, 255 levels would be 3 GB)
ZMETADATA_BUDGET = 64 << 20


async def consolidate(node: Node) -> dict[str, Any]:
    """Give the group directories below ``node`` a ``.zmetadata``; return ``node``'s documents.

    Each group's ``.zmetadata`` holds every .zgroup/.zattrs/.zarray below it (keys
    relative to it), so ``xarray.open_zarr`` (consolidated by default) opens the
    mirror or any group of it without a warning. It is built from the mirror's own
    files, so it cannot disagree with them. ``node``'s own is whole; the others are
    given from the shallowest down while their sizes together (estimated from the
    documents' files before anything is written) stay within ZMETADATA_BUDGET: a
    group left without one opens unconsolidated, and netCDF-C never reads them.
    """
    groups: list[tuple[int, StaticDir, dict[str, Any], int]] = []
    docs, _ = await _collect(node, 0, groups)
    spent = 0
    for depth, group, group_docs, estimate in sorted(groups, key=lambda g: g[0]):
        if depth and spent + estimate > ZMETADATA_BUDGET:
            continue
        text = _dumps({"zarr_consolidated_format": 1, "metadata": group_docs})
        spent += len(text) if depth else 0
        group.entries[".zmetadata"] = BytesFile(text, group.mtime_ns)
    return docs


async def _collect(
    node: Node, depth: int, groups: list[tuple[int, StaticDir, dict[str, Any], int]]
) -> tuple[dict[str, Any], int]:
    """``node``'s documents (keys relative to it) and their size estimate; each group met is
    added to ``groups`` as (depth, node, documents, estimate)."""
    entries = node.entries if isinstance(node, StaticDir) else getattr(node, "extra", {})
    docs: dict[str, Any] = {}
    estimate = 0
    for name, child in sorted(entries.items()):
        if name in (".zgroup", ".zattrs", ".zarray") and isinstance(child, BytesFile):
            docs[name] = await child.document() if isinstance(child, DocFile) else \
                json.loads(await child.read(0, child.size))
            estimate += child.size + len(name)
        elif isinstance(child, StaticDir | ChunkGridDir):
            below, size = await _collect(child, depth + 1, groups)
            for key, doc in below.items():
                docs[f"{name}/{key}"] = doc
            estimate += size + (len(name) + 1) * len(below)
    if isinstance(node, StaticDir) and ".zgroup" in docs:
        groups.append((depth, node, docs, estimate))
    return docs, estimate

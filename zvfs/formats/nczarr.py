"""NCZarr (netCDF-C's Zarr dialect) on top of Zarr v2.

netCDF writes plain v2 plus ``_nczarr_*`` keys (upper case in 4.9.0, lower case
later) in .zgroup/.zarray/.zattrs. What changes for a reader: dimension names
come from ``_nczarr_array.dimrefs`` (or ``_ARRAY_DIMENSIONS``), a netCDF scalar
is stored as shape [1] and flagged ``storage: scalar`` (4.9.0) or ``scalar: 1`` (later
versions; shown here as shape ()), and the ``_nczarr_*`` keys are bookkeeping, not user
attributes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .meta import ArrayMeta
from .zarr_v2 import Reader as V2Reader
from .zarr_v2 import parse_array as parse_v2_array


def nczarr_keys(doc: Any) -> dict[str, Any]:
    """The ``_nczarr_*`` entries of a metadata document, keyed lower case."""
    if not isinstance(doc, dict):
        return {}
    return {
        k.lower(): v
        for k, v in doc.items()
        if isinstance(k, str) and k.lower().startswith("_nczarr")
    }


def is_nczarr(*docs: Any) -> bool:
    return any(nczarr_keys(d) for d in docs)


def attribute_types(attrs: Any) -> dict[str, str]:
    """NCZarr's attribute types (``_nczarr_attr.types``: name -> dtype string), or {}.

    Kept apart from the user attributes so views can give each attribute its
    netCDF type (a float stays a float, "NaN" is a number).
    """
    info = nczarr_keys(attrs).get("_nczarr_attr")
    types = info.get("types") if isinstance(info, dict) else None
    if not isinstance(types, dict):
        return {}
    return {str(k): v for k, v in types.items() if isinstance(v, str)}


class DefinitionOrder(NamedTuple):
    """A group's variables and dimensions in the order netCDF-C defined them."""

    variables: tuple[str, ...] = ()
    dimensions: tuple[str, ...] = ()


#: no order given: variables by name, dimensions by first use
BY_NAME = DefinitionOrder()


def definition_order(zgroup: Any) -> DefinitionOrder:
    """``_nczarr_group.vars`` and the keys of its ``dims``, as written.

    netCDF-C lists a group's dimensions and variables in that order (ncdump, xarray's
    data_vars): a served file in it reads as the store's own ncdump does.
    """
    info = nczarr_keys(zgroup).get("_nczarr_group")
    if not isinstance(info, dict):
        return BY_NAME

    def names(v: Any) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for n in v if isinstance(n, str))) if isinstance(v, (list, dict)) else ()

    return DefinitionOrder(names(info.get("vars")), names(info.get("dims")))


def strip_nczarr(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if not k.lower().startswith("_nczarr")}


def parse_array(path: str, zarray: Any, zattrs: Any, key: str | None = None) -> ArrayMeta:
    """A v2 parse, then the NCZarr adjustments (scalar, dimension names, attributes)."""
    info = (
        nczarr_keys(zarray).get("_nczarr_array") or nczarr_keys(zattrs).get("_nczarr_array") or {}
    )
    if isinstance(zarray, dict) and zarray.get("dtype") in ("<U1", ">U1", "|U1"):
        # netCDF-C 4.9 writes a char variable as "<U1" holding one byte a character (zarr-python
        # cannot read it either); its chunks decoded to a quarter of their size (EIO)
        zarray = {**zarray, "dtype": "|S1"}
    meta = parse_v2_array(path, zarray, zattrs, key, fmt="nczarr")
    meta.attributes = strip_nczarr(meta.attributes)
    if isinstance(meta.source, dict):
        meta.source["nczarr_attr_types"] = attribute_types(zattrs)
    if not isinstance(info, dict):
        return meta
    dimrefs = info.get("dimrefs", info.get("dimension_references"))
    # netCDF-C 4.9.0 says "storage": "scalar"; later versions "scalar": 1 (true in their docs)
    scalar = info.get("storage") == "scalar" or info.get("scalar") in (True, 1)
    if meta.error is None and scalar and meta.shape == (1,):
        meta.shape, meta.chunks = (), ()
        meta.dimension_names = None
        meta.source = {**meta.source, "scalar": True}
    elif isinstance(dimrefs, list) and len(dimrefs) == len(meta.shape) and dimrefs:
        meta.dimension_names = tuple(
            str(d).rstrip("/").rsplit("/", 1)[-1] if isinstance(d, str) else None for d in dimrefs
        )
    return meta


class Reader(V2Reader):
    """v2 reads; a scalar's single stored chunk (0,) is served as the 0-d chunk ()."""

    def __init__(self, store, meta: ArrayMeta):
        super().__init__(store, meta)
        self.scalar = bool(meta.source.get("scalar"))

    def stored_index(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        return (0,) if self.scalar else idx

    @property
    def stored_chunks(self) -> tuple[int, ...]:
        return (1,) if self.scalar else self.meta.chunks

    def read(self, idx: tuple[int, ...]) -> np.ndarray | None:
        out = super().read(idx)
        if out is not None and self.scalar:
            out = out.reshape(())
        return out

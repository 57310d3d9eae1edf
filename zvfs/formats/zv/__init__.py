"""Zarr Vectors (ZV): blocking decoder for both on-disk layouts (0.7 and 0.9).

Entry points: :func:`find_groups` and :func:`open_group` give a :class:`ZVGroup`;
``group.level(name)`` a :class:`Level` with per-chunk decodes; :mod:`.assemble`
builds level-wide arrays (vertices, links, faces, edges, objects) from those.
Errors in the data raise :class:`ZVError` naming the store key.
"""

from .assemble import (
    Links,
    graph_edges,
    level_link_attribute,
    level_links,
    level_table_rows,
    level_vertex_attribute,
    level_vertices,
    mesh_faces,
    object_vertices,
    skeleton_parents,
    vertex_count,
)
from .blobs import (
    FRAGMENT_MAGIC,
    FragmentIndex,
    ManifestBlock,
    chunk_name,
    parse_fragment_index,
    parse_manifest,
)
from .errors import MissingDependency, ZVError
from .level import AttrInfo, Level, ZVGroup, draco_available, find_groups, layout_of, open_group

__all__ = [
    "FRAGMENT_MAGIC", "AttrInfo", "FragmentIndex", "Level", "Links", "ManifestBlock",
    "MissingDependency", "ZVError", "ZVGroup", "chunk_name", "draco_available", "find_groups",
    "graph_edges", "layout_of", "level_link_attribute", "level_links", "level_table_rows",
    "level_vertex_attribute",
    "level_vertices", "mesh_faces", "object_vertices", "open_group", "parse_fragment_index",
    "parse_manifest", "skeleton_parents", "vertex_count",
]

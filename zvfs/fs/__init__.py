"""The FUSE layer: inodes and handles over the node tree of zvfs.views.node."""

from zvfs.fs.operations import ZvfsOperations
from zvfs.fs.ownership import Ownership

__all__ = ["Ownership", "ZvfsOperations"]

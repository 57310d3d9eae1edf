"""Fills ``.zvfs/`` with the decoded views that exist.

Each view family registers here; the fs layer and the CLI only call
:func:`attach_decoded_views`.
"""

from __future__ import annotations

from zvfs.views.context import MountContext
from zvfs.views.root import MountRoot


def attach_decoded_views(ctx: MountContext, root: MountRoot) -> None:
    if root.control is None:
        return

"""pyfuse3, imported without ``importlib.metadata``.

pyfuse3 sets its ``__version__`` at import from its installed metadata
(``importlib.metadata.version``). That imports ``importlib.metadata`` and the ``email``
package under it (some 20 modules, read from disk one by one when the page cache is cold)
and scans every ``sys.path`` entry for distributions: about 0.08 s of a 0.45 s cold mount
on a slow test machine, for a string zvfs never shows. So the first import of pyfuse3
sees a stand-in that knows no distribution (pyfuse3 then says its version is "unknown"),
which is taken away again at once: anything imported later gets the real module. Every
module of zvfs imports pyfuse3 from here.

The stand-in is in ``sys.modules`` only while pyfuse3 is imported, which the daemon does
before it starts a thread that could import anything (start-up's read-ahead thread only
opens files); a process that already holds ``importlib.metadata`` imports pyfuse3 as is.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING


def _import_without_metadata() -> types.ModuleType:
    if "pyfuse3" in sys.modules or "importlib.metadata" in sys.modules:
        import pyfuse3  # already paid for: nothing to save

        return pyfuse3

    class PackageNotFoundError(ModuleNotFoundError):
        pass

    def version(name: str) -> str:
        raise PackageNotFoundError(name)

    stand_in = types.ModuleType("importlib.metadata")
    stand_in.PackageNotFoundError = PackageNotFoundError  # type: ignore[attr-defined]
    stand_in.version = version  # type: ignore[attr-defined]
    sys.modules["importlib.metadata"] = stand_in
    try:
        import pyfuse3
    finally:
        if sys.modules.get("importlib.metadata") is stand_in:
            del sys.modules["importlib.metadata"]
    return pyfuse3


if TYPE_CHECKING:
    import pyfuse3
else:
    pyfuse3 = _import_without_metadata()

__all__ = ["pyfuse3"]

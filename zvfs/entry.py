"""The console scripts' entry points (``zvfs``, ``mount.zvfs``, ``python -m zvfs``).

They exist so a mount's start-up read-ahead (:mod:`zvfs.warmup`) begins before the CLI
and everything after it is imported, not after: those imports are what it speeds up.
"""

from __future__ import annotations

import sys

from zvfs import warmup


def main() -> int:
    if sys.argv[1:2] == ["mount"]:
        warmup.start()
    from zvfs.cli import main as cli_main

    return cli_main()


def mount_helper_main() -> int:
    warmup.start()
    from zvfs.cli import mount_helper_main as helper

    return helper()

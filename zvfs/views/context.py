"""What every view of one mount shares: the store, the caches, the options."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from zvfs.cache import Cache
from zvfs.stats import Counters, counters
from zvfs.stores.base import Store

log = logging.getLogger("zvfs")


@dataclass
class MountContext:
    """Built once by the CLI and handed to the view builders.

    ``metadata_ttl`` is seconds (None means indefinite: the data never changes).
    """

    store: Store
    metadata_ttl: float | None = 60.0
    cache_size: int = 512 << 20
    decoded: str = "hidden"  # hidden | visible | off
    mount_time: float = field(default_factory=time.time)
    counters: Counters = counters
    listings: Cache = field(init=False)
    chunks: Cache = field(init=False)
    _logged: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        # listings are small; bound them by entry count via sizeof=1
        self.listings = Cache(max_bytes=100_000, ttl=self.metadata_ttl, sizeof=lambda _v: 1)
        self.chunks = Cache(max_bytes=self.cache_size)

    @property
    def immutable(self) -> bool:
        """True when the store is declared immutable (``metadata_ttl=indefinite``)."""
        return self.metadata_ttl is None

    def warn_once(self, tag: str, message: str) -> None:
        """Log ``message`` the first time ``tag`` is seen, so a bad key is one line, not one per lookup."""
        if tag not in self._logged:
            self._logged.add(tag)
            log.warning("%s", message)

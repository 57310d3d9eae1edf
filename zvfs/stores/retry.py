"""How a remote store retries a request: bounded attempts, a deadline, backoff with jitter.

One policy object serves every request of a mount, so the worst case of a read
against a dead endpoint is a number the user chose and the README states:
a request gives up after ``attempts`` tries or once ``deadline`` seconds have
passed, whichever comes first; each try waits at most ``timeout`` seconds for
the server to connect and to send the next bytes. A fault is classified by a
*kind* (throttled, server, reset, timeout, truncated, checksum, denied, ...);
only the transient kinds are retried, and nothing about a transient fault is
remembered once a retry succeeds.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from zvfs.stats import ERROR_KINDS

#: fault kinds that may pass on their own: retried with backoff (the others of
#: zvfs.stats.ERROR_KINDS, which stats.json and the metrics pre-register, are not)
TRANSIENT_KINDS = frozenset({"throttled", "server", "reset", "timeout", "truncated", "checksum"})
assert TRANSIENT_KINDS <= set(ERROR_KINDS)


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries per request at most, within ``deadline`` seconds in all."""

    attempts: int = 10
    timeout: float = 10.0
    deadline: float = 60.0
    backoff_base: float = 0.05
    backoff_cap: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.timeout <= 0 or self.deadline <= 0:
            raise ValueError("timeout and deadline must be positive")

    def backoff(self, attempt: int) -> float:
        """Seconds to sleep before try ``attempt + 1`` (full jitter, as AWS recommends)."""
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * (2 ** (attempt - 1))))

    def worst_case(self) -> float:
        """An upper bound of the seconds one request can take before it fails."""
        return self.deadline + self.timeout + self.backoff_cap


class Attempts:
    """Iterates the tries of one request; ``retry()`` sleeps or says to give up.

    ::

        tries = Attempts(policy)
        while True:
            try:
                return do_request()
            except Transient:
                if not tries.retry():
                    raise
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.number = 1
        self._end = time.monotonic() + policy.deadline

    def retry(self) -> bool:
        """Sleep the backoff and return True, or return False when the budget is spent."""
        if self.number >= self.policy.attempts:
            return False
        pause = self.policy.backoff(self.number)
        if time.monotonic() + pause >= self._end:
            return False
        time.sleep(pause)
        self.number += 1
        return True

    @property
    def left(self) -> float:
        """Seconds left before the deadline."""
        return self._end - time.monotonic()

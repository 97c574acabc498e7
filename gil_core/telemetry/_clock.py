"""The store's order key: a hybrid logical clock, so a row written after a writer has read another row is ordered
after it, whatever the machines' wall clocks say.

A stamp is one integer in nanoseconds since the epoch: ``max(wall clock, last stamp given or seen + 1)``. While no
writer's clock is ahead of the others', that is the wall clock, as the order key always was; a writer whose clock
is behind a stamp it has read goes on from that stamp, a nanosecond at a time, until its clock catches up (the
logical part of the clock lives in the low digits). No counter is shared, so it needs nothing of the store but
listings (put-if-absent object stores included): what a writer has seen is what its listings showed.

Order key versions, recorded in each file's Parquet key-value metadata under ``ORDER_KEY``:

* none (files written before this clock): ``_seq`` is the writer's wall clock, monotonic within one process;
* ``hlc-ns/1``: ``_seq`` is this clock's stamp.

Both are read as they are: a version-1 stamp is above every stamp its writer had listed, version 0's included,
so old and new rows form one order without rewriting anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["ORDER_KEY", "ORDER_KEY_VERSION", "HybridClock"]

ORDER_KEY = "gil.order_key"
"""The Parquet key-value metadata naming how a file's ``_seq`` was stamped (absent: the wall clock)."""

ORDER_KEY_VERSION = "hlc-ns/1"

_AHEAD_WARNING_NS = 60 * 1_000_000_000
_log = logging.getLogger(__name__)


class HybridClock:
    """A hybrid logical clock for one store object. ``wall_ns`` is the physical clock (injectable: a test runs a
    process whose clock is behind). Thread-safe."""

    def __init__(self, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._wall_ns = wall_ns
        self._lock = threading.Lock()
        self._last = 0
        self._warned = False

    def now(self) -> int:
        """A stamp for a write: above every stamp this clock gave or saw, and never below the wall clock."""
        with self._lock:
            self._last = max(self._wall_ns(), self._last + 1)
            return self._last

    def observe(self, stamp: int) -> None:
        """A stamp read from the store: every later ``now()`` is above it."""
        with self._lock:
            if stamp <= self._last:
                return
            self._last = stamp
            ahead = stamp - self._wall_ns()
            warn = ahead > _AHEAD_WARNING_NS and not self._warned
            self._warned = self._warned or warn
        if warn:  # once per clock: it says a writer's clock is ahead (or this one behind); the order holds
            _log.warning(
                "the store holds order stamps %.0f s ahead of this machine's clock: another writer's clock is ahead, "
                "or this one is behind; writes are ordered after them all the same",
                ahead / 1e9,
            )

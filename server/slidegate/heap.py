"""Short garbage-collection pauses while the service remembers thousands of requests.

A remembered request (slidegate.service) holds about 34 objects the collector tracks; 10,000 of them made each
full collection walk 340,000 objects, a pause of 170-250 ms measured on a 2-core machine — the whole of
REDIS_TIMEOUT, and ten times Envoy's default deadline, for every call in flight. Frozen objects
(``gc.freeze``) are left out of collections: the remembered requests are frozen as they accumulate, and when
the service forgets them all at once, everything is unfrozen and collected while little is left to walk (7 ms
measured). Objects are still freed by reference counting while frozen; only garbage cycles among frozen objects
wait for that next collection. Used by ``slidegate serve`` only: ``gc.freeze`` is process-wide, and a program
embedding the service may freeze for its own reasons.
"""

from __future__ import annotations

import gc

FREEZE_EVERY = 1000  # remembered requests between freezes (each one costs microseconds)


class Remembered:
    """Told by the service when it remembers a request and when it forgets them all."""

    def __init__(self, freeze_every: int = FREEZE_EVERY) -> None:
        self._freeze_every = freeze_every
        self._since = 0

    def added(self) -> None:
        self._since += 1
        if self._since >= self._freeze_every:
            self._since = 0
            gc.freeze()

    def cleared(self) -> None:
        self._since = 0
        gc.unfreeze()
        gc.collect()

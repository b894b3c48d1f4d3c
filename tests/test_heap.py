"""slidegate.heap: requests the service forgets are freed a slice a turn of the event loop, not at once (10,000
requests of 8 descriptors freed at once held the loop 60-70 ms)."""

from __future__ import annotations

import asyncio
import gc

from slidegate.heap import FREE_PER_TURN, Heap


async def test_forgotten_requests_are_freed_a_slice_a_turn() -> None:
    heap = Heap()
    forgotten = {i: [object() for _ in range(3)] for i in range(5 * FREE_PER_TURN + 1)}
    gc.freeze()
    try:
        heap.forgot(forgotten)
        left = []
        for _ in range(7):
            await asyncio.sleep(0)
            left.append(len(forgotten))
        assert left == [4 * FREE_PER_TURN + 1, 3 * FREE_PER_TURN + 1, 2 * FREE_PER_TURN + 1, FREE_PER_TURN + 1, 1,
                        0, 0]
        assert gc.get_freeze_count() == 0  # once all are freed, what was frozen is unfrozen and collected
    finally:
        gc.unfreeze()


def test_a_heap_used_from_another_event_loop_starts_afresh() -> None:
    # handles of a loop that ended never run: without starting afresh, nothing would be freed or trimmed again
    heap = Heap()
    first = {i: object() for i in range(10 * FREE_PER_TURN)}
    second = {i: object() for i in range(10)}

    async def forget(remembered: dict[int, object], turns: int) -> None:
        heap.forgot(remembered)
        for _ in range(turns):
            await asyncio.sleep(0)

    try:
        asyncio.run(forget(first, 1))  # the loop ends with most of them still to free
        asyncio.run(forget(second, 3))
    finally:
        gc.unfreeze()
    assert not second

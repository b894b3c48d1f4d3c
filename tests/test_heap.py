"""slidegate.heap: requests the service forgets are freed a slice a turn of the event loop, not at once (10,000
requests of 8 descriptors freed at once held the loop 60-70 ms)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from slidegate import heap as heap_module
from slidegate.heap import FREE_PER_TURN, Heap


async def test_forgotten_requests_are_freed_a_slice_a_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    heap = Heap()
    heap.started()
    forgotten = {i: [object() for _ in range(3)] for i in range(5 * FREE_PER_TURN + 1)}
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        heap.forgot(forgotten)
        left = []
        for _ in range(7):
            await asyncio.sleep(0)
            left.append(len(forgotten))
        assert left == [4 * FREE_PER_TURN + 1, 3 * FREE_PER_TURN + 1, 2 * FREE_PER_TURN + 1, FREE_PER_TURN + 1, 1,
                        0, 0]
        # freed by reference counting although frozen; nothing stray to collect, so no collection walked them all
        assert gc.get_freeze_count() <= frozen - (5 * FREE_PER_TURN + 1)  # each entry's list
        # once stray frozen objects are many, they are collected and what is left frozen again
        monkeypatch.setattr(heap_module, "STRAY_FROZEN", -1)
        heap.forgot({0: object()})
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert heap.frozen > 0 and abs(gc.get_freeze_count() - heap.frozen) < 100  # a few freed since
    finally:
        gc.unfreeze()


def test_garbage_cycles_made_between_freezes_are_not_frozen() -> None:
    # a frozen garbage cycle waits for the collection of STRAY_FROZEN (grpc.aio makes one per call): what the
    # remembered requests hold is frozen, the garbage made meanwhile is not
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    heap = Heap(freeze_every=1)
    kept = [[object()] for _ in range(100)]
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection meanwhile: whatever is not collected before the freeze is frozen
    try:
        for _ in range(1000):
            Cycle()
        heap.remembered()
        assert gc.get_freeze_count() >= len(kept)
        gc.unfreeze()  # what was frozen is back in the collector's lists, to be seen
        assert not [o for o in gc.get_objects() if type(o) is Cycle]  # isinstance would wake lazy objects up
        assert any(o is kept[0] for o in gc.get_objects())
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


async def test_a_process_settled_is_frozen() -> None:
    # the first full collection walked every object of startup, a few calls in (16 ms, most of Envoy's deadline)
    try:
        Heap().started()
        assert gc.get_freeze_count() > 0
        assert len(gc.get_objects()) < gc.get_freeze_count() / 10
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

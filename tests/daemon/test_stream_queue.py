"""The frontend's output queue (daemon/stream.py) against its readable version, asyncio.Queue:
the same seeded scripts of puts, gets, waiting getters, timed-out and cancelled getters give the
same results, exceptions and order, and no item is lost."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from deepserve.daemon.stream import Stream, get_within_readable, offer_readable


async def _script(q: Any, seed: int) -> list[Any]:
    rng = random.Random(seed)
    seen: list[Any] = []
    getters: list[asyncio.Task[Any]] = []

    async def getter(i: int) -> None:
        seen.append(("got", i, await q.get()))

    async def timed(i: int) -> None:
        try:
            async with asyncio.timeout(0):
                seen.append(("timed got", i, await q.get()))
        except TimeoutError:
            seen.append(("timed out", i))

    async def within(i: int, timeout_s: float) -> None:
        """Stream.get_within, or for asyncio.Queue its readable version."""
        try:
            got = await (q.get_within(timeout_s) if isinstance(q, Stream) else get_within_readable(q, timeout_s))
            seen.append(("within got", i, got))
        except TimeoutError:
            seen.append(("within out", i))

    for step in range(300):
        op = rng.randrange(8)
        if op == 0:
            try:
                q.put_nowait(step)
                seen.append(("put", step))
            except asyncio.QueueFull:
                seen.append(("full", step))
        elif op == 1:  # Stream.offer, or for asyncio.Queue its readable version
            seen.append(("offer", step, q.offer(step) if isinstance(q, Stream) else offer_readable(q, step)))
        elif op == 2:
            try:
                seen.append(("nowait", q.get_nowait()))
            except asyncio.QueueEmpty:
                seen.append(("empty",))
        elif op == 3:
            getters.append(asyncio.ensure_future(getter(step)))
        elif op == 4 and getters:
            getters.pop(rng.randrange(len(getters))).cancel()
        elif op == 5:
            await timed(step)
        elif op == 6:
            seen.append(("sizes", q.qsize(), q.full(), q.empty()))
        elif op == 7:  # waits within 0 (up at the next loop turn), or long, beside the other getters
            getters.append(asyncio.ensure_future(within(step, rng.choice((0.0, -1.0, 60.0)))))
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
    for t in getters:
        t.cancel()
    await asyncio.sleep(0)
    seen.append(("left", [q.get_nowait() for _ in range(q.qsize())]))
    return seen


def test_stream_behaves_as_asyncio_queue() -> None:
    for seed in range(40):
        for maxsize in (0, 1, 3):
            want = asyncio.run(_script(asyncio.Queue(maxsize), seed))
            got = asyncio.run(_script(Stream(maxsize), seed))
            assert got == want, (seed, maxsize)


def test_a_woken_getter_cancelled_passes_the_item_on() -> None:
    async def main(q: Any) -> list[Any]:
        a = asyncio.ensure_future(q.get())
        b = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        q.put_nowait("x")  # wakes a ...
        a.cancel()  # ... which is cancelled before it runs: b gets the item
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return [a.cancelled(), await asyncio.wait_for(b, 1)]

    assert asyncio.run(main(Stream())) == asyncio.run(main(asyncio.Queue())) == [True, "x"]

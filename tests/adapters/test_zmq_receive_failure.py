"""A kernel failure in ZmqTransport's receive callback (the log refusing the step of an envelope
delivered there) fails the driver, as in an actor's task; the event loop only logged it, and the
node went on without the step in its log."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from deepserve.adapters.zmq import ZmqTransport
from deepserve.core import Actor, Context, MemorySink, Message
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.envelope import Envelope
from deepserve.core.records import Step

pytestmark = pytest.mark.timeout(60)


class RfPing(Message, frozen=True):
    n: int


class RfQuiet(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        pass


class RefusingSink(MemorySink):
    """Refuses every step of an input from `src`: a disk failing when the peer's envelopes come."""

    def __init__(self, src: str) -> None:
        super().__init__()
        self.src = src

    def append(self, step: Step) -> int:
        if step.input.src == self.src:
            raise OSError("disk full")
        return super().append(step)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_log_failure_in_the_receive_callback_fails_the_driver(loop: str, tmp_path: Path) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    endpoint = f"ipc://{tmp_path}/rx.ipc"

    async def main() -> None:
        rx = ZmqTransport(bind=endpoint)
        tx = ZmqTransport(routes={"rx/": endpoint})
        try:
            async with AsyncDriver(transport=rx, sink=RefusingSink(src="peer/0")) as d:
                d.spawn("rx/0", RfQuiet)
                await d.idle()  # parked: the envelope runs inline, in the receive callback
                tx.attach(lambda env: None)
                assert tx.send(Envelope("peer/0", "rx/0", 1, 0, None, RfPing(1)))
                with anyio.fail_after(10):
                    await anyio.sleep_forever()
        finally:
            await tx.aclose()
            rx.close()  # a failed driver leaves its transport open (its `__aexit__` raises first)

    with pytest.raises(ExceptionGroup) as failed:  # the driver's task group, failed by the OSError
        anyio.run(main, backend="asyncio", backend_options={"use_uvloop": loop == "uvloop"})
    assert any(isinstance(e, OSError) and "disk full" in str(e) for e in failed.value.exceptions)

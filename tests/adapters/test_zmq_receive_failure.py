"""A kernel failure in ZmqTransport's receive callback (the log refusing the step of an envelope
delivered there) fails the driver, as in an actor's task; the event loop only logged it, and the
node went on without the step in its log."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from test_asyncremote import RefusingSink, _fails_with_disk_full

from deepserve.adapters.zmq import ZmqTransport
from deepserve.core import Actor, Context, Message
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.envelope import Envelope

pytestmark = pytest.mark.timeout(60)


class RfPing(Message, frozen=True):
    n: int


class RfQuiet(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        pass


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_log_failure_in_the_receive_callback_fails_the_driver(loop: str, tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/rx.ipc"

    async def main() -> None:
        rx = ZmqTransport(bind=endpoint)
        tx = ZmqTransport(routes={"rx/": endpoint})
        try:
            async with AsyncDriver(transport=rx, sink=RefusingSink(lambda step: step.input.src == "peer/0")) as d:
                d.spawn("rx/0", RfQuiet)
                await d.idle()  # parked: the envelope runs inline, in the receive callback
                tx.attach(lambda env: None)
                assert tx.send(Envelope("peer/0", "rx/0", 1, 0, None, RfPing(1)))
                with anyio.fail_after(10):
                    await anyio.sleep_forever()
        finally:
            await tx.aclose()
            rx.close()  # closed by the failed driver's `__aexit__` already: a no-op then

    _fails_with_disk_full(main, loop)

"""`deepserve bench transport`: the ZeroMQ transport between real OS processes, each
row beside raw pyzmq doing the same work in the same run.

Every message is the same encoded envelope (`wire_encode` of a small msgspec
message) in both, encoded by the sender and decoded by the receiver. The parent
process receives (one way) or asks (round trips); the other side is a child started
with `python -m deepserve.benchmarks.transport ROLE ...`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import zmq

from deepserve.benchmarks.table import Row
from deepserve.core.asyncdriver import run as run_async
from deepserve.core.envelope import Envelope
from deepserve.core.messages import Message
from deepserve.core.transport import wire_decode, wire_encode

Progress = Callable[[str], None]
RAW_BATCH = 512  # raw sender: NOBLOCK sends until the socket is full, then wait
YIELD_EVERY = 512  # transport sender: sends per turn of the event loop
CHILD_TIMEOUT_S = 300.0


class ZmqBenchPing(Message, frozen=True):
    n: int
    text: str = "tok"


def _env(src: str, dst: str, n: int) -> Envelope:
    return Envelope(src, dst, n + 1, n, None, ZmqBenchPing(n))


# ---- children ----------------------------------------------------------------------
def _raw_push(endpoint: str, n: int, mode: str) -> None:
    """mode: "encode" (encode each message as it goes, as the transport does),
    "preencoded" (bytes ready before the clock starts), "exit" (preencoded, then
    the process exits at once, its context never terminated: issue 7's sender)."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 100_000)
    push.connect(endpoint)
    ready = [] if mode == "encode" else [wire_encode(_env("tx/0", "rx/0", i)) for i in range(n)]
    for i in range(n):
        data = ready[i] if ready else wire_encode(_env("tx/0", "rx/0", i))
        while True:
            try:
                push.send(data, zmq.NOBLOCK)
                break
            except zmq.Again:
                push.poll(100, zmq.POLLOUT)
    if mode == "exit":
        os._exit(0)  # what pyzmq accepted but its I/O thread has not written is gone
    push.close(linger=-1)
    ctx.term()


def _raw_echo(endpoint: str) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    print("ready", flush=True)
    while True:
        ident, data = router.recv_multipart()
        if data == b"stop":
            break
        env = wire_decode(data)
        router.send_multipart([ident, wire_encode(_env(env.dst, env.src, env.msg.n))])
    router.close(linger=0)
    ctx.term()


async def _zmq_send(endpoint: str, n: int) -> None:
    from deepserve.adapters.zmq import ZmqTransport

    t = ZmqTransport(routes={"rx/": endpoint})
    for i in range(n):
        t.send(_env("tx/0", "rx/0", i))
        room = t.congestion()
        if room is not None:
            await room.wait()
        elif i % YIELD_EVERY == 0:
            await asyncio.sleep(0)
    left = await t.aclose()  # the exit: flush, wait for acks
    print(json.dumps({"accepted": t.sent, "refused": t.refused, "unacknowledged": len(left)}), flush=True)


async def _zmq_echo(endpoint: str, reply_to: str) -> None:
    from deepserve.adapters.zmq import ZmqTransport

    t = ZmqTransport(bind=endpoint, routes={"c/": reply_to})
    done = asyncio.Event()

    def echo(env: Envelope) -> None:
        if env.msg.n < 0:
            done.set()
        else:
            t.send(_env(env.dst, env.src, env.msg.n))

    t.attach(echo)
    print("ready", flush=True)
    await done.wait()
    await t.aclose()


def _child(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "deepserve.benchmarks.transport", *args],
                            stdout=subprocess.PIPE, text=True)


def _ready(child: subprocess.Popen) -> None:
    if child.stdout is None or child.stdout.readline().strip() != "ready":
        raise RuntimeError("benchmark child did not start")


# ---- parents -----------------------------------------------------------------------
def raw_one_way(tmp: str, n: int, mode: str = "encode", decode: bool = True) -> tuple[float, int]:
    """(messages/s, messages received) for a raw PUSH -> PULL stream of n."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 100_000)
    endpoint = f"ipc://{tmp}/raw-{mode}.ipc"
    pull.bind(endpoint)
    child = _child("raw-push", endpoint, str(n), mode)
    got, t0, t1 = 0, 0.0, 0.0
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while got < n and time.monotonic() < deadline:
        if not pull.poll(200):
            if child.poll() is not None:
                break  # the sender is gone and nothing more came: the rest is lost
            continue
        while got < n:  # drain with NOBLOCK, as the transport does
            try:
                data = pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if decode:
                wire_decode(data)
            got += 1
            if got == 1:
                t0 = time.perf_counter()
        t1 = time.perf_counter()
    child.wait(CHILD_TIMEOUT_S)
    pull.close(linger=0)
    ctx.term()
    return (got - 1) / max(t1 - t0, 1e-9), got


async def _zmq_one_way(tmp: str, n: int) -> tuple[float, int, dict]:
    from deepserve.adapters.zmq import ZmqTransport

    got = 0
    t0 = t1 = 0.0
    finished = asyncio.Event()

    def deliver(env: Envelope) -> None:
        nonlocal got, t0, t1
        got += 1
        if got == 1:
            t0 = time.perf_counter()
        t1 = time.perf_counter()
        if got >= n:
            finished.set()

    rx = ZmqTransport(bind=f"ipc://{tmp}/zmq-rx.ipc")
    rx.attach(deliver)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deepserve.benchmarks.transport", "zmq-send", rx.endpoint or "", str(n),
        stdout=subprocess.PIPE)
    out, _ = await asyncio.wait_for(child.communicate(), CHILD_TIMEOUT_S)
    report = json.loads(out.decode().strip().splitlines()[-1])
    rx.close()
    return (got - 1) / max(t1 - t0, 1e-9), got, report


def raw_round_trips(tmp: str, n: int) -> float:
    endpoint = f"ipc://{tmp}/raw-echo.ipc"
    child = _child("raw-echo", endpoint)
    _ready(child)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    t0 = time.perf_counter()
    for i in range(n):
        dealer.send(wire_encode(_env("c/0", "e/0", i)))
        wire_decode(dealer.recv())
    rate = n / (time.perf_counter() - t0)
    dealer.send(b"stop")
    child.wait(CHILD_TIMEOUT_S)
    dealer.close(linger=0)
    ctx.term()
    return rate


def raw_fd_round_trips(tmp: str, n: int) -> float:
    """The raw echo again, but the client waits on the socket's FD with epoll (what
    any event loop must do) instead of blocking inside libzmq's recv."""
    import select

    endpoint = f"ipc://{tmp}/raw-echo-fd.ipc"
    child = _child("raw-echo", endpoint)
    _ready(child)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    poller = select.epoll()
    poller.register(dealer.getsockopt(zmq.FD), select.EPOLLIN)
    t0 = time.perf_counter()
    for i in range(n):
        dealer.send(wire_encode(_env("c/0", "e/0", i)), zmq.NOBLOCK)
        while True:
            try:
                wire_decode(dealer.recv(zmq.NOBLOCK))
                break
            except zmq.Again:
                poller.poll()
    rate = n / (time.perf_counter() - t0)
    dealer.send(b"stop")
    child.wait(CHILD_TIMEOUT_S)
    poller.close()
    dealer.close(linger=0)
    ctx.term()
    return rate


async def _zmq_round_trips(tmp: str, n: int) -> float:
    from deepserve.adapters.zmq import ZmqTransport

    echo_ep = f"ipc://{tmp}/zmq-echo.ipc"
    reply: asyncio.Future[Envelope] | None = None

    def deliver(env: Envelope) -> None:
        if reply is not None and not reply.done():
            reply.set_result(env)

    t = ZmqTransport(bind=f"ipc://{tmp}/zmq-client.ipc", routes={"e/": echo_ep})
    t.attach(deliver)
    child = _child("zmq-echo", echo_ep, t.endpoint or "")
    _ready(child)
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    for i in range(n):
        reply = loop.create_future()
        t.send(_env("c/0", "e/0", i))
        await reply
    rate = n / (time.perf_counter() - t0)
    t.send(_env("c/0", "e/0", -1))
    await t.aclose()
    child.wait(CHILD_TIMEOUT_S)
    return rate


def transport_bench(scale: float, progress: Progress, rounds: int = 3) -> tuple[str, list[Row]]:
    """Each workload `rounds` times, raw and transport interleaved; the best of each
    (a loaded machine only ever makes a run slower)."""
    n_msgs, n_rts = max(1000, int(200_000 * scale)), max(200, int(10_000 * scale))
    raw, bare, ours, raw_rts, fd_rts, our_rts = [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ds-bench-zmq-") as tmp:
        for r in range(rounds):
            progress(f"round {r + 1}/{rounds}: one way, {n_msgs:,} messages (raw PUSH/PULL, the transport)")
            raw.append(raw_one_way(tmp, n_msgs)[0])
            bare.append(raw_one_way(tmp, n_msgs, "preencoded", decode=False)[0])
            rate, got, report = run_async(_zmq_one_way, tmp, n_msgs)
            ours.append(rate)
            if got != report["accepted"] or report["refused"] or report["unacknowledged"]:
                break  # a loss: report this run
            progress(f"round {r + 1}/{rounds}: {n_rts:,} round trips (raw DEALER/ROUTER echo, the transport)")
            raw_rts.append(raw_round_trips(tmp, n_rts))
            fd_rts.append(raw_fd_round_trips(tmp, n_rts))
            our_rts.append(run_async(_zmq_round_trips, tmp, n_rts))
        progress("a raw PUSH sender exiting at once after sending")
        _, raw_got = raw_one_way(tmp, n_msgs, "exit", decode=False)
    rows = [
        Row("zmq_msgs_per_s", max(ours), "msgs/s", "raw_push_pull_batched_msgs_per_s", max(raw)),
        Row("zmq_msgs_per_s_vs_bare", max(ours), "msgs/s", "raw_push_pull_preencoded_no_decode_per_s",
            max(bare)),
        Row("zmq_roundtrips_per_s", max(our_rts, default=0.0), "round trips/s",
            "raw_dealer_router_echo_per_s", max(raw_rts, default=0.0)),
        Row("zmq_roundtrips_per_s_vs_fd_wait", max(our_rts, default=0.0), "round trips/s",
            "raw_echo_client_waiting_on_fd_per_s", max(fd_rts, default=0.0)),
        # The transport's sender exits through `aclose` (flush, acks) right after its
        # last send; the raw sender exits at once. Accepted = send() returned True.
        Row("zmq_lost_on_exit", float(report["accepted"] - got), "msgs",
            "raw_push_lost_on_exit", float(n_msgs - raw_got)),
        Row("zmq_refused", float(report["refused"]), "msgs"),
        Row("zmq_unacknowledged_at_exit", float(report["unacknowledged"]), "msgs"),
    ]
    title = (f"deepserve bench transport: ipc:// between two processes, {n_msgs:,} one-way messages, "
             f"{n_rts:,} round trips, best of {rounds} (loaded machines: compare ratios)")
    return title, rows


def _main(argv: list[str]) -> None:
    role = argv[0]
    if role == "raw-push":
        _raw_push(argv[1], int(argv[2]), argv[3])
    elif role == "raw-echo":
        _raw_echo(argv[1])
    elif role == "zmq-send":
        run_async(_zmq_send, argv[1], int(argv[2]))
    elif role == "zmq-echo":
        run_async(_zmq_echo, argv[1], argv[2])
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    _main(sys.argv[1:])

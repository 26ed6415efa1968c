"""What the device actors share: answering a request from a later handler, and assertions.

A device answers most requests after a delay (a graph runs, bytes move), i.e. from a timer's
handler. `ReplyTo` (the kernel's `ReplyHandle`) captures the request's return address when it
arrives, and `ctx.reply(msg, to)` answers it later: `ctx.ask` callers get their answer matched
and their timeout cancelled.
"""

from __future__ import annotations

import math

from deepserve.core import Context, Message, ReplyHandle

# The kernel's handle for answering a request from a later handler.
ReplyTo = ReplyHandle


def reply_to(ctx: Context) -> ReplyTo:
    """The return address of the message being handled."""
    return ctx.reply_handle()


def answer(ctx: Context, to: ReplyTo, msg: Message) -> None:
    """Send `msg` as the reply to the request `to` names, from any later handler."""
    ctx.reply(msg, to)


# Relative slack for float comparisons of rates and capacities summed over many flows.
RTOL = 1e-9


def respond(ctx: Context, msg: Message) -> None:
    """Answer the message being handled. Unlike `ctx.reply`, an external tell (ext/...) gets the
    answer too, like an answer sent later does: devices answer every request the same way."""
    answer(ctx, reply_to(ctx), msg)


def delay_until(now: float, due: float) -> float:
    """The timer delay that fires at exactly `due` (the kernel adds it to `now`, and
    `due - now` is not always exact when `now` < due / 2): a timer armed earlier than the
    stepwise timeline would arm it (a delayed NPU start, a lone fabric transfer's completion)
    then fires on the same float, so the timeline is unchanged. Where no delay reaches `due`
    (`now + delay` rounds half to even past it), the timer fires just before `due`."""
    delay = due - now
    while now + delay < due:
        delay = math.nextafter(delay, math.inf)
    while delay > 0.0 and now + delay > due:
        delay = math.nextafter(delay, -math.inf)
    return delay

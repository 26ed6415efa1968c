"""What the device actors share: answering a request from a later handler, and assertions.

A device answers most requests after a delay (a graph runs, bytes move), i.e. from a timer's
handler. `ReplyTo` (the kernel's `ReplyHandle`) captures the request's return address when it
arrives, and `ctx.reply(msg, to)` answers it later: `ctx.ask` callers get their answer matched
and their timeout cancelled.
"""

from __future__ import annotations

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

"""This process's ends of the stream channels (app/transport/stream_channels.py): one listener for the streams it
calls (an Ingress's from the ChatProcessor, a ChatProcessor's from the models), one sender for the streams it
serves. The listener binds the node's address as Ray knows it, so callers on other nodes can reach it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import ray

from app.transport.stream_channels import ChannelReceiver, ChannelRoute, ChannelSender

from app.api.errors import as_api_error
from app.observe.refusals import is_refusal

from .error_mapping import Refused, to_api_error
from .relay import relay

_receiver: ChannelReceiver | None = None
_sender: ChannelSender | None = None


def receiver() -> ChannelReceiver:
    global _receiver
    if _receiver is None:
        _receiver = ChannelReceiver(ray.util.get_node_ip_address())
    return _receiver


def sender() -> ChannelSender:
    global _sender
    if _sender is None:
        _sender = ChannelSender()
    return _sender


def stream_call(channels: bool, call: Callable[..., Any]) -> AsyncIterator[list[Any]]:
    """One streaming hop, the caller's side: `call(*extra)` places the Serve streaming call with `extra` after its
    own arguments. With `channels`, extra is the stream's route (where its items may come) and the items come
    through this process's listener; without, nothing is added and every item comes in the call (relay()).
    Failures become the protocol's errors either way."""
    if channels:
        return receiver().stream(call, to_api_error)
    return relay(call)


async def served(route: ChannelRoute | None, source: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The callee's side: what a streaming method yields, through its caller's channel when it has a route (its
    failure, a refusal included, then goes in the stream's Closing). Without one, every item goes in the call, and
    a refusal as its last item (error_mapping.Refused), not as the call's exception."""
    if route is None:  # a caller without a channel (stream_channels: false): every item in the call
        try:
            async for batch in source:
                yield batch
        except Exception as exc:
            api = as_api_error(exc)
            if api is None or not is_refusal(api):
                raise
            yield Refused(api)
        return
    async for item in sender().serve(route, source):
        yield item


def channel_info() -> dict[str, Any]:
    """What this process's channel ends did so far (replica_info: tests and operators)."""
    return {**(_receiver.info() if _receiver else {}), **(_sender.info() if _sender else {})}

"""A bound on the RPCs doing work at once (the load option `max_concurrent_rpcs`).

Each call holds preparation threads, queue places and memory for its inputs,
so past the bound a call is refused at once with RESOURCE_EXHAUSTED rather
than queued without end. Health, Status, GetMetrics, LoadModel and Free are
never gated: the host must always be able to see and steer the process.
A refusal is an EngineError, which leaves through the servicer's one status map
(status_map.answered wraps every gated RPC). Runs on the event loop only (a
plain counter, no lock).
"""

import functools
import inspect

from engine import EngineError


class RpcGate:
    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0

    def enter(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        self.active -= 1

    def refusal(self, rpc: str) -> str:
        return (f"{rpc}: {self.active} calls are already being served "
                f"(bound: option max_concurrent_rpcs={self.limit}); retry later")


def gated(method):
    """Wrap a servicer method (a coroutine or an async generator) in `self.gate`."""
    name = method.__name__

    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(self, request, context):
            if not self.gate.enter():
                raise EngineError("RESOURCE_EXHAUSTED", self.gate.refusal(name))
            try:
                async for item in method(self, request, context):
                    yield item
            finally:
                self.gate.leave()

        return stream

    @functools.wraps(method)
    async def unary(self, request, context):
        if not self.gate.enter():
            raise EngineError("RESOURCE_EXHAUSTED", self.gate.refusal(name))
        try:
            return await method(self, request, context)
        finally:
            self.gate.leave()

    return unary

"""The one error -> gRPC status map: every RPC's failure leaves through it (never UNKNOWN).

OptionError (a field the client sent) is INVALID_ARGUMENT; EngineError carries its
own code (RESOURCE_EXHAUSTED, FAILED_PRECONDITION, NOT_FOUND, UNAVAILABLE, ...);
anything else is a bug: INTERNAL, with its traceback in the log.
"""

import asyncio
import functools
import logging

import grpc

from common.python_utils import OptionError
from engine import EngineError

log = logging.getLogger("mlx-backend")


def status_of(e: Exception, rpc: str):
    """The one error -> status map of every RPC: (gRPC code name, message)."""
    if isinstance(e, OptionError):
        return "INVALID_ARGUMENT", str(e)
    if isinstance(e, EngineError):
        return e.code, str(e)
    log.error("%s failed", rpc, exc_info=e)  # a bug: its traceback goes to the log
    return "INTERNAL", f"{rpc} failed: {type(e).__name__}: {e}"


async def _abort(context, e: Exception, rpc: str) -> None:
    if isinstance(e, (grpc.aio.AbortError, asyncio.CancelledError)):
        raise e  # an abort already carries its status; a cancelled call has no one to answer
    code, message = status_of(e, rpc)
    await context.abort(getattr(grpc.StatusCode, code), message)


def answered(handler):
    """A unary RPC whose failures, whatever they are, leave through status_of (never UNKNOWN)."""
    @functools.wraps(handler)
    async def run(self, request, context):
        try:
            return await handler(self, request, context)
        except Exception as e:
            await _abort(context, e, handler.__name__)
    return run


def answered_stream(handler):
    """The same for a server-streaming RPC."""
    @functools.wraps(handler)
    async def run(self, request, context):
        try:
            async for item in handler(self, request, context):
                yield item
        except Exception as e:
            await _abort(context, e, handler.__name__)
    return run

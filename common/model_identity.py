"""Refuse a request meant for another model (LocalAI's distributed mode).

A worker may reuse a stopped backend's port for another model's backend, and
the host's health probe checks only liveness: every inference request carries
`ModelIdentity`, the model it is meant for, and a backend that loaded another
model answers NOT_FOUND with MODEL_MISMATCH_SENTINEL in the message (the host
needs both to tell this from other NOT_FOUNDs).

Our servicer checks this itself against the model it actually serves (see
`identity_mismatch`). LocalAI's backends get it from the interceptors below,
which grpc_auth.get_auth_interceptors() installs: they remember the `Model` of
the last successful LoadModel and guard the RPCs in GUARDED_METHODS.
"""

import asyncio
import functools
import inspect
import threading
from typing import Optional

import grpc

MODEL_MISMATCH_SENTINEL = "model identity mismatch"

LOAD_METHOD = "/backend.Backend/LoadModel"

# Every RPC whose request message carries a ModelIdentity field (backend.proto of
# the host). The codec RPCs (AudioEncode/AudioDecode) are not among them.
GUARDED_METHODS = frozenset("/backend.Backend/" + name for name in (
    "Predict", "PredictStream", "Embedding", "TokenizeString",
    "GenerateImage", "GenerateVideo", "TTS", "TTSStream", "SoundGeneration",
    "AudioTranscription", "AudioTranscriptionStream", "Detect", "Depth",
    "FaceVerify", "FaceAnalyze", "VoiceVerify", "VoiceAnalyze", "VoiceEmbed",
    "Rerank", "TokenClassify", "Score", "VAD", "Diarize", "SoundDetection",
    "AudioTransform",
))
_GUARDED_METHODS = GUARDED_METHODS  # LocalAI's name


def identity_mismatch(loaded: str, requested: str) -> Optional[str]:
    """The refusal when `requested` names a model other than `loaded`, else None.

    Either side empty means no judgement: an older host sends no identity, and a
    model loaded by such a host has none; a false refusal is worse than the miss.
    """
    if not requested or not loaded or requested == loaded:
        return None
    return f"{MODEL_MISMATCH_SENTINEL}: loaded {loaded!r}, requested {requested!r}"


class ModelIdentityState:
    """The identity of the model this process loaded (one model per process)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loaded = ""

    def record(self, model: str) -> None:
        with self._lock:
            self._loaded = model or ""

    @property
    def loaded(self) -> str:
        with self._lock:
            return self._loaded

    def mismatch(self, requested: str) -> Optional[str]:
        return identity_mismatch(self.loaded, requested)


def _with_behavior(handler, behavior):
    """`handler` with another behaviour (unary request; same serialisers)."""
    make = grpc.unary_stream_rpc_method_handler if handler.response_streaming else grpc.unary_unary_rpc_method_handler
    return make(behavior, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def _guarded(method: str, handler) -> bool:
    # A streaming request would need its first message read first: none of the guarded RPCs has one.
    return (handler is not None and not handler.request_streaming
            and (method == LOAD_METHOD or method in GUARDED_METHODS))


def _succeeded(result) -> bool:
    return bool(getattr(result, "success", True))


class ModelIdentityInterceptor(grpc.ServerInterceptor):
    """For a synchronous grpc.server."""

    def __init__(self, state: Optional[ModelIdentityState] = None):
        self.state = state or ModelIdentityState()

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if not _guarded(method, handler):
            return handler
        if method == LOAD_METHOD:
            load = handler.unary_unary

            def record(request, context):
                result = load(request, context)
                if _succeeded(result):  # a failed load leaves the previous identity
                    self.state.record(getattr(request, "Model", ""))
                return result

            return _with_behavior(handler, record)
        serve = handler.unary_stream if handler.response_streaming else handler.unary_unary

        def guard(request, context):
            refusal = self.state.mismatch(getattr(request, "ModelIdentity", ""))
            if refusal is not None:
                context.abort(grpc.StatusCode.NOT_FOUND, refusal)  # raises
            return serve(request, context)

        return _with_behavior(handler, guard)


async def _call(behavior, request, context):
    """Run a unary behaviour, async or not; a plain function runs on a worker
    thread, as grpc.aio runs sync handlers, so a slow one cannot stall the loop."""
    if inspect.iscoroutinefunction(behavior):
        return await behavior(request, context)
    result = await asyncio.get_running_loop().run_in_executor(None, behavior, request, context)
    return await result if inspect.isawaitable(result) else result


_END = object()


async def _stream(behavior, request, context):
    """Yield what a streaming behaviour yields; a plain generator is advanced on a
    worker thread, one item at a time."""
    if inspect.isasyncgenfunction(behavior):
        items = behavior(request, context)
    else:
        items = await asyncio.get_running_loop().run_in_executor(None, behavior, request, context)
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
        return
    advance = functools.partial(next, iter(items), _END)  # no StopIteration through a future
    while (item := await asyncio.get_running_loop().run_in_executor(None, advance)) is not _END:
        yield item


class AsyncModelIdentityInterceptor(grpc.aio.ServerInterceptor):
    """For a grpc.aio server, whose servicer may mix sync and async methods."""

    def __init__(self, state: Optional[ModelIdentityState] = None):
        self.state = state or ModelIdentityState()

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if not _guarded(method, handler):
            return handler
        if method == LOAD_METHOD:
            load = handler.unary_unary

            async def record(request, context):
                result = await _call(load, request, context)
                if _succeeded(result):
                    self.state.record(getattr(request, "Model", ""))
                return result

            return _with_behavior(handler, record)

        async def refuse_if_other(request, context):
            refusal = self.state.mismatch(getattr(request, "ModelIdentity", ""))
            if refusal is not None:
                await context.abort(grpc.StatusCode.NOT_FOUND, refusal)

        if handler.response_streaming:
            serve_stream = handler.unary_stream

            async def guard_stream(request, context):
                await refuse_if_other(request, context)
                async for item in _stream(serve_stream, request, context):
                    yield item

            return _with_behavior(handler, guard_stream)
        serve = handler.unary_unary

        async def guard(request, context):
            await refuse_if_other(request, context)
            return await _call(serve, request, context)

        return _with_behavior(handler, guard)

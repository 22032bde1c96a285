#!/usr/bin/env python3
"""The MLX backend process: a gRPC server speaking the host's Backend contract.

The servicer is thin: it turns proto messages into engine Requests (on the
preparation thread) and engine Events into Replies. The event loop never runs
MLX or blocks; the engine thread does all model work.
"""

import argparse
import asyncio
import concurrent.futures
import functools
import json
import logging
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from common.openblas import maybe_reexec_with_openblas  # noqa: E402

if __name__ == "__main__":
    maybe_reexec_with_openblas()

import grpc  # noqa: E402
from grpc_health.v1 import health as grpc_health, health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection  # noqa: E402

import backend_pb2  # noqa: E402
import backend_pb2_grpc  # noqa: E402
from common import auth, model_identity, parent_watch  # noqa: E402
from common.mlx_utils import Delta, ToolCall  # noqa: E402
from common.python_utils import OptionError  # noqa: E402
import limits  # noqa: E402
import load_options  # noqa: E402
import prepare  # noqa: E402
import rpc_gate  # noqa: E402
from render_guard import bounded  # noqa: E402
from rpc_gate import gated  # noqa: E402
from engine import Engine, EngineConfig, EngineError, lockstep, spec_config  # noqa: E402
from loaders import adapt_options, media_bounds, model_loader  # noqa: E402

log = logging.getLogger("mlx-backend")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
EXIT_CANNOT_LISTEN = 98  # the --addr could not be bound (98 is Linux's EADDRINUSE)
SHUTDOWN_GRACE_S = 8.0  # running streams get this long to finish at shutdown
LOADED_MESSAGE = "MLX model loaded successfully"  # LoadModel's answer, as LocalAI's mlx backend words it
ENGINE_STOP_S = 3.0  # then the engine this long to end its step (a prefill chunk is ~1.5 s on a CPU)
# Threads are made only when every existing one is busy, so this is a ceiling, not a cost:
# requests whose template render runs up to its time bound hold one each, and the
# ordinary requests next to them still find a free one.
PREP_THREADS = 16


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


class BackendServicer(backend_pb2_grpc.BackendServicer):
    def __init__(self, engine: Engine):
        self.engine = engine
        # Chat templates and tokenizers run here, off the event loop.
        self.prep = concurrent.futures.ThreadPoolExecutor(max_workers=PREP_THREADS, thread_name_prefix="prep")
        # Models load here while the engine keeps serving the old one; one load at a time.
        self.loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="load")
        self.load_lock = asyncio.Lock()
        self.gate = rpc_gate.RpcGate(load_options.ROWS["max_concurrent_rpcs"].default)

    # ---- helpers ------------------------------------------------------------

    def _on_prep(self, fn, *args):
        return asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    def _loaded(self):
        if not self.engine.alive:
            raise EngineError("UNAVAILABLE", f"mlx: the engine has stopped ({self.engine.dead or 'gone'})")
        lm = self.engine.model  # read once: the engine may swap it at any time
        if lm is None:
            raise EngineError("FAILED_PRECONDITION", "mlx: model not loaded")
        return lm

    def _check_identity(self, lm, identity: str):
        refusal = model_identity.identity_mismatch(lm.name, identity)
        if refusal is not None:
            raise EngineError("NOT_FOUND", f"mlx: {refusal}")

    async def _prepared(self, request):
        """The engine Request for a PredictOptions (its failures leave through status_of)."""
        lm = self._loaded()
        self._check_identity(lm, request.ModelIdentity)
        if lm.kind == "embedding":
            raise OptionError("the loaded model is an embedding model: it serves Embedding and Rerank only")
        if lm.kind == "reranker":
            raise OptionError("the loaded model is a cross-encoder reranker: it serves Rerank only")
        with self.engine.arriving():  # the engine may wait for it to prefill a burst together
            return await self._on_prep(prepare.build_request, lm, request)

    @staticmethod
    def _reply(ev, deltas) -> "backend_pb2.Reply":
        """A Reply: content text in `message`, every channel in `chat_deltas`, running totals."""
        reply = backend_pb2.Reply(
            message="".join(d.content for d in deltas).encode("utf-8"), tokens=ev.tokens,
            prompt_tokens=ev.prompt_tokens, timing_prompt_processing=ev.prompt_ms,
            timing_token_generation=ev.gen_ms)
        for d in deltas:
            reply.chat_deltas.append(backend_pb2.ChatDelta(
                content=d.content, reasoning_content=d.reasoning,
                tool_calls=[backend_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments=c.arguments)
                            for c in d.tool_calls]))
        if ev.logprobs is not None:
            reply.logprobs = json.dumps({"content": ev.logprobs}, ensure_ascii=False).encode("utf-8")
        return reply

    # ---- RPCs -----------------------------------------------------------------

    @answered
    async def Health(self, request, context):
        trouble = self.engine.trouble()
        if trouble is not None:  # dead, failing or stuck: the host then restarts this process
            raise EngineError("UNAVAILABLE", f"mlx: {trouble}")
        return backend_pb2.Reply(message=b"OK")

    @answered
    async def LoadModel(self, request, context):
        try:
            # Every option and field is checked here, before anything loads; the engine gets them typed.
            options = load_options.parse(request.Options)
            spec = model_loader.LoadSpec(
                model=request.Model, model_file=request.ModelFile, model_path=request.ModelPath,
                options=options,
                context_size=(load_options.check("context_size", request.ContextSize, "ContextSize")
                              if request.ContextSize else options.context_size or 0),
                dtype=load_options.check("dtype", request.DType, "DType") if request.DType else options.dtype,
                trust_remote_code=request.TrustRemoteCode or options.trust_remote_code,
                adapters=adapt_options.lora_requests(
                    request.LoraAdapter, request.LoraScale, request.LoraAdapters, request.LoraScales),
                kv=adapt_options.kv_spec(request.CacheTypeKey, request.CacheTypeValue, options),
                media=media_bounds.from_load(options, {f: getattr(request, f) for f in media_bounds.HOST_FIELDS}))
            config = EngineConfig.from_settings(options)
            text_limits = limits.from_options(options)
            speculation = spec_config.parse(options, request.DraftModel)
            if speculation.mode == "draft" and hasattr(self.engine, "load_model"):
                raise OptionError("DraftModel: a draft model is not served across ranks")
        except OptionError as e:
            return backend_pb2.Result(success=False, message=f"invalid option: {e}")
        except Exception as e:  # a load answers success=false, whatever went wrong (a bug: logged)
            log.exception("LoadModel: reading its options failed")
            return backend_pb2.Result(success=False, message=f"{type(e).__name__}: {e}")
        async with self.load_lock:
            try:
                if options.free_before_load:  # for machines that cannot hold two models at once
                    await asyncio.wrap_future(self.engine.swap(None))
                # The old model keeps serving while the new one loads on its own thread.
                load = getattr(self.engine, "load_model", model_loader.load)  # lockstep: on every rank
                lm = await asyncio.get_running_loop().run_in_executor(self.loader, load, spec)
                lm = await asyncio.get_running_loop().run_in_executor(
                    self.loader, spec_config.attach, lm, speculation, spec, request.DraftModel)
                lm.derived[limits.KEY] = text_limits
                await asyncio.wrap_future(self.engine.swap(lm, config))
                self.gate.limit = options.max_concurrent_rpcs
            except (model_loader.ModelNotFound, model_loader.ModelLoadError, EngineError) as e:
                log.error("LoadModel failed: %s", e)
                return backend_pb2.Result(success=False, message=str(e))
            except Exception as e:
                log.exception("LoadModel failed")
                return backend_pb2.Result(success=False, message=f"{type(e).__name__}: {e}")
        log.info("LoadModel: serving %s (dtype %s, context %d)", lm.source, lm.dtype, lm.context_size)
        # The host only logs the message: LocalAI's wording, the details are in our log.
        return backend_pb2.Result(success=True, message=LOADED_MESSAGE)

    @answered
    async def Free(self, request, context):
        try:
            async with self.load_lock:
                await asyncio.wrap_future(self.engine.swap(None))
        except EngineError as e:
            return backend_pb2.Result(success=False, message=str(e))
        return backend_pb2.Result(success=True, message="model freed")

    def _cancel_when_done(self, context, req) -> None:
        # gRPC may only cancel the handler at its next write, a decode step
        # later; the done callback fires as soon as the client goes away.
        context.add_done_callback(lambda _: self.engine.cancel(req.id))

    @answered_stream
    @gated
    async def PredictStream(self, request, context):
        req = await self._prepared(request)
        self._cancel_when_done(context, req)
        async for ev in self.engine.stream(req):
            if ev.deltas or ev.finish:
                yield self._reply(ev, ev.deltas)

    @answered
    @gated
    async def Predict(self, request, context):
        req = await self._prepared(request)
        self._cancel_when_done(context, req)
        deltas, last = [], None
        async for ev in self.engine.stream(req):
            deltas.extend(ev.deltas)
            last = ev
        return self._reply(last, [merge_deltas(deltas)])

    @answered
    @gated
    async def TokenizeString(self, request, context):
        lm = self._loaded()
        self._check_identity(lm, request.ModelIdentity)
        tokens = await self._on_prep(prepare.prompt_tokens, lm, request)
        return backend_pb2.TokenizationResponse(length=len(tokens), tokens=tokens)

    @answered
    @gated
    async def Detokenize(self, request, context):
        lm = self._loaded()
        # Counted before anything is copied out of the message; checked and decoded off the loop.
        bound = limits.of(lm).max_detokenize_tokens
        if len(request.tokens) > bound:
            raise OptionError(f"tokens: {len(request.tokens)} ids; at most {bound} (option max_detokenize_tokens)")
        text = await self._on_prep(detokenize, lm, request.tokens)
        return backend_pb2.DetokenizeResponse(content=text)

    @answered
    async def Status(self, request, context):
        State = backend_pb2.StatusResponse.State
        if self.engine.trouble() is not None:  # dead, failing or stuck, as Health says
            state = State.ERROR
        elif self.engine.model is None:
            state = State.UNINITIALIZED
        else:
            state = State.BUSY if self.engine.busy else State.READY
        mem = dict(self.engine.memory)
        return backend_pb2.StatusResponse(
            state=state, memory=backend_pb2.MemoryUsageData(total=mem.get("active", 0), breakdown=mem))

    @answered
    @gated
    async def ModelMetadata(self, request, context):
        return await self._on_prep(model_metadata, self._loaded())

    async def _forward(self, context, request, prep, *args):
        """Prepare forward jobs on the prep thread, run them on the engine: (model, results)."""
        lm = self._loaded()
        self._check_identity(lm, request.ModelIdentity)
        if lm.kind == "vision":
            raise OptionError("Embedding, Score and Rerank are not served for a vision model")
        with self.engine.arriving():  # concurrent embeddings arriving together share one pass
            jobs = await self._on_prep(prep, lm, request, *args)
        # When the call ends early (deadline, client gone) its jobs leave the engine's queue.
        context.add_done_callback(
            lambda _: [setattr(j, "cancelled", True) for j in (jobs if isinstance(jobs, list) else [jobs])])
        if not isinstance(jobs, list):
            return lm, await self.engine.forward(jobs)
        return lm, await asyncio.gather(*(self.engine.forward(j) for j in jobs))

    @answered
    @gated
    async def Embedding(self, request, context):
        started = time.perf_counter()
        lm, result = await self._forward(context, request, prepare.embed_job)
        (vectors,) = result.vectors
        log.info("embedding%s: %d tokens -> %d x %d in %.0f ms", _tag(request.CorrelationId),
                 result.prompt_tokens, len(vectors), len(vectors[0]), (time.perf_counter() - started) * 1000)
        Layout = backend_pb2.EmbeddingLayout
        return backend_pb2.EmbeddingResult(
            embeddings=[x for v in vectors for x in v], tokens=len(vectors), dim=len(vectors[0]),
            prompt_tokens=result.prompt_tokens,
            layout=Layout.EMBEDDING_LAYOUT_PER_TOKEN if lm.embedding.pooling == "none"
            else Layout.EMBEDDING_LAYOUT_FINAL)

    @answered
    @gated
    async def Score(self, request, context):
        started = time.perf_counter()
        lm, result = await self._forward(context, request, prepare.score_request)
        reply = await asyncio.get_running_loop().run_in_executor(
            self.prep, score_response, lm, result, request.length_normalize, request.include_token_logprobs)
        log.info("score: %d candidates, %d tokens evaluated (%d cached) in %.0f ms", len(result.tokens),
                 result.prompt_tokens, result.cached_tokens, (time.perf_counter() - started) * 1000)
        return reply

    @answered
    @gated
    async def Rerank(self, request, context):
        started = time.perf_counter()
        lm, results = await self._forward(context, request, prepare.rerank_jobs)
        documents = list(request.documents)
        scores = prepare.rerank_scores(lm, results)
        evaluated = sum(r.prompt_tokens for r in results)
        order = prepare.ranked(scores, request.top_n)
        log.info("rerank: %d documents, %d tokens evaluated in %.0f ms", len(documents), evaluated,
                 (time.perf_counter() - started) * 1000)
        return backend_pb2.RerankResult(
            usage=backend_pb2.Usage(total_tokens=evaluated, prompt_tokens=evaluated),
            results=[backend_pb2.DocumentResult(index=i, text=documents[i], relevance_score=scores[i])
                     for i in order])

    @answered
    async def GetMetrics(self, request, context):
        m = self.engine.metrics
        return backend_pb2.MetricsResponse(
            tokens_per_second=m["tokens_per_second"], tokens_generated=m["tokens_generated"],
            prompt_tokens_processed=m["prompt_tokens_processed"])


def _tag(label: str) -> str:
    return f" ({label})" if label else ""


def detokenize(lm, tokens) -> str:
    """Detokenize's ids, range-checked, as text (prep thread)."""
    vocab = len(lm.tokenizer)
    bad = [t for t in tokens if not 0 <= t < vocab][:5]
    if bad:
        raise OptionError(f"tokens: ids out of range [0, {vocab}): {bad}")
    return lm.tokenizer.decode(list(tokens))


def score_response(lm, result, length_normalize: bool, per_token: bool) -> "backend_pb2.ScoreResponse":
    """Candidate scores as the host reads them (prep thread: token texts are decoded here)."""
    out = backend_pb2.ScoreResponse()
    for tokens, logprobs in zip(result.tokens, result.logprobs):
        c = out.candidates.add(log_prob=sum(logprobs), num_tokens=len(tokens))
        if length_normalize:
            c.length_normalized_log_prob = c.log_prob / max(len(tokens), 1)
        if per_token:
            for t, lp in zip(tokens, logprobs):
                c.tokens.add(token=lm.tokenizer.decode([t]), log_prob=lp)
    return out


def merge_deltas(deltas) -> Delta:
    """The streamed deltas merged as the host merges them: one ChatDelta for Predict."""
    calls = {}
    for d in deltas:
        for c in d.tool_calls:
            merged = calls.setdefault(c.index, ToolCall(index=c.index))
            merged.id = c.id or merged.id
            merged.name = c.name or merged.name
            merged.arguments += c.arguments
    return Delta(content="".join(d.content for d in deltas),
                 reasoning="".join(d.reasoning for d in deltas),
                 tool_calls=[calls[i] for i in sorted(calls)])


def model_metadata(lm) -> "backend_pb2.ModelMetadataResponse":
    """What the host needs to know of the model's chat format (prep thread)."""
    tok = lm.tokenizer
    # An encoder's tokenizer is transformers' own, without mlx-lm's chat attributes: none of them.
    out = backend_pb2.ModelMetadataResponse(supports_thinking=bool(getattr(tok, "has_thinking", False)))
    if getattr(lm, "kind", "text") == "vision":  # a raw Prompt marks each image with it
        out.media_marker = prepare.MEDIA_MARKER
    if getattr(tok, "has_chat_template", False):
        bound = limits.of(lm)
        try:
            with bounded("ModelMetadata", bound.template_seconds, bound.template_output_bytes):
                out.rendered_template = tok.apply_chat_template(
                    [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=False,
                    enable_thinking=True)
        except Exception as e:  # a template that needs more than one user turn
            log.warning("ModelMetadata: the chat template did not render: %s", e)
    markers = out.tool_format
    if getattr(tok, "has_thinking", False):
        markers.reasoning_start, markers.reasoning_end = tok.think_start, tok.think_end
    if getattr(tok, "has_tool_calling", False):
        markers.format_type = tok.tool_parser.__module__.rsplit(".", 1)[-1]
        markers.per_call_start, markers.per_call_end = tok.tool_call_start, tok.tool_call_end or ""
        if markers.format_type == "json_tools":
            markers.name_field, markers.args_field = "name", "arguments"
    return out


BACKEND_SERVICE = backend_pb2.DESCRIPTOR.services_by_name["Backend"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


async def standard_services(server, engine: Engine, loop) -> "grpc_health.aio.HealthServicer":
    """grpc.health.v1 (SERVING while the engine lives, for "" and backend.Backend) and reflection."""
    health = grpc_health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((BACKEND_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server)

    async def set_all(status) -> None:
        for name in ("", BACKEND_SERVICE):
            await health.set(name, status)

    def engine_closed(cause: str) -> None:  # engine thread: hand over to the loop
        try:
            loop.call_soon_threadsafe(
                lambda: loop.create_task(set_all(health_pb2.HealthCheckResponse.NOT_SERVING)))
        except RuntimeError:  # the loop is gone: the process is exiting anyway
            pass

    engine.on_close = engine_closed
    await set_all(health_pb2.HealthCheckResponse.SERVING if engine.alive
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
    health.engine_watch = loop.create_task(watch_engine(engine, set_all))  # held: else it may vanish
    return health


async def watch_engine(engine: Engine, set_all) -> None:
    """Keep grpc health in step with the engine: NOT_SERVING while it fails every pass or is stuck
    in one (Engine.trouble), SERVING again when it recovers; the host restarts a process that stays out."""
    serving = True
    while engine.alive:
        trouble = engine.trouble()
        if (trouble is None) != serving:
            serving = trouble is None
            if not serving:
                log.error("health: not serving: %s", trouble)
            else:
                log.info("health: serving again")
            await set_all(health_pb2.HealthCheckResponse.SERVING if serving
                          else health_pb2.HealthCheckResponse.NOT_SERVING)
        # A quarter of the bound: a stuck engine is seen within 1.25x health_timeout.
        await asyncio.sleep(min(max(engine.config.health_timeout / 4, 0.01), 1.0))


async def serve(addr: str, group=None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # Watch the parent first, so a host that dies while we start up is noticed.
    # The host sends SIGTERM, then SIGKILL 15 s later: the grace plus the engine's
    # stop (ENGINE_STOP_S) end well before that.
    grace = parent_watch.duration_from_env("MLX_BACKEND_SHUTDOWN_GRACE", SHUTDOWN_GRACE_S, allow_zero=True)
    watch_on, interval = parent_watch.settings_from_env()
    watcher = None
    if watch_on:
        # The graceful path gets its grace, the engine its stop time, and 2 s to spare.
        watcher = parent_watch.start_parent_watch(
            lambda: loop.call_soon_threadsafe(stop.set), interval, force_exit_after=grace + ENGINE_STOP_S + 2.0)

    engine = Engine() if group is None else lockstep.LockstepEngine(group)
    interceptors = auth.server_interceptors()
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # gRPC's default lets a second server bind a port already served and share its
        # connections: a stale or stray backend would silently answer half of the host's calls.
        ("grpc.so_reuseport", 0),
    ])
    backend_pb2_grpc.add_BackendServicer_to_server(BackendServicer(engine), server)
    health = await standard_services(server, engine, loop)
    try:
        bound = server.add_insecure_port(addr)
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound = 0
    if bound == 0:
        log.error("cannot listen on %s (address in use or not available)", addr)
        raise SystemExit(EXIT_CANNOT_LISTEN)
    exposed = auth.open_bind_warning(addr)
    if exposed:
        log.warning("%s", exposed)

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await server.start()
    log.info("serving on %s (pid %d); auth %s; parent watch %s; shutdown grace %gs", addr, os.getpid(),
             f"on ({auth.ENV_TOKEN})" if interceptors else "off",
             f"on (parent pid {os.getppid()}, every {interval:g}s)" if watcher else
             ("off (no parent to watch)" if watch_on else f"off ({parent_watch.ENV_WATCH})"),
             grace)

    await stop.wait()
    # server.stop refuses new RPCs at once, lets in-flight ones run up to `grace`,
    # then cancels them; their engine requests leave the batch as they unwind.
    log.info("shutting down: in-flight requests get up to %gs", grace)
    await health.enter_graceful_shutdown()
    await server.stop(grace)
    # Fails whatever is left with CANCELLED and joins the engine thread; off the
    # loop so the engine's last events can still be delivered meanwhile.
    await asyncio.to_thread(engine.stop, ENGINE_STOP_S)
    log.info("stopped")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="MLX backend for LocalAI-style hosts")
    parser.add_argument("--addr", default="localhost:50051", help="HOST:PORT to listen on")
    parser.add_argument("--log-level", default=os.environ.get("MLX_BACKEND_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The engine thread's Python work between MLX calls holds the GIL for up to
    # one switch interval (5 ms by default): a shorter one keeps Health snappy.
    sys.setswitchinterval(0.001)
    group = lockstep.join() if lockstep.wanted() else None  # under mlx.launch: one rank of a group
    if group is not None and group.rank > 0:
        lockstep.follow(group)  # no port: replays rank 0's steps until rank 0 stops
    asyncio.run(serve(args.addr, group))
    # Everything has stopped. Skip the interpreter's teardown: MLX's native one can
    # abort ("terminate called without an active exception") while threads that
    # used it are being torn down, turning a clean stop into SIGABRT.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

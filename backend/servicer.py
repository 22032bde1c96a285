"""The Backend service: proto messages -> preparation -> engine -> proto replies.

The servicer is thin: it turns proto messages into engine work (prepared on the
preparation thread) and engine results into replies (replies.py). It asks a loaded
model what it serves (`lm.serves`), never which library or kind serves it. Every
RPC's failure leaves through the one status map (status_map.answered). The event
loop never runs MLX or blocks; the engine thread does all model work.
"""

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import audio_replies
import backend_pb2
import backend_pb2_grpc
from common import model_identity
from common.python_utils import OptionError
import limits
import load_options
import prepare
import replies
import rpc_gate
from rpc_gate import gated
from status_map import answered, answered_stream
from engine import Engine, EngineConfig, EngineError, lane_choice
from engine.audio import AudioDone, AudioPart
from engine.speculation import spec_config
from loaders import adapt_options, media_bounds, model_loader
from prepare import audio as audio_prep

log = logging.getLogger("mlx-backend")

LOADED_MESSAGE = "MLX model loaded successfully"  # LoadModel's answer, as LocalAI's mlx backend words it
# Threads are made only when every existing one is busy, so this is a ceiling, not a cost:
# requests whose template render runs up to its time bound hold one each, and the
# ordinary requests next to them still find a free one.
PREP_THREADS = 16


@dataclass
class LoadPlan:
    """A LoadModel's request read and checked, before anything loads."""
    options: Any  # load_options.Settings
    spec: model_loader.LoadSpec
    config: EngineConfig
    text_limits: limits.TextLimits
    speculation: Any  # spec_config's settings


def read_load(request, distributed: bool) -> LoadPlan:
    """Every option and field of a ModelOptions checked (OptionError names the bad one); the engine
    gets them typed."""
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
    if speculation.mode == "draft" and distributed:
        raise OptionError("DraftModel: a draft model is not served across ranks")
    return LoadPlan(options, spec, config, text_limits, speculation)


def _probes(lm) -> list:
    """Fresh probe requests for `lm`, prepared as a client's (prepare/probe.py); none when they
    cannot be (a context shorter than they are): the caches alone then choose the lane."""
    try:
        return prepare.probe_requests(lm)
    except (OptionError, EngineError) as e:
        log.warning("LoadModel: the lane is not checked: %s", e)
        return []


def _tag(label: str) -> str:
    return f" ({label})" if label else ""


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

    def _serving(self, request, task: str, rpc: str):
        """The loaded model, when it serves the audio `task` ("transcribe", "speak", "detect")
        and the request names it; FAILED_PRECONDITION naming what is loaded otherwise."""
        lm = self._loaded()
        self._check_identity(lm, request.ModelIdentity)
        if task not in lm.serves.audio:
            raise EngineError("FAILED_PRECONDITION", f"mlx: {rpc}: the loaded model is {lm.serves.what}: it serves "
                              f"{prepare.served_rpcs(lm.serves)} only")
        return lm

    async def _prepared(self, request):
        """The engine Request for a PredictOptions (its failures leave through status_of)."""
        lm = self._loaded()
        self._check_identity(lm, request.ModelIdentity)
        serves = lm.serves
        if serves.audio:  # an audio model: the RPC, not a field, is wrong
            raise EngineError("FAILED_PRECONDITION", f"mlx: the loaded model is {serves.what}: it serves "
                              f"{prepare.served_rpcs(serves)} only")
        if not serves.generate:
            raise OptionError(f"the loaded model is {serves.what}: it serves {prepare.served_rpcs(serves)} only")
        with self.engine.arriving():  # the engine may wait for it to prefill a burst together
            return await self._on_prep(prepare.build_request, lm, request)

    def _cancel_when_done(self, context, *work) -> None:
        """When the call ends early (deadline, client gone), its streams and forward jobs leave
        the engine, all the same way: engine.cancel(id), a no-op for what has finished.
        gRPC may only cancel the handler at its next write, a decode step later; the done
        callback fires as soon as the client goes away."""
        context.add_done_callback(lambda _: [self.engine.cancel(w.id) for w in work if w.id])

    async def _forward(self, context, request, prep, *args):
        """Prepare forward jobs on the prep thread, run them on the engine: (model, results)."""
        lm = self._loaded()
        self._check_identity(lm, request.ModelIdentity)
        serves = lm.serves
        if serves.audio:
            raise EngineError("FAILED_PRECONDITION", f"mlx: the loaded model is {serves.what}: it serves "
                              f"{prepare.served_rpcs(serves)} only")
        if not (serves.embed or serves.score or serves.rerank):
            raise OptionError(f"Embedding, Score and Rerank are not served for {serves.what}")
        with self.engine.arriving():  # concurrent embeddings arriving together share one pass
            jobs = await self._on_prep(prep, lm, request, *args)
        many = isinstance(jobs, list)
        jobs = jobs if isinstance(jobs, list) else [jobs]
        self._cancel_when_done(context, *jobs)  # their ids are given as they are submitted, below
        results = await asyncio.gather(*(self.engine.forward(j) for j in jobs))
        return lm, (results if many else results[0])

    # ---- the host's view: health, status, metrics ----------------------------------

    @answered
    async def Health(self, request, context):
        trouble = self.engine.trouble()
        if trouble is not None:  # dead, failing or stuck: the host then restarts this process
            raise EngineError("UNAVAILABLE", f"mlx: {trouble}")
        return backend_pb2.Reply(message=b"OK")

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
    async def GetMetrics(self, request, context):
        m = self.engine.metrics
        return backend_pb2.MetricsResponse(
            tokens_per_second=m["tokens_per_second"], tokens_generated=m["tokens_generated"],
            prompt_tokens_processed=m["prompt_tokens_processed"])

    # ---- loading ----------------------------------------------------------------

    @answered
    async def LoadModel(self, request, context):
        try:
            plan = read_load(request, distributed=self.engine.distributed)
        except OptionError as e:
            return backend_pb2.Result(success=False, message=f"invalid option: {e}")
        except Exception as e:  # a load answers success=false, whatever went wrong (a bug: logged)
            log.exception("LoadModel: reading its options failed")
            return backend_pb2.Result(success=False, message=f"{type(e).__name__}: {e}")
        async with self.load_lock:
            try:
                lm = await self._load(plan, request.DraftModel)
            except (model_loader.ModelNotFound, model_loader.ModelLoadError, EngineError) as e:
                log.error("LoadModel failed: %s", e)
                return backend_pb2.Result(success=False, message=str(e))
            except Exception as e:
                log.exception("LoadModel failed")
                return backend_pb2.Result(success=False, message=f"{type(e).__name__}: {e}")
        log.info("LoadModel: serving %s (dtype %s, context %d, lane %s)", lm.source, lm.dtype, lm.context_size,
                 lm.lane.name)
        # The host only logs the message: LocalAI's wording, the details are in our log.
        return backend_pb2.Result(success=True, message=LOADED_MESSAGE)

    async def _load(self, plan: LoadPlan, draft_model: str):
        """Load the plan's model and swap it into the engine (under the load lock). What the load
        decides after the loader (speculation, text limits, the lane) goes into a new value of the
        model (dataclasses.replace): the engine is given the finished one, which nothing changes."""
        if plan.options.free_before_load:  # for machines that cannot hold two models at once
            await asyncio.wrap_future(self.engine.swap(None))
        # The old model keeps serving while the new one loads on its own thread.
        loop = asyncio.get_running_loop()
        loaded = await loop.run_in_executor(self.loader, self.engine.load, plan.spec)  # lockstep: on every rank
        speculation = await loop.run_in_executor(
            self.loader, spec_config.with_draft, plan.speculation, loaded, plan.spec, draft_model)
        lm = dataclasses.replace(loaded, speculation=speculation, text_limits=plan.text_limits)
        if lm.serves.generate:
            lm = dataclasses.replace(lm, lane=await self._choose_lane(lm, plan))
        await asyncio.wrap_future(self.engine.swap(lm, plan.config))
        self.gate.limit = plan.options.max_concurrent_rpcs
        return lm

    async def _choose_lane(self, lm, plan: LoadPlan):
        """The model's lane (engine/lane_choice.py): its caches and a check on the loading thread
        (across ranks on the engine thread, every rank running each probe on its shard: one
        verdict for the group), then one request through the lane on the engine thread, which
        may give way to the solo lane; ModelLoadError when none serves it."""
        loop = asyncio.get_running_loop()
        probes = functools.partial(_probes, lm)
        try:
            if self.engine.distributed:
                lane = await asyncio.wrap_future(self.engine.decide(lm, plan.config, probes, plan.options.lane))
            else:
                lane = await loop.run_in_executor(
                    self.loader, lane_choice.decide, lm, plan.config, probes, plan.options.lane)
            trial = await loop.run_in_executor(self.loader, probes)  # the first, and a spare for the solo lane
            return await asyncio.wrap_future(
                self.engine.trial(lm, lane, plan.config, trial[:2], plan.options.lane == "auto"))
        except model_loader.ModelLoadError as e:  # named as the loaders name theirs: which model is refused
            raise model_loader.ModelLoadError(f"{lm.source}: {e}") from None

    @answered
    async def Free(self, request, context):
        try:
            async with self.load_lock:
                await asyncio.wrap_future(self.engine.swap(None))
        except EngineError as e:
            return backend_pb2.Result(success=False, message=str(e))
        return backend_pb2.Result(success=True, message="model freed")

    # ---- generation and tokens ----------------------------------------------------

    @answered_stream
    @gated
    async def PredictStream(self, request, context):
        req = await self._prepared(request)
        self._cancel_when_done(context, req)
        async for ev in self.engine.stream(req):
            if ev.deltas or ev.finish:
                yield replies.reply(ev, ev.deltas)

    @answered
    @gated
    async def Predict(self, request, context):
        req = await self._prepared(request)
        self._cancel_when_done(context, req)
        deltas, last = [], None
        async for ev in self.engine.stream(req):
            deltas.extend(ev.deltas)
            last = ev
        return replies.reply(last, [replies.merge_deltas(deltas)])

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
        text = await self._on_prep(replies.detokenize, lm, request.tokens)
        return backend_pb2.DetokenizeResponse(content=text)

    @answered
    @gated
    async def ModelMetadata(self, request, context):
        return await self._on_prep(replies.model_metadata, self._loaded())

    # ---- forward work: Embedding, Score, Rerank ----------------------------------------

    @answered
    @gated
    async def Embedding(self, request, context):
        started = time.perf_counter()
        lm, result = await self._forward(context, request, prepare.embed_job)
        out = replies.embedding_result(lm, result)
        log.info("embedding%s: %d tokens -> %d x %d in %.0f ms", _tag(request.CorrelationId),
                 result.prompt_tokens, out.tokens, out.dim, (time.perf_counter() - started) * 1000)
        return out

    @answered
    @gated
    async def Score(self, request, context):
        started = time.perf_counter()
        lm, result = await self._forward(context, request, prepare.score_request)
        reply = await self._on_prep(
            replies.score_response, lm, result, request.length_normalize, request.include_token_logprobs)
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
        log.info("rerank: %d documents, %d tokens evaluated in %.0f ms", len(documents), evaluated,
                 (time.perf_counter() - started) * 1000)
        return replies.rerank_result(documents, scores, prepare.ranked(scores, request.top_n), evaluated)

    # ---- audio: speech to text, text to speech, voice activity -----------------------------

    async def _run_audio(self, context, job):
        """The job's parts as they come, then its AudioDone (prepared, bounded: prepare/audio.py)."""
        self._cancel_when_done(context, job)
        async for item in self.engine.audio(job):
            yield item

    async def _transcribe(self, request, context, rpc: str):
        lm = self._serving(request, "transcribe", rpc)
        job = await self._on_prep(audio_prep.transcription_job, lm, request)
        done = None
        async for item in self._run_audio(context, job):
            done = item
        seconds = job.args["seconds"]
        result = audio_replies.transcript_result(done.value, seconds)
        log.info("transcription%s: %.1f s of audio -> %d characters, %d segments (queued %.0f ms, %.0f ms: "
                 "%.2fx real time)", _tag(job.label), seconds, len(result.text), len(result.segments),
                 done.queued_ms, done.run_ms, done.run_ms / 1000 / seconds if seconds else 0)
        return result

    @answered
    @gated
    async def AudioTranscription(self, request, context):
        return await self._transcribe(request, context, "AudioTranscription")

    @answered_stream
    @gated
    async def AudioTranscriptionStream(self, request, context):
        # The library gives a transcript whole: each segment goes as a delta, then the result.
        result = await self._transcribe(request, context, "AudioTranscriptionStream")
        for segment in result.segments:
            yield backend_pb2.TranscriptStreamResponse(delta=segment.text)
        if not result.segments and result.text:
            yield backend_pb2.TranscriptStreamResponse(delta=result.text)
        yield backend_pb2.TranscriptStreamResponse(final_result=result)

    @answered
    @gated
    async def TTS(self, request, context):
        lm = self._serving(request, "speak", "TTS")
        job = await self._on_prep(audio_prep.speech_job, lm, request, True)
        chunks, done = [], None
        async for item in self._run_audio(context, job):
            if isinstance(item, AudioPart):
                chunks.append(item.value)
            else:
                done = item
        rate = done.value["sample_rate"] or lm.audio.sample_rate
        if not chunks or not rate:
            raise EngineError("INTERNAL", "TTS: the model made no audio for this text")
        size = await self._on_prep(audio_replies.write_wav, request.dst, chunks, rate)
        seconds = done.value["samples"] / rate
        log.info("speech%s: %.2f s at %d Hz -> %s (%d bytes; queued %.0f ms, %.0f ms: %.2fx real time)",
                 _tag(job.label), seconds, rate, request.dst, size, done.queued_ms, done.run_ms,
                 done.run_ms / 1000 / seconds if seconds else 0)
        return backend_pb2.Result(success=True, message=f"audio written to {request.dst}")

    @answered_stream
    @gated
    async def TTSStream(self, request, context):
        lm = self._serving(request, "speak", "TTSStream")
        job = await self._on_prep(audio_prep.speech_job, lm, request, False)
        rate = lm.audio.sample_rate
        if rate:
            yield audio_replies.stream_header(rate)  # the host writes its WAV header from it
        async for item in self._run_audio(context, job):
            if isinstance(item, AudioPart):
                samples, chunk_rate = item.value
                if not rate:
                    rate = chunk_rate
                    yield audio_replies.stream_header(rate)
                yield audio_replies.stream_chunk(samples)
            elif isinstance(item, AudioDone):
                log.info("speech stream%s: %d samples at %s Hz (queued %.0f ms, %.0f ms)", _tag(job.label),
                         item.value["samples"], rate, item.queued_ms, item.run_ms)

    @answered
    @gated
    async def VAD(self, request, context):
        lm = self._serving(request, "detect", "VAD")
        job = await self._on_prep(audio_prep.voice_job, lm, request)
        done = None
        async for item in self._run_audio(context, job):
            done = item
        log.info("voice activity%s: %d segments (%.0f ms)", _tag(job.label), len(done.value), done.run_ms)
        return audio_replies.vad_response(done.value)

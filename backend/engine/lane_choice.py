"""Which lane generates for a loaded model: its cache classes, then a check at load.

The batch (lanes/text_batch.py, lanes/vision_batch.py) serves many requests at once by
merging their caches; it is used where it gives the text the library's own single stream
gives. The solo lane (lanes/solo.py, lanes/solo_vision.py) runs one request at a time
through the library's own generation step: the library's text by construction, and the
reference the batch is checked against. Decided from what the model does, never its name:

- a cache class mlx-lm's batch cannot merge (loaders/cache_kinds.py), or a vision model whose
  embedding step the vision batch does not reproduce (loaders/vision_probe.py batch_obstacle): solo;
- else `decide` (on the loading thread, while the previous model keeps serving): five greedy
  requests of different lengths (the first past the model's smallest sliding window:
  prepare/probe.py) run through the solo lane, one at a time, and again with each prompt
  prefilled in pieces, which measures the single stream's own noise at the model's precision
  (lane_tolerance.py); then through the batch, three prefilled together (the shorter ones
  padded) and two joining them while they decode (lane_probe.py). The batch is kept when every
  request gives the solo lane's tokens, compared up to the first near tie (a top-2 margin within
  the noise: there rounding alone may pick the other token), and their log-probabilities within
  a few times that noise: a few probe tokens can agree while the batch computes something else
  (afm7's shared-KV layers place their queries by the padded cache's length, not the row's
  position: the same 3 tokens, log-probabilities 0.3 apart, other text later). If it raises or
  differs, the batch is tried once more with each prompt prefilled alone and merged only to
  decode, so no padding reaches a recurrent state (mamba, jamba); a model with a recurrent
  state (an ArraysCache layer) is never batched padded, checked prefilled alone from the start;
  if that differs too, solo;
- then `trial` (on the engine thread, where requests run): one request through the chosen
  lane; a batch that fails it gives way to solo; a model failing in the solo lane too is refused.

Both return the lane; LoadModel builds the served model with it (a new LoadedModel value):
nothing here writes to a model, and each run is given the lane it tests.

The solo lane failing a request means the library's own step cannot generate with the model
here: refused at LoadModel with that reason. The load option `lane` (batch or solo) skips
the check; only the trial runs. Cost at load: 15 to 20 short generations of a few tokens
(prepare/probe.py; more tokens each where later prompts are long, an image's: lane_probe.py) on the loading
thread, once per model on a machine (lane_verdicts.py keeps the verdict), and one on the engine
thread at every load.
"""

import dataclasses
import logging
from typing import Callable, List, Optional

from engine import lane_probe, lane_tolerance, lane_verdicts
from loaders import cache_kinds, rounding
from loaders.loaded import Lane, ModelLoadError, materialize

log = logging.getLogger("mlx-backend.engine")

FLOAT32_EPS = 2.0 ** -23
UNCHECKED = "not checked: no probe request fits this model"
_NAMES = "ABCDEFGH"


def lane_figures(lm) -> dict:
    """For Status: the lane of the model served (none when nothing is)."""
    if lm is None:
        return {}
    lane = getattr(lm, "lane", Lane())
    return {"lane_solo": int(lane.solo), "lane_prefill_alone": int(lane.prefill_alone)}


def decide(lm, config, probes: Callable[[], List], forced: str = "auto", hooks=None,
           beat: Callable[[], None] = lambda: None) -> Lane:
    """The lane for `lm` (loading thread; across ranks the engine thread, with the group's probe
    `hooks`, which journal each run to the followers: Engine.decide): by the load option `forced`
    (batch, solo), else from the model's caches and the check. `probes()` gives fresh probe
    requests for a run. Raises ModelLoadError when the library's own step fails, or when
    lane:batch cannot serve the model."""
    obstacle = _batch_obstacle(lm)
    if forced == "solo":
        lane = Lane(solo=True, reason="load option lane:solo")
    elif forced == "batch":
        if obstacle:
            raise ModelLoadError(f"lane:batch cannot serve this model: {obstacle} "
                                 f"(leave lane unset for the solo lane)")
        lane = Lane(reason="load option lane:batch")
    else:
        kept = lane_verdicts.read(lm, config)
        if kept is not None:
            lane = Lane(kept.solo, kept.prefill_alone, f"{kept.reason}; found by the check at an earlier load")
        else:
            lane = _checked(lm, config, probes, obstacle, hooks, beat)
            if lane.reason != UNCHECKED:
                lane_verdicts.write(lm, config, lane)
    log.info("lane: %s (%s; caches: %s)", lane.name, lane.reason, ", ".join(cache_kinds.of(lm.model)))
    return lane


def _batch_obstacle(lm) -> Optional[str]:
    """Why no batch can serve this model, known before any check (None: the check decides): a
    cache class mlx-lm's batch cannot merge, or what a vision model's embedding step does with
    a test image at load that the vision batch does not reproduce (loaders/vision_probe.py)."""
    unmergeable = cache_kinds.unmergeable(lm.model)
    if unmergeable:
        return f"its {unmergeable} cache cannot be merged into mlx-lm's batch"
    obstacle = lm.vision.batch_obstacle if lm.vision is not None else None
    return f"the vision batch cannot serve it: {obstacle}" if obstacle else None


def _checked(lm, config, probes: Callable[[], List], obstacle: Optional[str], hooks=None,
             beat: Callable[[], None] = lambda: None) -> Lane:
    import mlx.core as mx

    if obstacle:  # the trial shows the solo lane generates
        return Lane(solo=True, reason=obstacle)
    stream = mx.default_stream(mx.default_device())

    def outcomes(lane: Lane, requests: Optional[List] = None, run_config=config):
        return lane_probe.run(lm, lane, run_config, requests or probes(), stream, beat, hooks=hooks)

    def batched(lane: Lane) -> Optional[str]:
        """How the lane differs from the reference: some arriving together, the rest joining them."""
        return differs(reference, outcomes(lane), tolerance)

    first = probes()
    if not first:  # none could be prepared for this model (a context shorter than they are)
        return Lane(reason=UNCHECKED)
    try:
        reference = outcomes(Lane(solo=True), first)
        failed = next((o.error for o in reference if o.error), None)
        if failed:
            raise ModelLoadError(f"the library's own generation step fails with this model here: {failed}")
        tolerance = _noise(lm, config, reference, outcomes, probes)
        if cache_kinds.recurrent(lm.model) and not lm.serves.media:
            # Padding entering a recurrent state changes it whatever a few probes show (a tiny
            # nemotron_h passed them padded and failed on other prompts): never padded.
            why = "keeps a recurrent state, which left padding would enter"
        else:
            why = batched(Lane())
        if why is None:
            return Lane(reason="batched, it gives the single stream's tokens")
        if not lm.serves.media:  # the vision batch prefills each prompt on its own already
            if batched(Lane(prefill_alone=True)) is None:
                return Lane(prefill_alone=True, reason=f"batched, it {why}; prefilled alone, it gives "
                                                       f"the single stream's tokens")
        return Lane(solo=True, reason=f"batched, it {why}")
    finally:
        # Whatever the runs left on the model unevaluated would be bound to this thread's stream.
        materialize(lm.vision.vlm if lm.vision is not None else lm.model)


def _noise(lm, config, reference: List, outcomes: Callable, probes: Callable[[], List]) -> lane_tolerance.Tolerance:
    """The single stream's own noise (lane_tolerance.py): the probes after the first (which may be
    long: past a sliding window) run again in the solo lane, each prompt prefilled in pieces of a
    third of the shortest."""
    again = probes()[1:]
    step = max(3, min(len(r.prompt) for r in again) // 3)
    rerun = outcomes(Lane(solo=True), again, dataclasses.replace(config, prefill_step_size=step))
    tolerance = lane_tolerance.measured(rounding.eps(lm.model), reference[1:], rerun)
    log.info("lane check: the single stream's own noise is %s (prefilled in pieces of %d tokens); "
             "%d steps compared", tolerance, step, lane_tolerance.steps_compared(reference, tolerance))
    return tolerance


def differs(reference: List[lane_probe.Outcome], got: List[lane_probe.Outcome],
            tolerance: lane_tolerance.Tolerance = lane_tolerance.Tolerance(FLOAT32_EPS)) -> Optional[str]:
    """How `got` differs from the reference run of the same requests (None: it does not): another
    token, or a log-probability further from the reference's than `tolerance` allows."""
    for name, ref, out in zip(_NAMES, reference, got):
        if out.error:
            return f"fails request {name} ({out.error})"
        for i, (token, logprob, margin) in enumerate(zip(ref.tokens, ref.logprobs, ref.margins)):
            if tolerance.tie(logprob, margin):  # a near tie: past it either token is the library's
                break
            if i >= len(out.tokens) or out.tokens[i] != token:
                return f"gives other tokens than the single stream (request {name}, token {i + 1})"
            moved, allowed = abs(out.logprobs[i] - logprob), tolerance.allowed(logprob, margin)
            if moved > allowed:
                return (f"gives other log-probabilities than the single stream (request {name}, token {i + 1}: "
                        f"{moved:.3g} apart, its noise allows {allowed:.3g})")
        else:
            if out.tokens[len(ref.tokens):] or out.finish != ref.finish:
                return f"ends request {name} otherwise than the single stream"
    return None


def trial(lm, lane: Lane, config, requests: List, stream, beat: Callable[[], None], fallback: bool,
          hooks=None) -> Lane:
    """One request through `lane` (decide's) on the engine thread, as requests will run; the lane
    that serves `lm`. A batch that fails it gives way to the solo lane (with `fallback`: the lane
    was not fixed by an option), tried with the next request and kept as the verdict;
    ModelLoadError when no lane serves it."""
    if not requests:
        return lane
    got = lane_probe.run(lm, lane, config, requests[:1], stream, beat, hooks=hooks)[0]
    if got.error is None:
        return lane
    if lane.solo or not fallback or len(requests) < 2:
        raise ModelLoadError(f"a request fails in the {lane.name} lane: {got.error}")
    log.warning("lane: a request fails in the batch (%s); trying the solo lane", got.error)
    batch_error = got.error
    solo = Lane(solo=True, reason=f"a request fails in the batch: {batch_error}")
    got = lane_probe.run(lm, solo, config, requests[1:2], stream, beat, hooks=hooks)[0]
    if got.error is not None:
        raise ModelLoadError(f"requests fail in the batch ({batch_error}) and in the solo lane ({got.error})")
    lane_verdicts.write(lm, config, solo)
    log.info("lane: solo (%s)", solo.reason)
    return solo

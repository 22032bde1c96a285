"""What mlx-lm does to the device before it generates, done the same way (on Metal only).

Read from mlx-lm 0.32.2 (the installed source):
- mlx_lm.server's main calls utils.maybe_set_recommended_wired_limit() once, for the life of
  the process: when the device reports a recommended working set (Metal does), the wired
  limit is raised to it, so the weights stay resident instead of being paged out between
  steps; a device that reports none (the CPU) is left alone. Its BatchGenerator sets the same
  limit while a batch is open and puts the old one back when it closes, which a swap would
  undo: set once here, it holds across models, as the library's server holds it.
- generate's wired_limit() warns when the weights take more than 90% of that working set
  (generation then pages and is slow): said here at each load, in our log.
- The server generates on the default stream of the default device from its one generation
  thread, as our engine thread does (core.py); generate.py's own new stream serves its
  module-level functions called from any thread, which we never do.
- Neither calls mx.set_cache_limit: the cache is bounded by mx.clear_cache() every 512
  decode steps inside BatchGenerator, which our text batch runs. So no cache limit here.
Engine thread only (MLX calls); `plan` and `model_warning` are pure.
"""

import logging
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("mlx-backend.engine")

TOO_LARGE = 0.9  # generate.wired_limit's share of the working set past which it warns


@dataclass(frozen=True)
class DeviceSetup:
    """The calls to make on this device; None: that call is skipped."""
    wired_limit: Optional[int] = None  # bytes: mx.set_wired_limit


def plan(info: dict) -> DeviceSetup:
    """From mx.device_info(): the recommended working set when the device reports one (Metal)."""
    recommended = info.get("max_recommended_working_set_size")
    return DeviceSetup(wired_limit=int(recommended) if recommended else None)


def model_warning(model_bytes: int, setup: DeviceSetup) -> Optional[str]:
    """What to tell the operator when the weights nearly fill the wired working set, or None."""
    if setup.wired_limit is None or model_bytes <= TOO_LARGE * setup.wired_limit:
        return None
    return (f"the model takes {model_bytes >> 20} MB, close to the device's recommended working set of "
            f"{setup.wired_limit >> 20} MB: generation may page and be slow")


def apply(mx) -> DeviceSetup:
    """At the engine thread's start: what `plan` says for this device, done."""
    try:
        info = mx.device_info()
    except Exception:  # an MLX without device information: nothing to set
        info = {}
    setup = plan(info)
    if setup.wired_limit is not None:
        mx.set_wired_limit(setup.wired_limit)
        log.info("wired memory limit: %d MB (the device's recommended working set)", setup.wired_limit >> 20)
    return setup


def check_model(model, setup: DeviceSetup) -> None:
    """At a swap: the warning of model_warning, when there is one (nothing to add up on the CPU)."""
    if setup.wired_limit is None or model is None:
        return
    from mlx.utils import tree_flatten

    weights = getattr(model, "model", None)
    if weights is None:
        return
    warning = model_warning(sum(v.nbytes for _, v in tree_flatten(weights.parameters())), setup)
    if warning:
        log.warning("%s", warning)

"""The ring group: who this rank is, how it starts, and whether a model can be split over it."""

import dataclasses
import hashlib
import hmac
import json
import logging
import os
from typing import Any, Dict, List, Optional, Sequence

log = logging.getLogger("mlx-backend.lockstep")

HEARTBEAT_S = 1.0  # each side says it is alive at least this often
ENV_TIMEOUT = "MLX_BACKEND_RANK_TIMEOUT"  # seconds of silence after which a rank counts as gone
DEFAULT_TIMEOUT_S = 30.0
ENV_CONNECT = "MLX_BACKEND_GROUP_CONNECT_TIMEOUT"  # seconds the followers have to reach rank 0 at start
CONNECT_S = 120.0
HELLO_S = 10.0  # a connection to the control port has this long to finish its handshake
MAX_HANDSHAKES = 16  # connections in handshake at once; more are closed at once
ENV_SECRET = "MLX_BACKEND_GROUP_SECRET"  # the same on every rank; authenticates the control channel
ENV_TOKEN = "LOCALAI_GRPC_AUTH_TOKEN"  # the secret is derived from it when ENV_SECRET is unset
ENV_CONTROL_PORT = "MLX_BACKEND_CONTROL_PORT"  # rank 0's control port (0: any free port)
# A follower runs code from a model folder only if its own environment says so.
ENV_RANK_REMOTE_CODE = "MLX_BACKEND_RANK_TRUST_REMOTE_CODE"
EXIT_GROUP_LOST = 3  # the exit status of a rank whose group broke


class GroupLost(BaseException):
    """A rank is gone: nothing this process runs can go on (it escapes every per-request handler)."""


@dataclasses.dataclass
class Group:
    rank: int
    size: int
    mx_group: Any
    hosts: List[List[str]]
    timeout: float = DEFAULT_TIMEOUT_S
    secret: bytes = b""


def group_secret(env=None) -> bytes:
    """The control channel's key: from MLX_BACKEND_GROUP_SECRET, else derived from the gRPC token.

    A group without either does not start: any process that could reach rank
    0's control port could otherwise claim a rank and read every prompt.
    """
    env = os.environ if env is None else env
    secret = env.get(ENV_SECRET, "")
    if secret:
        return hashlib.sha256(b"mlx-lockstep-secret|" + secret.encode()).digest()
    token = env.get(ENV_TOKEN, "")
    if token:
        # Derived, not the token itself: the channel's key never equals a credential the host sends.
        return hmac.new(token.encode(), b"mlx-lockstep-secret", hashlib.sha256).digest()
    raise SystemExit(f"a distributed group needs a shared secret: set {ENV_SECRET} (or {ENV_TOKEN}) to the "
                     f"same value on every rank (`make serve-distributed` generates one)")


def control_port(env=None) -> int:
    env = os.environ if env is None else env
    raw = env.get(ENV_CONTROL_PORT, "") or "0"
    if not raw.isdigit() or int(raw) > 65535:
        raise SystemExit(f"{ENV_CONTROL_PORT}={raw!r} is not a port number (0-65535)")
    return int(raw)


def connect_seconds(env=None) -> float:
    """How long the followers have to reach rank 0's control channel at start (and rank 0 waits)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_CONNECT, "") or str(CONNECT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 1.0 <= seconds <= 86400.0:
        raise SystemExit(f"{ENV_CONNECT}={raw!r} is not a number of seconds in [1, 86400]")
    return seconds


def rank_allows_remote_code(env=None) -> bool:
    env = os.environ if env is None else env
    return env.get(ENV_RANK_REMOTE_CODE, "").strip().lower() in ("1", "true", "yes", "on")


def wanted() -> bool:
    """Is this process one rank of a ring group (mlx.launch, or the hostfile set by hand)?"""
    path = os.environ.get("MLX_HOSTFILE", "")
    if not path or "MLX_RANK" not in os.environ:
        return False
    try:
        return len(_hosts(path)) > 1
    except (OSError, ValueError):
        return True  # a broken hostfile: let the ring backend say why


def _hosts(path: str) -> List[List[str]]:
    with open(path) as f:
        text = f.read().strip()
    return json.loads(text) if text else []


def join() -> Group:
    """Join the ring group (blocks until every rank is there); main thread, at start."""
    import mlx.core as mx

    from engine.lockstep.wire import max_frame_bytes

    # Checked before joining, so a rank without them says why at once.
    secret = group_secret()
    control_port()
    connect_seconds()
    max_frame_bytes()
    g = mx.distributed.init(backend="ring", strict=True)
    timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
    group = Group(rank=g.rank(), size=g.size(), mx_group=g, hosts=_hosts(os.environ["MLX_HOSTFILE"]),
                  timeout=timeout, secret=secret)
    log.info("rank %d of %d joined the ring group", group.rank, group.size)
    return group


def exchange_port(group: Group, port: int) -> int:
    """Rank 0's control port, told to every rank through the group itself."""
    import mlx.core as mx

    total = mx.distributed.all_sum(mx.array([port if group.rank == 0 else 0], dtype=mx.int32),
                                   group=group.mx_group, stream=mx.cpu)
    return int(total.item())


def tensor_obstacle(model, config: Dict[str, Any], n: int) -> Optional[str]:
    """Why mlx-lm's tensor parallelism (`model.shard`) cannot split this model over n ranks, or None."""
    if not hasattr(model, "shard"):
        return "mlx-lm has no tensor parallelism for this architecture (its Model has no shard())"
    text = config.get("text_config", config)
    heads = text.get("num_attention_heads")
    sizes = {"attention heads": heads, "KV heads": text.get("num_key_value_heads", heads),
             "MLP width": text.get("intermediate_size")}
    bad = [f"{v} {name}" for name, v in sizes.items() if isinstance(v, int) and v % n]
    return f"{', '.join(bad)} do not divide by {n}" if bad else None


def pipeline_obstacle(model, n: int, split: Optional[Sequence[int]]) -> Optional[str]:
    """Why mlx-lm's pipeline parallelism (`model.model.pipeline`) cannot spread this model's
    layers over n ranks (with `split`: layers per rank, rank 0 first), or None."""
    inner = getattr(model, "model", None)
    if not hasattr(inner, "pipeline"):
        return "mlx-lm has no pipeline parallelism for this architecture (its model has no pipeline())"
    layers = len(inner.layers)
    if split is None:
        return None if layers >= n else f"its {layers} layers cannot give each of {n} ranks one"
    if not _takes_split(inner.pipeline):
        return "mlx-lm's pipeline for this architecture takes no pipeline_split (it spreads the layers evenly)"
    if len(split) != n or sum(split) != layers:
        return (f"pipeline_split {','.join(map(str, split))} must give each of the {n} ranks a positive "
                f"number of layers, {layers} in all")
    return None


def _takes_split(pipeline) -> bool:
    import inspect

    return "split" in inspect.signature(pipeline).parameters


def one_machine(group: "Group") -> bool:
    """Whether every rank of the group is on one host (the hostfile names one address)."""
    return len({h[0].rsplit(":", 1)[0] for h in group.hosts if h}) <= 1


def choose_mode(model, config: Dict[str, Any], group: "Group", wanted: str = "auto",
                split: Optional[Sequence[int]] = None) -> str:
    """"tensor" or "pipeline" for this model over the group, by the load option `parallel`
    (`wanted`); ModelLoadError naming what does not divide. `auto`: tensor parallelism where it
    divides the model and the ranks share one machine (two all-sums per layer per step, cheap
    there), else pipeline parallelism (one send per rank per step: what a slower link between
    machines pays for), else whichever divides."""
    from loaders.model_loader import ModelLoadError

    kind, n = config.get("model_type", "this model"), group.size
    obstacles = {"tensor": tensor_obstacle(model, config, n), "pipeline": pipeline_obstacle(model, n, split)}
    if split is not None and wanted == "tensor":
        raise ModelLoadError("pipeline_split is for parallel:pipeline (or auto), not parallel:tensor")
    if wanted != "auto":
        if obstacles[wanted]:
            raise ModelLoadError(f"{kind} cannot be divided over {n} ranks by {wanted} parallelism: "
                                 f"{obstacles[wanted]}")
        return wanted
    order = ("pipeline",) if split is not None else (
        ("tensor", "pipeline") if one_machine(group) else ("pipeline", "tensor"))
    for mode in order:
        if not obstacles[mode]:
            return mode
    raise ModelLoadError(f"{kind} cannot be divided over {n} ranks: "
                         + "; ".join(f"{mode} parallelism: {obstacles[mode]}" for mode in order))


class Sharder:
    """model_loader's hook: this rank's part of the model, by tensor or pipeline parallelism
    (the load option `parallel`, decided by `check` the same way on every rank: it reads only the
    model's config, the options and the hostfile every rank shares)."""

    def __init__(self, group: Group, options=None):
        import load_options

        settings = load_options.settings(options or {})
        self.group = group
        self.wanted, self.split = settings.parallel, settings.pipeline_split
        self.mode = ""

    def check(self, model, config) -> None:
        """Choose the mode; refuse, with the reason, a model that cannot be divided."""
        self.mode = choose_mode(model, config, self.group, self.wanted, self.split)

    def __call__(self, model, config) -> None:
        from loaders.model_loader import ModelLoadError

        kind = config.get("model_type")
        whole = _cache_facts(model)
        try:
            if self.mode == "pipeline" and self.split:
                model.model.pipeline(self.group.mx_group, list(self.split))
            elif self.mode == "pipeline":  # as mlx-lm's sharded_load calls it (kimi_k3's takes no split)
                model.model.pipeline(self.group.mx_group)
            else:
                model.shard(self.group.mx_group)
        except (ValueError, AssertionError) as e:  # the library's own reason
            raise ModelLoadError(f"{kind}: mlx-lm's {self.mode} split fails over {self.group.size} ranks: {e}") from None
        mine = _cache_facts(model)
        if mine != whole:
            # Each rank decides from its own layers' caches whether a prompt cache can be cut back,
            # where a prefill keeps snapshots, which lane runs: a stage whose layers are of other
            # kinds than the model's would decide otherwise than the others, and the ranks would
            # make different calls (and wait on each other for ever).
            inner = model.model
            raise ModelLoadError(
                f"{kind}: in a pipeline over {self.group.size} ranks, rank {self.group.rank}'s layers "
                f"{inner.start_idx}-{inner.end_idx - 1} keep {_said(mine)} where the model keeps {_said(whole)}: "
                f"every rank must hold layers of each kind (give a pipeline_split whose every part does, or "
                f"parallel:tensor)")


def _cache_facts(model) -> tuple:
    """What a rank decides its caches by: their classes, the smallest sliding window, and
    whether a prefill keeps snapshots (engine/prefix/snapshots.py)."""
    from engine.prefix import snapshots
    from loaders import cache_kinds

    return tuple(sorted(cache_kinds.of(model))), cache_kinds.window(model), snapshots.wanted(model)


def _said(facts: tuple) -> str:
    names, window, _ = facts
    return ", ".join(names) + (f" (window {window})" if window else "")

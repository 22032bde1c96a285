"""The ring group: who this rank is, how it starts, and whether a model can be split over it."""

import dataclasses
import hashlib
import hmac
import json
import logging
import os
from typing import Any, Dict, List

log = logging.getLogger("mlx-backend.lockstep")

HEARTBEAT_S = 1.0  # each side says it is alive at least this often
ENV_TIMEOUT = "MLX_BACKEND_RANK_TIMEOUT"  # seconds of silence after which a rank counts as gone
DEFAULT_TIMEOUT_S = 30.0
CONNECT_S = 120.0  # followers have this long to reach rank 0 at start
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


def check_shardable(model, config: Dict[str, Any], n: int) -> None:
    """Refuse, with the reason, a model that cannot be split over n ranks."""
    from loaders.model_loader import ModelLoadError

    kind = config.get("model_type", "this model")
    if not hasattr(model, "shard"):
        raise ModelLoadError(f"{kind}: mlx-lm cannot split this architecture over ranks (no tensor parallelism)")
    text = config.get("text_config", config)
    heads = text.get("num_attention_heads")
    sizes = {"attention heads": heads, "KV heads": text.get("num_key_value_heads", heads),
             "MLP width": text.get("intermediate_size")}
    bad = [f"{v} {name}" for name, v in sizes.items() if isinstance(v, int) and v % n]
    if bad:
        raise ModelLoadError(f"{kind} cannot be split over {n} ranks: {', '.join(bad)} do not divide by {n}")


class Sharder:
    """model_loader's hook: this rank's slice of every split layer (tensor parallel)."""

    def __init__(self, group: Group):
        self.group = group

    def check(self, model, config) -> None:
        check_shardable(model, config, self.group.size)

    def __call__(self, model, config) -> None:
        model.shard(self.group.mx_group)

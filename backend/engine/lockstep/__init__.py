"""One model served by several processes (ranks) in lockstep, tensor- or pipeline-parallel.

Started under `mlx.launch --backend ring` (or with the ring backend's
hostfile environment set by hand), every rank runs backend.py. Rank 0 serves
gRPC with the ordinary Engine, whose batch (the text batch, or the solo lane's
generation step) is wrapped so that every call that changes it is written to a
journal; the other ranks (followers) open no port and replay that journal on
their own batch of the same kind, call for call. The model is split across
ranks with mlx-lm's `shard()` or `pipeline()`, so each forward pass holds
collectives (all_sum; send, recv and all_gather) that only line up because
every rank runs the same admit / step sequence. Samplers carry per-request keys (engine/lanes/sampling.py) and the
logits after the all_sum are the same on every rank, so every rank draws the
same tokens without exchanging them.

The journal travels over a control channel of its own: one TCP connection
from each follower to rank 0, length-prefixed JSON frames (no pickling), each
authenticated with an HMAC under the group's secret and bounded in size.
Beside the commands it carries model loads and their results, heartbeats and
each follower's memory figures; and because it is a connection per rank, a
dead or silent rank is known by its number. A collective waits forever on a
rank that stopped, so liveness is never left to the collectives: the channel's
watchdog fails what runs and ends the process in bounded time.
"""

from engine.lockstep.follower import follow
from engine.lockstep.group import Group, GroupLost, join, wanted
from engine.lockstep.leader import LockstepEngine

__all__ = ["Group", "GroupLost", "LockstepEngine", "follow", "join", "wanted"]

"""One model served by several processes (ranks) in lockstep, tensor-parallel.

Started under `mlx.launch --backend ring` (or with the ring backend's
hostfile environment set by hand), every rank runs backend.py. Rank 0 serves
gRPC with the ordinary Engine, whose text batch is wrapped so that every call
that changes it is written to a journal; the other ranks (followers) open no
port and replay that journal on their own TextBatch, call for call. The model
is split across ranks with mlx-lm's `shard()`, so each forward pass holds
collectives (all_sum) that only line up because every rank runs the same
admit / step sequence. Samplers carry per-request keys (sampling.py) and the
logits after the all_sum are the same on every rank, so every rank draws the
same tokens without exchanging them.

The journal travels over a control channel of its own: one TCP connection
from each follower to rank 0, length-prefixed JSON frames (no pickling).
Beside the commands it carries model loads and their results, heartbeats and
each follower's memory figures; and because it is a connection per rank, a
dead or silent rank is known by its number. A collective waits forever on a
rank that stopped, so liveness is never left to the collectives: the channel's
watchdog fails what runs and ends the process in bounded time.
"""

import concurrent.futures
import dataclasses
import gc
import itertools
import json
import logging
import os
import queue
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional

from engine import Engine, EngineError

log = logging.getLogger("mlx-backend.lockstep")

HEARTBEAT_S = 1.0  # each side says it is alive at least this often
ENV_TIMEOUT = "MLX_BACKEND_RANK_TIMEOUT"  # seconds of silence after which a rank counts as gone
DEFAULT_TIMEOUT_S = 30.0
CONNECT_S = 120.0  # followers have this long to reach rank 0 at start
LOAD_TIMEOUT_S = 3600.0
EXIT_GRACE_S = 1.0  # after the group is lost, errors reach the clients, then the process exits
FORCE_EXIT_S = 4.0  # the longest rank 0 waits for its engine thread before it exits anyway
EXIT_GROUP_LOST = 3


class GroupLost(BaseException):
    """A rank is gone: nothing this process runs can go on (it escapes every per-request handler)."""


# ---- the group -----------------------------------------------------------------


@dataclasses.dataclass
class Group:
    rank: int
    size: int
    mx_group: Any
    hosts: List[List[str]]
    timeout: float = DEFAULT_TIMEOUT_S


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

    g = mx.distributed.init(backend="ring", strict=True)
    timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
    group = Group(rank=g.rank(), size=g.size(), mx_group=g, hosts=_hosts(os.environ["MLX_HOSTFILE"]),
                  timeout=timeout)
    log.info("rank %d of %d joined the ring group", group.rank, group.size)
    return group


def _exchange_port(group: Group, port: int) -> int:
    """Rank 0's control port, told to every rank through the group itself."""
    import mlx.core as mx

    total = mx.distributed.all_sum(mx.array([port if group.rank == 0 else 0], dtype=mx.int32),
                                   group=group.mx_group, stream=mx.cpu)
    return int(total.item())


def check_shardable(model, config: Dict[str, Any], n: int) -> None:
    """Refuse, with the reason, a model that cannot be split over n ranks."""
    from model_loader import ModelLoadError

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


class _Sharder:
    """model_loader's hook: this rank's slice of every split layer (tensor parallel)."""

    def __init__(self, group: Group):
        self.group = group

    def check(self, model, config) -> None:
        check_shardable(model, config, self.group.size)

    def __call__(self, model, config) -> None:
        model.shard(self.group.mx_group)


# ---- frames ----------------------------------------------------------------------


def _send(sock: socket.socket, lock: threading.Lock, msg: dict) -> None:
    data = json.dumps(msg, separators=(",", ":")).encode()
    with lock:
        sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> dict:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, n))


def _memory() -> Dict[str, int]:
    import mlx.core as mx

    return {"active": mx.get_active_memory(), "peak": mx.get_peak_memory(), "cache": mx.get_cache_memory()}


# ---- the wire form of a request's admission ------------------------------------------


def admit_wire(prompt, max_tokens, sampling, extra, ignore_eos, direct) -> dict:
    specs = []
    for p in extra:
        spec = getattr(p, "remote", None)
        if spec is None:  # refused before anything runs: this request alone fails
            raise RuntimeError("a logits processor of this request cannot be rebuilt on the other ranks")
        specs.append(list(spec))
    return {"k": "admit", "prompt": list(prompt), "max": max_tokens, "sampling": dataclasses.asdict(sampling),
            "extra": specs, "eos": ignore_eos, "direct": direct}


def sampling_from_wire(d: dict):
    from sampling import SamplingParams

    d = dict(d, logit_bias={int(k): v for k, v in d["logit_bias"].items()})
    return SamplingParams(**d)


def processors_from_wire(lm, specs) -> list:
    out = []
    for kind, *args in specs:
        if kind == "grammar":
            import grammar

            source, field, fault_at = args
            out.append(grammar.compile_processor(lm, source, field, fault_at=fault_at))
        elif kind == "fault_at":
            from prepare import _injected_fault

            out.append(_injected_fault(args[0]))
        else:
            raise ValueError(f"unknown logits processor {kind!r}")
    return out


# ---- rank 0 ------------------------------------------------------------------------


class Leader:
    """Rank 0's end of the control channel: one connection per follower."""

    def __init__(self, group: Group):
        self.group = group
        self.lost = ""  # "rank N: why", once a rank is gone
        self.on_lost = None  # called once, from a channel thread
        self.memory: Dict[int, Dict[str, int]] = {}
        self._socks: Dict[int, socket.socket] = {}
        self._seen: Dict[int, float] = {}
        self._lock = threading.Lock()
        self._lost_lock = threading.Lock()
        self._last_send = 0.0
        self._loads: Dict[int, Dict[int, concurrent.futures.Future]] = {}
        self._load_ids = itertools.count(1)
        self._stopping = False
        host = group.hosts[0][0].rsplit(":", 1)[0]
        server = socket.create_server((host, 0))
        _exchange_port(group, server.getsockname()[1])
        server.settimeout(CONNECT_S)
        try:
            while len(self._socks) < group.size - 1:
                sock, _ = server.accept()
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                rank = _recv(sock)["rank"]
                self._socks[rank] = sock
                self._seen[rank] = time.monotonic()
        except socket.timeout:
            missing = sorted(set(range(1, group.size)) - set(self._socks))
            raise SystemExit(f"ranks {missing} did not reach rank 0 within {CONNECT_S:g}s")
        finally:
            server.close()
        log.info("control channel up with ranks %s", sorted(self._socks))
        for rank, sock in self._socks.items():
            threading.Thread(target=self._receive, args=(rank, sock), name=f"rank{rank}-rx", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def send(self, msg: dict) -> None:
        """To every follower, in order; a rank that cannot take it is lost."""
        for rank, sock in self._socks.items():
            try:
                _send(sock, self._lock, msg)
            except OSError as e:
                self.lose(rank, f"the connection failed ({e})")
        self._last_send = time.monotonic()

    def lose(self, rank: int, why: str) -> None:
        with self._lost_lock:
            if self.lost or self._stopping:
                return
            self.lost = f"rank {rank}: {why}"
        log.critical("lost %s", self.lost)
        for futures in list(self._loads.values()):
            for f in list(futures.values()):
                if not f.done():
                    f.set_exception(EngineError("UNAVAILABLE", f"mlx: lost {self.lost}"))
        if self.on_lost is not None:
            self.on_lost(self.lost)

    def _receive(self, rank: int, sock: socket.socket) -> None:
        while True:
            try:
                msg = _recv(sock)
            except (OSError, ValueError) as e:
                self.lose(rank, f"it closed the control connection ({e})")
                return
            self._seen[rank] = time.monotonic()
            if "memory" in msg:
                self.memory[rank] = msg["memory"]
            if msg.get("k") == "loaded":
                f = self._loads.get(msg["id"], {}).get(rank)
                if f is not None and not f.done():
                    f.set_result(msg)

    def _beat(self) -> None:
        while not self.lost:
            time.sleep(HEARTBEAT_S / 2)
            now = time.monotonic()
            if now - self._last_send >= HEARTBEAT_S:
                self.send({"k": "hb"})
            for rank, seen in list(self._seen.items()):
                if now - seen > self.group.timeout:
                    self.lose(rank, f"it sent nothing for {now - seen:.0f}s")

    def stop(self) -> None:
        """Every follower ends (the backend is shutting down)."""
        self._stopping = True
        self.send({"k": "stop"})

    # ---- loading: every rank loads its shard, rank 0 waits for all ----------------

    def load(self, spec):
        import model_loader

        load_id = next(self._load_ids)
        futures = {r: concurrent.futures.Future() for r in self._socks}
        self._loads[load_id] = futures
        try:
            self.send({"k": "load", "id": load_id, "spec": dataclasses.asdict(spec)})
            own: Optional[BaseException] = None
            lm = None
            try:
                lm = model_loader.load(spec, shard=_Sharder(self.group))
            except Exception as e:
                own = e
            failures = []
            for rank, f in sorted(futures.items()):
                try:
                    reply = f.result(timeout=LOAD_TIMEOUT_S)
                except concurrent.futures.TimeoutError:
                    reply = {"ok": False, "message": f"no answer within {LOAD_TIMEOUT_S:g}s"}
                if not reply.get("ok"):
                    failures.append(f"rank {rank}: {reply.get('message')}")
            if own is not None or failures:
                self.send({"k": "discard", "id": load_id})
                if own is not None:
                    raise own
                raise model_loader.ModelLoadError("; ".join(failures))
            lm.derived["load_id"] = load_id
            log.info("every rank holds its shard of %s (%d ranks)", lm.source, self.group.size)
            return lm
        finally:
            self._loads.pop(load_id, None)


class RecordingBatch:
    """The engine's TextBatch on rank 0, journaling every call that changes it.

    Calls that run the model (admit, step) send the journal, themselves last,
    before they run here, so the followers run the same call at the same time.
    The KV caches the engine later saves are named by where they came from
    (a step, an admission, a removal), since each rank holds its own.
    """

    def __init__(self, inner, leader: Leader, settings: dict):
        self.inner = inner
        self.leader = leader
        self.journal: List[dict] = [{"k": "new", **settings}]
        self._names: Dict[int, tuple] = {}  # id(cache) -> (name, cache), until the next model call

    def _run(self, op: dict, fn):
        self.journal.append(op)
        self.flush()
        self._names.clear()
        try:
            return fn()
        except Exception as e:
            if self.leader.lost or "[ring]" in str(e):
                raise GroupLost(self.leader.lost or str(e)) from e
            raise

    def flush(self) -> None:
        if self.journal:
            ops, self.journal = self.journal, []
            self.leader.send({"k": "ops", "ops": ops})

    def _name(self, cache, name) -> None:
        if cache is not None:
            self._names[id(cache)] = (name, cache)

    def admit(self, prompt, max_tokens, sampling, extra, ignore_eos, on_error, direct=False):
        op = admit_wire(prompt, max_tokens, sampling, extra, ignore_eos, direct)
        uid, cached, first = self._run(op, lambda: self.inner.admit(
            prompt, max_tokens, sampling, extra, ignore_eos, on_error, direct=direct))
        if first is not None:
            self._name(first.prompt_cache, ["a"])
        return uid, cached, first

    def step(self):
        responses = self._run({"k": "step"}, self.inner.step)
        for r in responses:
            self._name(r.prompt_cache, ["s", r.uid])
        return responses

    def remove(self, uids, keep_cache=False):
        self.journal.append({"k": "remove", "uids": list(uids), "keep": keep_cache})
        kept = self.inner.remove(uids, keep_cache=keep_cache)
        for uid, (cache, _) in kept.items():
            self._name(cache, ["r", uid])
        return kept

    def save(self, tokens, cache):
        named = self._names.get(id(cache))
        if named is None or named[1] is not cache:
            # A cache the followers cannot name: kept nowhere, so every rank's prefix cache stays the same.
            if cache is not None and tokens:
                log.warning("a prompt cache entry of unknown origin was not kept")
            return
        if tokens:
            self.journal.append({"k": "save", "from": named[0]})
        self.inner.save(tokens, cache)

    def close(self):
        self.journal.append({"k": "close"})
        self.flush()
        self.inner.close()

    @property
    def cache_bytes(self) -> int:
        return self.inner.cache_bytes


class _GroupFault:
    """Engine command: the group is lost (put by the channel's watchdog)."""


class LockstepEngine(Engine):
    """The Engine of rank 0: the same decisions, its text batch journaled to the followers."""

    def __init__(self, group: Group, config=None):
        self.group = group
        self.leader = Leader(group)
        self.leader.on_lost = self._group_lost
        self._closed_by_loss = threading.Event()
        super().__init__(config)

    def load_model(self, spec):
        """LoadModel: every rank loads its shard (loader thread)."""
        if self.leader.lost:
            raise EngineError("UNAVAILABLE", f"mlx: lost {self.leader.lost}")
        return self.leader.load(spec)

    def _batch(self):
        if self._text is None:
            inner = super()._batch()
            c = self.config
            self._text = RecordingBatch(inner, self.leader, {
                "max_sequences": c.max_sequences, "prefill_batch_size": c.prefill_batch_size,
                "prefill_step_size": inner.prefill_step_size, "prompt_cache_bytes": c.prompt_cache_bytes,
                "prompt_cache_entries": c.prompt_cache_entries})
        return self._text

    def _handle(self, command) -> None:
        if isinstance(command, _GroupFault):
            raise GroupLost(self.leader.lost)
        from engine import Stop

        if isinstance(command, Stop):
            super()._handle(command)
            self.leader.stop()
            return
        super()._handle(command)

    def _swap(self, model, config) -> None:
        super()._swap(model, config)
        load_id = model.derived.get("load_id") if model is not None else None
        self.leader.send({"k": "ops", "ops": [{"k": "swap", "id": load_id}]})

    def _flush(self) -> None:
        super()._flush()
        if isinstance(self._text, RecordingBatch):
            self._text.flush()  # removals and saves reach the followers while idle too

    def _update_memory(self) -> None:
        super()._update_memory()
        self.memory["group_size"] = self.group.size
        self.memory["rank0_active"] = self.memory.get("active", 0)
        for rank, mem in sorted(self.leader.memory.items()):
            for key in ("active", "peak"):
                self.memory[f"rank{rank}_{key}"] = int(mem.get(key, 0))

    def _close(self, cause: str) -> None:
        if self.leader.lost or "GroupLost" in cause:
            deadline = time.monotonic() + 1.0  # the ring may say so before the channel names the rank
            while not self.leader.lost and time.monotonic() < deadline:
                time.sleep(0.05)
            cause = f"the distributed group lost {self.leader.lost or 'a rank'}"
            self._closed_by_loss.set()
        super()._close(cause)
        if self._closed_by_loss.is_set():
            _exit_soon(EXIT_GROUP_LOST, EXIT_GRACE_S)

    def _group_lost(self, why: str) -> None:
        """Channel thread: end the engine; if it is stuck in a collective, end everything anyway."""
        self._inbox.put(_GroupFault())

        def force():
            if self._closed_by_loss.wait(FORCE_EXIT_S):
                return
            log.critical("the engine thread is stuck (in a collective with %s); exiting", why)
            try:
                with self._lock:
                    self.dead = f"the distributed group lost {why}"
                # Best effort from this thread: the engine thread is blocked and will not run again.
                for slot in list(self._slots.values()) + list(self._waiting):
                    self._end(slot, _lost_event(why))
                self._flush()
            finally:
                _exit_soon(EXIT_GROUP_LOST, EXIT_GRACE_S)

        threading.Thread(target=force, name="group-lost", daemon=True).start()


def _lost_event(why: str):
    from engine import Event

    return Event(error=EngineError("UNAVAILABLE", f"mlx: the distributed group lost {why}"))


def _exit_soon(code: int, delay: float) -> None:
    def run():
        time.sleep(delay)
        logging.shutdown()
        os._exit(code)

    threading.Thread(target=run, name="exit", daemon=True).start()


# ---- the other ranks ------------------------------------------------------------------


class Follower:
    """A rank > 0: loads what rank 0 loads and replays its text batch's journal."""

    def __init__(self, group: Group):
        import mlx.core as mx

        self.group = group
        self.mx = mx
        self._lock = threading.Lock()
        self._ops: "queue.SimpleQueue" = queue.SimpleQueue()
        self._pending: Dict[int, Any] = {}  # load id -> LoadedModel, ready to swap in
        self._pending_lock = threading.Lock()
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="load")
        self._seen = time.monotonic()
        self._stopping = False
        self.memory: Dict[str, int] = {}
        self.lm = None
        self.text = None
        self._named: Dict[tuple, tuple] = {}
        port = _exchange_port(group, 0)
        host = group.hosts[0][0].rsplit(":", 1)[0]
        self.sock = socket.create_connection((host, port), timeout=CONNECT_S)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send(self.sock, self._lock, {"rank": group.rank})
        threading.Thread(target=self._receive, name="rank0-rx", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _fatal(self, why: str) -> None:
        if self._stopping:
            return
        log.critical("rank %d: %s; exiting", self.group.rank, why)
        logging.shutdown()
        os._exit(EXIT_GROUP_LOST)

    def _receive(self) -> None:
        while True:
            try:
                msg = _recv(self.sock)
            except (OSError, ValueError) as e:
                self._fatal(f"rank 0 closed the control connection ({e})")
                return
            self._seen = time.monotonic()
            kind = msg.get("k")
            if kind in ("ops", "stop"):
                self._ops.put(msg)
            elif kind == "load":
                self._loader.submit(self._load, msg["id"], msg["spec"])
            elif kind == "discard":
                with self._pending_lock:
                    self._pending.pop(msg["id"], None)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                _send(self.sock, self._lock, {"k": "hb", "memory": self.memory})
            except OSError as e:
                self._fatal(f"the control connection failed ({e})")
            silent = time.monotonic() - self._seen
            if silent > self.group.timeout:
                self._fatal(f"rank 0 sent nothing for {silent:.0f}s")

    def _load(self, load_id: int, spec: dict) -> None:
        import model_loader

        try:
            lm = model_loader.load(model_loader.LoadSpec(**spec), shard=_Sharder(self.group))
            with self._pending_lock:
                self._pending[load_id] = lm
            reply = {"k": "loaded", "id": load_id, "ok": True}
        except Exception as e:
            log.error("rank %d: loading failed: %s", self.group.rank, e)
            reply = {"k": "loaded", "id": load_id, "ok": False, "message": f"{type(e).__name__}: {e}"}
        self.memory = _memory()
        try:
            _send(self.sock, self._lock, reply)
        except OSError as e:
            self._fatal(f"the control connection failed ({e})")

    def run(self) -> None:
        """The follower's engine loop: the only thread here that runs the model."""
        self.stream = self.mx.default_stream(self.mx.default_device())
        while True:
            msg = self._ops.get()
            if msg["k"] == "stop":
                self._stopping = True
                log.info("rank %d: stopped by rank 0", self.group.rank)
                return
            for op in msg["ops"]:
                try:
                    self._apply(op)
                except GroupLost as e:
                    self._fatal(f"the group broke: {e}")
                except Exception as e:
                    if "[ring]" in str(e):
                        self._fatal(f"the group broke: {e}")
                    # Rank 0 met the same failure on the same call and decides what follows.
                    log.warning("rank %d: %s failed: %s: %s", self.group.rank, op["k"], type(e).__name__, e)
            self.memory = _memory()

    def _apply(self, op: dict) -> None:
        kind = op["k"]
        if kind == "new":
            from text_batch import TextBatch

            settings = {k: v for k, v in op.items() if k != "k"}
            self.text = TextBatch(self.lm, stream=self.stream, **settings)
        elif kind == "admit":
            self._named.clear()
            _, _, first = self.text.admit(
                op["prompt"], op["max"], sampling_from_wire(op["sampling"]),
                processors_from_wire(self.lm, op["extra"]), op["eos"], on_error=_ignore, direct=op["direct"])
            if first is not None and first.prompt_cache is not None:
                self._named[("a",)] = (first.prompt_cache, first.all_tokens)
        elif kind == "step":
            self._named.clear()
            for r in self.text.step():
                if r.prompt_cache is not None:
                    self._named[("s", r.uid)] = (r.prompt_cache, r.all_tokens)
        elif kind == "remove":
            for uid, (cache, tokens) in self.text.remove(op["uids"], keep_cache=op["keep"]).items():
                self._named[("r", uid)] = (cache, tokens)
        elif kind == "save":
            cache, tokens = self._named.get(tuple(op["from"]), (None, None))
            self.text.save(tokens, cache)
        elif kind == "close":
            if self.text is not None:
                self.text.close()
            self.text = None
            self._named.clear()
        elif kind == "swap":
            if self.text is not None:
                self.text.close()
            self.text, self.lm = None, None
            self._named.clear()
            gc.collect()
            self.mx.clear_cache()
            if op["id"] is not None:
                with self._pending_lock:
                    self.lm = self._pending.pop(op["id"])
                    self._pending.clear()  # an older load that was never swapped in
        else:
            raise ValueError(f"unknown journal entry {kind!r}")


def _ignore(e: Exception) -> None:
    log.debug("a request's sampler failed here as on rank 0: %s", e)


def follow(group: Group) -> None:
    """Run this process as a follower until rank 0 stops it; never returns."""
    follower = Follower(group)
    log.info("rank %d of %d following rank 0 (pid %d)", group.rank, group.size, os.getpid())
    try:
        follower.run()
        code = 0
    except BaseException:
        log.exception("rank %d: the follower loop failed", group.rank)
        code = 1
    logging.shutdown()
    os._exit(code)

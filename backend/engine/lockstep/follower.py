"""The other ranks: load what rank 0 loads, replay its batch's journal call for call."""

import concurrent.futures
import gc
import logging
import os
import queue
import socket
import threading
import time
from typing import Any, Dict

from engine.lockstep.group import (ENV_RANK_REMOTE_CODE, EXIT_GROUP_LOST, HEARTBEAT_S, HELLO_S, Group,
                                   GroupLost, Sharder, connect_seconds, exchange_port, rank_allows_remote_code)
from engine.lockstep.wire import Channel, memory_figures, open_hello, processors_from_wire, sampling_from_wire

ENV_CONNECT_DELAY = "MLX_BACKEND_FAULT_RANK_CONNECT_DELAY"  # tests: strangers reach rank 0 before this rank

log = logging.getLogger("mlx-backend.lockstep")


class Follower:
    """A rank > 0: loads what rank 0 loads and replays its text batch's journal."""

    def __init__(self, group: Group):
        import mlx.core as mx

        self.group = group
        self.mx = mx
        self._ops: "queue.SimpleQueue" = queue.SimpleQueue()
        self._pending: Dict[int, Any] = {}  # load id -> LoadedModel, ready to swap in
        self._pending_lock = threading.Lock()
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="load")
        self._seen = time.monotonic()
        self._heard = False  # any frame from rank 0 yet
        self._stopping = False
        self.memory: Dict[str, int] = {}
        self.served = _Slot()  # the batch of the model served
        self.probing = _Slot()  # the batch of a lane check's run (of a model loaded, not yet swapped in)
        port = exchange_port(group, 0)
        host = group.hosts[0][0].rsplit(":", 1)[0]
        if os.environ.get("MLX_BACKEND_FAULT_INJECTION") == "1" and os.environ.get(ENV_CONNECT_DELAY):
            time.sleep(float(os.environ[ENV_CONNECT_DELAY]))
        self.channel = _reach_rank0(host, port, group)
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
                msg = self.channel.recv()
            except (OSError, ValueError) as e:
                # Rank 0 drops a rank whose frames fail its check before it sends a single frame.
                hint = "" if self._heard else "; nothing came first: is MLX_BACKEND_GROUP_SECRET the same on every rank?"
                self._fatal(f"rank 0 closed the control connection ({e}){hint}")
                return
            self._heard = True
            self._seen = time.monotonic()
            kind = msg.get("k")
            if kind == "stop":
                # From here rank 0 closing the connection is the expected end, not a lost group:
                # the loop may still be busy with earlier ops when the close arrives.
                self._stopping = True
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
                self.channel.send({"k": "hb", "memory": self.memory})
            except OSError as e:
                self._fatal(f"the control connection failed ({e})")
            silent = time.monotonic() - self._seen
            if silent > self.group.timeout:
                self._fatal(f"rank 0 sent nothing for {silent:.0f}s")

    def _load(self, load_id: int, spec: dict) -> None:
        from loaders import model_loader

        try:
            if spec.get("trust_remote_code") and not rank_allows_remote_code():
                raise model_loader.ModelLoadError(
                    f"rank {self.group.rank} does not run code from model folders (trust_remote_code); "
                    f"set {ENV_RANK_REMOTE_CODE}=1 in that rank's environment to allow it")
            lm = model_loader.load(model_loader.LoadSpec(**spec), shard=Sharder(self.group, spec.get("options")))
            with self._pending_lock:
                self._pending[load_id] = lm
            reply = {"k": "loaded", "id": load_id, "ok": True}
        except Exception as e:
            log.error("rank %d: loading failed: %s", self.group.rank, e)
            reply = {"k": "loaded", "id": load_id, "ok": False, "message": f"{type(e).__name__}: {e}"[:4000]}
        self.memory = memory_figures()
        try:
            self.channel.send(reply)
        except (OSError, ValueError) as e:
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
            self.memory = memory_figures()

    def _apply(self, op: dict) -> None:
        kind = op["k"]
        if kind == "swap":
            self._swap(op["id"])
            return
        slot = self.probing if "p" in op else self.served  # a lane check's batch, or the served one
        if kind == "new":
            from engine.lanes.solo import SoloBatch
            from engine.lanes.text_batch import TextBatch

            if "p" in op:  # the model rank 0 checks: loaded on every rank, not yet swapped in
                with self._pending_lock:
                    slot.lm = self._pending[op["p"]]
            settings = {k: v for k, v in op.items() if k not in ("k", "p", "lane")}
            lane = SoloBatch if op["lane"] == "solo" else TextBatch
            slot.text = lane(slot.lm, stream=self.stream, **settings)
        elif kind == "admit":
            slot.named.clear()
            _, _, first = slot.text.admit(
                op["prompt"], op["max"], sampling_from_wire(op["sampling"]),
                processors_from_wire(slot.lm, op["extra"]), op["eos"], on_error=_ignore, direct=op["direct"],
                boundaries=op.get("b", ()))
            if first is not None and first.prompt_cache is not None:
                slot.named[("a",)] = (first.prompt_cache, first.all_tokens)
        elif kind == "step":
            slot.named.clear()
            for r in slot.text.step():
                if getattr(r, "prompt_cache", None) is not None:  # a Failed response has none
                    slot.named[("s", r.uid)] = (r.prompt_cache, r.all_tokens)
        elif kind == "remove":
            for uid, (cache, tokens) in slot.text.remove(op["uids"], keep_cache=op["keep"]).items():
                slot.named[("r", uid)] = (cache, tokens)
        elif kind == "save":
            cache, tokens = slot.named.get(tuple(op["from"]), (None, None))
            slot.text.save(tokens, cache)
        elif kind == "drop":  # what rank 0's prefix-cache bounds evicted
            for tokens in op["keys"]:
                slot.text.cache.drop(slot.lm.epoch, tokens)
        elif kind == "close":
            slot.close()
            if "p" in op:
                slot.lm = None  # still pending: the swap takes it
        else:
            raise ValueError(f"unknown journal entry {kind!r}")

    def _swap(self, load_id) -> None:
        self.served.close()
        self.probing.close()
        self.served.lm = self.probing.lm = None
        gc.collect()
        self.mx.clear_cache()
        if load_id is not None:
            with self._pending_lock:
                self.served.lm = self._pending.pop(load_id)
                self._pending.clear()  # an older load that was never swapped in


class _Slot:
    """A model, the batch (TextBatch or SoloBatch) replaying rank 0's for it, and the caches its last calls gave."""

    def __init__(self):
        self.lm = None
        self.text = None
        self.named: Dict[tuple, tuple] = {}

    def close(self) -> None:
        if self.text is not None:
            self.text.close()
        self.text = None
        self.named.clear()


def _reach_rank0(host: str, port: int, group: Group) -> Channel:
    """The control channel to rank 0, tried again while strangers fill its handshake slots."""
    deadline = time.monotonic() + connect_seconds()
    while True:
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic()))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return open_hello(sock, group.secret, group.rank, HELLO_S)
        except OSError as e:  # not FrameError: a peer that is not rank 0 of this group is not retried
            if sock is not None:
                sock.close()
            if time.monotonic() + 1.0 > deadline:
                raise
            log.warning("rank %d: reaching rank 0 failed (%s); trying again", group.rank, e)
            time.sleep(1.0)


def _ignore(e: Exception) -> None:
    log.debug("a request's sampler failed here as on rank 0: %s", e)


def follow(group: Group) -> None:
    """Run this process as a follower until rank 0 stops it; never returns."""
    try:
        follower = Follower(group)
    except (OSError, ValueError) as e:  # rank 0 unreachable, or not speaking this group's protocol and secret
        log.critical("rank %d: cannot join rank 0's control channel: %s", group.rank, e)
        logging.shutdown()
        os._exit(EXIT_GROUP_LOST)
    log.info("rank %d of %d following rank 0 (pid %d)", group.rank, group.size, os.getpid())
    try:
        follower.run()
        code = 0
    except BaseException:
        log.exception("rank %d: the follower loop failed", group.rank)
        code = 1
    logging.shutdown()
    os._exit(code)

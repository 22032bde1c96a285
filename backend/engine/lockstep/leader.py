"""Rank 0: the control channel to the followers, the plain Engine with lockstep's hooks (its batch\njournaled: recording.py), and the watchdog that ends the process when the group is lost."""

import concurrent.futures
import dataclasses
import itertools
import logging
import os
import queue
import socket
import threading
import time
from typing import Dict, Optional

from engine.core import Engine
from engine.hooks import Hooks
from engine.requests import EngineError
from engine.lockstep.group import (EXIT_GROUP_LOST, HEARTBEAT_S, HELLO_S, MAX_HANDSHAKES, Group, GroupLost,
                                   Sharder, connect_seconds, control_port, exchange_port)
from engine.lockstep.recording import RecordingBatch
from engine.lockstep.wire import Channel, FrameError, accept_hello

log = logging.getLogger("mlx-backend.lockstep")

LOAD_TIMEOUT_S = 3600.0
EXIT_GRACE_S = 1.0  # after the group is lost, errors reach the clients, then the process exits
FORCE_EXIT_S = 4.0  # the longest rank 0 waits for its engine thread before it exits anyway


class Leader:
    """Rank 0's end of the control channel: one connection per follower."""

    def __init__(self, group: Group):
        self.group = group
        self.lost = ""  # "rank N: why", once a rank is gone
        self.on_lost = None  # called once, from a channel thread
        self.memory: Dict[int, Dict[str, int]] = {}
        self._channels: Dict[int, Channel] = {}
        self._lost_lock = threading.Lock()
        self._last_send = 0.0
        self._loads: Dict[int, Dict[int, concurrent.futures.Future]] = {}
        self._load_ids = itertools.count(1)
        self._stopping = False
        host = group.hosts[0][0].rsplit(":", 1)[0]
        server = socket.create_server((host, control_port()))
        exchange_port(group, server.getsockname()[1])
        log.info("control channel waiting for ranks %s on %s:%d", list(range(1, group.size)), host,
                 server.getsockname()[1])
        try:
            self._channels = _accept_ranks(server, group)
        finally:
            server.close()
        self._seen: Dict[int, float] = {rank: time.monotonic() for rank in self._channels}
        self._closed = {rank: threading.Event() for rank in self._channels}
        log.info("control channel up with ranks %s", sorted(self._channels))
        for rank, channel in self._channels.items():
            threading.Thread(target=self._receive, args=(rank, channel), name=f"rank{rank}-rx", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def send(self, msg: dict) -> None:
        """To every follower, in order; a rank that cannot take it is lost."""
        for rank, channel in self._channels.items():
            try:
                channel.send(msg)
            except (OSError, FrameError) as e:  # a frame that cannot go out leaves the ranks apart
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

    def _receive(self, rank: int, channel: Channel) -> None:
        while True:
            try:
                msg = channel.recv()
            except (OSError, ValueError) as e:
                self._closed[rank].set()
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

    def stop(self, wait_s: float = 3.0) -> None:
        """Every follower ends (the backend is shutting down). Waits (up to `wait_s`) for each
        to close its end: closing ours first, with a frame of theirs still unread, would reset
        the connection and could throw away the stop frame before they read it."""
        self._stopping = True
        self.send({"k": "stop"})
        for channel in self._channels.values():
            try:
                channel.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        for closed in self._closed.values():
            closed.wait(max(0.0, deadline - time.monotonic()))

    # ---- loading: every rank loads its shard, rank 0 waits for all ----------------

    def load(self, spec):
        """Every rank loads its shard; rank 0's model, with the load's id (the followers swap to
        their shard of that load when the engine swaps this one in)."""
        from loaders import model_loader

        load_id = next(self._load_ids)
        futures = {r: concurrent.futures.Future() for r in self._channels}
        self._loads[load_id] = futures
        try:
            self.send({"k": "load", "id": load_id, "spec": dataclasses.asdict(spec)})
            own: Optional[BaseException] = None
            lm = None
            try:
                lm = model_loader.load(spec, shard=Sharder(self.group, spec.options))
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
            log.info("every rank holds its shard of %s (%d ranks)", lm.source, self.group.size)
            return dataclasses.replace(lm, load_id=load_id)
        finally:
            self._loads.pop(load_id, None)


def _accept_ranks(server: socket.socket, group: Group) -> Dict[int, Channel]:
    """A channel per follower. Peers that fail the handshake are dropped; the wait goes on for the real ones."""
    joined: "queue.SimpleQueue" = queue.SimpleQueue()
    slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
    formed = threading.Event()

    def handshake(sock: socket.socket, peer) -> None:
        try:
            rank, channel = accept_hello(sock, group.secret, group.size, HELLO_S)
            channel.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            joined.put((rank, channel, peer))
            if formed.is_set():  # too late: nobody reads the queue any more
                _close_joined(joined)
        except (OSError, ValueError) as e:  # socket.timeout is an OSError; FrameError a ValueError
            log.warning("control channel: dropped a connection from %s: %s", peer, e or type(e).__name__)
            sock.close()
        finally:
            slots.release()

    channels: Dict[int, Channel] = {}
    deadline = time.monotonic() + connect_seconds()
    server.settimeout(0.2)  # also how often the joined queue is read
    while len(channels) < group.size - 1:
        while not joined.empty():
            rank, channel, peer = joined.get()
            if rank in channels:  # it holds the secret: a second process started as the same rank
                log.warning("control channel: rank %d connected again from %s; dropped", rank, peer)
                channel.close()
            else:
                channels[rank] = channel
        if len(channels) == group.size - 1:
            break
        if time.monotonic() > deadline:
            for channel in channels.values():
                channel.close()
            missing = sorted(set(range(1, group.size)) - set(channels))
            raise SystemExit(f"ranks {missing} did not reach rank 0 within {connect_seconds():g}s")
        try:
            sock, peer = server.accept()
        except socket.timeout:
            continue
        if not slots.acquire(blocking=False):
            log.warning("control channel: %d handshakes under way; dropped a connection from %s",
                        MAX_HANDSHAKES, peer)
            sock.close()
            continue
        threading.Thread(target=handshake, args=(sock, peer), name="hello", daemon=True).start()
    formed.set()
    _close_joined(joined)
    return channels


def _close_joined(joined: "queue.SimpleQueue") -> None:
    while True:
        try:
            rank, channel, peer = joined.get_nowait()
        except queue.Empty:
            return
        log.warning("control channel: rank %d connected again from %s; dropped", rank, peer)
        channel.close()


UNBOUNDED = 1 << 62


def _settings(batch, config) -> dict:
    """What a follower builds its batch with: the lane's kind (the text batch, or the solo
    lane's generation step) and the very settings of rank 0's (a lane may run fewer rows or
    prefill alone: batch_factory.py), so every rank makes the same calls."""
    from engine.lanes.solo import SoloBatch

    # A follower's prefix cache has no bounds of its own: it evicts what rank 0's evicts (the
    # journal's "drop"), since in a pipeline each rank's share of an entry weighs other bytes and
    # bounds of its own would keep other entries, and a prompt would start from another prefix.
    cache = {"prompt_cache_bytes": UNBOUNDED, "prompt_cache_entries": UNBOUNDED}
    if isinstance(batch, SoloBatch):
        return {"lane": "solo", "prefill_step_size": batch.prefill_step_size, **cache}
    return {"lane": "batch", "max_sequences": batch.max_sequences, "prefill_batch_size": batch.prefill_batch_size,
            "prefill_step_size": batch.prefill_step_size, "backlog_step_size": batch.backlog_step_size, **cache}


class LockstepHooks(Hooks):
    """What rank 0's engine does differently: the same decisions, its batch journaled."""
    speculate = False  # a speculating stream runs outside the batch the followers replay
    disk_tier = False  # a hit here that the followers' replay misses would part the ranks

    def __init__(self, group: Group, leader: Leader):
        self.group = group
        self.leader = leader
        self.closed_by_loss = threading.Event()

    def wrap(self, batch, config):
        return RecordingBatch(batch, self.leader, _settings(batch, config))

    def probe(self, model):
        return ProbeHooks(self.leader, model.load_id)

    def forward_refusal(self):  # its passes would run collectives the followers never join
        return EngineError("FAILED_PRECONDITION", "Embedding, Score and Rerank are not served across ranks")

    def flushed(self, batch) -> None:
        if isinstance(batch, RecordingBatch):
            batch.flush()  # removals and saves reach the followers while idle too

    def memory(self, memory: dict) -> None:
        memory["group_size"] = self.group.size
        memory["rank0_active"] = memory.get("active", 0)
        for rank, mem in sorted(self.leader.memory.items()):
            for key in ("active", "peak"):
                memory[f"rank{rank}_{key}"] = int(mem.get(key, 0))

    def swapped(self, model) -> None:
        load_id = model.load_id if model is not None else None
        self.leader.send({"k": "ops", "ops": [{"k": "swap", "id": load_id}]})

    def stopped(self) -> None:
        self.leader.stop()

    def close_cause(self, cause: str) -> str:
        if self.leader.lost or "GroupLost" in cause:
            deadline = time.monotonic() + 1.0  # the ring may say so before the channel names the rank
            while not self.leader.lost and time.monotonic() < deadline:
                time.sleep(0.05)
            cause = f"the distributed group lost {self.leader.lost or 'a rank'}"
            self.closed_by_loss.set()
        return cause

    def closed(self) -> None:
        if self.closed_by_loss.is_set():
            _exit_soon(EXIT_GROUP_LOST, EXIT_GRACE_S)


class ProbeHooks(Hooks):
    """A lane check's runs of a model every rank holds but none serves yet (its load id): each
    run's batch journaled to the followers' probe slot, beside the served batch, so the check
    runs on every rank's shard at once (lane_choice.py, on rank 0's engine thread)."""
    speculate = False
    disk_tier = False

    def __init__(self, leader: Leader, load_id: int):
        self.leader = leader
        self.load_id = load_id

    def wrap(self, batch, config):
        return RecordingBatch(batch, self.leader, _settings(batch, config), probe=self.load_id)


class LockstepEngine(Engine):
    """The Engine of rank 0: the plain scheduler with lockstep's hooks, and loads on every rank."""

    def __init__(self, group: Group, config=None):
        self.group = group
        self.leader = Leader(group)
        self._hooks = LockstepHooks(group, self.leader)
        self.leader.on_lost = self._group_lost
        super().__init__(config, hooks=self._hooks)

    @property
    def distributed(self) -> bool:
        return True

    def load(self, spec):
        """LoadModel: every rank loads its shard (loader thread)."""
        if self.leader.lost:
            raise EngineError("UNAVAILABLE", f"mlx: lost {self.leader.lost}")
        return self.leader.load(spec)

    def _group_lost(self, why: str) -> None:
        """Channel thread: end the engine through its inbox; if it is stuck in a collective, end
        everything anyway."""
        self.lose(GroupLost(self.leader.lost))

        def force():
            if self._hooks.closed_by_loss.wait(FORCE_EXIT_S):
                return
            log.critical("the engine thread is stuck (in a collective with %s); exiting", why)
            try:
                self.abandon(f"the distributed group lost {why}")
            finally:
                _exit_soon(EXIT_GROUP_LOST, EXIT_GRACE_S)

        threading.Thread(target=force, name="group-lost", daemon=True).start()


def _exit_soon(code: int, delay: float) -> None:
    def run():
        time.sleep(delay)
        logging.shutdown()
        os._exit(code)

    threading.Thread(target=run, name="exit", daemon=True).start()

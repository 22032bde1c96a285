"""What travels on the control channel: authenticated, bounded JSON frames, and a request's admission."""

import dataclasses
import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time
from typing import Dict, Optional, Tuple


# A frame: 4-byte big-endian body length, 32-byte HMAC-SHA256 tag, JSON body.
# The tag covers the direction and the frame's number on this connection, so a
# frame cannot be replayed, reordered or reflected; the key is per connection
# (the group secret and both ends' nonces), so nothing from another connection
# verifies either. A peer whose frame is too long, fails its tag or is not a
# JSON object is cut off before anything of it is used.

MAGIC = b"MLXLS\x00\x00\x01"  # what rank 0 says first: the protocol and its version
NONCE_BYTES = 16
TAG_BYTES = 32
_LENGTH = struct.Struct(">I")
_ENV_MAX_FRAME = "MLX_BACKEND_GROUP_MAX_FRAME_BYTES"
DEFAULT_MAX_FRAME = 64 << 20  # rank 0 -> follower: journal frames (prompts as token ids)
FOLLOWER_MAX_FRAME = 1 << 20  # follower -> rank 0: heartbeats, load results
HELLO_MAX_FRAME = 4096  # the hello: {"rank": N}
_TO_FOLLOWER, _TO_LEADER = b"leader->follower", b"follower->leader"


class FrameError(ValueError):
    """A frame this end refuses: over the size bound, failing its tag, or not a JSON object."""


def max_frame_bytes() -> int:
    raw = os.environ.get(_ENV_MAX_FRAME, "")
    try:
        value = int(raw) if raw else DEFAULT_MAX_FRAME
    except ValueError:
        raise SystemExit(f"{_ENV_MAX_FRAME}={raw!r} is not an integer")
    if not 1 << 16 <= value <= 1 << 31:
        raise SystemExit(f"{_ENV_MAX_FRAME}={value} is outside [65536, 2147483648]")
    return value


def session_key(secret: bytes, leader_nonce: bytes, follower_nonce: bytes) -> bytes:
    return hmac.new(secret, b"mlx-lockstep-session|" + leader_nonce + follower_nonce, hashlib.sha256).digest()


class Channel:
    """One authenticated connection; send from any thread, receive from one."""

    def __init__(self, sock: socket.socket, key: bytes, leader: bool, max_in: int, max_out: int):
        self.sock = sock
        self._key = key
        self._out, self._in = (_TO_FOLLOWER, _TO_LEADER) if leader else (_TO_LEADER, _TO_FOLLOWER)
        self.max_in, self.max_out = max_in, max_out
        self._sent = 0
        self._received = 0
        self._lock = threading.Lock()

    def _tag(self, direction: bytes, number: int, body: bytes) -> bytes:
        return hmac.new(self._key, direction + number.to_bytes(8, "big") + body, hashlib.sha256).digest()

    def send(self, msg: dict) -> None:
        body = json.dumps(msg, separators=(",", ":")).encode()
        if len(body) > self.max_out:  # the other end would cut this connection off
            raise FrameError(f"a {msg.get('k', 'hello')!r} frame of {len(body)} bytes is over the "
                             f"{self.max_out}-byte bound ({_ENV_MAX_FRAME})")
        with self._lock:
            tag = self._tag(self._out, self._sent, body)
            self._sent += 1
            self.sock.sendall(_LENGTH.pack(len(body)) + tag + body)

    def recv(self, deadline: Optional[float] = None) -> dict:
        (n,) = _LENGTH.unpack(recv_exact(self.sock, _LENGTH.size, deadline))
        if n > self.max_in:
            raise FrameError(f"a frame of {n} bytes is over the {self.max_in}-byte bound")
        tag = recv_exact(self.sock, TAG_BYTES, deadline)
        body = recv_exact(self.sock, n, deadline)
        if not hmac.compare_digest(tag, self._tag(self._in, self._received, body)):
            raise FrameError("a frame failed authentication (another group secret, or not a rank of this group)")
        self._received += 1
        try:
            msg = json.loads(body)
        except ValueError as e:
            raise FrameError(f"an authenticated frame is not JSON: {e}") from None
        if not isinstance(msg, dict):
            raise FrameError("an authenticated frame is not a JSON object")
        return msg

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def recv_exact(sock: socket.socket, n: int, deadline: Optional[float] = None) -> bytes:
    """n bytes; with a deadline (time.monotonic()), all of them by then, however slowly they trickle in."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the handshake took too long")
            sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def accept_hello(sock: socket.socket, secret: bytes, size: int, timeout: float) -> Tuple[int, Channel]:
    """Rank 0's side of the handshake: (the peer's rank, its channel); FrameError/OSError drop it.

    All of it ends within `timeout`, so a silent or trickling peer costs that long at most.
    """
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    leader_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(MAGIC + leader_nonce)
    follower_nonce = recv_exact(sock, NONCE_BYTES, deadline)
    channel = Channel(sock, session_key(secret, leader_nonce, follower_nonce), True, HELLO_MAX_FRAME,
                      max_frame_bytes())
    hello = channel.recv(deadline)
    rank = hello.get("rank")
    if type(rank) is not int or not 1 <= rank < size:
        raise FrameError(f"the hello names rank {rank!r}, not one of 1..{size - 1}")
    sock.settimeout(None)
    channel.max_in = FOLLOWER_MAX_FRAME
    return rank, channel


def open_hello(sock: socket.socket, secret: bytes, rank: int, timeout: float) -> Channel:
    """A follower's side of the handshake, on a connected socket."""
    sock.settimeout(timeout)
    greeting = recv_exact(sock, len(MAGIC) + NONCE_BYTES, time.monotonic() + timeout)
    if greeting[:len(MAGIC)] != MAGIC:
        raise FrameError("the control port did not answer as rank 0 of this backend (protocol mismatch)")
    follower_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(follower_nonce)
    channel = Channel(sock, session_key(secret, greeting[len(MAGIC):], follower_nonce), False,
                      max_frame_bytes(), FOLLOWER_MAX_FRAME)
    channel.send({"rank": rank})
    sock.settimeout(None)
    return channel


def memory_figures() -> Dict[str, int]:
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
    op = {"k": "admit", "prompt": [], "max": max_tokens, "sampling": dataclasses.asdict(sampling),
          "extra": specs, "eos": ignore_eos, "direct": direct}
    # At most 11 bytes per id (10 digits and a comma); half the frame is left for the ops around it.
    size = 11 * len(prompt) + len(json.dumps(op))
    if size > max_frame_bytes() // 2:
        raise RuntimeError(f"this request's admission (~{size} bytes) is over half the control channel's "
                           f"{max_frame_bytes()}-byte frame bound ({_ENV_MAX_FRAME})")
    op["prompt"] = list(prompt)
    return op


def sampling_from_wire(d: dict):
    from engine.lanes.sampling import SamplingParams

    d = dict(d, logit_bias={int(k): v for k, v in d["logit_bias"].items()})
    return SamplingParams(**d)


def processors_from_wire(lm, specs) -> list:
    out = []
    for kind, *args in specs:
        if kind == "grammar":
            from engine import faults
            from engine.lanes import grammar

            source, field, fault_at = args
            out.append(faults.grammar(grammar.compile_processor(lm, source, field), fault_at))
        elif kind == "fault_at":
            from engine import faults

            out.append(faults.processor(args[0]))
        else:
            raise ValueError(f"unknown logits processor {kind!r}")
    return out

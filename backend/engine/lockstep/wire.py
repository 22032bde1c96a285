"""What travels on the control channel: length-prefixed JSON frames, and a request's admission."""

import dataclasses
import json
import socket
import struct
import threading
from typing import Dict


def send_frame(sock: socket.socket, lock: threading.Lock, msg: dict) -> None:
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


def recv_frame(sock: socket.socket) -> dict:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, n))


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
    return {"k": "admit", "prompt": list(prompt), "max": max_tokens, "sampling": dataclasses.asdict(sampling),
            "extra": specs, "eos": ignore_eos, "direct": direct}


def sampling_from_wire(d: dict):
    from engine.sampling import SamplingParams

    d = dict(d, logit_bias={int(k): v for k, v in d["logit_bias"].items()})
    return SamplingParams(**d)


def processors_from_wire(lm, specs) -> list:
    out = []
    for kind, *args in specs:
        if kind == "grammar":
            from engine import grammar

            source, field, fault_at = args
            out.append(grammar.compile_processor(lm, source, field, fault_at=fault_at))
        elif kind == "fault_at":
            from engine.sampling import injected_fault

            out.append(injected_fault(args[0]))
        else:
            raise ValueError(f"unknown logits processor {kind!r}")
    return out

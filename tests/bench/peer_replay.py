"""Replay a trace against one server and time every request as its user would feel it.

Each request is sent on its own thread at its arrival time; the record keeps when it was sent,
when its first piece of text came back, when it ended and how many tokens it generated.
Our server is spoken to over gRPC as LocalAI sends chat (Messages through the template,
streamed, a random seed, TopP 0.95); a peer over its OpenAI-compatible streamed chat API.
"""

import http.client
import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from peer_trace import TraceRequest

TIMEOUT_S = 1800.0  # liveness only: the slowest request of an all-at-once trace here takes minutes


@dataclass
class Record:
    index: int
    kind: str
    sent: float = 0.0  # time.perf_counter() seconds
    first: Optional[float] = None  # the first non-empty text
    end: Optional[float] = None
    tokens: int = 0
    tokens_from: str = ""  # "server" (its own count) or "tokenizer" (our count of the text)
    text: str = ""
    error: Optional[str] = None
    retries: int = 0  # connections the server refused or reset before answering, each sent again


Send = Callable[[TraceRequest, Record], None]


def replay(trace: Sequence[TraceRequest], send: Send) -> Tuple[List[Record], float, float]:
    """(records, trace start, trace end): every request on its own thread at its arrival time."""
    records = [Record(index=r.index, kind=r.kind) for r in trace]
    start = time.perf_counter()

    def run(req: TraceRequest, rec: Record) -> None:
        delay = start + req.arrival_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        rec.sent = time.perf_counter()
        try:
            send(req, rec)
        except Exception as e:  # a failed request is reported, never retried
            rec.error = f"{type(e).__name__}: {e}"
        rec.end = time.perf_counter()

    threads = [threading.Thread(target=run, args=(req, rec), daemon=True) for req, rec in zip(trace, records)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, start, time.perf_counter()


def _got_text(rec: Record, piece: str) -> None:
    if piece:
        if rec.first is None:
            rec.first = time.perf_counter()
        rec.text += piece


# ---- our server: gRPC, as LocalAI sends chat --------------------------------------------


def grpc_sender(stub, pb, model: str) -> Send:
    def send(req: TraceRequest, rec: Record) -> None:
        options = pb.PredictOptions(
            Messages=[pb.Message(role="user", content=req.prompt)], UseTokenizerTemplate=True,
            Tokens=req.max_tokens, Temperature=req.temperature, TopP=0.95, Seed=req.seed, ModelIdentity=model)
        last = None
        for last in stub.PredictStream(options, timeout=TIMEOUT_S):
            # The host forwards chat deltas' content when there are any, else the message bytes.
            piece = "".join(d.content for d in last.chat_deltas) or last.message.decode("utf-8", "replace")
            _got_text(rec, piece)
        if last is not None:
            rec.tokens, rec.tokens_from = last.tokens, "server"

    return send


# ---- a peer: OpenAI-compatible streamed chat completions --------------------------------


# A peer's HTTP server may refuse or reset a connection past its listen backlog when many
# arrive at once (mlx_lm.server does at 32). A user's client sends it again: the OpenAI Python
# client retries a connection error twice by default, after 0.5 s and 1 s (its defaults); the
# request's times still count from its first send.
RETRY_DELAYS_S = (0.5, 1.0)


def http_sender(port: int, model: str, count: Callable[[str], int]) -> Send:
    def send(req: TraceRequest, rec: Record) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": req.prompt}],
                "max_tokens": req.max_tokens, "temperature": req.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        if req.temperature > 0:
            body.update(top_p=0.95, seed=req.seed)
        for delay in RETRY_DELAYS_S + (None,):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            try:
                try:
                    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                except ConnectionError:  # refused or reset before any answer: sent again, as a client would
                    if delay is None:
                        raise
                    rec.retries += 1
                    time.sleep(delay)
                    continue
                _read_stream(resp, rec)
                break
            finally:
                conn.close()
        if not rec.tokens_from:  # the server sent no usage: count the text as the model's tokenizer does
            rec.tokens, rec.tokens_from = count(rec.text), "tokenizer"

    return send


def _read_stream(resp, rec: Record) -> None:
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}")
    for event in _sse_events(resp):
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            _got_text(rec, (delta.get("content") or "") + (delta.get("reasoning_content") or ""))
        usage = event.get("usage")
        if usage and usage.get("completion_tokens"):
            rec.tokens, rec.tokens_from = usage["completion_tokens"], "server"


def _sse_events(resp):
    """The JSON payloads of a server-sent event stream, until [DONE]."""
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)

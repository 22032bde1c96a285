"""The peer bench's pure parts: the seeded trace, the figures of a replay, the stream parser.

The servers themselves are only exercised by `make bench-peers`; what is checked here is that
the workload is what its knobs say and that the figures are computed as docs/benchmarks.md
defines them (TTFT, TPOT, E2E, throughput; percentiles as numpy computes them).
"""

import os
import socket
import struct
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import peer_report  # noqa: E402
import peer_trace  # noqa: E402
import peer_replay  # noqa: E402
from peer_replay import Record, _sse_events  # noqa: E402
from peer_trace import TraceSpec, all_at_once, generate  # noqa: E402


def words(text: str) -> int:
    return len(text.split())


def test_a_trace_is_its_seed():
    spec = TraceSpec(requests=20)
    assert generate(spec) == generate(spec)
    assert generate(spec) != generate(TraceSpec(requests=20, seed=1))


@pytest.mark.parametrize("share, kinds", [(0.0, {"chat"}), (1.0, {"document"}), (0.5, {"chat", "document"})])
def test_the_mix_follows_the_share(share, kinds):
    trace = generate(TraceSpec(requests=40, document_share=share))
    assert len(trace) == 40 and [r.index for r in trace] == list(range(40))
    assert {r.kind for r in trace} == kinds


def test_budgets_temperature_and_seeds_are_per_request():
    trace = generate(TraceSpec(requests=200, min_tokens=32, max_tokens=128, temperature=0.7))
    budgets = [r.max_tokens for r in trace]
    assert min(budgets) >= 32 and max(budgets) <= 128 and len(set(budgets)) > 30
    assert {r.temperature for r in trace} == {0.7}
    assert len({r.seed for r in trace}) == 200


def test_poisson_arrivals_at_the_rate():
    trace = generate(TraceSpec(requests=2001, rate=0.5))
    gaps = np.diff([r.arrival_s for r in trace])
    assert trace[0].arrival_s == 0.0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 2.0) < 0.15  # mean gap 1/rate
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential gaps: as spread as they are long


def test_rate_zero_and_all_at_once_send_everything_at_the_start():
    assert {r.arrival_s for r in generate(TraceSpec(requests=10, rate=0))} == {0.0}
    trace = generate(TraceSpec(requests=10, rate=2))
    once = all_at_once(trace)
    assert {r.arrival_s for r in once} == {0.0}
    assert [(r.prompt, r.max_tokens, r.seed) for r in once] == [(r.prompt, r.max_tokens, r.seed) for r in trace]


def test_documents_reach_their_length_by_the_counter_given():
    trace = generate(TraceSpec(requests=30, document_share=1.0, document_tokens=300), count=words)
    for r in trace:
        body = r.prompt.split("\n\n", 1)[1]
        assert words(body) >= 300
        assert words(body.rsplit(". ", 1)[0]) < 300  # one sentence fewer would be short


def test_chat_questions_do_not_repeat():
    prompts = [r.prompt for r in generate(TraceSpec(requests=60, document_share=0.0))]
    assert len(set(prompts)) == 60


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0],
                                    list(np.random.default_rng(0).random(33))])
def test_percentiles_as_numpy_computes_them(values):
    for q in (0, 50, 90, 99, 100):
        assert peer_report.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert peer_report.percentile([], 50) is None


def test_the_figures_of_a_replay():
    records = [Record(index=0, kind="chat", sent=10.0, first=11.0, end=15.0, tokens=5),  # TPOT 1 s
               Record(index=1, kind="document", sent=12.0, first=16.0, end=18.0, tokens=3),  # TPOT 1 s
               Record(index=2, kind="chat", sent=12.0, first=13.0, end=13.0, tokens=1),  # one token: no TPOT
               Record(index=3, kind="chat", sent=12.0, end=14.0, error="RpcError: boom"),
               Record(index=4, kind="chat", sent=12.0, end=14.0)]  # ended without text
    f = peer_report.summarise(records, start=10.0, end=20.0)
    assert (f["requests"], f["completed"], f["output_tokens"], f["wall_s"]) == (5, 3, 9, 10.0)
    assert f["throughput"] == pytest.approx(0.9)
    assert f["ttft_p50"] == pytest.approx(1.0) and f["ttft_p99"] == pytest.approx(np.percentile([1, 4, 1], 99))
    assert f["tpot_p50"] == pytest.approx(1000.0) and f["tpot_p99"] == pytest.approx(1000.0)
    assert f["e2e_p50"] == pytest.approx(5.0) and f["e2e_p99"] == pytest.approx(np.percentile([5, 6, 1], 99))
    assert f["errors"] == ["#3: RpcError: boom", "#4: no text"]


def test_the_table_bolds_each_columns_best():
    fast = peer_report.summarise([Record(0, "chat", 0.0, 0.5, 2.5, 11)], 0.0, 2.5)
    slow = peer_report.summarise([Record(0, "chat", 0.0, 1.0, 6.0, 11)], 0.0, 6.0)
    lines = peer_report.table([{"server": "a", "figures": fast}, {"server": "b", "figures": slow}]).splitlines()
    assert lines[0].startswith("| server | throughput tok/s | TTFT p50 |")
    assert lines[2] == ("| a | **4.40** | **0.5 s** | **0.5 s** | **200 ms** | **200 ms** | **2.5 s** | **2.5 s** "
                        "| 1/1 |")
    assert lines[3] == "| b | 1.83 | 1.0 s | 1.0 s | 500 ms | 500 ms | 6.0 s | 6.0 s | 1/1 |"
    empty = peer_report.summarise([Record(0, "chat", 0.0, None, 1.0, 0, error="x")], 0.0, 1.0)
    assert "| c | 0.00 | n/a |" in peer_report.table([{"server": "c", "figures": empty}])
    again = peer_report.summarise([Record(0, "chat", 0.0, 0.5, 2.5, 11, retries=2)], 0.0, 2.5)
    assert peer_report.table([{"server": "d", "figures": again}]).endswith("| 1/1 (2 sent again) |")


def test_server_sent_events_until_done():
    lines = [b": keep-alive\n", b"\n", b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n', b"\n",
             b'data:{"usage": {"completion_tokens": 1}}\n', b"data: [DONE]\n", b'data: {"after": 1}\n']
    assert list(_sse_events(iter(lines))) == [{"choices": [{"delta": {"content": "Hi"}}]},
                                              {"usage": {"completion_tokens": 1}}]


def _server_resetting_first(resets: int):
    """A one-thread HTTP server on a free port that resets its first `resets` connections
    (RST, as a full listen backlog does) and answers the next with a streamed chat reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            seen.append(conn)
            if len(seen) <= resets:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                         b'data: {"choices": [{"delta": {"content": "Hello"}}]}\n\n'
                         b'data: {"usage": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n')
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, seen


@pytest.mark.parametrize("resets", [0, 1, 2])
def test_a_peer_that_resets_a_connection_is_sent_it_again(monkeypatch, resets):
    monkeypatch.setattr(peer_replay, "RETRY_DELAYS_S", (0.01, 0.02))
    listener, seen = _server_resetting_first(resets)
    try:
        send = peer_replay.http_sender(listener.getsockname()[1], "m", words)
        rec = Record(index=0, kind="chat", sent=1.0)
        send(generate(TraceSpec(requests=1))[0], rec)
    finally:
        listener.close()
    assert (rec.text, rec.tokens, rec.tokens_from, rec.retries, len(seen)) == ("Hello", 2, "server", resets, resets + 1)
    assert rec.sent == 1.0  # its times still count from the first send


def test_a_peer_that_keeps_resetting_fails_the_request_after_the_clients_retries(monkeypatch):
    monkeypatch.setattr(peer_replay, "RETRY_DELAYS_S", (0.01, 0.02))
    listener, seen = _server_resetting_first(99)
    try:
        send = peer_replay.http_sender(listener.getsockname()[1], "m", words)
        rec = Record(index=0, kind="chat")
        with pytest.raises(ConnectionError):
            send(generate(TraceSpec(requests=1))[0], rec)
    finally:
        listener.close()
    assert (rec.retries, len(seen), rec.text) == (2, 3, "")

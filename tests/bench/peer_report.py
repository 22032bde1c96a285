"""The figures of one replay, and the markdown table that compares servers at one load.

TTFT: send -> first piece of text. TPOT: a request's time after its first text over the
tokens after the first. E2E: send -> end. Throughput: every output token of the trace over
the trace's wall time (first arrival to last end).
"""

from dataclasses import asdict
from typing import Dict, List, Optional, Sequence

from peer_replay import Record

# key, header, unit, better (the best of a column is bold)
COLUMNS = [("throughput", "throughput tok/s", "", max),
           ("ttft_p50", "TTFT p50", "s", min), ("ttft_p99", "TTFT p99", "s", min),
           ("tpot_p50", "TPOT p50", "ms", min), ("tpot_p99", "TPOT p99", "ms", min),
           ("e2e_p50", "E2E p50", "s", min), ("e2e_p99", "E2E p99", "s", min)]


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarise(records: Sequence[Record], start: float, end: float) -> Dict:
    done = [r for r in records if r.error is None and r.first is not None]
    ttft = [r.first - r.sent for r in done]
    e2e = [r.end - r.sent for r in done]
    tpot = [(r.end - r.first) / (r.tokens - 1) for r in done if r.tokens > 1]
    tokens = sum(r.tokens for r in done)
    wall = end - start
    out = {"requests": len(records), "completed": len(done), "output_tokens": tokens, "wall_s": wall,
           "throughput": tokens / wall if wall > 0 else None,
           "token_counts_from": sorted({r.tokens_from for r in done}),
           "sent_again": sum(r.retries for r in records),  # connections refused or reset, each sent again
           "errors": [f"#{r.index}: {r.error}" for r in records if r.error is not None]
           + [f"#{r.index}: no text" for r in records if r.error is None and r.first is None]}
    for name, values, scale in (("ttft", ttft, 1.0), ("tpot", tpot, 1000.0), ("e2e", e2e, 1.0)):
        for q in (50, 99):
            p = percentile(values, q)
            out[f"{name}_p{q}"] = None if p is None else p * scale
    return out


def timeline(records: Sequence[Record], start: float) -> List[Dict]:
    """Every request as JSON, its times in seconds since the trace's start."""
    def since(t: Optional[float]) -> Optional[float]:
        return None if t is None else round(t - start, 4)

    return [dict(asdict(r), sent=since(r.sent), first=since(r.first), end=since(r.end)) for r in records]


def _cell(value: Optional[float], unit: str, best: bool) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.0f} ms" if unit == "ms" else f"{value:.1f} s" if unit == "s" else f"{value:.2f}"
    return f"**{text}**" if best else text


def table(rows: List[Dict]) -> str:
    """rows: {"server": label, "figures": summarise(...)}, one per server; the best of each column bold."""
    lines = ["| server | " + " | ".join(h for _, h, _, _ in COLUMNS) + " | completed |",
             "|---|" + "---|" * (len(COLUMNS) + 1)]
    bests = {}
    for key, _, _, better in COLUMNS:
        values = [r["figures"][key] for r in rows if r["figures"].get(key) is not None]
        bests[key] = better(values) if len(values) > 1 else None
    for r in rows:
        f = r["figures"]
        cells = [_cell(f.get(key), unit, f.get(key) is not None and f.get(key) == bests[key])
                 for key, _, unit, _ in COLUMNS]
        again = f" ({f['sent_again']} sent again)" if f.get("sent_again") else ""
        lines.append(f"| {r['server']} | " + " | ".join(cells) + f" | {f['completed']}/{f['requests']}{again} |")
    return "\n".join(lines)

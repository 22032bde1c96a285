"""The output router: one request's text split into content, reasoning and tool calls.

Fed one delta at a time (after the stop matcher); the split never depends on
how the text is chunked. Pure Python, no MLX import.
"""

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Callable, List, Optional

try:  # imported as common.stop_matcher
    from .stop_matcher import longest_partial_suffix
except ImportError:  # imported flat, as LocalAI's backends do
    from stop_matcher import longest_partial_suffix
try:  # imported as common.tool_calls
    from .tool_calls import BareScan, bare_tool_calls, json_tool_parser, normalise_calls, tool_names
except ImportError:  # imported flat, as LocalAI's backends do
    from tool_calls import BareScan, bare_tool_calls, json_tool_parser, normalise_calls, tool_names

router_log = logging.getLogger("mlx-backend.router")

CONTENT, REASONING, TOOL, BARE = "content", "reasoning", "tool", "bare"


@dataclass
class ToolCall:
    """One tool-call delta; the host merges deltas by index."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    tool_calls: List[ToolCall] = field(default_factory=list)


class OutputRouter:
    """Splits the text deltas of one request into content, reasoning and tool calls.

    Fed with the output of the detokenizer and the StopMatcher, one delta at a
    time; the result does not depend on how the text is chunked. A tail that
    could start a marker is held back until it cannot; markers reach content
    only inside the raw text of a call that did not parse, and a stray marker
    (an end without a start) is dropped. As in mlx-lm, a tool-call start inside
    reasoning opens a call, and after a call the text is content again. With
    tools offered, blanks at the start of the content wait for the first
    other character, which may open a bare JSON call.
    """

    # Written here rather than reusing mlx_lm.generate.TextStateMachine: that module
    # imports MLX, and it keeps no raw text to return for an unparsable call, has no
    # bare-JSON calls and its flush can leave a call half done.

    def __init__(
        self,
        *,
        think_start: Optional[str] = None,
        think_end: Optional[str] = None,
        tool_start: Optional[str] = None,
        tool_end: Optional[str] = None,
        tool_parser: Optional[Callable] = None,
        tools=None,
        start_in_reasoning: bool = False,
    ):
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except ValueError:
                tools = None
        self._tools = tools
        self._names = tool_names(tools) if isinstance(tools, list) else set()
        self._tool_start = tool_start or ""
        self._parser = tool_parser or json_tool_parser

        def edges(*pairs):
            return [(m, nxt) for m, nxt in pairs if m]

        # A None target strips a stray marker and stays in the same state.
        self._edges = {
            CONTENT: edges((think_start, REASONING), (tool_start, TOOL), (think_end, None), (tool_end, None)),
            REASONING: edges((think_end, CONTENT), (tool_start, TOOL), (think_start, None), (tool_end, None)),
            TOOL: edges((tool_end, CONTENT)) if tool_start else [],
        }
        self._markers = {s: [m for m, _ in e] for s, e in self._edges.items()}
        self._state = REASONING if start_in_reasoning else CONTENT
        self._held = ""  # a tail that may still become a marker
        self._tool_parts: List[str] = []  # body of the open tool call
        self._bare_parts: List[str] = []  # leading blanks / undecided bare JSON
        self._scan: Optional[BareScan] = None
        self._at_start = True  # no content but blanks delivered yet
        self._count = 0
        self._ids: set = set()
        self._failed = self._finished = False

    @classmethod
    def for_tokenizer(cls, tokenizer, tools=None, prompt_text: str = "") -> "OutputRouter":
        """Markers and tool parser from an mlx-lm TokenizerWrapper (duck-typed)."""
        think_start = getattr(tokenizer, "think_start", None)
        think_end = getattr(tokenizer, "think_end", None)
        if not getattr(tokenizer, "has_thinking", bool(think_start)):
            think_start = think_end = None
        tool_start = getattr(tokenizer, "tool_call_start", None)
        tool_end = getattr(tokenizer, "tool_call_end", None)
        tool_parser = getattr(tokenizer, "tool_parser", None)
        if not getattr(tokenizer, "has_tool_calling", bool(tool_start)):
            tool_start = tool_end = tool_parser = None
        # Templates that open the thinking block themselves leave the model inside it.
        tail = (prompt_text or "").rstrip()
        opened = bool(think_start) and tail.endswith(think_start)
        if opened and think_end and tail.endswith(think_end):
            opened = False
        return cls(
            think_start=think_start,
            think_end=think_end,
            tool_start=tool_start,
            tool_end=tool_end,
            tool_parser=tool_parser,
            tools=tools,
            start_in_reasoning=opened,
        )

    @property
    def tool_call_count(self) -> int:
        return self._count

    def feed(self, text: str) -> List[Delta]:
        if self._finished or not text:
            return []
        if self._failed:
            return [Delta(content=text)]
        mark = self._mark()
        try:
            out: List[Delta] = []
            self._route(text, out)
            return out
        except Exception:
            return self._fail(mark, text)

    def finalize(self) -> List[Delta]:
        """Flush everything held back; the stream ended for whatever reason."""
        if self._finished:
            return []
        self._finished = True
        if self._failed:
            return []
        mark = self._mark()
        try:
            out: List[Delta] = []
            self._finish(out)
            return out
        except Exception:
            return self._fail(mark, "")

    # -- failure: plain content from here on --------------------------------

    def _mark(self):
        # Lists are only appended to or replaced, so a length marks their state.
        return (self._state, self._held, self._tool_parts, len(self._tool_parts),
                self._bare_parts, len(self._bare_parts), self._count)

    def _fail(self, mark, text: str) -> List[Delta]:
        state, held, tool_parts, n_tool, bare_parts, n_bare, self._count = mark
        self._failed = True
        router_log.exception("output router failed; the rest of this request is plain content")
        raw = "".join(bare_parts[:n_bare])
        if state == TOOL:
            raw += self._tool_start + "".join(tool_parts[:n_tool])
        raw += held + text
        return [Delta(content=raw)] if raw else []

    # -- routing ---------------------------------------------------------

    def _route(self, s: str, out: List[Delta], final: bool = False) -> None:
        while True:
            state = self._state
            if state == BARE:
                s = self._bare_step(s, out, final)
                if s is None:
                    return
                continue
            if state == CONTENT and self._at_start and self._names and not self._held:
                blanks = len(s) - len(s.lstrip())
                if blanks:
                    self._bare_parts.append(s[:blanks])
                    s = s[blanks:]
                if not s:
                    return
                if s[0] in "{[`":
                    self._state, self._scan = BARE, BareScan(s[0] == "`")
                    continue
                s, self._bare_parts = "".join(self._bare_parts) + s, []
            buf, self._held = self._held + s, ""
            if not buf:
                return
            hit = None
            for marker, nxt in self._edges[state]:
                i = buf.find(marker)
                if i >= 0 and (hit is None or i < hit[0] or (i == hit[0] and len(marker) > len(hit[1]))):
                    hit = (i, marker, nxt)
            keep = 0 if final and state != TOOL else longest_partial_suffix(buf, self._markers[state])
            hold = len(buf) - keep
            # A marker that started earlier, or a longer one at the same place, may still complete.
            if hit is None or hold <= hit[0]:
                self._emit(state, buf[:hold], out)
                self._held = buf[hold:]
                return
            at, marker, nxt = hit
            self._emit(state, buf[:at], out)
            s = buf[at + len(marker):]
            if state == TOOL:
                self._close_tool(marker, out)
            elif nxt == TOOL:
                self._state, self._tool_parts = TOOL, []
            elif nxt is not None:
                self._state = nxt

    def _emit(self, state: str, text: str, out: List[Delta]) -> None:
        if not text:
            return
        if state == TOOL:
            self._tool_parts.append(text)
        elif state == REASONING:
            self._push(out, "reasoning", text)
        else:
            self._push(out, "content", text)

    def _push(self, out: List[Delta], channel: str, text: str) -> None:
        if channel == "content" and self._at_start and not text.isspace():
            self._at_start = False
        # Every delta carries one channel, so consecutive text of a channel merges.
        if out and getattr(out[-1], channel):
            setattr(out[-1], channel, getattr(out[-1], channel) + text)
        else:
            out.append(Delta(**{channel: text}))

    def _push_calls(self, calls: List[dict], out: List[Delta]) -> None:
        deltas = []
        for call in calls:
            # The model's own id (Kimi, Mistral) is kept unless this request already used it.
            call_id = call["id"]
            if not call_id or call_id in self._ids:
                call_id = "call_" + uuid.uuid4().hex[:24]
            self._ids.add(call_id)
            deltas.append(ToolCall(self._count, call_id, call["name"], call["arguments"]))
            self._count += 1
        out.append(Delta(tool_calls=deltas))

    def _close_tool(self, end: str, out: List[Delta]) -> None:
        """Parse the finished call; `end` is the end marker, or what of it arrived."""
        body, self._tool_parts = "".join(self._tool_parts), []
        self._state = CONTENT
        try:
            calls = normalise_calls(self._parser(body, self._tools))
        except Exception as e:  # parsers raise ValueError, KeyError, AttributeError, ...
            router_log.warning("unparsable tool call sent as text (%s: %.200s)", type(e).__name__, e)
            self._push(out, "content", self._tool_start + body + end)
            return
        self._push_calls(calls, out)

    def _bare_step(self, s: str, out: List[Delta], final: bool) -> Optional[str]:
        """Advance the undecided bare JSON; returns the text left to route, or None."""
        scan = self._scan
        r = scan.feed(s)
        if r == 0 and not final:
            self._bare_parts.append(s)
            return None
        used = len(s) if r == 0 else abs(r)
        raw, rest = "".join(self._bare_parts) + s[:used], s[used:]
        self._bare_parts, self._scan, self._state = [], None, CONTENT
        calls = None
        if r >= 0 and scan.complete(final):
            base = len(raw) - scan.pos  # the blanks before the value were not scanned
            calls = bare_tool_calls(raw[base + scan.begin : base + scan.end], self._names)
        if calls:
            self._push_calls(calls, out)
            return rest
        # Not a call: the same text is content, routed as usual.
        self._at_start = False
        return raw + rest

    def _finish(self, out: List[Delta]) -> None:
        if self._state != TOOL:
            s, self._held = self._held, ""
            self._route(s, out, final=True)  # also decides an undecided bare JSON
        if self._state == TOOL:
            end, self._held = self._held, ""
            self._close_tool(end, out)
            return
        if self._bare_parts:
            blanks, self._bare_parts = "".join(self._bare_parts), []
            self._push(out, "content", blanks)

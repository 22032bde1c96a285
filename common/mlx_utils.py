"""Text-side helpers of the MLX backend: pure Python, no MLX import.

They run on the decoded text of one request, one delta at a time, and must
give the same result however the text is split into deltas.
"""

import bisect
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple


def longest_partial_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker.

    That suffix may still grow into a marker, so it must be held back.
    """
    best = 0
    for marker in markers:
        upto = min(len(marker) - 1, len(text))
        for n in range(upto, best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def truncate_at_stop(text: str, stops: Sequence[str]) -> Tuple[str, bool]:
    """The whole text cut at the earliest occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


@dataclass
class StopMatcher:
    """Streaming stop-string cutter.

    mlx-lm's StopSequences matches token ids, but a stop string can start or end
    inside a token, so this one works on the decoded text. `feed` returns the
    text that is safe to send; a tail that could start a stop string is held
    back until it cannot. Once a stop matched, nothing more is ever returned.
    """

    stops: List[str]
    _held: str = ""
    stopped: bool = False
    _stops: List[str] = field(init=False)

    def __post_init__(self):
        self._stops = [s for s in dict.fromkeys(self.stops) if s]

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        buf = self._held + text
        cut, found = truncate_at_stop(buf, self._stops)
        # A longer stop that began before the match may still complete and
        # would then be the earliest one: wait for it before deciding.
        pending = len(buf) - longest_partial_suffix(buf, self._stops)
        if found and pending >= len(cut):
            self._held, self.stopped = "", True
            return cut
        self._held = buf[pending:]
        return buf[:pending]

    def finalize(self) -> str:
        """The held-back tail, cut at a stop it holds, once the stream has ended."""
        if self.stopped:
            return ""
        out, self.stopped = truncate_at_stop(self._held, self._stops)
        self._held = ""
        return out


# --- Output routing: content / reasoning / tool-call channels ---------------

router_log = logging.getLogger("mlx-backend.router")

CONTENT, REASONING, TOOL, BARE = "content", "reasoning", "tool", "bare"
_JSON_WS = " \t\n\r"
_BARE_KEYS = {"name", "arguments", "parameters", "id", "type"}


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


def _json_tool_parser(text: str, tools: Any = None):
    return json.loads(text.strip())


def _tool_names(tools) -> set:
    names = set()
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _arguments_text(args) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _normalise_calls(parsed) -> List[dict]:
    """Parser output (a dict or a list of them) -> [{id, name, arguments}]; raises if unusable."""
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"not a tool call: {item!r:.200}")
        args = item.get("arguments", item.get("parameters"))
        if args is None:
            args = {}
        call_id = item.get("id") if isinstance(item.get("id"), str) else ""
        calls.append(dict(id=call_id, name=name, arguments=_arguments_text(args)))
    if not calls:
        raise ValueError("no tool call")
    return calls


def bare_tool_calls(text: str, names: set) -> Optional[List[dict]]:
    """A JSON call (or list of calls) to one of the offered tools, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    for item in items:
        if not isinstance(item, dict) or not set(item) <= _BARE_KEYS:
            return None
        if not isinstance(item.get("name"), str) or item["name"] not in names:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
    # A model-made id in bare JSON is often a placeholder reused across turns: not kept.
    return [
        dict(id="", name=i["name"], arguments=_arguments_text(i.get("arguments", i.get("parameters", {}))))
        for i in items
    ]


class _BareScan:
    """Follows, one character at a time, a JSON value at the start of the content
    (optionally inside a ``` fence) just far enough to know where it ends.

    Prose that merely starts with "{" or "[" is rejected at its second
    non-blank character, so ordinary text is not held back for long.
    """

    MORE, DONE, REJECT = 0, 1, 2

    def __init__(self, fenced: bool):
        self.fenced = fenced
        self.phase = "fence" if fenced else "json"
        self.ticks = 0
        self.stack: List[str] = []
        self.opened = 0
        self.in_str = self.escape = False
        self.expect = None  # the set the next non-blank character must belong to
        self.pos = 0  # characters consumed so far
        self.begin = self.end = -1  # the JSON value's span in the consumed text

    def feed(self, text: str) -> int:
        """0: undecided, all of `text` read; n > 0: the value ended after n characters;
        -n: rejected at the n-th character."""
        for i, c in enumerate(text):
            r = self._char(c)
            self.pos += 1
            if r == self.DONE:
                return i + 1
            if r == self.REJECT:
                return -(i + 1)
        return 0

    def complete(self, final: bool) -> bool:
        if self.end < 0:
            return False
        if not self.fenced or self.phase == "done":
            return True
        return final and self.ticks == 0  # stream ended after the JSON, fence unclosed

    def _char(self, c: str) -> int:
        phase = self.phase
        if phase == "fence":
            if c != "`":
                return self.REJECT
            self.ticks += 1
            if self.ticks == 3:
                self.phase, self.ticks = "lang", 0
            return self.MORE
        if phase in ("lang", "open"):
            if c in "{[":
                self.phase = "json"
            elif c.isspace():
                self.phase = "open"
                return self.MORE
            elif phase == "lang" and (c.isalnum() or c in "_-"):
                return self.MORE
            else:
                return self.REJECT
        if phase == "after":
            if c == "`":
                self.ticks += 1
                if self.ticks == 3:
                    self.phase = "done"
                    return self.DONE
                return self.MORE
            return self.MORE if c.isspace() and not self.ticks else self.REJECT
        return self._json_char(c)

    def _json_char(self, c: str) -> int:
        if self.in_str:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_str = False
            return self.MORE
        if c in _JSON_WS:
            return self.MORE
        if self.expect is not None:
            if c not in self.expect:
                return self.REJECT
            self.expect = None
        if c == '"':
            self.in_str = True
        elif c in "{[":
            if not self.stack:
                self.begin = self.pos
            self.stack.append("}" if c == "{" else "]")
            self.opened += 1
            if self.opened == 1:
                self.expect = '"' if c == "{" else "{"
            elif self.opened == 2 and self.stack[0] == "]":
                self.expect = '"'
        elif c in "}]":
            if not self.stack or self.stack.pop() != c:
                return self.REJECT
            if not self.stack:
                self.end = self.pos + 1
                if not self.fenced:
                    return self.DONE
                self.phase, self.ticks = "after", 0
        return self.MORE


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
        self._names = _tool_names(tools) if isinstance(tools, list) else set()
        self._tool_start = tool_start or ""
        self._parser = tool_parser or _json_tool_parser

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
        self._scan: Optional[_BareScan] = None
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
                    self._state, self._scan = BARE, _BareScan(s[0] == "`")
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
            calls = _normalise_calls(self._parser(body, self._tools))
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


class TextPipeline:
    """Token ids of one request -> channel deltas that are safe to send.

    The streaming detokenizer (mlx-lm's, duck-typed: add_token / finalize /
    last_segment) never splits a UTF-8 character; the StopMatcher cuts at the
    earliest stop string; the OutputRouter splits what is left into content,
    reasoning and tool calls. Every character reaches the output once.
    """

    def __init__(self, detokenizer, stops: Sequence[str], router: Optional["OutputRouter"] = None):
        self._detok = detokenizer
        self._stops = StopMatcher(list(stops))
        self.router = router or OutputRouter()
        self._decoded = 0  # characters out of the detokenizer so far
        self._visible = 0  # characters the stop matcher let through
        self._starts: List[int] = []  # where each token's text begins

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def add_token(self, token: int) -> List[Delta]:
        if self._stops.stopped:
            return []
        self._starts.append(self._decoded)
        self._detok.add_token(token)
        return self._route(self._detok.last_segment)

    def finalize(self) -> List[Delta]:
        """Flush the detokenizer, the stop matcher's tail and the router."""
        out: List[Delta] = []
        if not self._stops.stopped:
            self._detok.finalize()
            out = self._route(self._detok.last_segment, final=True)
        return out + self.router.finalize()

    def kept_tokens(self) -> int:
        """How many tokens' text begins before the cut: the rest made only stop text."""
        return bisect.bisect_left(self._starts, self._visible) if self._stops.stopped else len(self._starts)

    def _route(self, segment: str, final: bool = False) -> List[Delta]:
        self._decoded += len(segment)
        text = self._stops.feed(segment)
        if final:
            text += self._stops.finalize()
        self._visible += len(text)
        return self.router.feed(text)


# --- Whole-text face: LocalAI's shared-helper names over the same router -----
# LocalAI's mlx backends import these two names from common/ and call them on a
# finished reply; they run the streaming OutputRouter over the whole text, so a
# reply splits the same way whichever face reads it.


def route_whole(router: OutputRouter, text: str) -> Tuple[str, str, List[ToolCall]]:
    """(content, reasoning, tool calls) that `router` makes of one whole text."""
    deltas = router.feed(text) + router.finalize()
    return ("".join(d.content for d in deltas), "".join(d.reasoning for d in deltas),
            [c for d in deltas for c in d.tool_calls])


def split_reasoning(text: str, think_start: str, think_end: str) -> Tuple[str, str]:
    """(reasoning, content) of a finished reply, both trimmed (templates put blank
    lines around the markers); a reply with no marker comes back unchanged.

    A reply whose first marker is `think_end` began inside the block: templates
    such as Qwen3's open it in the prompt, so the model only ever closes it.
    """
    if not text or not think_start or (think_start not in text and (not think_end or think_end not in text)):
        return "", text
    end_at = text.find(think_end) if think_end else -1
    opened = end_at >= 0 and think_start not in text[:end_at]
    router = OutputRouter(think_start=think_start, think_end=think_end or None, start_in_reasoning=opened)
    content, reasoning, _ = route_whole(router, text)
    return reasoning.strip(), content.strip()


def parse_tool_calls(text: str, tool_module: Any, tools: Any) -> Tuple[List[dict], str]:
    """([{index, id, name, arguments}], the text left) for a finished reply.

    `tool_module` is an mlx-lm tool-parser module (or anything with
    `tool_call_start`, `tool_call_end` and `parse_tool_call(body, tools)`).
    As when streaming: an empty end marker runs the call to the end of the text,
    a call that does not parse stays in the text, and with `tools` offered a bare
    JSON call to one of them counts. Without any call the text comes back unchanged;
    with calls, the text left is trimmed.
    """
    start = getattr(tool_module, "tool_call_start", None) if tool_module is not None else None
    parser = getattr(tool_module, "parse_tool_call", None) if tool_module is not None else None
    if not text or not start or parser is None:
        return [], text
    router = OutputRouter(tool_start=start, tool_end=getattr(tool_module, "tool_call_end", None) or None,
                          tool_parser=parser, tools=tools)
    content, _, calls = route_whole(router, text)
    if not calls:
        return [], text
    return [dict(index=c.index, id=c.id, name=c.name, arguments=c.arguments) for c in calls], content.strip()

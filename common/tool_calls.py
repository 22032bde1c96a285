"""Tool calls in generated text: a parser's output made uniform, and bare JSON calls.

`normalise_calls` turns what a tool parser returns into {id, name, arguments};
`bare_tool_calls` recognises a JSON call to an offered tool that a small model
writes without markers, and `BareScan` follows such a value as it streams in,
just far enough to know where it ends. Pure Python, no MLX import.
"""

import json
from typing import Any, List, Optional

_JSON_WS = " \t\n\r"
_BARE_KEYS = {"name", "arguments", "parameters", "id", "type"}


def json_tool_parser(text: str, tools: Any = None):
    return json.loads(text.strip())


def tool_names(tools) -> set:
    names = set()
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _arguments_text(args) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def normalise_calls(parsed) -> List[dict]:
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


class BareScan:
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

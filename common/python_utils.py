"""Framework-agnostic helpers: model Options and chat messages.

Pure Python; the servicer turns proto messages into plain values with these.
"""

import json
from typing import Any, Dict, Iterable, List, Optional


class OptionError(ValueError):
    """A value a client sent that cannot be used; the message names the field."""


def parse_value(raw: str) -> Any:
    """Type an option value as a person would read it: bool, int, float, JSON, str."""
    text = raw.strip()
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def parse_load_options(options: Iterable[str]) -> Dict[str, Any]:
    """`key:value` strings (the host's ModelOptions.Options) into a typed dict:
    how LoadModel reads them.

    Keys are case-insensitive and '-' equals '_'; a bare `key` means True (as
    llama.cpp's backend reads it); the value is everything after the first ':'
    (so URLs and JSON survive); an entry without a key is an OptionError.
    """
    parsed: Dict[str, Any] = {}
    for item in options:
        if not item or not item.strip():
            continue
        key, sep, value = item.partition(":")
        key = key.strip().lower().replace("-", "_")
        if not key:
            raise OptionError(f"Options: entry {item!r} has no key")
        parsed[key] = parse_value(value) if sep else True
    return parsed


def parse_options(options: Iterable[str]) -> Dict[str, Any]:
    """LocalAI's shared-helper contract for the same list: entries without a colon,
    or without a key, are skipped rather than refused; never raises.

    Values and keys are typed and normalised as in parse_load_options.
    """
    return parse_load_options(o for o in options if o.partition(":")[0].strip() and ":" in o)


def _number(name: str, value: Any, kind: type, minimum=None, maximum=None):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(f"option {name}: expected a number, got {value!r}")
    if kind is int and float(value) != int(value):
        raise OptionError(f"option {name}: expected a whole number, got {value!r}")
    value = kind(value)
    if minimum is not None and value < minimum:
        raise OptionError(f"option {name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise OptionError(f"option {name}: must be <= {maximum}, got {value}")
    return value


def option_int(opts: Dict[str, Any], name: str, default: Optional[int], minimum=None):
    return default if name not in opts else _number(name, opts[name], int, minimum)


def option_float(opts: Dict[str, Any], name: str, default: Optional[float], minimum=None, maximum=None):
    if name not in opts:
        return default
    return _number(name, opts[name], float, minimum, maximum)


def option_bool(opts: Dict[str, Any], name: str, default: bool) -> bool:
    if name not in opts:
        return default
    if not isinstance(opts[name], bool):
        raise OptionError(f"option {name}: expected true or false, got {opts[name]!r}")
    return opts[name]


JSON_DEPTH = 64  # nesting a request's JSON may have, unless the caller passes its own bound


def json_depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (without recursion: walked with a stack)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def load_json(name: str, text: str, max_depth: int = JSON_DEPTH) -> Any:
    """json.loads with a nesting bound: too deep is an OptionError naming the field, never a
    RecursionError (the C parser gives up past Python's recursion limit)."""
    try:
        value = json.loads(text)
    except RecursionError:
        value = None
    else:
        if not json_depth_over(value, max_depth):
            return value
    raise OptionError(f"{name}: JSON nested deeper than {max_depth} levels (option max_json_depth)")


def parse_json_field(name: str, text: str, expect: type, max_depth: int = JSON_DEPTH) -> Any:
    """A JSON string from a request field, checked for its top-level type and nesting."""
    try:
        value = load_json(name, text, max_depth)
    except json.JSONDecodeError as e:
        raise OptionError(f"{name}: not valid JSON ({e.msg} at position {e.pos})") from None
    if not isinstance(value, expect):
        raise OptionError(f"{name}: expected a JSON {expect.__name__}")
    return value


def message_to_dict(index: int, role: str, content: str, name: str = "",
                    tool_call_id: str = "", reasoning_content: str = "",
                    tool_calls: str = "", strict: bool = True, max_depth: int = JSON_DEPTH) -> Dict[str, Any]:
    """One chat message as chat templates expect it.

    `tool_calls` arrives as a JSON array string (OpenAI shape); templates want
    the objects, with `arguments` as a mapping where it parses as one. Strict
    (the servicer): a bad message is an OptionError naming it. Lenient (LocalAI's
    contract): a tool_calls field that is not a JSON array is left out, and a
    call without function.name is passed on as sent.
    """
    if not role and strict:
        raise OptionError(f"Messages[{index}]: role is empty")
    msg: Dict[str, Any] = {"role": role, "content": content or ""}
    if name:
        msg["name"] = name
    if tool_call_id:
        msg["tool_call_id"] = tool_call_id
    if reasoning_content:
        msg["reasoning_content"] = reasoning_content
    if tool_calls:
        try:
            calls = parse_json_field(f"Messages[{index}].tool_calls", tool_calls, list, max_depth)
        except OptionError:
            if strict:
                raise
            return msg
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not fn.get("name"):
                if strict:
                    raise OptionError(f"Messages[{index}].tool_calls: each call needs function.name")
                continue
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = load_json(f"Messages[{index}].tool_calls", fn["arguments"] or "{}",
                                                max_depth)
                except json.JSONDecodeError:
                    pass  # templates that print arguments verbatim still work
                except OptionError:  # nested past the bound
                    if strict:
                        raise
        msg["tool_calls"] = calls
    return msg


def messages_to_dicts(messages, strict: bool = False, max_depth: int = JSON_DEPTH) -> List[Dict[str, Any]]:
    """Proto Messages (anything with the Message fields) into template dicts;
    lenient by default (LocalAI's contract), strict for the servicer."""
    return [
        message_to_dict(i, m.role, m.content, m.name, m.tool_call_id,
                        m.reasoning_content, m.tool_calls, strict=strict, max_depth=max_depth)
        for i, m in enumerate(messages)
    ]


def parse_tools(tools: str, max_depth: int = JSON_DEPTH) -> Optional[List[Dict[str, Any]]]:
    """The request's Tools JSON (an array of OpenAI tool objects) or None."""
    if not tools.strip():
        return None
    value = parse_json_field("Tools", tools, list, max_depth)
    return value or None


def parse_bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"{name}: expected true or false, got {text!r}")

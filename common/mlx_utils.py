"""Text-side helpers of the MLX backend under LocalAI's module name: pure Python, no MLX import.

LocalAI's mlx backends import `split_reasoning` and `parse_tool_calls` from
here (with common/ on sys.path); our own code and tests import the streaming
pieces from here too. Each lives in a module of its own: stop matching
(`stop_matcher`), tool-call parsing (`tool_calls`), the output router
(`output_router`) and the text pipeline (`text_pipeline`); this module
re-exports their names and adds the whole-text face over the router.
"""

from typing import Any, List, Tuple

try:  # imported as common.mlx_utils
    from .output_router import BARE, CONTENT, REASONING, TOOL, Delta, OutputRouter, ToolCall, router_log
    from .stop_matcher import StopMatcher, longest_partial_suffix, truncate_at_stop
    from .text_pipeline import TextPipeline
    from .tool_calls import bare_tool_calls
except ImportError:  # imported flat, as LocalAI's backends do
    from output_router import BARE, CONTENT, REASONING, TOOL, Delta, OutputRouter, ToolCall, router_log
    from stop_matcher import StopMatcher, longest_partial_suffix, truncate_at_stop
    from text_pipeline import TextPipeline
    from tool_calls import bare_tool_calls

__all__ = [
    "BARE", "CONTENT", "REASONING", "TOOL", "Delta", "OutputRouter", "StopMatcher", "TextPipeline", "ToolCall",
    "bare_tool_calls", "longest_partial_suffix", "parse_tool_calls", "route_whole", "router_log",
    "split_reasoning", "truncate_at_stop",
]


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

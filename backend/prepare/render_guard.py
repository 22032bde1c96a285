"""A chat-template render bounded in time and output size (preparation thread).

A Python thread cannot be killed, and the template runs inside transformers'
own sandboxed jinja environment, which we do not build. So the bound watches
the template's compiled code itself: while a render runs, a trace function on
this thread follows only the frames jinja compiled from the template (their
file name is "<template>"), checks the clock every few hundred lines (loops
included: a for loop's every turn is a line event) and adds up the text the
template's root generator yields. Past either budget it raises inside the template,
which ends the render there. Other threads are untouched; rendering
costs about 3x a plain render (a fraction of a millisecond for a chat).
"""

import sys
import time
from contextlib import contextmanager

from engine import EngineError

TEMPLATE_FILE = "<template>"  # jinja's file name for code compiled from a string
CHECK_EVERY = 256  # line events between clock reads
ROOT = "root"  # jinja's name for the generator that yields a template's output


class RenderBudgetExceeded(EngineError):
    def __init__(self, message: str):
        super().__init__("RESOURCE_EXHAUSTED", message)


@contextmanager
def bounded(field: str, seconds: float, output_bytes: int):
    """Around a template render on this thread; `field` names what the client sent."""
    deadline = time.monotonic() + seconds
    state = {"lines": 0, "chars": 0}

    def local(frame, event, arg):
        if event == "line":
            state["lines"] += 1
            if state["lines"] % CHECK_EVERY == 0 and time.monotonic() > deadline:
                raise RenderBudgetExceeded(
                    f"{field}: rendering the chat template took over {seconds:g} s "
                    f"(option template_seconds)")
        elif event == "return" and isinstance(arg, str) and frame.f_code.co_name == ROOT:
            # The template's output, each piece once: a macro returns its text to its caller
            # and a block yields through the root, so only the root's yields are counted.
            # Characters, not bytes: counting bytes would cost an encode per piece;
            # a character is at most 4 bytes and the budget is generous.
            state["chars"] += len(arg)
            if state["chars"] > output_bytes:
                raise RenderBudgetExceeded(
                    f"{field}: the chat template rendered over {output_bytes} bytes "
                    f"(option template_output_bytes)")
        return local

    def on_call(frame, event, arg):
        return local if frame.f_code.co_filename == TEMPLATE_FILE else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)

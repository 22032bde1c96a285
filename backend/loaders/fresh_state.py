"""A model's state as loaded, put back before each request of the solo lane.

Some families keep per-generation state on their modules, outside the prompt cache: Falcon
OCR's language model keeps the last image prompt's rope delta and uses it for a later prompt
that has no image; Falcon Perception keeps positions, an attention mask and detections. The
library's own generation in a fresh process starts from the state the model had when
loaded, so a request served after others (the load check's among them) would not get the
library's text. Each module's own attributes and private arrays (never its parameters or
sub-modules) are kept at load and put back before each request of the solo lane, where one
request runs at a time.
"""

import copy
from typing import Any, Dict, List, Tuple


def _own(value):
    """A plain container copied (a list the model appends to must not grow the kept one); anything
    else as it is (a module or the model itself that an attribute points to stays that object)."""
    return copy.copy(value) if type(value) in (list, dict, set) else value


def _owned(module) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(its plain attributes, its private array and container entries): what a module's own
    code sets on it. Its public entries are its parameters and sub-modules, never touched."""
    return ({k: _own(v) for k, v in vars(module).items()},
            {k: _own(v) for k, v in module.items() if k.startswith("_")})


class FreshState:
    def __init__(self, model):
        # After materialize: its arrays are computed, so the engine thread may use them.
        self._kept: List[Tuple[Any, Dict[str, Any], Dict[str, Any]]] = [(m, *_owned(m)) for m in model.modules()]

    def restore(self) -> None:
        for module, attributes, entries in self._kept:
            vars(module).clear()
            vars(module).update({k: _own(v) for k, v in attributes.items()})
            for key in [k for k in module if k.startswith("_") and k not in entries]:
                del module[key]
            dict.update(module, {k: _own(v) for k, v in entries.items()})  # Module.update takes parameters only

"""Special tokens at the ids a family's processor writes in code, in a tiny tokenizer.

Some processors do not ask the tokenizer for their image tokens' ids but write them as
numbers (DotsOCR's 151665, HunYuan-VL's 120118-120120, Jina-VLM's 151665-151668). The tiny
byte-level BPE (a few hundred tokens) is then padded: each such token moved to its id, every
id below the highest one that no trained token holds taken by a filler. Fillers are
vocabulary entries no merge produces, so no text encodes to them and the tokenizer's
behaviour on text is unchanged; the model's embedding and output head just grow to the
fixed ids (kept small by a narrow text model).
"""

import json
import re
from pathlib import Path
from typing import Dict, Set

FILLER = "<filler{}>"
_FILLER = re.compile(r"<filler\d+>")


def place(folder: Path, fixed: Dict[str, int]) -> None:
    """Move the special tokens `fixed` names (already trained into the tokenizer saved in
    `folder`) to their ids, fillers in every id left free below the highest."""
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    missing = sorted(set(fixed) - set(vocab))
    if missing:
        raise ValueError(f"tokens to place at fixed ids are not in the trained vocabulary: {missing}")
    held = {i: t for t, i in vocab.items() if t not in fixed}
    clash = sorted(i for i in fixed.values() if i in held)
    if clash:
        raise ValueError(f"fixed ids {clash} are held by trained tokens; fixed ids start past the trained vocabulary")
    held.update({i: t for t, i in fixed.items()})
    data["model"]["vocab"] = {held.get(i, FILLER.format(i)): i for i in range(max(held) + 1)}
    for added in data["added_tokens"]:
        added["id"] = data["model"]["vocab"][added["content"]]
    data["added_tokens"].sort(key=lambda a: a["id"])
    path.write_text(json.dumps(data, ensure_ascii=False))


def fillers(tok) -> Set[int]:
    """The ids of the fillers in `tok`'s vocabulary."""
    return {i for t, i in tok.get_vocab().items() if _FILLER.fullmatch(t)}

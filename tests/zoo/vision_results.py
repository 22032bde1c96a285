"""The vision matrix's results as the JSON the families document is generated from.

Schema (shared with the text matrix): {"library": "mlx-vlm <version>", "families":
{"<model_type>": {"status": "served" | "refused" | "library-cannot" | "not-built", "reason":
why, when not served, "lane": "batch" | "solo" | null, "cache_kinds": [...], "checks":
{"alone", "batched", "stream", "prefix", "speculation", "score", "images", "video": true,
false or null (not applicable or not run)}}}}.
"""

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

CHECKS = ("alone", "batched", "stream", "prefix", "speculation", "score", "images", "video", "audio", "matters")


@dataclass
class Record:
    status: str = "served"
    reason: str = ""
    lane: Optional[str] = None
    cache_kinds: List[str] = field(default_factory=list)
    checks: Dict[str, Optional[bool]] = field(default_factory=lambda: dict.fromkeys(CHECKS))

    def check(self, name: str, ok: bool) -> None:
        self.checks[name] = bool(ok)

    def not_built(self, why: str) -> None:
        self.status, self.reason = "not-built", why

    def library_cannot(self, why: str) -> None:
        self.status, self.reason = "library-cannot", why

    def refused(self, why: str) -> None:
        self.status, self.reason = "refused", why


class Results:
    def __init__(self, path: str):
        self.path = path
        self.records: Dict[str, Record] = {}

    def family(self, name: str) -> Record:
        return self.records.setdefault(name, Record())

    def write(self) -> None:
        """This run's records, over those an earlier run of the same library left in the file: a run of
        some families (FAMILIES=...) into a folder of a whole run updates just those."""
        import mlx_vlm

        library = f"mlx-vlm {mlx_vlm.__version__}"
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        families = {}
        try:
            with open(self.path) as f:
                earlier = json.load(f)
        except (OSError, ValueError):  # none yet, or not whole: this run's records alone
            earlier = {}
        if earlier.get("library") == library:
            families = earlier.get("families", {})
        families.update({name: vars(r) for name, r in self.records.items()})
        body = {"library": library, "families": dict(sorted(families.items()))}
        tmp = f"{self.path}.partial-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, self.path)

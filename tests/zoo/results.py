"""A family matrix's results file (text.json, vision.json), rewritten after every family.

The schema the matrices and families_doc.py share:
  {"library": "mlx-lm 0.32.2", "families": {"<model_type>": {
      "status": "served" | "refused" | "library-cannot" | "not-built",
      "reason": "<why, when not served or not exact>", "lane": "batch" | "solo" | null,
      "cache_kinds": ["KVCache", ...],
      "checks": {"alone": true | false | null, "batched": ..., "stream": ..., "prefix": ...,
                 "speculation": ..., "score": ..., "images": ..., "video": ...}}}}
null means not applicable or not run. Written to the folder in env ZOO_RESULTS_DIR (default:
the test run's own temporary folder), atomically, so the file is whole whatever stops the run.
"""

import json
import os
from pathlib import Path

CHECKS = ("alone", "batched", "stream", "prefix", "speculation", "score", "images", "video")
STATUSES = ("served", "refused", "library-cannot", "not-built")


def results_dir(tmp_path_factory) -> Path:
    """ZOO_RESULTS_DIR, else a folder of this test run."""
    chosen = os.environ.get("ZOO_RESULTS_DIR")
    return Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "zoo"


def entry(status: str, reason: str = "", lane=None, cache_kinds=(), **checks) -> dict:
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}")
    return {"status": status, "reason": reason, "lane": lane, "cache_kinds": list(cache_kinds),
            "checks": {c: checks.get(c) for c in CHECKS}}


class Results:
    """One results file: `record` a family's entry and the file is rewritten whole."""

    def __init__(self, path: Path, library: str):
        self.path = Path(path)
        self.data = {"library": library, "families": {}}

    def record(self, family: str, value: dict) -> None:
        self.data["families"][family] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

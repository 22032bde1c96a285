"""End-to-end: a store that cannot keep what it is given never costs a load or a request.

Each case starts a real server whose store root (MLX_BACKEND_CACHE_DIR, store.py) is at
fault: a regular file, an empty read-only mount, a full disk, a root whose every kept file a
first server wrote has bytes flipped, and one root two servers use at once. In each, the
server does the same work: load a tiny GGUF (a conversion to keep), answer a prompt, load a
tiny llama folder (a lane check whose verdict is kept; one prefix-cache entry in memory, so a
second prompt evicts the first to disk), answer three prompts (the first again last). Every
load succeeds, every text is mlx-lm's own greedy text (family_oracle.py, a separate process:
cold text, whatever the store did), Health answers OK, the fault is counted in Status, nothing
half-written is left in the root, and SIGTERM ends the server with 0.
"""

import contextlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from common.launcher import START_S, Backend, backend_pb2
from conftest import run_threads
from disk_faults import fill, tmpfs
from family_models import build
from family_oracle import Oracle, agrees, job
from gguf_fixture import write_tiny_gguf

pytestmark = pytest.mark.e2e

PROMPTS = ["The mill stands by the river where the water turns the old wheel all day long.",
           "Snow covers the high pastures and the goats come down to the village in winter."]
GGUF_PROMPT = "ab a ab."
TOKENS = 8
# The second prompt evicts the first from memory: a disk write. The disk tier's bound is given:
# its default (a quarter of the free space) turns a full disk's tier off before any write.
OPTIONS = ["prompt_cache_entries:1", f"prompt_cache_disk_bytes:{64 << 20}"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from loaders.gguf_loader import gguf_to_mlx_dir

    folder = tmp_path_factory.mktemp("store-models")
    gguf = write_tiny_gguf(str(folder / "tiny.gguf"))
    llama = build("llama")
    # The oracle reads the conversion this test process made in its own store (the converter
    # is checked against gguf's own reader elsewhere: test_gguf_cache.py).
    answers = Oracle([job(str(gguf_to_mlx_dir(gguf)), [GGUF_PROMPT], TOKENS), job(llama, PROMPTS, TOKENS)])
    return SimpleNamespace(gguf=gguf, llama=llama, oracle=answers)


def _status(backend) -> dict:
    return dict(backend.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown)


def _predict(backend, prompt: str) -> str:
    reply = backend.stub.Predict(backend_pb2.PredictOptions(Prompt=prompt, Tokens=TOKENS), timeout=120)
    return reply.message.decode("utf-8", "replace")


def work(backend, models) -> SimpleNamespace:
    """The same work in every case; what it answered and the figures after it."""
    out = SimpleNamespace()
    result = backend.load(models.gguf)
    assert result.success, result.message
    out.gguf = _predict(backend, GGUF_PROMPT)
    result = backend.load(models.llama, Options=OPTIONS)
    assert result.success, result.message
    out.texts = [_predict(backend, p) for p in (PROMPTS[0], PROMPTS[1], PROMPTS[0])]
    assert backend.stub.Health(backend_pb2.HealthMessage(), timeout=30).message == b"OK"
    out.status = _status(backend)
    return out


def check_texts(out, models) -> None:
    gguf, llama = models.oracle.result()
    assert agrees(out.gguf, gguf["greedy"][0]), (out.gguf, gguf["greedy"][0])
    for text, want in zip(out.texts, [llama["greedy"][0], llama["greedy"][1], llama["greedy"][0]]):
        assert agrees(text, want), (text, want)


def serve(root, log_dir, name: str, models) -> SimpleNamespace:
    backend = Backend(env={"MLX_BACKEND_CACHE_DIR": str(root)}, log_path=str(log_dir / f"store-{name}.log"))
    try:
        backend.wait_healthy(START_S)
        out = work(backend, models)
    finally:
        exit_code = backend.stop()
    assert exit_code == 0
    return out


def leftovers(root: Path) -> list:
    """Names of temporary files or folders the store left under `root` (none may stay)."""
    return [str(p) for p in root.rglob(".tmp-*")] if root.is_dir() else []


def test_a_root_that_is_a_file(tmp_path, log_dir, models):
    root = tmp_path / "root"
    root.write_text("a file where the cache root should be")
    out = serve(root, log_dir, "as-file", models)
    check_texts(out, models)
    for kind in ("gguf", "lanes", "prompt_cache"):
        assert out.status[f"store_{kind}_faults"] > 0, (kind, out.status)
    assert root.read_text() == "a file where the cache root should be"


@pytest.fixture
def mounted(tmp_path):
    """mount(options) -> a fresh tmpfs at a folder of this test's (skipped where mounting is not allowed)."""
    with contextlib.ExitStack() as stack:
        yield lambda options: stack.enter_context(tmpfs(tmp_path / "mount", options))


def test_a_read_only_root(log_dir, models, mounted):
    root = mounted("size=1m,mode=0700,ro")
    out = serve(root, log_dir, "read-only", models)
    check_texts(out, models)
    for kind in ("gguf", "lanes"):
        assert out.status[f"store_{kind}_faults"] > 0, (kind, out.status)
    assert os.listdir(root) == []


def test_a_full_root(log_dir, models, mounted):
    root = mounted("size=1m,mode=0700")
    fill(root)
    out = serve(root, log_dir, "full", models)
    check_texts(out, models)
    assert out.status["store_gguf_faults"] > 0 and out.status["store_prompt_cache_faults"] > 0, out.status
    assert leftovers(root) == []


def _flip_every_kept_file(root: Path) -> int:
    """One byte flipped in the middle of every file the first server kept (not the locks)."""
    flipped = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.name.startswith(".lock") and path.stat().st_size:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
            flipped += 1
    return flipped


def test_a_root_whose_every_kept_file_is_damaged(tmp_path, log_dir, models):
    root = tmp_path / "root"
    first = serve(root, log_dir, "damaged-first", models)
    check_texts(first, models)
    kinds = {p.name for p in root.iterdir()}
    assert {"gguf", "lanes", "prompt-cache"} <= kinds, kinds
    assert _flip_every_kept_file(root) >= 4
    out = serve(root, log_dir, "damaged-second", models)
    check_texts(out, models)
    for name in ("gguf_cache_corrupt", "lane_cache_corrupt", "prompt_cache_disk_corrupt"):
        assert out.status[name] > 0, (name, out.status)
    assert leftovers(root) == []


def test_two_servers_on_one_root_at_once(tmp_path, log_dir, models):
    root = tmp_path / "root"
    outs = run_threads([lambda n=n: serve(root, log_dir, f"shared-{n}", models) for n in "ab"])
    for out in outs:
        assert not isinstance(out, Exception), out
        check_texts(out, models)
    (entry,) = [p for p in (root / "gguf").iterdir() if not p.name.startswith(".")]  # converted once, kept once
    assert leftovers(root) == []

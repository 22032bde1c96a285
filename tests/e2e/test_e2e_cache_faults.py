"""End-to-end: what the backend keeps on disk is private, and a damaged file is a miss.

A first server, started with umask 0 on cache folders that do not exist yet (and a
prompt-cache folder made 0777 beforehand), converts a tiny GGUF and serves it, has
bytes of the converted weights flipped and loads it again (converted anew: the same
text and the same bytes as the clean conversion), then writes a prefix-cache file for
each damage case below and a folder for each model of the other cases (the tiny llama
under other paths: other fingerprints, the same text). Every path it made is 0700 /
0600. A second server on the same folders meets, one case per prompt: an intact file
(served from it: the control), flipped payload bytes, a flipped header byte, a
truncated file, a file of another format version, a model folder that is a file, one
that belongs to another user, one on a full disk (a 1 MiB tmpfs, filled), and a third
server sharing a folder with it. Each prompt's text is mlx-lm's own greedy text
(family_oracle.py, a separate process): a damaged file is a miss, served cold, removed,
logged once with its path and counted in Status; every call succeeds, Health answers
OK and SIGTERM ends each server with 0.
"""

import base64
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest

from common.launcher import START_S, Backend, backend_pb2
from conftest import run_threads
from disk_faults import fill
from family_models import build
from family_oracle import Oracle, agrees, job
from gguf_fixture import write_tiny_gguf
from test_e2e_prompt_disk import TOKENS, _predict, cached_tokens

pytestmark = pytest.mark.e2e

THEN = " And the evening came slowly over the fields and the river"
# Distinct first words: no two prompts share a token, so no file serves another case.
FIRST = {
    "intact": "Apples grow on the old trees behind the farm, red and green in the autumn sun.",
    "payload": "Boats rest in the harbour at night while the fishermen sleep in their houses.",
    "header": "Clouds gather over the mountains and the first snow falls on the high pastures.",
    "truncated": "Dogs bark at the gate whenever the postman walks up the lane with his bag.",
    "format": "Engines hum in the workshop where the mechanics repair the old red tractors.",
    "as-file": "Forests stretch for miles along the valley where the wolves hunt in winter.",
    "foreign": "Gardens bloom in the spring when the bees return from their winter hives.",
    "full": "Harbours fill with ships from the south carrying spices, silk and oranges.",
    "shared-a": "Islands rise from the sea like the backs of sleeping whales under the mist.",
    "shared-b": "Jugglers toss bright balls in the square while the children clap and laugh.",
    "shared": "Kites dance above the dunes when the wind blows in from the grey sea.",
}
DAMAGED = ("payload", "header", "truncated")
MODELS = ("as-file", "foreign", "full", "shared")  # one folder each: the tiny llama under another path
GGUF_PROMPT = "ab a ab."
NOBODY = 65534
ONE_ENTRY = ["prompt_cache_entries:1"]  # each prompt evicts the one before: written at once


def second(case: str) -> str:
    return FIRST[case] + THEN


@pytest.fixture(scope="module")
def oracle():
    answers = Oracle([job(build("llama"), [second(c) for c in FIRST], TOKENS)])
    yield lambda case: answers.result()[0]["greedy"][list(FIRST).index(case)]
    answers.proc.kill()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("private")
    prompts = base / "shared" / "prompt-cache"
    prompts.mkdir(parents=True)
    prompts.chmod(0o777)  # made loose by someone else: the backend tightens it
    cache = base / "home" / "cache"  # neither exists: the backend makes both
    (base / "models").mkdir()
    models = {name: base / "models" / name for name in MODELS}
    for copy in models.values():  # another folder: another fingerprint, the same weights (hard links: no bytes)
        shutil.copytree(build("llama"), copy, copy_function=os.link)
    return SimpleNamespace(base=base, cache=cache, prompts=prompts, models=models, env={
        "MLX_BACKEND_CACHE_DIR": str(cache), "MLX_BACKEND_PROMPT_CACHE_DIR": str(prompts)})


def _load(backend, model, options=()):
    result = backend.load(str(model), Options=list(options))
    assert result.success, result.message


def _status(backend) -> dict:
    return dict(backend.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown)


def _text(reply) -> str:
    return reply.message.decode("utf-8", "replace")


def _tokens(backend, case: str) -> list:
    return list(backend.stub.TokenizeString(backend_pb2.PredictOptions(Prompt=FIRST[case]), timeout=30).tokens)


def _modes(*tops: Path) -> dict:
    out = {}
    for top in tops:
        out[top] = os.lstat(top).st_mode
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                out[Path(folder) / name] = os.lstat(Path(folder) / name).st_mode
    return out


@pytest.fixture(scope="module")
def full_disk(folders):
    """A 1 MiB tmpfs, filled to the last byte (None where mounting is not allowed)."""
    mount = folders.base / "full-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        yield None
        return
    try:
        fill(mount)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture(scope="module")
def later(folders, log_dir, full_disk):  # (stopped before the full disk is unmounted)
    """The second server and a third sharing its folders, started now (they touch no cache
    folder before a load): their start-up overlaps the first server's work."""
    servers = [Backend(env=folders.env, log_path=str(log_dir / f"cache-faults-{n}.log")) for n in ("second", "third")]
    yield servers
    assert [s.stop() for s in servers] == [0, 0]


@pytest.fixture(scope="module")
def first(folders, log_dir, oracle, later):  # (the oracle computes meanwhile, the later servers start)
    """The first server's work, as a record: texts, figures, folders, and the modes it left."""
    log = log_dir / "cache-faults-first.log"
    old = os.umask(0)  # inherited by the server: the modes must not come from the umask
    try:
        backend = Backend(env=folders.env, log_path=str(log))
    finally:
        os.umask(old)
    out = SimpleNamespace(log=log, folder={})
    try:
        backend.wait_healthy(START_S)
        gguf = write_tiny_gguf(str(folders.base / "tiny.gguf"))
        _load(backend, gguf)
        out.gguf_clean = _text(_predict(backend, GGUF_PROMPT, "gguf-clean", tokens=8))
        (entry,) = [p for p in (folders.cache / "gguf").iterdir() if p.is_dir() and not p.name.startswith(".")]
        out.gguf_weights = entry / "model.safetensors"
        out.gguf_bytes = out.gguf_weights.read_bytes()
        data = bytearray(out.gguf_bytes)
        for i in range(len(data) // 2, len(data), 61):
            data[i] ^= 0xFF
        out.gguf_weights.write_bytes(bytes(data))
        _load(backend, gguf)
        out.gguf_again = _text(_predict(backend, GGUF_PROMPT, "gguf-again", tokens=8))
        out.gguf_bytes_again = out.gguf_weights.read_bytes()
        out.gguf_status = _status(backend)
        plan = [("llama", build("llama"), DAMAGED + ("intact", "format"))]
        plan += [(name, folders.models[name], [name]) for name in MODELS]
        for name, model, cases in plan:
            _load(backend, model)  # a swap: the previous model's entries go to disk
            for case in cases:
                _predict(backend, FIRST[case], f"first-{name}-{case}", tokens=1)  # the entry: this prompt
        out.tokens = {case: _tokens(backend, case) for case in FIRST}  # one tokenizer for all
    finally:
        out.exit = backend.stop()  # the last model's entries go to disk
    out.modes = _modes(folders.cache.parent, folders.prompts)
    for name, _, cases in plan:  # each model's folder: the one holding its first prompt's file
        (out.folder[name],) = [f.name for f in folders.prompts.iterdir() if f.is_dir()
                               and _file_of(f, out.tokens[cases[0]]) is not None]
    return out


def _file_of(folder: Path, tokens) -> Optional[Path]:
    """The prefix-cache file whose tokens (safetensors metadata: little-endian int64, base64)
    start with `tokens`; None when none does."""
    import mlx.core as mx

    for path in folder.glob("[!.]*.safetensors"):  # (not a temporary file being written)
        _, meta = mx.load(str(path), return_metadata=True)
        held = np.frombuffer(base64.b64decode(meta["tokens"]), dtype="<i8").tolist()
        if held[:len(tokens)] == tokens:
            return path
    return None


def _flip_payload(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(8 + int.from_bytes(data[:8], "little"), len(data), 97):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _flip_header(path: Path) -> None:
    """Layer 0's keys named "a1" instead of "a0" in the description (escaped in the metadata):
    one bit, still valid JSON; read unverified, the layer's keys would be its values."""
    data = bytearray(path.read_bytes())
    data[data.index(b'\\"a0\\"', 0, 8 + int.from_bytes(data[:8], "little")) + 3] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _other_format(path: Path) -> None:
    import mlx.core as mx

    arrays, meta = mx.load(str(path), return_metadata=True)
    meta["format"] = "mlx-backend-prompt-cache/1"  # an earlier format (tokens as int32), never read
    mx.save_safetensors(str(path), arrays, meta)


DAMAGE = {"payload": _flip_payload, "header": _flip_header, "truncated": _truncate, "format": _other_format}


@pytest.fixture(scope="module")
def damaged(first, later, folders, full_disk, log_dir):
    """The second server (and a third sharing its folders), on the first one's folders after
    the damage; Health OK and a clean exit checked when they stop."""
    assert first.exit == 0
    llama = folders.prompts / first.folder["llama"]
    paths = {case: _file_of(llama, first.tokens[case]) for case in (*DAMAGE, "intact")}
    assert None not in paths.values(), paths
    for case, damage in DAMAGE.items():
        damage(paths[case])
    as_file = folders.prompts / first.folder["as-file"]
    shutil.rmtree(as_file)
    as_file.write_text("not a folder")
    foreign = folders.prompts / first.folder["foreign"]
    if os.geteuid() == 0:
        for p in [foreign, *foreign.iterdir()]:
            os.chown(p, NOBODY, NOBODY)
    full = folders.prompts / first.folder["full"]
    if full_disk is not None:
        shutil.rmtree(full)
        (full_disk / "folder").mkdir()
        full.symlink_to(full_disk / "folder")  # the model's files on the full disk
    for s in later:
        s.wait_healthy(START_S)
    yield SimpleNamespace(backend=later[0], other=later[1], log=log_dir / "cache-faults-second.log",
                          other_log=log_dir / "cache-faults-third.log", paths=paths, as_file=as_file,
                          foreign=foreign, full=full_disk and full_disk / "folder",
                          shared=folders.prompts / first.folder["shared"], models=folders.models)
    for s in later:
        assert s.stub.Health(backend_pb2.HealthMessage(), timeout=30).message == b"OK"


def test_every_path_the_backend_made_is_this_users_alone(first, folders):
    assert first.exit == 0
    assert len(first.modes) > 10  # both caches' folders, entries, files and the lock
    loose = {str(p): oct(stat.S_IMODE(m)) for p, m in first.modes.items()
             if stat.S_IMODE(m) != (0o700 if stat.S_ISDIR(m) else 0o600)}
    assert loose == {}
    assert all(stat.S_ISDIR(m) or stat.S_ISREG(m) for m in first.modes.values())
    assert stat.S_IMODE(first.modes[folders.prompts]) == 0o700  # was 0777


def test_a_flipped_byte_in_a_gguf_conversion_is_converted_again(first):
    assert first.gguf_again == first.gguf_clean and first.gguf_clean
    assert first.gguf_bytes_again == first.gguf_bytes  # the conversion anew, not the damaged file
    assert first.gguf_status["gguf_cache_corrupt"] == 1
    lines = [line for line in open(first.log, encoding="utf-8") if "is damaged" in line]
    assert len(lines) == 1 and str(first.gguf_weights.parent) in lines[0], lines


def test_an_intact_file_is_served_from_disk(damaged, oracle):
    _load(damaged.backend, build("llama"))
    reply = _predict(damaged.backend, second("intact"), "intact")
    assert cached_tokens(damaged.log, "intact") > 0
    assert agrees(_text(reply), oracle("intact"))


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_or_foreign_file_is_a_miss(damaged, oracle, case):
    _load(damaged.backend, build("llama"))
    reply = _predict(damaged.backend, second(case), case)
    assert agrees(_text(reply), oracle(case)), (case, _text(reply), oracle(case))
    assert cached_tokens(damaged.log, case) == 0
    path = damaged.paths[case]
    assert not path.exists()
    logged = [line for line in open(damaged.log, encoding="utf-8") if str(path) in line]
    assert len(logged) == 1, logged
    assert ("is damaged" if case in DAMAGED else "not this model's") in logged[0]


def test_status_counts_each_damaged_file_once(damaged):
    # A header is checked when the folder is listed (the load), the arrays when read (the
    # prompt): the cases' prompts again, whatever ran before, then the count.
    _load(damaged.backend, build("llama"))
    for case in DAMAGE:
        _predict(damaged.backend, second(case), f"{case}-again")
    assert _status(damaged.backend)["prompt_cache_disk_corrupt"] == len(DAMAGED)


def test_a_model_folder_that_is_a_file_turns_its_tier_off(damaged, oracle):
    _load(damaged.backend, damaged.models["as-file"])
    reply = _predict(damaged.backend, second("as-file"), "as-file")
    assert cached_tokens(damaged.log, "as-file") == 0
    assert agrees(_text(reply), oracle("as-file"))
    assert damaged.as_file.read_text() == "not a folder"
    assert any("disk tier is off" in line and str(damaged.as_file) in line for line in open(damaged.log))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_refused(damaged, oracle):
    files = sorted(p.name for p in damaged.foreign.iterdir())
    _load(damaged.backend, damaged.models["foreign"])
    reply = _predict(damaged.backend, second("foreign"), "foreign")
    assert cached_tokens(damaged.log, "foreign") == 0  # its file was never read
    assert agrees(_text(reply), oracle("foreign"))
    assert any("disk tier is off" in line and f"uid {NOBODY}" in line for line in open(damaged.log))
    st = damaged.foreign.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700)  # neither taken over nor changed
    assert sorted(p.name for p in damaged.foreign.iterdir()) == files


def test_a_full_disk_fails_the_writes_and_serves_every_prompt(damaged, oracle):
    if damaged.full is None:
        pytest.skip("mounting a tmpfs is not allowed here")
    backend = damaged.backend
    # A budget far above the disk: every eviction is written, and fails.
    _load(backend, damaged.models["full"], ONE_ENTRY + ["prompt_cache_disk_bytes:1000000000"])
    for i, case in enumerate(("shared-a", "shared-b", "intact")):
        _predict(backend, FIRST[case], f"full-{i}", tokens=1)
    reply = _predict(backend, second("full"), "full")
    assert cached_tokens(damaged.log, "full") == 0
    assert agrees(_text(reply), oracle("full"))
    assert _status(backend)["prompt_cache_disk_corrupt"] <= len(DAMAGED)  # a failed write is no damaged file
    deadline = time.monotonic() + 30  # the last eviction's write may still be under way
    while list(damaged.full.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(damaged.full.iterdir()) == []  # nothing written, nothing half-written left
    assert any("writing an entry into" in line and "failed" in line for line in open(damaged.log))


def _wait_for(folder: Path, tokens, timeout: float = 60.0) -> Path:
    deadline = time.monotonic() + timeout
    while (path := _file_of(folder, tokens)) is None:
        assert time.monotonic() < deadline, f"no file for {tokens[:8]}... in {folder}"
        time.sleep(0.2)
    return path


def test_two_processes_on_one_folder_serve_each_others_files(damaged, first, oracle):
    a, b = damaged.backend, damaged.other
    for backend in (a, b):
        _load(backend, damaged.models["shared"], ONE_ENTRY)
    # Each writes one entry (its next prompt evicts it), then serves the other's.
    _predict(a, FIRST["shared-a"], "shared-a-first", tokens=1)
    _predict(b, FIRST["shared-b"], "shared-b-first", tokens=1)
    _predict(a, FIRST["intact"], "shared-a-evict", tokens=1)
    _predict(b, FIRST["format"], "shared-b-evict", tokens=1)
    for case in ("shared-a", "shared-b"):
        _wait_for(damaged.shared, first.tokens[case])
    replies = run_threads([lambda: _predict(a, second("shared-b"), "shared-b-on-a"),
                           lambda: _predict(b, second("shared-a"), "shared-a-on-b")])
    assert cached_tokens(damaged.log, "shared-b-on-a") > 0
    assert cached_tokens(damaged.other_log, "shared-a-on-b") > 0
    assert agrees(_text(replies[0]), oracle("shared-b"))
    assert agrees(_text(replies[1]), oracle("shared-a"))

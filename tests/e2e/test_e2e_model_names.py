"""End-to-end: a model named the way LocalAI names it loads, and a hub model is keyed by its revision.

One backend folder laid out as for LocalAI and started as LocalAI starts it (run.sh, the host's
environment: HOME and HF_HOME of this test's own, the hub unreachable). LoadModel is sent with
the fields LocalAI's Go code fills (core/config/model_config.go, pkg/model/loader.go: `Model`
from the YAML, `ModelFile` its `filepath.Join(ModelPath, Model)`, `ModelPath` the models
folder) for: a model imported from a local folder (`file:///abs/path`, so `ModelFile` is
`<models>/file:/abs/path`), `~/...`, a name relative to the models folder, a symlinked folder,
and hub ids held in the local hub cache (HF_HOME): a text model, the same id after the hub moved
it to another revision (another model), and a vision model, routed to mlx-vlm by its config.
Each answer is the library's own greedy text (family_oracle.py, a separate process); a hub id
that is neither cached nor reachable fails the load with a message saying so, and the server
keeps serving.
"""

import os
import shutil
from pathlib import Path

import pytest

import localai_backend
from common.launcher import backend_pb2
from family_models import build
from family_oracle import Oracle, agrees, job
from localai_host import start_like_localai, stop_like_localai, wait_healthy_like_the_host
from vision_fixture import image_b64, tiny_qwen2_vl

pytestmark = pytest.mark.e2e

PROMPT = "The quick brown fox jumps over the lazy dog and runs"
TOKENS = 8


def _hub_snapshot(hub: Path, repo: str, revision: str, source: str) -> Path:
    """`source`'s files as huggingface_hub's cache holds a snapshot of `repo` at `revision`
    (refs/main naming it), the way a download leaves it."""
    top = hub / f"models--{repo.replace('/', '--')}"
    snapshot = top / "snapshots" / revision
    shutil.copytree(source, snapshot)
    (top / "refs").mkdir(parents=True, exist_ok=True)
    (top / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("names")
    llama, qwen = build("llama"), build("qwen2")
    oracle = Oracle([job(llama, [PROMPT], TOKENS), job(qwen, [PROMPT], TOKENS)])
    home, models, hf = base / "home", base / "models", base / "hf"
    (home / "models").mkdir(parents=True)
    models.mkdir()
    os.symlink(llama, home / "models" / "tiny")
    shutil.copytree(llama, models / "tiny-copy")
    os.symlink(llama, models / "linked")
    hub = hf / "hub"
    _hub_snapshot(hub, "org/tiny", "1111aaaa", llama)
    _hub_snapshot(hub, "org/tiny-vl", "3333cccc", tiny_qwen2_vl())
    folder = localai_backend.layout(str(base / "backends"))
    env = dict(os.environ, HOME=str(home), HF_HOME=str(hf))
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return dict(base=base, llama=llama, qwen=qwen, oracle=oracle, home=home, models=models, hub=hub,
                folder=folder, env=env)


@pytest.fixture(scope="module")
def served(world, log_dir):
    log = log_dir / "model-names.log"
    proc, channel, stub = start_like_localai(world["folder"], log, env=world["env"])
    try:
        wait_healthy_like_the_host(stub, proc)
        yield stub, log
    finally:
        channel.close()
        stop_like_localai(proc)


def load_as_localai(stub, model: str, models: Path):
    """LoadModel with LocalAI's fields: ModelFile is Go's filepath.Join(ModelPath, Model), which
    cleans the path (so `file:///abs` becomes `file:/abs`)."""
    model_file = os.path.normpath(os.path.join(str(models), model))
    return stub.LoadModel(backend_pb2.ModelOptions(Model=model, ModelFile=model_file, ModelPath=str(models),
                                                   ContextSize=4096), timeout=300)


def answer(stub, model: str) -> str:
    reply = stub.Predict(backend_pb2.PredictOptions(Prompt=PROMPT, Tokens=TOKENS, ModelIdentity=model), timeout=120)
    return reply.message.decode("utf-8", "replace")


def loads_and_answers(stub, world, model: str, want: int) -> None:
    result = load_as_localai(stub, model, world["models"])
    assert result.success, (model, result.message)
    want_text = world["oracle"].result()[want]["greedy"][0]
    got = answer(stub, model)
    assert agrees(got, want_text), (model, got, want_text)


def test_go_joins_a_file_uri_as_localai_sends_it(world):
    # The oracle of what the host sends: filepath.Join("/m", "file:///abs/x") == "/m/file:/abs/x".
    assert os.path.normpath(os.path.join("/m", "file:///abs/x")) == "/m/file:/abs/x"


def test_a_model_imported_from_a_local_folder(served, world):
    stub, _ = served
    uri = f"file://{world['llama']}"
    assert load_as_localai(stub, uri, world["models"]).success
    loads_and_answers(stub, world, uri, 0)


@pytest.mark.parametrize("name", ["~/models/tiny", "tiny-copy", "linked"])
def test_home_relative_and_symlinked_names(served, world, name):
    loads_and_answers(served[0], world, name, 0)


def test_a_hub_id_is_its_snapshot_and_another_revision_is_another_model(served, world):
    stub, log = served
    loads_and_answers(stub, world, "org/tiny", 0)
    _hub_snapshot(world["hub"], "org/tiny", "2222bbbb", world["qwen"])  # the hub moved main to a new model
    loads_and_answers(stub, world, "org/tiny", 1)
    text = Path(log).read_text(errors="replace")
    assert "snapshots/1111aaaa" in text and "snapshots/2222bbbb" in text  # each keyed and loaded by its revision


def test_a_hub_vision_model_is_routed_by_its_config(served, world):
    stub, _ = served
    result = load_as_localai(stub, "org/tiny-vl", world["models"])
    assert result.success, result.message
    meta = stub.ModelMetadata(backend_pb2.ModelOptions(), timeout=30)
    assert meta.media_marker, "a vision model reports its media marker"
    reply = stub.Predict(backend_pb2.PredictOptions(
        Messages=[backend_pb2.Message(role="user", content="Describe this.")], UseTokenizerTemplate=True,
        Images=[image_b64(1)], Tokens=4), timeout=120)
    assert reply.tokens > 0


def test_a_hub_id_neither_cached_nor_reachable_fails_the_load_and_the_server_goes_on(served, world):
    stub, _ = served
    assert load_as_localai(stub, "tiny-copy", world["models"]).success
    result = load_as_localai(stub, "org/not-here", world["models"])
    assert not result.success
    assert "org/not-here" in result.message and "not in the local hub cache" in result.message, result.message
    assert agrees(answer(stub, "tiny-copy"), world["oracle"].result()[0]["greedy"][0])

"""End-to-end: at the precisions users run, the server gives mlx-lm's own tokens.

A family of each kind the server treats differently (dense llama, sliding-window gemma3_text,
convolutional lfm2, linear-attention qwen3_next, MoE qwen3_moe and gpt_oss), each at bf16,
affine q8 and q4 (group 64, made from bf16 by mlx-lm's own convert) and mxfp4
(tests/zoo/precision.py), served with DType native (the weights as stored, as on a Mac GPU).
The oracle is mlx-lm's single stream at the same weights, in a process of its own
(tests/precision_oracle.py), which also measures the library's own noise at that precision
(its batch against its single stream) and says where a comparison must end: the first step
whose top-2 margin is within that noise, in bfloat16 spacings. Per variant: three prompts of
different lengths (one past gemma3_text's window) alone give the library's tokens up to there;
the three at once give the alone answers; a stream gives the unary answer. A variant the
library itself cannot run here (mlx-lm's GatherMM takes float32 only on the CPU: the MoE
families at bf16) is refused at LoadModel with the library's reason, the server still
serving. Results go to precision.json beside the other matrices'.
"""

import json
import os

import pytest

from common.launcher import Backend, backend_pb2
from conftest import run_threads
from precision_oracle import start
from zoo import precision

pytestmark = pytest.mark.e2e

TOKENS = 16
PROMPTS = ["one two three one two three one two",
           "The river flows past the old mill. The sky is blue",
           "Count 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. The quick brown fox jumps over the lazy dog. Hello world! How are "
           "you today? The cat sat on the mat while the sun was shining."]
VARIANTS = [(f, p) for f in precision.FAMILIES for p in precision.PRECISIONS]


@pytest.fixture(scope="module")
def server(log_dir):
    started = Backend(log_path=str(log_dir / "zoo-precision.log"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def zoo(server, tmp_path_factory):
    paths = {v: precision.variant(*v) for v in VARIANTS}
    oracle = start([{"model": paths[v], "prompts": PROMPTS, "max_tokens": TOKENS} for v in VARIANTS])
    folder = os.environ.get("ZOO_RESULTS_DIR") or str(tmp_path_factory.getbasetemp() / "zoo")
    os.makedirs(folder, exist_ok=True)
    results = {}
    yield paths, lambda v: oracle.answer(VARIANTS.index(v)), results
    oracle.close()
    with open(os.path.join(folder, "precision.json"), "w") as f:
        json.dump({"variants": results}, f, indent=1)


@pytest.fixture(scope="module")
def backend(server, zoo):
    server.wait_healthy()
    return server


def ids(reply) -> list:
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def ask(prompt: str) -> "backend_pb2.PredictOptions":
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=TOKENS, Temperature=0.0, Logprobs=1)


def streamed(stub, prompt: str) -> list:
    return [e["id"] for r in stub.PredictStream(ask(prompt), timeout=300) if r.logprobs
            for e in json.loads(r.logprobs)["content"]]


@pytest.mark.parametrize("family, dtype", VARIANTS, ids=[f"{f}-{p}" for f, p in VARIANTS])
def test_a_precision_serves_the_library_output(backend, zoo, family, dtype):
    paths, oracle, results = zoo
    want = oracle((family, dtype))
    record = results.setdefault(f"{family}-{dtype}", {"family": family, "precision": dtype, "checks": {}})
    loaded = backend.load(paths[(family, dtype)], DType="native")
    if want["error"]:  # the library cannot run it here: refused at load, in its words
        record.update(status="library-cannot", reason=want["error"])
        assert not loaded.success, f"{family} {dtype}: loaded though mlx-lm cannot run it ({want['error']})"
        words = want["error"].split(": ", 1)[-1][:40]
        assert words in loaded.message, (want["error"], loaded.message)
        assert backend.stub.Health(backend_pb2.HealthMessage(), timeout=30).message == b"OK"
        return
    assert loaded.success, f"{family} {dtype}: refused at LoadModel: {loaded.message}"
    stub, checks = backend.stub, record["checks"]
    record.update(status="served", noise_units=want["noise"]["units"],
                  compared=sum(len(g["tokens"]) if g["cut"] is None else g["cut"] for g in want["greedy"]),
                  steps=sum(len(g["tokens"]) for g in want["greedy"]),
                  lane="solo" if stub.Status(backend_pb2.HealthMessage()).memory.breakdown.get("lane_solo")
                  else "batch")
    alone = [ids(stub.Predict(ask(p), timeout=300)) for p in PROMPTS]

    def agrees(got, g):
        upto = len(g["tokens"]) if g["cut"] is None else g["cut"]
        return got[:upto] == g["tokens"][:upto]

    checks["alone"] = all(agrees(a, g) for a, g in zip(alone, want["greedy"]))
    together = run_threads([lambda p=p: stub.Predict(ask(p), timeout=300) for p in PROMPTS])
    checks["together"] = all(not isinstance(r, Exception) and ids(r) == a for r, a in zip(together, alone))
    checks["stream"] = streamed(stub, PROMPTS[1]) == alone[1]
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        record.update(status="differs", reason=f"{', '.join(failed)} differ from mlx-lm's single stream")
    assert not failed, f"{family} {dtype}: {failed}: served {alone} library {[g['tokens'] for g in want['greedy']]}"

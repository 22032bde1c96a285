"""End-to-end: Gemma 3 vision prefills each image attending both ways, as its reference does, in
either lane.

The oracle is tests/gemma3_reference.py, a process of its own: the published rule written pair by
pair over the whole prompt, through mlx-vlm's own Gemma 3 layers. The cases are the tiny gemma3
of the vision matrix asked about pictures, one where its image's own tokens decide the answer (a
chunk of the prefill that saw only the earlier tokens of the image would answer otherwise; there
mlx-vlm 0.7.10's causal prefill does too, which the test records as the evidence
docs/model-families.md cites) and ones where they do not. Each must give the reference's tokens
alone in the batch lane, in the solo lane, and with the prefill cut into chunks smaller than the
image (a chunk then ends after it).
"""

import json
import os
import subprocess
import sys

import pytest

from common.launcher import Backend, chat
from family_oracle import server_blas_env
from vision_fixture import image_b64
from zoo import vision_builder

pytestmark = pytest.mark.e2e

N = 12
# (seed, width, height, question); the first: the image's own tokens turn the answer at token 10.
CASES = [(11, 160, 120, "Describe the image in one sentence."), (1, 160, 120, "Describe this."),
         (2, 96, 128, "What is in this picture?")]


@pytest.fixture(scope="module")
def model():
    return vision_builder.build("gemma3")


@pytest.fixture(scope="module")
def reference(model):
    answers = []
    for seed, width, height, question in CASES:
        job = {"model": model, "question": question, "image": [seed, width, height], "max_tokens": N}
        script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gemma3_reference.py")
        done = subprocess.run([sys.executable, script], input=json.dumps(job), text=True,
                              capture_output=True, env=server_blas_env(), timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        answers.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return answers


def ids(reply):
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def ask(case, **fields):
    seed, width, height, question = case
    return chat(question, Images=[image_b64(seed, (width, height))], Logprobs=1, Tokens=N, Temperature=0.0, **fields)


@pytest.mark.parametrize("options", [["lane:batch"], ["lane:solo"], ["lane:batch", "prefill_step_size:3"]],
                         ids=["batch", "solo", "chunks-of-3"])
def test_each_image_attends_both_ways_as_the_reference_does(model, reference, options, log_dir):
    with Backend(log_path=str(log_dir / f"gemma3-{'-'.join(options)}.log")) as backend:
        loaded = backend.load(model, Options=options)
        assert loaded.success, loaded.message
        for case, want in zip(CASES, reference):
            assert ids(backend.stub.Predict(ask(case), timeout=300)) == want["reference"], case


def test_the_first_case_is_one_where_the_library_s_causal_prefill_answers_otherwise(reference):
    # The evidence: mlx-vlm's own generation (a causal prefill) leaves the reference here, and only here.
    assert reference[0]["library"] != reference[0]["reference"]
    assert [r["library"] for r in reference[1:]] == [r["reference"] for r in reference[1:]]

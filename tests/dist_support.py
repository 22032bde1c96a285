"""Helpers for the distributed tests and bench: a tiny model, and a group of ranks.

The group is started the way `mlx.launch --backend ring` starts it, by hand
(a hostfile and MLX_RANK per process), so the tests know each rank's pid.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from common.launcher import BACKEND_DIR, Backend, backend_pb2, backend_pb2_grpc, free_port

import grpc

GROUP_SECRET = "test-group-secret"  # the control channel's secret of every group started here


def tiny_llama_dir(target: Path, heads: int = 4, kv_heads: int = 2, seed: int = 0, family: str = "llama") -> str:
    """A random-weight llama (2 layers, width 64) with SmolLM2's tokenizer and chat template;
    with `family` "qwen2" the same shape as mlx-lm's qwen2, which it divides both ways (tensor
    and pipeline parallel)."""
    return tiny_model_dir(target, family, hidden=64, layers=2, intermediate=128, heads=heads, kv_heads=kv_heads,
                          seed=seed)


def tiny_model_dir(target: Path, family: str = "qwen2", hidden: int = 192, layers: int = 6,
                   intermediate: int = 768, heads: int = 6, kv_heads: int = 6, seed: int = 0) -> str:
    """A random-weight model of mlx-lm's `family` with SmolLM2's tokenizer and chat template: the
    defaults divide by 2 and 3 in both modes (heads, KV heads and MLP width
    for tensor parallelism, layers for the pipeline), and the layers weigh enough next to the
    embeddings and head (whole on every rank) that a rank's share of the weights shows."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    if (target / "model.safetensors").exists():
        return str(target)
    src = gguf_to_mlx_dir(embedded_default())
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = {"model_type": family, "hidden_size": hidden, "num_hidden_layers": layers,
              "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "rms_norm_eps": 1e-5, "vocab_size": 49152, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "tie_word_embeddings": False, "eos_token_id": [2]}
    mx.random.seed(seed)
    module = importlib.import_module(f"mlx_lm.models.{family}")
    model = module.Model(module.ModelArgs.from_dict(config))
    # A head of its own and wide weights: varied text, and logits far apart (no near-ties for greedy).
    model.lm_head.weight = mx.random.normal(model.lm_head.weight.shape) * 0.5
    mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (tmp / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, tmp / name)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return str(target)


def hostfile(path: Path, ips: List[str]) -> str:
    path.write_text(json.dumps([[f"{ip}:{free_port()}"] for ip in ips]))
    return str(path)


class RankGroup(Backend):
    """N backend processes joined in a ring; rank 0 serves gRPC (a Backend), the others follow.

    `prefix[r]` runs rank r under another command (e.g. `ip netns exec NS`); `rank_env[r]` adds
    to rank r's environment.
    """

    def __init__(self, ranks: int, workdir: Path, env: Optional[Dict[str, str]] = None,
                 ips: Optional[List[str]] = None, prefix: Optional[List[List[str]]] = None,
                 log_name: str = "group", rank_env: Optional[Dict[int, Dict[str, str]]] = None):
        ips = ips or ["127.0.0.1"] * ranks
        hf = hostfile(workdir / f"{log_name}-hosts.json", ips)
        prefix = prefix or [[] for _ in range(ranks)]
        self.addr = f"{ips[0]}:{free_port()}"
        self.log_path = str(workdir / f"{log_name}-rank0.log")
        self.followers: List[subprocess.Popen] = []
        base = dict(os.environ, MLX_HOSTFILE=hf, MLX_BACKEND_GROUP_SECRET=GROUP_SECRET)
        base.update(env or {})
        for rank in range(1, ranks):
            out = open(workdir / f"{log_name}-rank{rank}.log", "ab")
            self.followers.append(subprocess.Popen(
                prefix[rank] + [sys.executable, os.path.join(BACKEND_DIR, "backend.py")],
                env=dict(base, MLX_RANK=str(rank), **(rank_env or {}).get(rank, {})), stdout=out,
                stderr=subprocess.STDOUT))
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            prefix[0] + [sys.executable, os.path.join(BACKEND_DIR, "backend.py"), "--addr", self.addr],
            env=dict(base, MLX_RANK="0", **(rank_env or {}).get(0, {})), stdout=out, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(self.addr)
        self.stub = backend_pb2_grpc.BackendStub(self.channel)
        self.raw_stub = self.stub

    @property
    def procs(self) -> List[subprocess.Popen]:
        return [self.proc] + self.followers

    def wait_all_exited(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs):
                return True
            time.sleep(0.1)
        return False

    def stop(self, timeout: float = 15.0) -> int:
        code = super().stop(timeout)
        if not self.wait_all_exited(timeout):
            for p in self.followers:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return code

    def stream(self, opts, timeout: float = 120.0):
        return self.stub.PredictStream(opts, timeout=timeout)


def greedy(prompt: str, tokens: int, **fields) -> "backend_pb2.PredictOptions":
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=tokens, Temperature=0.0, IgnoreEOS=True,
                                      Logprobs=1, TopLogprobs=2, **fields)

"""The servers a user would run instead of ours, as an operator would start them.

Each runs from its own venv (peer_venvs), on a loopback port, with OpenBLAS preloaded as
our server preloads it (common/openblas.py), and with a HOME of its own for the one run:
vllm-mlx saves its prefix cache under ~/.cache/vllm-mlx/prefix_cache/<model> at shutdown
and loads it at start (vllm_mlx/server.py, _get_cache_dir); rapid-mlx keeps
~/.cache/rapid-mlx/prefix_cache/<model>--<digest> and kv_checkpoints
(rapid_mlx/runtime/cache.py, runtime/disk_kv_checkpoint.py). A fresh HOME per run means no
run starts warm from an earlier one; what a run wrote there is measured, then removed.
"""

import contextlib
import http.client
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

from common.launcher import free_port
from common.openblas import DEFAULT_LIB
from peer_venvs import folder_size

log = logging.getLogger("bench-peers")

START_TIMEOUT_S = 600.0  # the first start of a torch-importing peer on a busy machine takes minutes
MLX_PIN = "mlx[cpu]==0.32.4"  # the MLX our venv runs, for every peer (each accepts it)


@dataclass(frozen=True)
class Peer:
    name: str
    label: str  # the table's row
    packages: Tuple[str, ...]
    argv: Callable[[str, str, int], List[str]]  # (venv bin folder, model dir, port)
    disk_caches: Tuple[str, ...] = ()  # under HOME: where it keeps prefix caches across runs


PEERS = [
    Peer("mlx-lm", "mlx_lm.server 0.32.2", ("mlx-lm==0.32.2", MLX_PIN),
         lambda bin_, model, port: [os.path.join(bin_, "mlx_lm.server"), "--model", model,
                                    "--host", "127.0.0.1", "--port", str(port)]),
    # Without --continuous-batching it serves one request at a time and answers 503 to the others.
    Peer("vllm-mlx", "vllm-mlx 0.6.0 `--continuous-batching`", ("vllm-mlx==0.6.0", MLX_PIN),
         lambda bin_, model, port: [os.path.join(bin_, "vllm-mlx"), "serve", model, "--host", "127.0.0.1",
                                    "--port", str(port), "--continuous-batching"],
         (".cache/vllm-mlx",)),
    Peer("rapid-mlx", "rapid-mlx 0.16.10", ("rapid-mlx==0.16.10", MLX_PIN),
         lambda bin_, model, port: [os.path.join(bin_, "rapid-mlx"), "serve", model, "--host", "127.0.0.1",
                                    "--port", str(port)],
         (".cache/rapid-mlx",)),
]
BY_NAME = {p.name: p for p in PEERS}


def openblas_env() -> Dict[str, str]:
    lib = os.environ.get("MLX_BACKEND_OPENBLAS_LIB", DEFAULT_LIB)
    if not os.path.exists(lib):
        return {}
    preload = os.environ.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": f"{lib}:{preload}" if preload else lib}


def process_tree(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def uses_openblas(pid: int) -> bool:
    """Whether any process of the tree under `pid` has OpenBLAS mapped (the preload took)."""
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/maps") as f:
                if "openblas" in f.read():
                    return True
        except OSError:
            pass
    return False


def _answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/v1/models")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and any workers it started
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def running(peer: Peer, python: str, model: str, log_path: str, report: Dict) -> Iterator[int]:
    """The peer serving `model` on a fresh port (yielded) until the block ends; `report` gets
    whether OpenBLAS was mapped and how much it wrote to its disk caches."""
    home = tempfile.mkdtemp(prefix=f"bench-peers-home-{peer.name}-")
    port = free_port()
    env = dict(os.environ, HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RAPID_MLX_TELEMETRY="0", DO_NOT_TRACK="1",
               **openblas_env())
    argv = peer.argv(os.path.dirname(python), model, port)
    with open(log_path, "ab") as out:
        out.write(f"\n==== {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{peer.name} exited with {proc.returncode} before serving (see {log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{peer.name} did not answer within {START_TIMEOUT_S:.0f} s (see {log_path})")
            time.sleep(0.5)
        report["openblas"] = uses_openblas(proc.pid)
        yield port
    finally:
        _stop(proc)
        report["disk_cache_bytes"] = {c: _size(os.path.join(home, c)) for c in peer.disk_caches}
        shutil.rmtree(home, ignore_errors=True)


def _size(path: str) -> int:
    return folder_size(path) if os.path.exists(path) else 0


def selected(names: Sequence[str]) -> List[Peer]:
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]

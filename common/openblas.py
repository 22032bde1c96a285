"""Preload Debian's OpenBLAS for MLX's CPU backend on Linux.

mlx-cpu's bundled reference BLAS is 5-15x slower for float32 matmuls.
LD_PRELOAD only takes effect when a process starts, so the process re-execs
itself once (same pid, same argv). MLX_BACKEND_OPENBLAS=0 opts out.
"""

import os
import sys

DEFAULT_LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"


def preloaded() -> bool:
    return "openblas" in os.environ.get("LD_PRELOAD", "")


def maybe_reexec_with_openblas() -> None:
    if not sys.platform.startswith("linux") or os.environ.get("MLX_BACKEND_OPENBLAS", "1") == "0":
        return
    lib = os.environ.get("MLX_BACKEND_OPENBLAS_LIB", DEFAULT_LIB)
    if preloaded() or not os.path.exists(lib):
        return
    preload = os.environ.get("LD_PRELOAD", "")
    env = dict(os.environ, LD_PRELOAD=f"{lib}:{preload}" if preload else lib)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

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


def preload_env():
    """This process's environment with OpenBLAS preloaded, or None when it is not to be (not
    Linux, opted out, no library, or already preloaded). Tests start their oracle processes
    with it, so the library computes there with the BLAS the backend computes with."""
    if not sys.platform.startswith("linux") or os.environ.get("MLX_BACKEND_OPENBLAS", "1") == "0":
        return None
    lib = os.environ.get("MLX_BACKEND_OPENBLAS_LIB", DEFAULT_LIB)
    if preloaded() or not os.path.exists(lib):
        return None
    preload = os.environ.get("LD_PRELOAD", "")
    return dict(os.environ, LD_PRELOAD=f"{lib}:{preload}" if preload else lib)


def maybe_reexec_with_openblas() -> None:
    env = preload_env()
    if env is not None:
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

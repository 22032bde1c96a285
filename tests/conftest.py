"""Shared fixtures: the real backend process with the real embedded model."""

import atexit
import os
import shutil
import sys
import tempfile
import threading

import grpc
import pytest
from hypothesis import HealthCheck, settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The test folders (unit/, e2e/) import the shared support modules here (models, fixtures,
# oracles) by bare name, as the benches under bench/ do.
sys.path[:0] = [os.path.join(REPO, "backend"), REPO, os.path.dirname(os.path.abspath(__file__))]

from common.launcher import Backend  # noqa: E402
from common.openblas import preload_env  # noqa: E402

# Hermetic: a run never reads the user's cache (MLX_BACKEND_CACHE_DIR, store.py). What the
# tests convert or keep in this process goes to this run's own store root, and every server a
# test starts gets a store root of its own (unless its test names one: a test about sharing),
# so no server reads another's prefix-cache files or lane verdicts: an earlier run's files
# would make a cold request warm, or skip a lane check, depending on the order the tests ran
# in. Each server's root is given hard links of the GGUF conversions this run has made (the
# embedded model, converted once, ~4 s): a conversion is a deterministic function of its file,
# verified at every load, and the store never writes a kept file in place.
_RUN = tempfile.mkdtemp(prefix="mlx-backend-test-cache-")
os.environ["MLX_BACKEND_CACHE_DIR"] = os.path.join(_RUN, "run")
os.environ.pop("MLX_BACKEND_PROMPT_CACHE_DIR", None)
atexit.register(shutil.rmtree, _RUN, True)
_start = Backend.__init__


def own_cache_root() -> str:
    """A fresh store root, holding hard links of this run's GGUF conversions."""
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    gguf_to_mlx_dir(embedded_default())  # once per run; then found
    root = tempfile.mkdtemp(dir=_RUN, prefix="server-")
    os.chmod(root, 0o700)
    converted = os.path.join(os.environ["MLX_BACKEND_CACHE_DIR"], "gguf")
    shutil.copytree(converted, os.path.join(root, "gguf"), copy_function=os.link,
                    ignore=lambda folder, names: [n for n in names if n.startswith(".")] if folder == converted else [])
    return root


def _own_cache(self, env=None, *args, **kwargs):
    env = dict(env or {})
    if "MLX_BACKEND_CACHE_DIR" not in env:
        env["MLX_BACKEND_CACHE_DIR"] = own_cache_root()
    _start(self, env, *args, **kwargs)


Backend.__init__ = _own_cache

# Every run draws the same examples (a red run can be replayed as it was), and no example is
# judged by wall time: this machine is shared, a slow example is not a failing one.
settings.register_profile("suite", derandomize=True, deadline=None, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])  # new draws
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


def serving(log_path, model="", env=None, **load_fields):
    """Fixture body: a healthy backend with `model` loaded, stopped afterwards."""
    backend = Backend(env=env, log_path=str(log_path))
    try:
        backend.wait_healthy()
        result = backend.load(model, **load_fields)
        assert result.success, result.message
        yield backend
    finally:
        backend.stop()


def completion_line(log_path, label: str) -> str:
    """The server log's completion line of the request labelled `label` (its CorrelationId)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if f"({label})" in line and "completion" in line:
                return line
    raise AssertionError(f"no log line for {label}")


def run_threads(fns):
    """Call each function on its own thread; their results, or the RpcError each raised."""
    results = [None] * len(fns)

    def run(i):
        try:
            results[i] = fns[i]()
        except grpc.RpcError as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.fixture(scope="session")
def server(log_dir):
    """One backend with the embedded SmolLM2 GGUF loaded, shared by the e2e tests."""
    from loaders.model_loader import embedded_default

    # Loaded by path, so requests that name another ModelIdentity are refused.
    yield from serving(log_dir / "server.log", embedded_default())


@pytest.fixture
def stub(server):
    return server.stub


def after_restart(root, log_dir, name, first_work):
    """Fixture body: a server on the prefix-cache folder under `root` runs `first_work(server)`
    and is stopped with SIGTERM (its warm entries written within the grace); yields
    (a second server started on the same folder, its log path), stopped afterwards."""
    env = {"MLX_BACKEND_CACHE_DIR": str(root), "MLX_BACKEND_PROMPT_CACHE_DIR": str(root / "prompt-cache")}
    first = Backend(env=env, log_path=str(log_dir / f"{name}-first.log"))
    try:
        first.wait_healthy()
        first_work(first)
    finally:
        assert first.stop() == 0
    second_log = log_dir / f"{name}-second.log"
    second = Backend(env=env, log_path=str(second_log))
    try:
        second.wait_healthy()
        yield second, second_log
    finally:
        second.stop()


def pytest_configure(config):
    """The tests run with OpenBLAS preloaded, as the server runs: the in-process engine tests
    load the model the server would (float32 on the CPU with OpenBLAS, as the loader chooses)
    and compute at its speed (without it, ~10 prompt tokens a second: one admission test took
    two minutes). LD_PRELOAD is read only at a process's start, so pytest runs again, with the
    same arguments, before it collects anything; the servers the tests start inherit it (the
    package test starts its own with a host's environment, where the server preloads itself)."""
    env = preload_env()
    if env is None:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    sys.stdout.flush()
    sys.stderr.flush()
    shutil.rmtree(_RUN, True)
    os.execve(sys.executable, [sys.executable, "-m", "pytest", *config.invocation_params.args], env)


def pytest_collection_modifyitems(config, items):
    """Every test under e2e/ is an e2e test (`make unit` deselects it) even if its module forgot
    the mark; unit/ may still mark a single test e2e (test_ports: one test starts two servers)."""
    e2e_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e") + os.sep
    for item in items:
        if str(item.path).startswith(e2e_dir):
            item.add_marker(pytest.mark.e2e)

"""Shared fixtures: the real backend process with the real embedded model."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO]

from common.launcher import Backend  # noqa: E402


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def server(log_dir):
    """One backend with the embedded SmolLM2 GGUF loaded, shared by the e2e tests."""
    backend = Backend(log_path=str(log_dir / "server.log"))
    backend.wait_healthy()
    from model_loader import embedded_default

    # Loaded by path, so requests that name another ModelIdentity are refused.
    result = backend.load(embedded_default())
    assert result.success, result.message
    yield backend
    backend.stop()


@pytest.fixture
def stub(server):
    return server.stub

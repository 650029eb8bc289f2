"""Shared fixtures: paths to the shared recordings, one engine per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DIARIST_TEST_DATA", REPO.parent / "shared" / "data"))


def data_file(rel: str) -> Path:
    """A file under the shared data folder; skips the test when it is not there."""
    p = DATA / rel
    if not p.is_file():
        pytest.skip(f"shared test data not found: {p} (set DIARIST_TEST_DATA)")
    return p


@pytest.fixture(scope="session")
def whisper_engine():
    """The bundled tiny.en on CPU, loaded once per session (inline stepping, no loop thread)."""
    from engine import Engine, EngineConfig

    return Engine(EngineConfig(model="whisper", kv_budget_bytes=512 << 20, max_running_requests=24))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a test module with one intra-op thread: tiny shapes pay more in thread synchronisation than
    they gain, badly so on shared cores. Restores the previous count afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

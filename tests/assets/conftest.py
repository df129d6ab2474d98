"""Fixtures of the install-asset tests (run by scripts/check-install-assets.sh)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools import REPO, Assets


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    return Assets(work=tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="session")
def modelgate_bin() -> Path:
    """The binary the assets run against: MODELGATE_BIN, else the one cargo test built."""
    if os.environ.get("MODELGATE_BIN"):
        return Path(os.environ["MODELGATE_BIN"])
    for candidate in (REPO / "target" / "debug" / "modelgate", REPO / "target" / "release" / "modelgate"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no target/debug/modelgate (cargo build, or set MODELGATE_BIN)")


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The corpus: MODELGATE_CORPUS, else as scripts/inputs.sh resolves it ($MODELGATE_INPUTS_DIR/corpus,
    default .inputs/corpus)."""
    inputs = REPO / os.environ.get("MODELGATE_INPUTS_DIR", ".inputs")
    path = Path(os.environ.get("MODELGATE_CORPUS", inputs / "corpus"))
    assert (path / "kserve" / "localmodelcache_readme_objects.yaml").is_file(), (
        f"corpus not found at {path} (scripts/inputs.sh resolves it; or set MODELGATE_CORPUS)"
    )
    return path

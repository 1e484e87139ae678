"""Fixtures for the model repository tests (helpers in repo_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from repo_support import Artifact, FakeClock, make_artifact
from tierlink.repo.signing import public_key_string


@pytest.fixture(scope="session")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="session")
def other_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="session")
def public(key: Ed25519PrivateKey) -> str:
    return public_key_string(key)


@pytest.fixture
def artifact(tmp_path: Path, key: Ed25519PrivateKey) -> Artifact:
    return make_artifact(tmp_path / "a", key)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()

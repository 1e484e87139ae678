"""The fleet file's security: section."""

from __future__ import annotations

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet, with_tls
from tierlink.settings.security import SecurityConfig, parse_security

NODES = {"nodes": [{"id": "d", "tier": "device", "models": ["fmnist-small"]}]}


def test_defaults_are_an_open_fleet() -> None:
    assert parse_security({}) == SecurityConfig()
    assert parse_fleet(NODES).security.tls is False


def test_tls_settings_are_read_and_checked() -> None:
    config = parse_fleet({**NODES, "security": {"tls": True, "client_auth": "required",
                                                "cert_ttl_s": 60, "ca_dir": "/tmp/ca"}})
    assert config.security == SecurityConfig(True, "required", 60.0, "/tmp/ca")
    assert with_tls(parse_fleet(NODES), True).security.tls is True
    for bad in ({"client_auth": "sometimes"}, {"cert_ttl_s": 1}, {"tsl": True}):
        with pytest.raises(ConfigError):
            parse_security(bad)

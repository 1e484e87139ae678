"""An application's client on a TLS fleet verifies the node by the identity its certificate
carries, not by the URL's address, and refuses half a key pair with a clear error."""

from pathlib import Path

import httpx
import pytest

from tierlink.client.tls import ClientTLS, client_options
from tierlink.errors import ConfigError


def test_the_node_is_reached_by_its_identity_and_anything_else_as_the_control_plane() -> None:
    tls = ClientTLS(ca="ca.pem", node="dev-1")
    assert tls.host_for(httpx.URL("https://127.0.0.1:8443/v2/models/fmnist/infer"),
                        "https://127.0.0.1:8443") == "dev-1.node.tierlink.internal"
    assert tls.host_for(httpx.URL("https://127.0.0.1:7000/v1/results/abc"),
                        "https://127.0.0.1:8443") == "control.tierlink.internal"


def test_no_tls_changes_nothing() -> None:
    assert client_options(None, "http://x") == {}
    assert client_options(None, "http://x", asynchronous=True) == {}


def test_bad_tls_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="certificate and its key together"):
        ClientTLS(ca=tmp_path / "ca.pem", node="dev-1", cert=tmp_path / "a.pem").context()
    with pytest.raises(ConfigError, match="cannot load the fleet's TLS files"):
        ClientTLS(ca=tmp_path / "missing.pem", node="dev-1").context()

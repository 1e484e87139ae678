"""What a sender may claim about a request (pure): applications speak for the node they
call, nodes for themselves and the tiers below, and a local input never arrives from a peer."""

from __future__ import annotations

from typing import Any

import pytest

from tierlink.core.types import Tier
from tierlink.security.claims import Refusal, bind_claims
from tierlink.security.pki import CertIdentity

TIERS = {"dev-1": Tier.DEVICE, "dev-2": Tier.DEVICE, "edge-1": Tier.EDGE,
         "edge-2": Tier.EDGE, "cloud-1": Tier.CLOUD}
DEV1 = CertIdentity("node", "dev-1", "device")
EDGE2 = CertIdentity("node", "edge-2", "edge")
APP = CertIdentity("client", "app")


def bind(sender: CertIdentity | None, receiver: str = "edge-1", **params: Any) -> Any:
    params = {k.replace("_", "."): v for k, v in params.items()}
    return bind_claims(receiver, sender, params, TIERS.get)


def reason(result: Any) -> str | None:
    return result.reason if isinstance(result, Refusal) else None


@pytest.mark.parametrize("sender", [None, APP, CertIdentity("operator", "ops")])
def test_applications_speak_for_the_node_they_call(sender: CertIdentity | None) -> None:
    assert bind(sender, tierlink_privacy="local") == {"tierlink.privacy": "local"}
    assert reason(bind(sender, tierlink_origin="edge-1")) is None
    assert reason(bind(sender, tierlink_origin="dev-1")) == "forged_origin"
    assert reason(bind(sender, tierlink_hops=1)) == "unauthenticated_peer"


def test_a_node_without_an_origin_is_the_origin() -> None:
    assert bind(DEV1, tierlink_privacy="any")["tierlink.origin"] == "dev-1"


def test_a_device_relays_only_its_own_inputs() -> None:
    assert reason(bind(DEV1, tierlink_origin="dev-1")) is None
    assert reason(bind(DEV1, tierlink_origin="dev-2")) == "forged_origin"
    assert reason(bind(DEV1, tierlink_origin="unknown-device")) == "forged_origin"


def test_an_edge_relays_what_comes_from_below_only() -> None:
    cloud = "cloud-1"
    assert reason(bind(EDGE2, cloud, tierlink_origin="dev-2", tierlink_hops=1)) is None
    assert reason(bind(EDGE2, cloud, tierlink_origin="edge-1")) == "forged_origin"
    assert reason(bind(EDGE2, cloud, tierlink_origin="cloud-1")) == "forged_origin"
    assert reason(bind(EDGE2, cloud, tierlink_origin="not-in-view")) is None


def test_nobody_claims_the_input_came_from_the_receiver() -> None:
    assert reason(bind(EDGE2, "cloud-1", tierlink_origin="cloud-1")) == "forged_origin"


@pytest.mark.parametrize("sender", [DEV1, EDGE2])
def test_a_local_input_never_arrives_from_another_node(sender: CertIdentity) -> None:
    assert reason(bind(sender, "cloud-1", tierlink_privacy="local",
                       tierlink_origin=sender.name)) == "local_forwarded"


def test_a_malformed_hop_count_is_left_to_the_request_parser() -> None:
    assert reason(bind(None, tierlink_hops="many")) is None

from dataclasses import replace

import pytest

from tierlink.core.types import Bill, Fallback, Outcome, Priority, Privacy, Tier
from tierlink.errors import InvalidRequest
from tierlink.node import protocol


def test_defaults_when_a_client_sends_no_parameters():
    req = protocol.parse_request("fmnist", {}, request_id="r", receiver="dev-1", input_bytes=10)
    assert req.origin == "dev-1" and req.privacy is Privacy.ANY
    assert req.priority is Priority.INTERACTIVE and req.deadline_ms == protocol.DEFAULT_DEADLINE_MS


def test_a_node_that_fails_closed_takes_a_request_without_a_level_as_local():
    closed = {"request_id": "r", "receiver": "dev-1", "input_bytes": 10,
              "default_privacy": "local"}
    assert protocol.parse_request("fmnist", {}, **closed).privacy is Privacy.LOCAL
    said = protocol.parse_request("fmnist", {"tierlink.privacy": "any"}, **closed)
    assert said.privacy is Privacy.ANY  # a request that names its level keeps it


def test_forwarded_parameters_round_trip_with_one_more_hop():
    req = protocol.parse_request("fmnist", {"tierlink.privacy": "site",
                                            "tierlink.priority": "realtime"},
                                 request_id="r", receiver="dev-1", input_bytes=10)
    fwd = protocol.forward_params(req, 42.0, "00-abc-def-01")
    again = protocol.parse_request("fmnist", fwd, request_id="r", receiver="edge-1",
                                   input_bytes=10)
    assert again.origin == "dev-1" and again.hops == 1 and again.deadline_ms == 42.0
    assert again.privacy is Privacy.SITE and again.priority is Priority.REALTIME
    assert fwd["traceparent"] == "00-abc-def-01"


def test_only_a_node_mirrors_a_request_and_the_flag_travels_up():
    with pytest.raises(InvalidRequest, match="set by the node that mirrors an answer"):
        protocol.parse_request("t", {"tierlink.mirror": True}, request_id="r", receiver="n",
                               input_bytes=0)
    with pytest.raises(InvalidRequest, match="tierlink.mirror must be true or false"):
        protocol.parse_request("t", {"tierlink.mirror": "yes", "tierlink.hops": 1},
                               request_id="r", receiver="n", input_bytes=0)
    req = protocol.parse_request("t", {}, request_id="r", receiver="dev-1", input_bytes=0)
    fwd = protocol.forward_params(replace(req, mirror=True), 500.0, None)
    again = protocol.parse_request("t", fwd, request_id="r", receiver="edge-1", input_bytes=0)
    assert again.mirror and again.hops == 1
    assert "tierlink.mirror" not in protocol.forward_params(req, 500.0, None)


def test_an_escalation_says_so_upstream_and_a_client_may_say_it_too():
    """A node that escalates marks what it sends (the receiver refuses it first when busy);
    an application holding an answer of its own may set the flag; it must be a boolean."""
    req = protocol.parse_request("t", {}, request_id="r", receiver="dev-1", input_bytes=0)
    assert not req.escalation
    assert "tierlink.escalation" not in protocol.forward_params(req, 500.0, None)
    fwd = protocol.forward_params(replace(req, escalation=True), 500.0, None)
    again = protocol.parse_request("t", fwd, request_id="r", receiver="edge-1", input_bytes=0)
    assert again.escalation and again.hops == 1
    # ...and it stays marked on the next hop
    assert protocol.forward_params(again, 400.0, None)["tierlink.escalation"] is True
    client = protocol.parse_request("t", {"tierlink.escalation": True}, request_id="r",
                                    receiver="dev-1", input_bytes=0)
    assert client.escalation and client.hops == 0
    with pytest.raises(InvalidRequest, match="tierlink.escalation must be true or false"):
        protocol.parse_request("t", {"tierlink.escalation": 1}, request_id="r",
                               receiver="n", input_bytes=0)


@pytest.mark.parametrize("params, name", [
    ({"tierlink.deadline_ms": "soon"}, "deadline"),
    ({"tierlink.privacy": "secret"}, "privacy"),
    ({"tierlink.priority": "urgent"}, "priority"),
    ({"tierlink.hops": -1}, "hops"),
])
def test_bad_parameters_name_themselves(params, name):
    with pytest.raises(InvalidRequest, match=name):
        protocol.parse_request("t", params, request_id="r", receiver="n", input_bytes=0)


def test_outcome_round_trips_through_response_parameters():
    out = Outcome("cloud-1", Tier.CLOUD, "fmnist-large", ("dev-1", "edge-1", "cloud-1"), 0.97,
                  escalations=2, fallbacks=(Fallback("edge-2", "timeout", "slow"),),
                  bill=Bill.of_compute(Tier.CLOUD, 1e-6) + Bill.of_transfer(Tier.CLOUD, 2e-7)
                  + Bill.of_compute(Tier.DEVICE, 3e-9))
    back = protocol.parse_outcome(protocol.outcome_params(out, 12.5))
    assert back.path == out.path and back.fallbacks == out.fallbacks
    assert back.bill == out.bill and back.cost == out.cost == pytest.approx(1.203e-6)
    assert back.timings_ms["server_ms"] == 12.5


@pytest.mark.parametrize("bad", ['{"compute": {"mars": 1}}', '{"energy": {"cloud": 1}}',
                                 '[1, 2]', '{"compute": 3}', "{"])
def test_a_malformed_bill_from_an_upstream_is_named(bad):
    params = protocol.outcome_params(Outcome("c", Tier.CLOUD, "m", ("c",), 0.9), 1.0)
    with pytest.raises(InvalidRequest, match="lacks routing parameters"):
        protocol.parse_outcome({**params, protocol.COST: bad})


def test_an_asynchronous_request_may_have_a_deadline_of_hours():
    six_hours = {protocol.DEADLINE: 6 * 3_600_000.0}
    req = protocol.parse_request("t", six_hours, request_id="r", receiver="n", input_bytes=0,
                                 asynchronous=True)
    assert req.deadline_ms == 6 * 3_600_000.0
    with pytest.raises(InvalidRequest, match="not a usable deadline") as err:
        protocol.parse_request("t", six_hours, request_id="r", receiver="n", input_bytes=0)
    assert "tierlink.async" in err.value.hint
    forwarded = {**six_hours, protocol.HOPS: 1}  # its entry node judged it
    assert protocol.parse_request("t", forwarded, request_id="r", receiver="n",
                                  input_bytes=0).deadline_ms == 6 * 3_600_000.0
    with pytest.raises(InvalidRequest):
        protocol.parse_request("t", {protocol.DEADLINE: 8 * 86_400_000.0}, request_id="r",
                               receiver="n", input_bytes=0, asynchronous=True)

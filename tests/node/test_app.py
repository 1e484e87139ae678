"""The node's OIP app in-process (Starlette TestClient) with the package's fake model."""

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tierlink.core.types import Tier
from tierlink.models.runtime import FakeModel, ModelInfo
from tierlink.node.app import create_app
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.settings.routing import parse_routing
from tierlink.transport import oip


@pytest.fixture()
def client():
    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    service = NodeService(NodeSpec("dev-1", Tier.DEVICE, ()), {"fmnist-small": FakeModel(info)})
    with TestClient(create_app(service, ready=True)) as c:
        yield c


def x(batch=1):
    return np.full((batch, 1, 28, 28), 0.5, dtype=np.float32)


def infer(client, model, params=None, arr=None, binary=True):
    body, headers = oip.encode_infer_request({"input": x() if arr is None else arr}, params,
                                             None, binary_inputs=binary, binary_outputs=binary)
    return client.post(f"/v2/models/{model}/infer", content=body, headers=headers)


def decode(resp):
    return oip.decode_infer_response(resp.content, oip.parse_header_length(
        resp.headers.get("inference-header-content-length")))


def test_health_and_metadata(client):
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2/models/fmnist-small").json()
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}
    assert client.get("/v2/models/fmnist").json()["platform"] == "tierlink_router"
    assert client.get("/v2/models/nope").status_code == 404


@pytest.mark.parametrize("binary", [True, False])
def test_direct_infer_returns_raw_logits(client, binary):
    resp = infer(client, "fmnist-small", binary=binary)
    assert resp.status_code == 200, resp.text
    assert decode(resp).outputs["logits"].shape == (1, 10)


def test_routed_infer_answers_with_outcome(client):
    # a deadline no noise on a loaded CI machine reaches: this test is about the answer
    resp = infer(client, "fmnist", {"tierlink.privacy": "local", "tierlink.deadline_ms": 5000})
    assert resp.status_code == 200, resp.text
    out = decode(resp)
    assert out.outputs["probabilities"].shape == (1, 10)
    assert out.parameters["tierlink.served_by"] == "dev-1"
    assert json.loads(out.parameters["tierlink.path"]) == ["dev-1"]


def test_wrong_shape_is_a_clear_400_and_the_node_keeps_serving(client):
    resp = infer(client, "fmnist-small", arr=np.zeros((1, 3, 28, 28), np.float32))
    assert resp.status_code == 400 and "shape" in resp.json()["error"]
    assert infer(client, "fmnist-small").status_code == 200


def test_asynchronous_on_a_model_is_refused_not_answered_at_once(client):
    resp = infer(client, "fmnist-small", {"tierlink.async": True})
    assert resp.status_code == 400 and "only a task" in resp.json()["error"]
    assert "'fmnist'" in resp.json()["hint"]
    assert infer(client, "fmnist-small").status_code == 200


def test_malformed_body_is_400(client):
    resp = client.post("/v2/models/fmnist-small/infer", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["code"] in ("invalid_request", "invalid_tensor")


def test_privacy_violation_on_receipt_is_refused_and_counted(client):
    params = {"tierlink.privacy": "local", "tierlink.origin": "dev-9"}
    resp = infer(client, "fmnist", params)
    assert resp.status_code == 403 and resp.json()["code"] == "privacy_violation"
    metrics = client.get("/metrics").text
    assert 'tierlink_inputs_received_total{privacy="local",tier="device",verdict="violation"} 1.0' \
        in metrics


def test_a_forwarded_request_out_of_time_is_refused_at_once(client):
    resp = infer(client, "fmnist", {"tierlink.deadline_ms": 0, "tierlink.hops": 1})
    assert resp.status_code == 504 and resp.json()["code"] == "deadline_exceeded"


@pytest.mark.parametrize("deadline", [0, -5, "nan", 1e12])
def test_an_applications_unusable_deadline_is_its_mistake(client, deadline):
    """From an application (no hops yet) a non-positive, NaN or over-limit deadline is a
    400 naming the parameter, not a 504."""
    resp = infer(client, "fmnist", {"tierlink.deadline_ms": deadline})
    assert resp.status_code == 400 and "tierlink.deadline_ms" in resp.json()["error"]


def test_bad_parameter_names_the_field(client):
    resp = infer(client, "fmnist", {"tierlink.privacy": "secret"})
    assert resp.status_code == 400 and "tierlink.privacy" in resp.json()["error"]


def test_policy_override_needs_fleet_permission(client):
    resp = infer(client, "fmnist", {"tierlink.policy": "cloud_only"})
    assert resp.status_code == 400 and "allow_policy_override" in resp.json()["hint"]


def test_metrics_exposition_has_the_vocabulary(client):
    infer(client, "fmnist")
    text = client.get("/metrics").text
    assert "tierlink_requests_total{kind=\"task\",model=\"fmnist\",outcome=\"ok\",tier=\"device\"} 1.0" in text
    for name in ("tierlink_requests_total", "tierlink_request_duration_seconds",
                 "tierlink_queue_depth", "tierlink_inflight_requests",
                 "tierlink_escalations_total", "tierlink_fallbacks_total"):
        assert name in text


def test_a_learning_policy_is_taught_by_each_routed_answer():
    from tierlink.policy.bandit import BanditPolicy

    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    spec = NodeSpec("dev-1", Tier.DEVICE, (), routing=parse_routing({"policy": "bandit"}))
    service = NodeService(spec, {"fmnist-small": FakeModel(info)})
    with TestClient(create_app(service, ready=True)) as c:
        for label in (3, None):
            params = {"tierlink.privacy": "local", "tierlink.deadline_ms": 5000}
            if label is not None:
                params["tierlink.label"] = label
            assert infer(c, "fmnist", params).status_code == 200
        bandit = service.live.router.desk.default
        assert isinstance(bandit, BanditPolicy) and bandit.model.updates == 2


def test_shadow_mode_logs_both_choices_and_the_outcome(tmp_path):
    from tierlink.cli.policy import evaluate_logs

    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    spec = NodeSpec("dev-1", Tier.DEVICE, (), state_dir=str(tmp_path),
                    routing=parse_routing({"shadow": {"policy": "tierlink",
                                                      "weights": {"cost": 0.0},
                                                      "explore": 0.0}}))
    service = NodeService(spec, {"fmnist-small": FakeModel(info)})
    with TestClient(create_app(service, ready=True)) as c:
        for _ in range(3):
            params = {"tierlink.privacy": "local", "tierlink.deadline_ms": 5000}
            assert infer(c, "fmnist", params).status_code == 200
        assert infer(c, "fmnist-small").status_code == 200  # a direct call: not a decision
    log = tmp_path / "shadow.jsonl"
    assert len(log.read_text().splitlines()) == 3
    report = evaluate_logs([log])
    assert report["decisions"] == 3 and report["agreement"] == 1.0
    assert report["candidate_policy"] == {"policy": "tierlink", "explore": 0.0,
                                          "weights": {"accuracy": 1.0, "latency": 1.0,
                                                      "cost": 0.0}}


def test_a_shadow_log_that_cannot_be_written_never_costs_the_answer(tmp_path):
    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    spec = NodeSpec("dev-1", Tier.DEVICE, (), state_dir=str(tmp_path),
                    routing=parse_routing({"shadow": {"policy": "tierlink"}}))
    service = NodeService(spec, {"fmnist-small": FakeModel(info)})
    with TestClient(create_app(service, ready=True)) as c:
        import errno

        class Full:
            def write(self, _text):
                raise OSError(errno.ENOSPC, "No space left on device")

            def close(self):
                return None

        sink = service.live.router.shadow.log
        sink.file.close()
        sink.file = Full()  # writes fail as on a full disk
        params = {"tierlink.privacy": "local", "tierlink.deadline_ms": 5000}
        assert infer(c, "fmnist", params).status_code == 200
        metrics = c.get("/metrics").text
    assert 'tierlink_shadow_decisions_dropped_total{tier="device"} 1.0' in metrics


def test_routed_requests_that_enter_here_are_counted_against_their_deadline(client):
    """``tierlink_sla_requests_total``: met / missed / invalid at the entry node only (a
    request forwarded here was counted where it entered)."""
    def count(priority, result):
        text = client.get("/metrics").text
        line = (f'tierlink_sla_requests_total{{priority="{priority}",result="{result}",'
                f'task="fmnist",tier="device"}}')
        return next((float(row.split()[-1]) for row in text.splitlines()
                     if row.startswith(line)), 0.0)

    assert infer(client, "fmnist", {"tierlink.deadline_ms": 5000}).status_code == 200
    assert infer(client, "fmnist", {"tierlink.deadline_ms": 5000,
                                    "tierlink.priority": "realtime"}).status_code == 200
    assert infer(client, "fmnist", {"tierlink.deadline_ms": 5000,
                                    "tierlink.hops": 1}).status_code == 200  # forwarded
    assert infer(client, "fmnist", {"tierlink.deadline_ms": 5000},
                 arr=np.zeros((1, 3), np.float32)).status_code == 400
    assert count("interactive", "met") == 1 and count("realtime", "met") == 1
    assert count("interactive", "invalid") == 1 and count("interactive", "missed") == 0


def test_a_device_that_fails_closed_holds_a_request_without_a_level_as_local():
    from dataclasses import replace

    info = ModelInfo("fmnist-small", "fmnist", "1", accuracy=0.9, latency_ms=0.5)
    spec = replace(NodeSpec("dev-1", Tier.DEVICE, ()), default_privacy="local")
    service = NodeService(spec, {"fmnist-small": FakeModel(info)})
    with TestClient(create_app(service, ready=True)) as c:
        assert infer(c, "fmnist").status_code == 200
        assert infer(c, "fmnist", {"tierlink.privacy": "any"}).status_code == 200
        text = c.get("/metrics").text
    received = {privacy: sum(float(row.split()[-1]) for row in text.splitlines()
                             if row.startswith("tierlink_inputs_received_total{")
                             and f'privacy="{privacy}"' in row)
                for privacy in ("local", "any")}
    assert received == {"local": 1.0, "any": 1.0}


def test_a_node_spec_refuses_an_unknown_default_privacy():
    from tierlink.errors import ConfigError

    with pytest.raises(ConfigError, match="default_privacy"):
        NodeSpec("dev-1", Tier.DEVICE, (), default_privacy="secret")


def test_an_overloaded_node_sheds_batch_with_a_retry_hint_and_serves_realtime(client):
    from dataclasses import replace

    gate = client.app.state.overload
    # Calm here: it must not climb back; and requests count as competing (min_inflight 0:
    # one at a time, nothing would be shed).
    gate.config = replace(gate.config, step_up=1e-9, min_inflight=0)
    gate.level = 1.0  # as after its event loop ran late for a while: realtime only
    gate.competing = True
    params = {"tierlink.privacy": "local", "tierlink.deadline_ms": 5000,
              "tierlink.priority": "batch"}
    refused = infer(client, "fmnist", params)  # with the hint header: shed before the body
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["code"] == "admission_refused" and "overloaded" in refused.text
    body, headers = oip.encode_infer_request({"input": x()}, params, None)
    headers = {k: v for k, v in headers.items() if not k.startswith("tierlink-")}
    bare = client.post("/v2/models/fmnist/infer", content=body, headers=headers)
    assert bare.status_code == 429 and bare.headers["retry-after"] == "1"  # by its parameters
    served = infer(client, "fmnist", {**params, "tierlink.priority": "realtime"})
    assert served.status_code == 200, served.text
    status = client.get("/tierlink/v1/status").json()["overload"]
    assert status["level"] == pytest.approx(1.0) and status["admitting"] == ["realtime"]
    metrics = client.get("/metrics").text
    assert 'tierlink_overload_shed_total{outcome="refused",priority="batch",tier="device"} 2.0' \
        in metrics

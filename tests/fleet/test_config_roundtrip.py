"""One typed configuration chain: a fleet file is parsed once into typed sections that
write themselves out again — ``parse(serialize(parse(f))) == parse(f)``, every key the user
wrote kept — and the nodes receive those sections, typed, through their spec files."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tierlink.core.types import Tier
from tierlink.fleet.config import FleetConfig, load_fleet, parse_fleet
from tierlink.node.spec import NodeSpec

ROOT = Path(__file__).resolve().parents[2]

NODES = """
nodes:
  - {id: cloud-1, tier: cloud, models: [fmnist-large]}
  - {id: dev-1, tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: cloud-1, delay_ms: 5}
"""

# One fleet file per section, each setting of the section written (not the defaults).
SECTIONS = {
    "routing": """
routing:
  policy: {name: bandit, options: {prior_weight: 12}}
  weights: {accuracy: 1.5, latency: 0.5, cost: 3}
  thresholds: {fmnist-small: 0.93}
  default_threshold: 0.85
  max_hops: 2
  reserve_ms: 7.5
  allow_policy_override: true
  retry_budget: 0.1
  breaker: {failure_threshold: 4, cooldown_s: 1.5, max_cooldown_s: 20}
  local_features_may_leave: true
  probe_idle_s: 3
  hedging: {enabled: false, quantile: 0.9, budget: 0.1, min_samples: 5, window: 50,
            min_delay_ms: 1}
  overload: {enabled: true, target_lag_ms: 30, probe_ms: 4, window_s: 0.3, step_down: 0.2,
             step_up: 0.05, max_wait_s: 0.1, retry_after_s: 2, min_inflight: 3}
  split_codec_loss: {int8: 0.12}
  cascade:
    tuned_on: {fmnist-small: 0123456789abcdef0123}
    records:
      fmnist-small: {share: 1.0, accuracy: 0.81234, threshold: 0.93, answered: 0.6,
                     answered_accuracy: 0.97}
      fmnist-small>fmnist-large: {share: 0.4, accuracy: 0.9}
    target: {accuracy_drop: 0.5, confidence: 0.9}
  accuracy_tolerance: 0.4
  bandit: {reward: {accuracy: 1, latency: 0.02, miss: 0.4, cost: 0.01, energy: 0.1,
                    privacy: 0.05}}
  shadow: {policy: {name: bandit, options: {prior_weight: 3}}, weights: {cost: 0},
           explore: 0.1}
  device_state: {low_battery: 0.3, hot: fair}
""",
    "cost": """
cost:
  compute_usd_per_s: {cloud: 0.001, edge: 0.0001}
  transfer_usd_per_gb: {cloud: 0.09}
""",
    "hard_examples": """
control: {tier: edge}
hard_examples: {enabled: true, sample_rate: 0.25, max_queue: 10, batch_size: 4,
                flush_interval_s: 0.5}
""",
    "tracing": """
tracing: {otlp_endpoint: "http://127.0.0.1:4318", protocol: http/protobuf, sample_ratio: 0.2}
""",
    "tracing_collect": """
tracing: {collect: true}
""",
    "security": """
security: {tls: true, client_auth: required, cert_ttl_s: 3600, ca_dir: /tmp/ca}
""",
    "control": """
control: {port: 8123, ttl_s: 2, tier: cloud, store: etcd, replicas: 2, etcd_members: 3}
""",
    "top_level": """
name: every-top-key
seed: 42
zoo: {profile: test}
trusted_keys: ["ed25519:AAAA"]
fault_injection: true
topology: static
tasks:
  spam:
    kind: classification
    input: {name: tokens, datatype: INT64, shape: [-1, 256]}
    outputs: {scores: logits}
    labels: [ham, spam]
""",
}

NODE_FILE = """
name: every-node-key
nodes:
  - {id: cloud-1, tier: cloud, models: [fmnist-large], heads: [], workers: 2, max_queue: 64,
     escalation_queue: 6, engine: ray, ray: {min_replicas: 1, max_replicas: 3, num_cpus: 0.25},
     labels: {region: eu}, advertise_url: "http://10.0.0.1:9000",
     chat: {task: chat, models: [{name: smollm2, model: smollm2-135m}]}}
  - {id: dev-1, tier: device, models: [fmnist-small], heads: [fmnist-large], cpu_quota: 0.5,
     providers: [CPUExecutionProvider], default_privacy: local, labels: {region: eu},
     device_state_file: /run/dev-1/state.json,
     chat: {models: [{name: smollm2, model: smollm2-135m, quantize: int8,
                      verifier: cloud-1/smollm2, kv_cache_mib: 12, max_sequences: 4,
                      quality: 0.5, kv_move: always, kv_codec: fp32}]}}
  - {id: dev-2, tier: device, models: [fmnist-small]}
links:
  - {from: [dev-1, dev-2], to: cloud-1, delay_ms: 5, jitter_ms: 1, bandwidth_mbit: 20,
     loss: 0.01}
"""


def round_trip(config: FleetConfig) -> FleetConfig:
    """Through YAML text, as a file would go."""
    return parse_fleet(yaml.safe_load(yaml.safe_dump(config.to_dict(), sort_keys=False)))


def leaves(data: Any, prefix: str = "") -> Iterator[str]:
    """Every key path of a mapping (a list's items as one level: ``nodes[].id``)."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
            yield f"{prefix}.{key}" if prefix else str(key)
    elif isinstance(data, list):
        for item in data:
            yield from leaves(item, f"{prefix}[]")


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_each_section_round_trips_and_keeps_every_key_written(section: str) -> None:
    raw = yaml.safe_load(SECTIONS[section] + NODES)
    parsed = parse_fleet(raw)
    assert round_trip(parsed) == parsed
    written = set(leaves(parsed.to_dict()))
    assert set(leaves(raw)) - written == set()


def test_nodes_and_links_round_trip_with_every_key() -> None:
    raw = yaml.safe_load(NODE_FILE)
    parsed = parse_fleet(raw)
    assert round_trip(parsed) == parsed
    # a link's node lists are written as one link per pair
    assert [(link["from"], link["to"]) for link in parsed.to_dict()["links"]] == [
        ("dev-1", "cloud-1"), ("dev-2", "cloud-1")]
    written = set(leaves(parsed.to_dict()))
    assert {k for k in leaves(raw) if not k.startswith("links")} - written == set()


@pytest.mark.parametrize("path", ["src/tierlink/demo/fleets/fleet.yaml",
                                  "src/tierlink/demo/fleets/chat-fleet.yaml",
                                  "examples/byo/fleet.yaml", "examples/python_model/fleet.yaml"])
def test_the_shipped_fleet_files_round_trip(path: str) -> None:
    parsed = load_fleet(ROOT / path)
    assert round_trip(parsed) == parsed


def test_nodes_receive_the_typed_sections_through_their_spec_files() -> None:
    fleet = parse_fleet(yaml.safe_load(SECTIONS["routing"] + SECTIONS["hard_examples"]
                                       + NODES))
    node = fleet.node("cloud-1")
    spec = NodeSpec("cloud-1", Tier.CLOUD, (), routing=fleet.routing,
                    hard_examples=fleet.hard_examples, engine=node.engine)
    again = NodeSpec.from_json(spec.to_json())
    assert again == spec
    assert again.routing == fleet.routing and again.routing.policy_options["prior_weight"] == 12
    assert again.hard_examples.store_tier is Tier.EDGE

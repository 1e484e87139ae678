"""The llama.cpp runtime on real node processes: a device serving SmolLM2's GGUF as it
ships (``runtime: llama.cpp``) answers the ``openai`` client on its own, and drafts for a
cloud node's torch model — the answer identical to the cloud's own greedy answer."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tierlink.core.types import Tier
from tierlink.llm.source import LMSource
from tierlink.node.spec import NodeSpec, UpstreamSpec
from tierlink.testing.processes import node_process

pytestmark = [pytest.mark.integration, pytest.mark.llama]


@pytest.fixture(scope="module", autouse=True)
def _llama_cpp() -> None:
    """Checked when a test here runs (CI deselects these while it builds the runtime)."""
    pytest.importorskip("llama_cpp", reason="the llama.cpp runtime: ./scripts/setup.sh --llama")

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three fruits."]


def _spec(node_id: str, tier: str, run_dir: Path, **kw: object) -> NodeSpec:
    return NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=(), port=0,
                    ready_file=str(run_dir / f"{node_id}.ready"), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-llama")


@pytest.fixture(scope="module")
def cloud(run_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    spec = _spec("cloud-1", "cloud", run_dir, llms=(LMSource("smollm2", "smollm2-135m"),),
                 chat_tasks={"chat": "smollm2"})
    with node_process(spec, run_dir, timeout_s=120) as node:
        yield node


@pytest.fixture(scope="module")
def device(run_dir: Path, cloud: tuple[str, subprocess.Popen[bytes]]) -> Iterator[str]:
    spec = _spec("dev-1", "device", run_dir,
                 llms=(LMSource("smollm2", "smollm2-135m", runtime="llama.cpp",
                                verifier="cloud-1/smollm2"),),
                 chat_tasks={"chat": "smollm2"}, upstreams=(UpstreamSpec("cloud-1", cloud[0]),))
    with node_process(spec, run_dir, timeout_s=120) as (url, _):
        yield url


def test_a_device_on_llama_cpp_answers_the_openai_client(device: str) -> None:
    client = openai.OpenAI(base_url=device + "/v1", api_key="unused", max_retries=0)
    own = [(m.model_extra or {})["tierlink"] for m in client.models.list() if m.id == "smollm2"]
    cards = [meta["card"] for meta in own if meta.get("tier") == "device"]
    assert [(c["format"], c["precision"]) for c in cards] == [("gguf", "q4_1")]
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    local = {"tierlink": {"privacy": "local"}}
    answer = client.chat.completions.create(model="chat", messages=msgs, max_tokens=16,
                                            temperature=0, extra_body=local)
    assert answer.choices[0].message.content  # Q4_1's own words (they differ from FP32's)
    meta = (answer.model_extra or {})["tierlink"]
    assert meta["mode"] == "local" and meta["served_by"] == "dev-1"
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="chat", messages=msgs, max_tokens=16,
                                            temperature=0, extra_body=local, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == answer.choices[0].message.content


def test_llama_cpp_drafts_and_the_torch_cloud_verifies(
        device: str, cloud: tuple[str, subprocess.Popen[bytes]]) -> None:
    on_device = openai.OpenAI(base_url=device + "/v1", api_key="unused", max_retries=0)
    on_cloud = openai.OpenAI(base_url=cloud[0] + "/v1", api_key="unused", max_retries=0)
    for prompt in PROMPTS[:2]:
        msgs = [{"role": "user", "content": prompt}]
        own = on_cloud.chat.completions.create(model="chat", messages=msgs, max_tokens=32,
                                               temperature=0)
        spec = on_device.chat.completions.create(
            model="chat", messages=msgs, max_tokens=32, temperature=0,
            extra_body={"tierlink": {"mode": "speculative"}})
        assert spec.choices[0].message.content == own.choices[0].message.content
        meta = (spec.model_extra or {})["tierlink"]
        assert meta["mode"] == "speculative" and meta["served_by"] == "cloud-1"
        assert 0 < meta["accepted"] <= meta["drafted"] and not meta["degraded"]

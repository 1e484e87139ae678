"""Chat on real node processes: the official ``openai`` client against a cloud node, errors
in OpenAI's shape, a client that leaves mid-stream, prompts kept where their privacy says,
a device that drafts for the cloud (speculative decoding) — greedy output identical to
the cloud's own, degraded to the device's model when the cloud is gone — and a device that
runs its model's first layers and the cloud the rest (a split), for a local prompt only
where the fleet lets its hidden states leave."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tierlink.core.types import Tier
from tierlink.llm.source import LMSource
from tierlink.node.spec import NodeSpec, UpstreamSpec
from tierlink.settings.routing import parse_routing
from tierlink.testing.processes import node_process

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three fruits."]


@contextmanager
def llm_node(spec: NodeSpec, run_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with node_process(spec, run_dir, timeout_s=120) as node:
        yield node


def _spec(node_id: str, tier: str, run_dir: Path, **kw: object) -> NodeSpec:
    return NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=(), port=0,
                    ready_file=str(run_dir / f"{node_id}.ready"), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat")


@pytest.fixture(scope="module")
def cloud(run_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    spec = _spec("cloud-1", "cloud", run_dir,
                 llms=(LMSource("smollm2", "smollm2-135m", quality=0.76),),
                 chat_tasks={"chat": "smollm2"})
    with llm_node(spec, run_dir) as node:
        yield node


@pytest.fixture(scope="module")
def client(cloud: tuple[str, subprocess.Popen[bytes]]) -> openai.OpenAI:
    return openai.OpenAI(base_url=cloud[0] + "/v1", api_key="unused", max_retries=0)


def test_the_openai_client_unchanged(client: openai.OpenAI) -> None:
    listed = {m.id for m in client.models.list()}
    assert {"smollm2", "chat"} <= listed
    answer = client.chat.completions.create(model="chat", messages=MSG, max_tokens=16,
                                            temperature=0)
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    meta = (answer.model_extra or {})["tierlink"]
    assert meta["served_by"] == "cloud-1" and meta["tier"] == "cloud"
    stream = client.chat.completions.create(model="chat", messages=MSG, max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content
    assert chunks[-1].usage is not None
    done = client.completions.create(model="smollm2", prompt="The capital of France is",
                                     max_tokens=4, temperature=0)
    assert done.choices[0].text and done.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"model": "nope", "messages": MSG}, openai.NotFoundError),
    ({"model": "chat", "messages": []}, openai.BadRequestError),
    ({"model": "chat", "messages": [{"role": "wizard", "content": "x"}]},
     openai.BadRequestError),
    ({"model": "chat", "messages": MSG, "max_tokens": 0}, openai.BadRequestError),
    ({"model": "chat", "messages": MSG, "max_tokens": 100_000}, openai.BadRequestError),
    ({"model": "chat", "messages": [{"role": "user", "content": "word " * 9000}]},
     openai.BadRequestError),
    ({"model": "chat", "messages": MSG, "extra_body": {"tierlink": {"privacy": "site"}}},
     openai.PermissionDeniedError),
    ({"model": "chat", "messages": MSG,
      "extra_body": {"tierlink": {"privacy": "local", "origin": "dev-9"}}},
     openai.PermissionDeniedError),
])
def test_errors_are_4xx_in_openai_shape(client: openai.OpenAI, kwargs: dict,
                                        error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        client.chat.completions.create(**kwargs)
    assert isinstance(info.value, openai.APIStatusError) and info.value.status_code < 500
    body = info.value.body
    assert isinstance(body, dict) and body.get("message")


def test_a_client_that_leaves_mid_stream(cloud: tuple[str, subprocess.Popen[bytes]],
                                         client: openai.OpenAI) -> None:
    url = cloud[0]
    body = {"model": "chat", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # one chunk, then hang up
    answer = client.chat.completions.create(model="chat", messages=MSG, max_tokens=8,
                                            temperature=0)
    assert answer.choices[0].message.content
    deadline = time.monotonic() + 20
    while True:  # the abandoned sequence was stopped, not run to 400 tokens
        status = httpx.get(url + "/metrics").text
        running = [ln for ln in status.splitlines()
                   if ln.startswith("tierlink_llm_num_requests_running{")]
        if running and all(ln.endswith(" 0.0") for ln in running):
            break
        assert time.monotonic() < deadline, running
        time.sleep(0.2)
    assert "tierlink_llm_time_to_first_token_seconds_bucket" in status
    assert cloud[1].poll() is None


def test_a_device_drafts_and_the_cloud_verifies(
        cloud: tuple[str, subprocess.Popen[bytes]], client: openai.OpenAI,
        run_dir: Path) -> None:
    spec = _spec("dev-1", "device", run_dir,
                 llms=(LMSource("smollm2", "smollm2-135m", quantize="int8",
                                verifier="cloud-1/smollm2", quality=0.56),),
                 chat_tasks={"chat": "smollm2"},
                 upstreams=(UpstreamSpec("cloud-1", cloud[0]),))
    with llm_node(spec, run_dir) as (url, _):
        device = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for prompt in PROMPTS:
            msgs = [{"role": "user", "content": prompt}]
            own = client.chat.completions.create(model="chat", messages=msgs,
                                                 max_tokens=32, temperature=0)
            spec_answer = device.chat.completions.create(model="chat", messages=msgs,
                                                         max_tokens=32, temperature=0)
            assert spec_answer.choices[0].message.content == own.choices[0].message.content
            meta = (spec_answer.model_extra or {})["tierlink"]
            assert meta["mode"] == "speculative" and meta["served_by"] == "cloud-1"
            assert 0 < meta["accepted"] <= meta["drafted"] and not meta["degraded"]
        relayed = device.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=32,
            temperature=0, extra_body={"tierlink": {"mode": "remote"}})
        own = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=32,
            temperature=0)
        assert relayed.choices[0].message.content == own.choices[0].message.content
        meta = (relayed.model_extra or {})["tierlink"]
        assert meta["mode"] == "remote" and meta["path"] == ["dev-1", "cloud-1"]
        assert meta["served_by"] == "cloud-1" and relayed.usage.completion_tokens > 0
        streamed = device.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=32,
            temperature=0, stream=True, extra_body={"tierlink": {"mode": "remote"}})
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == own.choices[0].message.content
        private = device.chat.completions.create(
            model="chat", messages=MSG, max_tokens=8, temperature=0,
            extra_body={"tierlink": {"privacy": "local"}})
        meta = (private.model_extra or {})["tierlink"]
        assert meta["mode"] == "local" and meta["path"] == ["dev-1"]
        with pytest.raises(openai.BadRequestError):
            device.chat.completions.create(
                model="chat", messages=MSG, max_tokens=8,
                extra_body={"tierlink": {"privacy": "local", "mode": "speculative"}})


def test_a_device_whose_verifier_is_gone_answers_degraded(run_dir: Path) -> None:
    from tierlink.netports import pick_port

    dead = f"http://127.0.0.1:{pick_port()}"  # nothing listens there
    spec = _spec("dev-2", "device", run_dir,
                 llms=(LMSource("smollm2", "smollm2-135m", quantize="int8",
                                verifier="cloud-1/smollm2", quality=0.56),),
                 chat_tasks={"chat": "smollm2"}, upstreams=(UpstreamSpec("cloud-1", dead),))
    with llm_node(spec, run_dir) as (url, _):
        device = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        answer = device.chat.completions.create(model="chat", messages=MSG, max_tokens=12,
                                                temperature=0)
        meta = (answer.model_extra or {})["tierlink"]
        assert answer.choices[0].message.content
        assert meta["degraded"] and meta["served_by"] == "dev-2"
        assert "cloud-1 unreachable" in meta["degraded_reason"]
        forced = device.chat.completions.create(  # asked for: tried, then its own draft
            model="chat", messages=MSG, max_tokens=12, temperature=0,
            extra_body={"tierlink": {"mode": "speculative"}})
        meta = (forced.model_extra or {})["tierlink"]
        assert meta["degraded"] and "verifier unavailable" in meta["degraded_reason"]


def test_a_node_without_a_model_relays_and_keeps_a_conversation_together(
        cloud: tuple[str, subprocess.Popen[bytes]], client: openai.OpenAI,
        run_dir: Path) -> None:
    spec = _spec("gw-1", "edge", run_dir, upstreams=(UpstreamSpec("cloud-1", cloud[0]),))
    with llm_node(spec, run_dir) as (url, _):
        gateway = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert "chat" in {m.id for m in gateway.models.list()}
        own = client.chat.completions.create(model="chat", messages=MSG, max_tokens=16,
                                             temperature=0)
        turn = {"session": "conv-7"}
        first = gateway.chat.completions.create(model="chat", messages=MSG, max_tokens=16,
                                                temperature=0, extra_body={"tierlink": turn})
        assert first.choices[0].message.content == own.choices[0].message.content
        meta = (first.model_extra or {})["tierlink"]
        assert meta["served_by"] == "cloud-1" and meta["path"] == ["gw-1", "cloud-1"]
        assert meta["placement"]["reason"].startswith("remote smollm2@cloud-1")
        follow = [*MSG, {"role": "assistant", "content": first.choices[0].message.content},
                  {"role": "user", "content": "And of Spain?"}]
        second = gateway.chat.completions.create(model="chat", messages=follow, max_tokens=16,
                                                 temperature=0, extra_body={"tierlink": turn})
        meta = (second.model_extra or {})["tierlink"]
        assert "cache is there" in meta["placement"]["reason"]
        details = second.usage.prompt_tokens_details  # the cloud kept the first turn
        assert details is not None and (details.cached_tokens or 0) > 10
        with pytest.raises(openai.NotFoundError):
            gateway.chat.completions.create(model="nope", messages=MSG, max_tokens=4)
        with pytest.raises(openai.PermissionDeniedError):  # a local prompt is not its own
            gateway.chat.completions.create(
                model="chat", messages=MSG, max_tokens=4,
                extra_body={"tierlink": {"privacy": "local", "origin": "dev-1"}})


@pytest.mark.parametrize("may_leave", [True, False])
def test_a_device_runs_the_first_layers_and_the_cloud_the_rest(
        cloud: tuple[str, subprocess.Popen[bytes]], client: openai.OpenAI, run_dir: Path,
        may_leave: bool) -> None:
    spec = _spec(f"dev-split-{may_leave}", "device", run_dir,
                 llms=(LMSource("smollm2", "smollm2-135m", split="cloud-1/smollm2",
                                split_cut=8, split_codec="fp16"),),
                 chat_tasks={"chat": "smollm2"},
                 upstreams=(UpstreamSpec("cloud-1", cloud[0]),),
                 routing=parse_routing({"local_features_may_leave": may_leave}))
    with llm_node(spec, run_dir) as (url, _):
        device = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        local_split = {"tierlink": {"privacy": "local", "mode": "split"}}
        if not may_leave:  # a local prompt's hidden states stay on its device
            with pytest.raises(openai.BadRequestError, match="split is not possible"):
                device.chat.completions.create(model="chat", messages=MSG, max_tokens=8,
                                               temperature=0, extra_body=local_split)
            return
        for prompt in PROMPTS[:2]:
            msgs = [{"role": "user", "content": prompt}]
            own = client.chat.completions.create(model="chat", messages=msgs,
                                                 max_tokens=24, temperature=0)
            split = device.chat.completions.create(model="chat", messages=msgs,
                                                   max_tokens=24, temperature=0,
                                                   extra_body=local_split)
            assert split.choices[0].message.content == own.choices[0].message.content
            assert split.usage.completion_tokens == own.usage.completion_tokens
            meta = (split.model_extra or {})["tierlink"]
            assert meta["mode"] == "split" and meta["served_by"] == "cloud-1"
            assert meta["path"] == [spec.node_id, "cloud-1"] and meta["cut"] == 8
            # the prompt's rows once, then one row per token: 576 FP16 values each
            assert meta["split_bytes"] > 576 * 2 * own.usage.prompt_tokens
        stream = device.chat.completions.create(model="chat", messages=MSG, max_tokens=16,
                                                temperature=0, stream=True,
                                                extra_body=local_split)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        own = client.chat.completions.create(model="chat", messages=MSG, max_tokens=16,
                                             temperature=0)
        assert text == own.choices[0].message.content

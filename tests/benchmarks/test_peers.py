"""The pure parts of ``benchmarks/peers.py``: percentiles, CPU accounting from ``/proc`` text,
summaries, the run order and the verdict; and that the peers' ONNX Runtime session is opened
exactly as a tierlink node opens its own. No server is started."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


peers = _load("peers_benchmark", BENCHMARKS / "peers.py")


def test_percentile_matches_numpy_linear_interpolation() -> None:
    values = list(np.random.default_rng(3).exponential(2.0, size=997))
    for q in (0, 1, 50, 90, 99, 100):
        assert peers.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert peers.percentile([4.0], 99) == 4.0
    assert peers.percentile([3.0, 1.0], 50) == 2.0  # order of the input does not matter
    with pytest.raises(ValueError):
        peers.percentile([], 50)


def _stat(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0,
          cstime: int = 0) -> str:
    # Fields 3.. of /proc/PID/stat: state ppid pgrp session tty tpgid flags minflt cminflt
    # majflt cmajflt utime stime cutime cstime priority nice ...
    rest = ["S", ppid, 1, 1, 0, -1, 4194560, 10, 0, 0, 0, utime, stime, cutime, cstime,
            20, 0, 7, 0, 12345]
    return f"{pid} ({comm}) " + " ".join(str(v) for v in rest) + "\n"


def test_parse_stat_counts_fields_after_the_last_parenthesis() -> None:
    st = peers.parse_stat(_stat(4321, "uvicorn (worker) 1)", 77, 150, 30, 5, 2))
    assert (st.pid, st.ppid, st.ticks) == (4321, 77, 150 + 30 + 5 + 2)


def test_tree_ticks_sums_root_and_descendants_only() -> None:
    texts = [_stat(10, "server", 1, 100, 50), _stat(11, "worker", 10, 40, 10),
             _stat(12, "grandchild", 11, 5, 5), _stat(20, "bystander", 1, 999, 999),
             _stat(21, "its child", 20, 7, 7)]
    stats = {s.pid: s for s in map(peers.parse_stat, texts)}
    assert peers.tree_ticks(stats, 10) == 150 + 50 + 10
    assert peers.tree_ticks(stats, 11) == 60
    assert peers.tree_ticks(stats, 99) == 0  # gone: nothing


def test_tree_ticks_keeps_a_reaped_childs_time_in_its_parent() -> None:
    before = {s.pid: s for s in map(peers.parse_stat, [_stat(10, "server", 1, 100, 0),
                                                       _stat(11, "child", 10, 30, 0)])}
    after = {s.pid: s for s in map(peers.parse_stat, [_stat(10, "server", 1, 110, 0, 30)])}
    assert peers.tree_ticks(after, 10) - peers.tree_ticks(before, 10) == 10


def test_read_stats_reads_this_process(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text(_stat(42, "x y", 1, 3, 4))
    (tmp_path / "43").mkdir()  # exited between listing and reading: skipped
    (tmp_path / "self").mkdir()
    stats = peers.read_stats(tmp_path)
    assert list(stats) == [42] and stats[42].ticks == 7


def test_machine_busy_counts_all_but_idle_and_iowait() -> None:
    text = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\nintr 1\n"
    assert peers.machine_busy_s(text) == pytest.approx((100 + 5 + 50 + 3 + 2 + 1)
                                                       / peers.CLK_TCK)


def _cell(rps: float, p99: float, cpu: float = 1.0) -> object:
    return peers.Cell(p50_ms=1.0, p99_ms=p99, rps=rps, cpu_ms_per_request=cpu,
                      client_cpu_ms_per_request=0.5, other_cores=0.1, requests=100, errors=0)


def test_summarize_takes_medians_and_keeps_every_round() -> None:
    s = peers.summarize([_cell(100, 5), _cell(80, 7), _cell(120, 6)])
    assert (s["rps"], s["rps_min"], s["rps_max"]) == (100, 80, 120)
    assert s["p99_ms"] == 6 and s["requests"] == 300 and len(s["rounds"]) == 3
    assert peers.spread(s, "rps") == pytest.approx(0.4)


def test_schedule_runs_every_cell_once_and_rotates_the_lane_order() -> None:
    plan = list(peers.schedule(["a", "b", "c"], [1, 8], rounds=3))
    assert len(plan) == len(set(plan)) == 18
    firsts = [plan[i][2] for i in (0, 6, 12)]  # the first lane of each round
    assert firsts == ["a", "b", "c"]
    assert [c for _, c, _ in plan[:6]] == [1, 1, 1, 8, 8, 8]


def _servers(ours: tuple[float, float], kserve: tuple[float, float],
             other: tuple[float, float] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    out = {"tierlink": {"1": {"rps": ours[0], "p99_ms": ours[1]}},
           "kserve": {"1": {"rps": kserve[0], "p99_ms": kserve[1]}}}
    if other:
        out["other"] = {"1": {"rps": other[0], "p99_ms": other[1]}}
    return out


def test_verdict_holds_within_the_bound_and_names_what_missed() -> None:
    comparisons = {"tierlink": ("kserve",)}
    ok = peers.verdict(_servers((91.0, 10.9), (100.0, 10.0)), comparisons)
    assert ok["holds"] and ok["checks"]["tierlink"]["1"]["rps_ratio"] == 0.91
    slow = peers.verdict(_servers((89.0, 5.0), (100.0, 10.0)), comparisons)
    assert not slow["holds"]
    assert slow["checks"]["tierlink"]["1"]["rps_ok"] is False
    assert slow["checks"]["tierlink"]["1"]["p99_ok"] is True
    tail = peers.verdict(_servers((200.0, 11.2), (100.0, 10.0)), comparisons)
    assert not tail["holds"] and tail["checks"]["tierlink"]["1"]["p99_ok"] is False


def test_verdict_takes_the_best_peer_for_each_metric() -> None:
    # kserve has the best throughput, "other" the best p99: tierlink must match both.
    servers = _servers((95.0, 6.0), (100.0, 10.0), other=(50.0, 5.0))
    v = peers.verdict(servers, {"tierlink": ("kserve", "other")})
    check = v["checks"]["tierlink"]["1"]
    assert check["rps_ratio"] == 0.95 and check["p99_ratio"] == 1.2
    assert not v["holds"]


def test_make_inputs_follows_the_signature() -> None:
    args = [SimpleNamespace(name="pixels", shape=["batch", 3, "h", 8], type="tensor(float)"),
            SimpleNamespace(name="ids", shape=[1, 4], type="tensor(int64)"),
            SimpleNamespace(name="mask", shape=[1, 4], type="tensor(bool)")]
    session = SimpleNamespace(get_inputs=lambda: args)
    inputs = peers.make_inputs(session, {})
    assert inputs["pixels"].shape == (1, 3, 1, 8) and inputs["pixels"].dtype == np.float32
    assert inputs["ids"].dtype == np.int64 and inputs["mask"].dtype == np.bool_
    sized = peers.make_inputs(session, {"pixels": (1, 3, 5, 8)})
    assert sized["pixels"].shape == (1, 3, 5, 8)
    assert np.array_equal(peers.make_inputs(session, {})["pixels"], inputs["pixels"])  # seeded


def test_peer_sessions_are_opened_like_the_nodes(tmp_path: Path) -> None:
    """Equal work per request: the peers' session options are the node's."""
    from onnx import TensorProto, helper, save

    from tierlink.models.onnx import OnnxModel
    from tierlink.models.runtime import ModelInfo

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    save(model, str(path))
    ort_session = _load("ort_session", BENCHMARKS / "peers" / "ort_session.py")
    theirs = ort_session.open_session(str(path))
    ours = OnnxModel(path, ModelInfo("relu", "t", "1"))._session
    a, b = theirs.get_session_options(), ours.get_session_options()
    for attr in ("intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level",
                 "execution_mode", "enable_cpu_mem_arena", "enable_mem_pattern"):
        assert getattr(a, attr) == getattr(b, attr), attr
    for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
        assert a.get_session_config_entry(key) == b.get_session_config_entry(key) == "0"
    assert theirs.get_providers() == ours.get_providers() == ["CPUExecutionProvider"]


def _lane(rps: float, p99: float) -> dict[str, float]:
    return {"rps": rps, "p99_ms": p99}


def test_batching_verdict_judges_the_gain_against_onnx_runtimes_own() -> None:
    servers = {"tierlink-grpc": {"8": _lane(100, 90), "32": _lane(100, 300)},
               "tierlink-batched-grpc": {"8": _lane(130, 80), "32": _lane(120, 290)},
               "mlserver-grpc": {"8": _lane(120, 75), "32": _lane(130, 300)}}
    v = peers.batching_verdict(servers, ort_batch_gain=1.4)
    at8, at32 = v["checks"]["8"], v["checks"]["32"]
    assert at8["gain_ok"] and at8["rps_ok"] and at8["p99_ok"] and at8["holds"]
    assert at8["batched_over_unbatched"] == 1.3
    assert not at32["gain_ok"]  # 1.2 < 0.9 x 1.4
    assert not at32["rps_ok"]  # 120 / 130 < 0.95
    assert not v["holds"]
    only8 = {lane: {"8": per["8"]} for lane, per in servers.items()}
    assert list(peers.batching_verdict(only8, 1.4)["checks"]) == ["8"]
    assert not peers.batching_verdict({k: {} for k in servers}, 1.4)["holds"]


def test_ort_batch_gain_compares_images_per_second_of_one_session() -> None:
    class Session:
        def __init__(self) -> None:
            self.batches: list[int] = []

        def run(self, _outputs: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            self.batches.append(len(feed["x"]))
            return [feed["x"]]

    session = Session()
    gain = peers.ort_batch_gain(session, {"x": np.zeros((1, 3), np.float32)}, batch=4,
                                rounds=2, images=8)
    assert session.batches == [1, 4] + [1] * 8 + [4] * 2 + [1] * 8 + [4] * 2
    assert gain["batch"] == 4 and len(gain["rounds"]) == 2 and gain["gain"] > 0

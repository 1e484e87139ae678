"""The pure link model and LinkSpec validation: no sockets, no clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tierlink.errors import LinkEmulationError
from tierlink.netem.link import LinkSpec, retransmission_timeout_s, schedule_chunk


def spec(**fields: Any) -> LinkSpec:
    return LinkSpec(name="a->b", target_host="127.0.0.1", target_port=9000, **fields)


def test_delay_only_delivers_after_the_one_way_delay() -> None:
    timing = schedule_chunk(spec(delay_ms=20), 100, now=10.0, wire_free=0.0,
                            previous_delivery=0.0, rng=random.Random(1))
    assert timing.departure == 10.0
    assert timing.delivery == pytest.approx(10.020)
    assert not timing.lost


def test_bandwidth_queues_chunks_on_one_wire_clock() -> None:
    link = spec(bandwidth_mbit=8)  # 1 byte per microsecond
    rng = random.Random(1)
    first = schedule_chunk(link, 1000, now=0.0, wire_free=0.0, previous_delivery=0.0, rng=rng)
    # A second connection's chunk read at the same instant waits for the wire.
    second = schedule_chunk(link, 1000, now=0.0, wire_free=first.departure,
                            previous_delivery=0.0, rng=rng)
    assert first.departure == pytest.approx(0.001)
    assert second.departure == pytest.approx(0.002)
    idle = schedule_chunk(link, 1000, now=5.0, wire_free=second.departure,
                          previous_delivery=0.0, rng=rng)
    assert idle.departure == pytest.approx(5.001)  # an idle wire does not bank credit


def test_jitter_stays_in_bounds_and_never_reorders() -> None:
    link = spec(delay_ms=10, jitter_ms=8)
    rng = random.Random(3)
    # Chunks 1 ms apart: a chunk never overtakes the one before it.
    previous = 0.0
    for i in range(2000):
        timing = schedule_chunk(link, 10, i * 0.001, 0.0, previous, rng)
        assert timing.delivery >= previous
        previous = timing.delivery
    # Chunks 20 ms apart never wait for each other, so each shows its own jitter.
    one_way = [schedule_chunk(link, 10, i * 0.020, 0.0, 0.0, rng).delivery - i * 0.020
               for i in range(2000)]
    assert 0.002 - 1e-9 <= min(one_way) < 0.0025
    assert 0.0175 < max(one_way) <= 0.018 + 1e-9


def test_loss_fraction_and_rto_follow_the_spec() -> None:
    link = spec(delay_ms=60, loss=0.1)
    assert retransmission_timeout_s(link) == pytest.approx(0.240)  # 2 x RTT > 200 ms
    assert retransmission_timeout_s(spec(delay_ms=40)) == pytest.approx(0.2)  # the floor
    rng = random.Random(11)
    timings = [schedule_chunk(link, 10, float(i), 0.0, 0.0, rng) for i in range(10_000)]
    lost = [t for t in timings if t.lost]
    assert 0.09 <= len(lost) / len(timings) <= 0.11
    assert all(t.delivery == pytest.approx(t.departure + 0.060 + 0.240) for t in lost)


def test_seeded_draws_are_reproducible() -> None:
    link = spec(delay_ms=5, jitter_ms=5, loss=0.3)

    def trace(seed: int) -> list[tuple[float, bool]]:
        rng = random.Random(seed)
        return [(t.delivery, t.lost) for t in
                (schedule_chunk(link, 10, float(i), 0.0, 0.0, rng) for i in range(100))]

    assert trace(5) == trace(5)
    assert trace(5) != trace(6)


@pytest.mark.parametrize(("fields", "bad_field"), [
    ({"delay_ms": -1}, "delay_ms"),
    ({"jitter_ms": -0.5}, "jitter_ms"),
    ({"bandwidth_mbit": 0}, "bandwidth_mbit"),
    ({"bandwidth_mbit": -3}, "bandwidth_mbit"),
    ({"loss": 1.0}, "loss"),
    ({"loss": -0.1}, "loss"),
    ({"delay_ms": float("nan")}, "delay_ms"),
    ({"delay_ms": "5"}, "delay_ms"),
    ({"listen_port": 70000}, "listen_port"),
    ({"up": "yes"}, "up"),
])
def test_invalid_fields_are_named(fields: dict[str, Any], bad_field: str) -> None:
    with pytest.raises(LinkEmulationError, match=bad_field) as caught:
        spec(**fields)
    assert caught.value.details["field"] == bad_field


def test_target_port_and_name_are_checked() -> None:
    with pytest.raises(LinkEmulationError, match="target_port"):
        LinkSpec(name="x", target_host="127.0.0.1", target_port=0)
    with pytest.raises(LinkEmulationError, match="name"):
        LinkSpec(name="a/b", target_host="127.0.0.1", target_port=1)


def test_from_dict_rejects_unknown_and_missing_fields() -> None:
    ok = LinkSpec.from_dict({"name": "l", "target_host": "127.0.0.1", "target_port": 80,
                             "delay_ms": 5, "bandwidth_mbit": None})
    assert ok.delay_ms == 5 and ok.rtt_ms == 10
    assert LinkSpec.from_dict(ok.to_dict()) == ok
    with pytest.raises(LinkEmulationError, match="delay"):
        LinkSpec.from_dict({"name": "l", "target_host": "h", "target_port": 80, "delay": 5})
    with pytest.raises(LinkEmulationError, match="target_port"):
        LinkSpec.from_dict({"name": "l", "target_host": "h"}, where="links[0]")


def test_updated_allows_only_runtime_fields() -> None:
    base = spec(delay_ms=5)
    assert base.updated(delay_ms=7, up=False) == spec(delay_ms=7, up=False)
    with pytest.raises(LinkEmulationError, match="listen_port"):
        base.updated(listen_port=1234)

import math
import random

import pytest

from tierlink.errors import InvalidRequest
from tierlink.rollout.stats import (
    CONFIDENCE_BINS,
    LATENCY_BUCKETS_MS,
    VersionStats,
    psi,
)

NB = len(LATENCY_BUCKETS_MS)


def lat(**by_bound):
    """Latency histogram from {"b20": count, ...} keyed by bucket upper bound."""
    counts = [0] * NB
    for key, count in by_bound.items():
        bound = math.inf if key == "binf" else float(key[1:])
        counts[LATENCY_BUCKETS_MS.index(bound)] = count
    return tuple(counts)


def stats(**kw):
    return VersionStats(**kw)


def test_from_dict_full_and_round_trip():
    d = {"requests": 10, "errors": 1, "escalations": 2, "latency_ms_buckets": list(lat(b20=9)),
         "confidence_buckets": [0] * 9 + [9], "feedback": 4, "feedback_correct": 3,
         "since": 1700000000.5, "newer_field": "ignored"}
    s = VersionStats.from_dict(d)
    assert s.requests == 10 and s.latency_ms_buckets == lat(b20=9) and s.since == 1700000000.5
    assert VersionStats.from_dict(s.to_dict()) == s


def test_from_dict_missing_fields_are_zero():
    s = VersionStats.from_dict({"requests": 5})
    assert s == VersionStats(requests=5)
    assert s.latency_ms_buckets == (0,) * NB and s.confidence_buckets == (0,) * CONFIDENCE_BINS
    assert VersionStats.from_dict({}) == VersionStats()
    assert VersionStats.from_dict({"requests": 3.0}).requests == 3  # JSON integer as float


@pytest.mark.parametrize("bad, field", [
    ({"requests": -1}, "requests"),
    ({"errors": "3"}, "errors"),
    ({"escalations": True}, "escalations"),
    ({"requests": 1.5}, "requests"),
    ({"latency_ms_buckets": [1, 2]}, "latency_ms_buckets"),
    ({"confidence_buckets": [0] * 9 + [-1]}, "confidence_buckets"),
    ({"confidence_buckets": "0000000000"}, "confidence_buckets"),
    ({"feedback": 2, "feedback_correct": 3}, "feedback_correct"),
    ({"since": -5}, "since"),
    ({"since": "yesterday"}, "since"),
])
def test_from_dict_rejects_bad_fields_by_name(bad, field):
    with pytest.raises(InvalidRequest, match=field) as err:
        VersionStats.from_dict(bad)
    assert "latency_ms_buckets[13]" in err.value.hint


def test_from_dict_rejects_non_object():
    with pytest.raises(InvalidRequest, match="object"):
        VersionStats.from_dict([1, 2])  # type: ignore[arg-type]


def test_rates_and_none_without_data():
    s = stats(requests=200, errors=4, escalations=30, feedback=50, feedback_correct=45)
    assert s.error_rate() == 0.02 and s.escalation_rate() == 0.15
    assert s.feedback_accuracy() == 0.9
    empty = VersionStats()
    assert empty.error_rate() is None and empty.escalation_rate() is None
    assert empty.feedback_accuracy() is None and empty.p95_ms() is None


def test_p95_upper_bound_and_interpolated():
    s = stats(latency_ms_buckets=lat(b10=20, b20=70, b50=10))  # 100 timed
    assert s.p95_ms() == 50.0  # the 95th request is in (20, 50]
    assert s.quantile_ms(0.95) == pytest.approx(35.0)  # halfway through that bucket
    assert s.quantile_ms(0.5) == pytest.approx(10 + 10 * 30 / 70)
    assert stats(latency_ms_buckets=lat(b1=100)).quantile_ms(0.95) == pytest.approx(0.95)


def test_p95_overflow_bucket():
    s = stats(latency_ms_buckets=lat(b20=1, binf=99))
    assert s.p95_ms() == math.inf
    assert s.quantile_ms(0.95) == 5000.0  # lower bound of the overflow bucket


def test_p95_skips_empty_leading_buckets():
    assert stats(latency_ms_buckets=lat(b200=10)).p95_ms() == 200.0


def test_minus_is_the_window():
    a = stats(requests=100, errors=2, latency_ms_buckets=lat(b20=100), since=10.0,
              feedback=10, feedback_correct=9)
    b = stats(requests=250, errors=7, latency_ms_buckets=lat(b20=200, b50=50), since=10.0,
              feedback=30, feedback_correct=20)
    w = b.minus(a)
    assert (w.requests, w.errors, w.feedback, w.feedback_correct) == (150, 5, 20, 11)
    assert w.latency_ms_buckets == lat(b20=100, b50=50)
    assert b.minus(None) == b
    assert b.minus(b) == stats(since=10.0)


def test_minus_counter_going_down_is_a_reset():
    before = stats(requests=500, errors=5, latency_ms_buckets=lat(b20=500), since=10.0)
    after_restart = stats(requests=40, errors=1, latency_ms_buckets=lat(b20=40), since=10.0)
    assert after_restart.is_reset_since(before)
    assert after_restart.minus(before) == after_restart


def test_minus_since_moving_is_a_reset_even_when_counts_grew():
    before = stats(requests=10, since=10.0)
    after = stats(requests=900, since=99.0)  # restarted, then served more than before
    assert after.minus(before) == after


def test_minus_one_histogram_bucket_going_down_is_a_reset():
    before = stats(requests=10, latency_ms_buckets=lat(b20=10))
    after = stats(requests=12, latency_ms_buckets=lat(b10=12))
    assert after.minus(before) == after


def test_plus_and_total():
    a = stats(requests=1, confidence_buckets=(1,) + (0,) * 9, since=50.0)
    b = stats(requests=2, confidence_buckets=(0,) * 9 + (2,), since=20.0)
    s = a.plus(b)
    assert s.requests == 3 and s.answers == 3 and s.since == 20.0
    assert VersionStats.total([a, b, VersionStats()]) == s
    assert VersionStats.total([]) == VersionStats()


def test_plus_then_minus_round_trips_random():
    rng = random.Random(7)
    for _ in range(200):
        def rand():
            fb = rng.randrange(50)
            return stats(requests=rng.randrange(1000), errors=rng.randrange(50),
                         escalations=rng.randrange(100),
                         latency_ms_buckets=tuple(rng.randrange(100) for _ in range(NB)),
                         confidence_buckets=tuple(rng.randrange(100) for _ in range(10)),
                         feedback=fb, feedback_correct=rng.randrange(fb + 1))
        a, d = rand(), rand()
        assert a.plus(d).minus(a) == d


GOOD = (0, 0, 0, 0, 1, 2, 3, 6, 13, 75)
SHIFTED = (2, 3, 5, 10, 15, 15, 15, 15, 10, 10)


def test_psi_identical_is_zero_and_scale_free():
    assert psi(GOOD, GOOD) == pytest.approx(0.0, abs=1e-12)
    assert psi(GOOD, [10 * c for c in GOOD]) == pytest.approx(0.0, abs=1e-12)


def test_psi_shift_is_significant_and_symmetric_in_sign():
    assert psi(GOOD, SHIFTED) > 0.25
    assert psi(SHIFTED, GOOD) > 0.25


def test_psi_empty_bins_finite():
    value = psi((0,) * 9 + (100,), (100,) + (0,) * 9)
    assert math.isfinite(value) and value > 5


def test_psi_sampling_noise_is_stable():
    rng = random.Random(3)
    shares = [c / sum(GOOD) for c in GOOD]

    def sample(n):
        counts = [0] * 10
        for _ in range(n):
            counts[rng.choices(range(10), shares)[0]] += 1
        return counts

    values = [psi(sample(2000), sample(300)) for _ in range(30)]
    assert max(values) < 0.1


def test_psi_contract_errors():
    with pytest.raises(ValueError):
        psi([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        psi([0, 0], [1, 1])
    with pytest.raises(ValueError):
        psi([1, 1], [1, 1], eps=0)

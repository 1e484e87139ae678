import numpy as np
import pytest

from tierlink.cascade.records import cascade_records, parse_records, record_to_dict
from tierlink.cascade.tune import Stage
from tierlink.core.types import Tier
from tierlink.errors import ConfigError


def three():
    conf = [np.array([0.9, 0.5, 0.4, 0.95]), np.array([0.6, 0.9, 0.3, 0.2]),
            np.array([0.9, 0.9, 0.9, 0.9])]
    correct = [np.array([1, 0, 0, 1], bool), np.array([0, 1, 0, 1], bool),
               np.array([1, 1, 1, 0], bool)]
    return [Stage(m, t, c, k, 0.0) for m, t, c, k in
            zip(("s", "m", "l"), (Tier.DEVICE, Tier.EDGE, Tier.CLOUD), conf, correct)]


def test_every_path_is_recorded_with_what_reaches_it():
    recs = cascade_records(three(), (0.8, 0.8))
    assert set(recs) == {"s", "m", "l", "s>m", "s>l", "m>l", "s>m>l"}
    # s escalates inputs 1 and 2 (confidence < 0.8); m is right on input 1 only.
    sm = recs["s>m"]
    assert (sm.share, sm.accuracy) == (0.5, 0.5)
    assert (sm.threshold, sm.answered, sm.answered_accuracy) == (0.8, 0.5, 1.0)
    # of those, m escalates input 2 alone; l is right on it.
    assert (recs["s>m>l"].share, recs["s>m>l"].accuracy) == (0.25, 1.0)
    assert recs["s>l"].threshold is None and recs["s>l"].accuracy == 1.0
    assert recs["s"].answered == 0.5 and recs["s"].answered_accuracy == 1.0


def test_records_round_trip_through_the_fleet_file_form():
    recs = cascade_records(three(), (0.8, 0.8))
    back = parse_records({k: record_to_dict(r) for k, r in recs.items()}, "routing.cascade")
    assert back[("s", "m")] == recs["s>m"]


@pytest.mark.parametrize("raw", [{"s": 3}, {"s": {"share": 1.0}},
                                 {"s": {"share": 2.0, "accuracy": 0.5}},
                                 {"s": {"share": 1.0, "accuracy": 0.5, "threshold": 0.9}},
                                 {"s>": {"share": 1.0, "accuracy": 0.5}}])
def test_bad_records_name_the_field_and_the_fix(raw):
    with pytest.raises(ConfigError) as info:
        parse_records(raw, "routing.cascade.records")
    assert "cascade tune" in (info.value.hint or "")

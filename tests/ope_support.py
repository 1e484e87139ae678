"""A synthetic shadow log with a known candidate value (for the OPE and CLI tests)."""

from __future__ import annotations

import numpy as np

from tierlink.policy.ope import Logged


def synthetic_log(n: int, explore: float, seed: int) -> tuple[list[Logged], float]:
    """Three options with rewards that depend on the option and a context; the logging
    policy prefers option 0; the candidate takes option 2 when the context is high."""
    rng = np.random.default_rng(seed)
    means = np.array([0.5, 0.3, 0.7])
    log, true = [], []
    for _ in range(n):
        x = rng.random()
        cand = 2 if x > 0.5 else 0
        act = int(rng.integers(3)) if rng.random() < explore else 0
        p = (1 - explore) * (act == 0) + explore / 3
        feats = [np.array([1.0, float(a == 1), float(a == 2), x]) for a in range(3)]
        r = means[act] + 0.2 * x * (act == 2) + rng.normal(0, 0.1)
        log.append(Logged(str(act), str(cand), p, float(r), tuple(feats[act]),
                          tuple(feats[cand])))
        true.append(means[cand] + 0.2 * x * (cand == 2))
    return log, float(np.mean(true))

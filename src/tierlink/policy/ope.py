"""Off-policy evaluation: a candidate policy's expected reward per request, estimated from
a shadow log of decisions another policy acted on (``policy/shadow.py``).

* **IPS** (inverse propensity scoring): the mean of ``r·[candidate = acting] / p`` — unbiased
  when every option the candidate takes had a chance to be acted on (``p > 0``: the
  exploration share), noisy when propensities are small.
* **Doubly robust** (Dudík et al., 2011): a reward model ``q̂`` (ridge regression on the
  logged options' features) predicts the candidate's reward on every request and the IPS
  term corrects its error where the log saw the candidate's choice:
  ``q̂(x, cand) + [cand = acting]/p · (r − q̂(x, acting))``. Unbiased if either the
  propensities or ``q̂`` are right; the reward model is fitted on the other half of the log
  (cross-fitting), so its errors are not fitted to the very rewards it corrects.

Intervals: mean ± z·sd/√n of the per-request terms (normal approximation; the log holds
thousands of requests). ``promote`` says yes only when the candidate's lower bound beats the
acting policy's own mean reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959964


@dataclass(frozen=True, slots=True)
class Logged:
    """A shadow decision with its outcome's reward."""

    acting: str
    candidate: str
    propensity: float
    reward: float
    acting_features: tuple[float, ...]
    candidate_features: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float
    ci_low: float
    ci_high: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"estimate": round(self.value, 6), "ci_low": round(self.ci_low, 6),
                "ci_high": round(self.ci_high, 6), "n": self.n}


def _interval(terms: np.ndarray, z: float = Z95) -> Estimate:
    n = int(terms.shape[0])
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = float(terms.mean())
    half = z * float(terms.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return Estimate(mean, mean - half, mean + half, n)


def _match(log: Sequence[Logged]) -> np.ndarray:
    return np.array([(e.acting == e.candidate) / e.propensity for e in log])


def ips(log: Sequence[Logged]) -> Estimate:
    rewards = np.array([e.reward for e in log])
    return _interval(_match(log) * rewards)


def _ridge(x: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    return np.linalg.solve(x.T @ x + l2 * np.eye(x.shape[1]), x.T @ y)


def doubly_robust(log: Sequence[Logged], l2: float = 1.0) -> Estimate:
    if len(log) < 4:
        return _interval(np.array([]))
    xa = np.array([e.acting_features for e in log])
    xc = np.array([e.candidate_features for e in log])
    r = np.array([e.reward for e in log])
    w = _match(log)
    halves = np.arange(len(log)) % 2
    terms = np.empty(len(log))
    for h in (0, 1):  # cross-fitting: q̂ from one half scores the other
        fit, use = halves != h, halves == h
        theta = _ridge(xa[fit], r[fit], l2)
        terms[use] = xc[use] @ theta + w[use] * (r[use] - xa[use] @ theta)
    return _interval(terms)


def on_policy(log: Sequence[Logged]) -> Estimate:
    """The acting policy's own mean reward over the log (exploration included)."""
    return _interval(np.array([e.reward for e in log]))


def promote(candidate: Estimate, acting: Estimate) -> bool:
    """Switch only when the candidate's lower bound beats the acting policy's mean."""
    return candidate.n > 0 and math.isfinite(candidate.ci_low) \
        and candidate.ci_low > acting.value


def log_line(e: Logged, candidate: dict[str, object]) -> str:
    """One decision as a JSON line (what a node in shadow mode appends)."""
    import json

    return json.dumps({"acting": e.acting, "candidate": e.candidate,
                       "propensity": round(e.propensity, 8), "reward": round(e.reward, 8),
                       "acting_features": [round(x, 6) for x in e.acting_features],
                       "candidate_features": [round(x, 6) for x in e.candidate_features],
                       "candidate_policy": candidate}, separators=(",", ":"))


def read_log(lines: Sequence[str]) -> tuple[list[Logged], list[dict[str, object]]]:
    """Decisions and the candidate policies they name; malformed lines are refused with
    their number (a half-written last line, from a node stopped mid-write, is skipped)."""
    import json

    from tierlink.errors import ConfigError

    out: list[Logged] = []
    candidates: list[dict[str, object]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            e = Logged(str(d["acting"]), str(d["candidate"]), float(d["propensity"]),
                       float(d["reward"]), tuple(float(x) for x in d["acting_features"]),
                       tuple(float(x) for x in d["candidate_features"]))
        except (ValueError, KeyError, TypeError) as exc:
            if i == len(lines):
                break
            raise ConfigError(f"shadow log line {i} is not a decision: {exc}") from None
        if not 0 < e.propensity <= 1:
            raise ConfigError(f"shadow log line {i}: propensity {e.propensity} not in (0, 1]")
        out.append(e)
        if d.get("candidate_policy") not in candidates:
            candidates.append(d.get("candidate_policy"))
    return out, candidates

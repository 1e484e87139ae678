"""How many tokens a device should draft before asking its verifier (pure, no I/O).

With per-token acceptance α (the chance the target keeps a draft token, given the ones
before it were kept), a round of k drafts yields ``(1 − α^(k+1)) / (1 − α)`` tokens
(accepted drafts plus the verifier's own) and costs ``k·t_draft + t_round(k)``: drafting,
then the link's round trip and the verifier's pass over k+1 rows. ``best_k`` picks the k
with the most tokens per second; ``SpecEstimator`` learns α, t_draft and t_round from the
rounds it sees (EWMA), so k grows on a slow link with a good draft and shrinks when drafts
are rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(alpha: float, k: int) -> float:
    alpha = min(max(alpha, 0.0), 0.999)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_k(alpha: float, draft_s: float, round_s: float, per_row_s: float,
           k_max: int = 8) -> int:
    """``round_s``: link round trip + verifier pass at k=0; ``per_row_s``: what one more
    verified row adds to the pass."""
    def rate(k: int) -> float:
        return expected_tokens(alpha, k) / (k * draft_s + round_s + k * per_row_s)
    return max(range(1, k_max + 1), key=rate)


@dataclass
class SpecEstimator:
    k_max: int = 8
    k_start: int = 4
    weight: float = 0.2  # EWMA weight of the newest round
    alpha: float = 0.7  # prior until rounds are seen
    draft_s: float = 0.03
    round_s: float = 0.05
    per_row_s: float = 0.002
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    ks: list[int] = field(default_factory=list)

    def next_k(self, remaining: int) -> int:
        k = self.k_start if self.rounds < 2 else best_k(
            self.alpha, self.draft_s, self.round_s, self.per_row_s, self.k_max)
        k = max(1, min(k, remaining - 1)) if remaining > 1 else 1
        self.ks.append(k)
        return k

    def observe(self, k: int, accepted: int, draft_s: float, round_s: float) -> None:
        """One round: ``accepted`` of ``k`` drafts kept; times for drafting k, and the round
        trip (send, verify, answer)."""
        self.rounds += 1
        self.drafted += k
        self.accepted += accepted
        # α per position: kept ones are successes; the first rejection (if any) a failure.
        trials = accepted + (1 if accepted < k else 0)
        if trials:
            rate = accepted / trials
            self.alpha += self.weight * (rate - self.alpha)
        if k:
            self.draft_s += self.weight * (draft_s / k - self.draft_s)
        base = max(round_s - k * self.per_row_s, 0.0)
        self.round_s += self.weight * (base - self.round_s)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_k(self) -> float:
        return sum(self.ks) / len(self.ks) if self.ks else 0.0

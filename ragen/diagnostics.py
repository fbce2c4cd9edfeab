"""Does the policy's first action depend on the instance? A diagnostic of input-independent (template) collapse.

The Echo Trap (RAGEN section 4) shows as a fall of the in-group reward std. A policy can also settle into one
opening for every instance while the reward std stays up, because instances still differ in how much that opening
costs: on Sokoban, GRPO runs of the tiny policy come to open with one direction on nearly every puzzle, although the
solutions start about evenly with each (bench/RESULTS.md, "Template collapse"). The per-token entropy
(actor/entropy) does not show it, since thoughts and template tokens dominate it. The first action of an episode is
the cleanest probe: it is chosen from the initial state alone, and every rollout of a group starts from the same
instance.

With X the instance (tag, seed) and A the first parsed action (`NO_ACTION` when the first turn parsed none):

    H(A)       Miller-Madow entropy of the first action over the batch (nats): the plug-in entropy of n draws with
               m distinct values reads low by about (m - 1) / (2n), and this adds it back
    I(A; X)  = sum_x (n_x / n) (E[H^(n_x, p)] - H^(A | X = x)),   p = the batch's first-action frequencies
    H(A | X) = H(A) - I(A; X)

H^ is the plug-in entropy, and E[H^(n_x, p)] what it averages over n_x draws from p: an instance whose n_x
rollouts open no more alike than n_x draws from the whole batch adds nothing. So I(A; X) is 0 in expectation for
a policy that ignores the instance, however few rollouts each instance has (Miller-Madow entropies in H(A) - H(A | X)
read about 0.27 nats for a uniform random opening seen 4 times an instance). It reads below the true information for
small groups: a policy that reads the state perfectly, over 4 equally frequent actions, gives 1.17 of ln 4 = 1.39 nats
from groups of 8 and 0.92 from groups of 4.

A random policy has H(A) high and I(A; X) near 0; a policy that reads the state keeps H(A) high and raises I(A; X)
toward it; a template collapse drops H(A) with I(A; X) staying near 0. Where one action is best everywhere (the
bandit) a low H(A) is the goal, not a collapse. I(A; X) can read a little below 0 by chance, and it needs at least
two rollouts of an average instance: it is left out otherwise (an evaluation with eval.samples = 1).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable, Sequence

from ragen.records import Trajectory

NO_ACTION = "<none>"  # the first turn parsed no action


def plugin_entropy(counts: Iterable[int]) -> float:
    """H^ = -sum_k p_k ln p_k, p_k = c_k / n over the nonzero counts (nats)."""
    counts = [c for c in counts if c > 0]
    n = sum(counts)
    return -sum(c / n * math.log(c / n) for c in counts)


def miller_madow_entropy(counts: Iterable[int]) -> float:
    """H_MM = -sum_k p_k ln p_k + (m - 1) / (2n), p_k = c_k / n over the nonzero counts c_k, m of them, n = sum_k c_k.
    Nats; 0 for a single draw or a single value."""
    counts = list(counts)
    if any(c < 0 for c in counts):
        raise ValueError(f"counts must be non-negative, got {counts}")
    counts = [c for c in counts if c > 0]
    n = sum(counts)
    if n == 0:
        raise ValueError("no draws: the entropy of an empty sample is undefined")
    return plugin_entropy(counts) + (len(counts) - 1) / (2 * n)


def first_action(trajectory: Trajectory) -> str:
    """The first action the episode's first turn parsed, or NO_ACTION."""
    actions = trajectory.turns[0].actions if trajectory.turns else ()
    return actions[0] if actions else NO_ACTION


def expected_plugin_entropy(n: int, probs: Iterable[float]) -> float:
    """E[H^] over n draws from `probs`: each count c_k ~ Binomial(n, p_k), so
    E[H^] = -sum_k sum_{c=1}^{n} C(n, c) p_k^c (1 - p_k)^(n - c) (c / n) ln(c / n)."""
    total = 0.0
    for p in probs:
        if p <= 0.0 or p >= 1.0:  # a certain or impossible value adds no entropy
            continue
        for c in range(1, n):  # c = n adds (n / n) ln 1 = 0
            log_binom = math.lgamma(n + 1) - math.lgamma(c + 1) - math.lgamma(n - c + 1)
            total -= math.exp(log_binom + c * math.log(p) + (n - c) * math.log1p(-p)) * (c / n) * math.log(c / n)
    return total


def action_dependence(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """First-action diagnostics of a batch (namespace-free keys, nats): first_action_entropy H(A),
    first_action_top_share (the most common first action's share), and, when the instances have 2 or more
    rollouts each on average, first_action_mi I(A; X) and first_action_cond_entropy H(A | X) (module docstring)."""
    if not trajectories:
        return {}
    actions = [first_action(t) for t in trajectories]
    marginal = Counter(actions)
    n = len(actions)
    out = {"first_action_entropy": miller_madow_entropy(marginal.values()),
           "first_action_top_share": max(marginal.values()) / n}
    by_instance: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for t, a in zip(trajectories, actions):
        by_instance[(t.tag, t.seed)][a] += 1
    if n >= 2 * len(by_instance):
        probs = [c / n for c in marginal.values()]
        mi = 0.0
        for counts in by_instance.values():
            n_x = sum(counts.values())
            mi += n_x / n * (expected_plugin_entropy(n_x, probs) - plugin_entropy(counts.values()))
        out |= {"first_action_mi": mi, "first_action_cond_entropy": out["first_action_entropy"] - mi}
    return out


def first_action_bonus(trajectories: Sequence[Trajectory], kind: str) -> list[float]:
    """A per-trajectory bonus (nats) whose mean over the parsed openings is a plug-in estimate of a first-action
    measure; added to the returns (algo.first_action_bonus) it rewards what the measure rewards:

        entropy: b_i = -ln p^(a_i)                        mean_i b_i = H^(A)
        mi:      b_i = ln p^(a_i | x_i) - ln p^(a_i)      mean_i b_i = I^(A; X)  (pointwise mutual information)

    p^(a) is the action's share of the batch's parsed openings and p^(a | x) of the instance's. An opening that
    parsed no action (NO_ACTION) gets 0 and counts in neither: as a rare "action" it would earn the largest
    entropy bonus for a malformed turn. As a reward the bonus's policy gradient is the measure's: with
    p(a) = E_x pi(a | x), grad H(A) = -sum_a grad p(a) ln p(a) = E_{x, a ~ pi}[grad ln pi(a | x) (-ln p(a))]
    (sum_a grad p(a) = 0), and H(A | X) likewise with pi(a | x) for p(a). `entropy` spreads the openings over the
    batch, against a template collapse. `mi` keeps a policy that reads the state reading it, but cannot start one:
    I(A; X) is at its minimum, 0, wherever the opening ignores the instance, so its gradient vanishes there."""
    if kind not in ("entropy", "mi"):
        raise ValueError(f"unknown first-action bonus {kind!r}; use entropy or mi")
    actions = [first_action(t) for t in trajectories]
    marginal = Counter(a for a in actions if a != NO_ACTION)
    by_instance: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for t, a in zip(trajectories, actions):
        if a != NO_ACTION:
            by_instance[(t.tag, t.seed)][a] += 1
    n, bonus = sum(marginal.values()), []
    for t, a in zip(trajectories, actions):
        if a == NO_ACTION:
            bonus.append(0.0)
            continue
        b = -math.log(marginal[a] / n)
        if kind == "mi":
            counts = by_instance[(t.tag, t.seed)]
            b += math.log(counts[a] / sum(counts.values()))
        bonus.append(b)
    return bonus

"""How alike are the policy's responses? The repetitive side of the Echo Trap (RAGEN section 4).

RAGEN describes the collapsed policies of vanilla StarPO as giving repetitive, templated responses.
`ragen.diagnostics` measures whether the first action depends on the instance; these measures look at the
sampled text itself (token ids, so they need no tokenizer):

    distinct_2                  distinct-2 (Li et al. 2016): |distinct token bigrams| / |bigrams| over every sampled
                                response of the batch; near 1 when the responses share little, near 0 when they
                                repeat one text. It falls with batch size for any policy, so compare runs of one size.
    response_distinct_in_group  mean over groups g (the rollouts of one start) of |distinct first-turn responses in g|
                                / |g|: 1 when the N rollouts of a start all answer differently, 1/N when all alike.
                                In a single-turn env such a group has no return spread for the filter to rank
                                (its rollouts share the env's randomness).
    response_top_share          the most common first-turn response's share of the batch: a text written for every
                                instance alike (a template) reads high, a policy that writes per instance near 1/B.

Identity is exact: the same token ids, thought included, so a template with one varied word counts as distinct.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

from ragen.records import Trajectory


def distinct_ngrams(sequences: Sequence[Sequence[int]], n: int = 2) -> float | None:
    """|distinct n-grams| / |n-grams| over the n-grams of every sequence (each taken within its own sequence);
    None when no sequence has n tokens."""
    if n < 1:
        raise ValueError(f"n-grams need n >= 1, got {n}")
    grams = [tuple(seq[i:i + n]) for seq in sequences for i in range(len(seq) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def response_diversity(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The module's three measures of a batch (namespace-free keys); distinct_2 is left out when no response has
    two tokens, and an empty batch gives {}."""
    if not trajectories:
        return {}
    firsts = [t.turns[0].response_ids if t.turns else () for t in trajectories]  # (B,) first-turn responses
    groups: dict[tuple[str, int], list[tuple[int, ...]]] = defaultdict(list)
    for t, response in zip(trajectories, firsts):
        groups[t.tag, t.group_id].append(response)
    out = {"response_distinct_in_group": sum(len(set(g)) / len(g) for g in groups.values()) / len(groups),
           "response_top_share": max(Counter(firsts).values()) / len(firsts)}
    distinct_2 = distinct_ngrams([turn.response_ids for t in trajectories for turn in t.turns], 2)
    if distinct_2 is not None:
        out["distinct_2"] = distinct_2
    return out

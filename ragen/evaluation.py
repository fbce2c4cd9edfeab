"""Evaluation: a policy's success on fixed instances, beside the solver's ceiling for those instances."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ragen.config import RolloutConfig
from ragen.diagnostics import action_dependence
from ragen.policy import Policy
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import policy_responder, run_episodes, summarize


def evaluate_policy(policy: Policy, tag: str, seeds: Sequence[int], cfg: RolloutConfig, *, temperature: float,
                    seed: int = 0, samples: int = 1) -> tuple[dict[str, float], list[Trajectory]]:
    """Play `samples` episodes per seed at `temperature` (RAGEN validates one per seed at 0.5).

    Pass r plays every seed once; all passes draw from one random stream seeded by `seed`, so pass 0 is the
    one-sample evaluation and more samples only add episodes. Returns the summary over all episodes, with
    `success_se` (the standard error of the success rate over instances, `instance_success`), and the
    trajectories pass by pass (len(seeds) * samples of them).
    """
    if samples < 1:
        raise ValueError(f"eval.samples must be at least 1 (episodes per instance), got {samples}")
    if not seeds:
        raise ValueError(f"no {tag} instances to evaluate: eval.episodes (stage evaluate) and train.eval_episodes "
                         "(val during training) must be at least 1")
    specs = [EpisodeSpec(tag, s, i) for i, s in enumerate(seeds)]
    generator = torch.Generator(policy.model.device).manual_seed(seed)  # on the model's device: CUDA samples there
    responder = policy_responder(policy, cfg, temperature=temperature, generator=generator)
    trajectories = []
    for _ in range(samples):
        trajectories += run_episodes(specs, responder, policy.renderer(cfg.enable_think), cfg,
                                     max_positions=policy.max_positions)
    return evaluation_summary(trajectories, len(seeds)), trajectories


def evaluation_summary(trajectories: Sequence[Trajectory], instances: int) -> dict[str, float]:
    """What `evaluate_policy` reports of its episodes (`instances` seeds, pass by pass): `summarize`'s rates and
    means, `action_dependence`'s first-action figures, and `success_se` over instances."""
    _, se = mean_and_se(instance_success(trajectories, instances))
    return {**summarize(trajectories), **action_dependence(trajectories), "success_se": se}


def instance_success(trajectories: Sequence[Trajectory], instances: int) -> list[float]:
    """Success rate of each instance over its samples, from trajectories laid out pass by pass:
    s_i = mean_r success[r * instances + i]; one float per instance, in the seeds' order."""
    if instances < 1 or len(trajectories) % instances:
        raise ValueError(f"{len(trajectories)} trajectories are not whole passes over {instances} instances")
    samples = len(trajectories) // instances
    return [sum(trajectories[r * instances + i].success for r in range(samples)) / samples for i in range(instances)]


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean of per-instance values x_i and its standard error over instances, sd(x) / sqrt(n) with the unbiased sd
    (0 for fewer than two). For x_i = success_a_i - success_b_i on the same instances this is the paired standard
    error, smaller than the unpaired one when the same instances are easy for both policies."""
    n = len(values)
    if n == 0:
        raise ValueError("no values: a mean over zero instances is undefined")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1) / n)


def paired_gap(trained: Sequence[Trajectory], base: Sequence[Trajectory], instances: int) -> tuple[float, float]:
    """Trained-minus-base success over the same instances, and its paired standard error (`mean_and_se`):

        d_i = s_trained,i - s_base,i   (`instance_success` of each, same instances in the same order)
        gap = mean_i d_i,   se = sd_i(d_i) / sqrt(n)

    Both evaluations must lay out the same `instances` pass by pass (`evaluate_policy` on the same seeds).
    """
    if len(base) != len(trained):
        raise ValueError(f"the base evaluation played {len(base)} episodes and the trained one {len(trained)}: a "
                         "paired gap needs the same instances and samples for both")
    if any((t.tag, t.seed) != (b.tag, b.seed) for t, b in zip(trained, base)):
        raise ValueError("the trained and base evaluations played other instances: a paired gap needs the same seeds "
                         "in the same order")
    mine, theirs = instance_success(trained, instances), instance_success(base, instances)
    return mean_and_se([a - b for a, b in zip(mine, theirs)])


def mean_and_se_over_seeds(gaps: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """Mean of per-instance gaps d_si (S training seeds x n instances, the same instances for every seed) and the
    two parts of its standard error.

        d_i     = mean_s d_si                          (each instance's gap, averaged over seeds)
        se_inst = sd_i(d_i) / sqrt(n)                  (which instances happen to be in the set, once, plus the
                                                        evaluation noise left after averaging over seeds)
        se_seed = sd_s(mean_i d_si) / sqrt(S)          (training runs that gain more or less everywhere)
        se      = sqrt(se_inst^2 + se_seed^2)

    Seeds evaluated on the same instances share those instances' true gains, so that spread does not average out
    over seeds as independent evaluations' would: sqrt(sum_s se_s^2) / S reads too small. se_seed counts the
    evaluation noise once more, which errs on the safe side. Returns (mean, se_inst, se_seed); se_seed is 0 for
    one seed."""
    if not gaps or not gaps[0]:
        raise ValueError("no gaps: a mean over zero seeds or instances is undefined")
    n = len(gaps[0])
    if any(len(row) != n for row in gaps):
        raise ValueError(f"every seed needs a gap for each of the same {n} instances, got {[len(r) for r in gaps]}")
    mean, se_inst = mean_and_se([sum(column) / len(gaps) for column in zip(*gaps)])
    _, se_seed = mean_and_se([sum(row) / n for row in gaps])
    return mean, se_inst, se_seed

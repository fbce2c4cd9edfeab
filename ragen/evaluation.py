"""Evaluation: a policy's success on fixed instances, beside the solver's ceiling for those instances."""

from __future__ import annotations

from typing import Sequence

import torch

from ragen.config import RolloutConfig
from ragen.policy import Policy
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import policy_responder, run_episodes, summarize


def evaluate_policy(policy: Policy, tag: str, seeds: Sequence[int], cfg: RolloutConfig, *, temperature: float,
                    seed: int = 0) -> tuple[dict[str, float], list[Trajectory]]:
    """Play one episode per seed at `temperature` (RAGEN validates at 0.5); returns the summary and trajectories."""
    specs = [EpisodeSpec(tag, s, i) for i, s in enumerate(seeds)]
    generator = torch.Generator(policy.model.device).manual_seed(seed)  # on the model's device: CUDA samples there
    responder = policy_responder(policy, cfg, temperature=temperature, generator=generator)
    trajectories = run_episodes(specs, responder, policy.renderer(cfg.enable_think), cfg,
                                max_positions=policy.model.config.max_position_embeddings)
    return summarize(trajectories), trajectories

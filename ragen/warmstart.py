"""Supervised warm start of the tiny policy (stage base).

`warm` mode: well-formatted responses with a short, skill-free thought and random valid actions, for every env:
a format-following agent with no skill, like an instruction-tuned LLM before RL. `sft` mode: the same format with
solver demonstrations (BFS plans for Sokoban, the optimal action for FrozenLake, the best arm, a Countdown
solution), for RAGEN's SFT-versus-RL comparison. Both are played through `rollout.run_episodes`, so the
supervised sequences are built exactly as rollouts are (same template pieces, same tokens).

Loss: token-mean negative log-likelihood over the masked tokens of the batch,
    L = - sum_{b,t} m[b,t] log pi(x[b,t] | x[b,<t]) / sum_{b,t} m[b,t],
with m the response tokens (`base.loss_mask=assistant`) or every post-system token (`all`: the env's text too, so
the model also learns to predict the state each action leads to).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen.envs import make_env
from ragen.envs.base import TextEnv
from ragen.envs.bandit import BanditEnv
from ragen.envs.countdown import CountdownEnv
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.sokoban import SokobanEnv
from ragen.envs.solvers import bandit_optimal_arm, countdown_solve, frozen_lake_turn_actions, sokoban_plan
from ragen.batching import build_batch
from ragen.config import RolloutConfig
from ragen.policy.sampling import Sample
from ragen.policy.scoring import shareable_prefix, token_logprobs
from ragen.policy.tokenizer import example_response, random_action, thought_kind
from ragen.records import Trajectory
from ragen.rollout import Responder


def actions_left(env: TextEnv) -> int:
    return env.max_actions_per_traj - env.num_steps


def random_actions(env: TextEnv, rng: random.Random, max_per_turn: int, turns_left: int = 0) -> list[str]:
    """1 to 3 random valid actions (never more than the turn or the budget allows)."""
    count = rng.randint(1, max(1, min(3, max_per_turn, actions_left(env))))
    return [random_action(env, rng) for _ in range(count)]


def expert_actions(env: TextEnv, rng: random.Random, max_per_turn: int, turns_left: int) -> list[str]:
    """The solver's next actions for the env's current state (random ones where no solution exists).

    FrozenLake is stochastic: the expert plays the first turn of an optimal policy under the rollout's limits
    (`turns_left` turns, up to `max_per_turn` actions per turn played blind, the episode's actions left), so it
    takes several steps in a turn only where the budget makes that worth more than looking again.
    """
    left = min(max_per_turn, actions_left(env))
    if isinstance(env, SokobanEnv):
        plan = sokoban_plan(env.board)
        return plan[:left] if plan else random_actions(env, rng, max_per_turn)
    if isinstance(env, FrozenLakeEnv):
        return frozen_lake_turn_actions(env.render(), actions_left(env), turns_left, max_per_turn)
    if isinstance(env, BanditEnv):
        return [bandit_optimal_arm(env.arms)[0]]
    if isinstance(env, CountdownEnv):
        solution = countdown_solve(env.nums, env.target)
        return [solution] if solution else random_actions(env, rng, max_per_turn)
    raise TypeError(f"no expert for {type(env).__name__}")


CHOOSERS: dict[str, Callable[[TextEnv, random.Random, int, int], list[str]]] = {
    "warm": random_actions, "sft": expert_actions}


def scripted_settings(rollout: RolloutConfig) -> RolloutConfig:
    """The rollout settings a script plays with: every episode in one pass, whatever rollout.max_episodes_per_pass
    says. A script holds no KV cache, and it draws its actions from one random stream turn by turn across its
    batch, so passes would hand each episode other actions (another warm base, another random baseline)."""
    return replace(rollout, max_episodes_per_pass=0)


def scripted_responder(mode: str, tokenizer: PreTrainedTokenizerBase, prefix: str, *, max_actions_per_turn: int,
                       max_turns: int, enable_think: bool, seed: int) -> Responder:
    """Responses written by a script instead of sampled: `mode` warm (random actions) or sft (solver)."""
    rng = random.Random(seed)
    choose = CHOOSERS[mode]
    turns_taken: dict[int, int] = {}  # id(env) -> turns answered in its episode (scripted turns always act)

    def respond(prompts: list[list[int]], envs: list[TextEnv]) -> list[Sample]:
        samples = []
        for env in envs:
            turn = 0 if env.num_steps == 0 else turns_taken.get(id(env), 0)
            turns_taken[id(env)] = turn + 1
            actions = choose(env, rng, max_actions_per_turn, env.turn_limit(max_turns) - turn)
            text = example_response(rng, actions, enable_think, kind=thought_kind(env))
            ids = tokenizer.encode(text[len(prefix):], add_special_tokens=False)
            samples.append(Sample(tuple(ids), (0.0,) * len(ids), "stop"))
        return samples

    return respond


# --- supervised training ---
def lr_at(step: int, *, steps: int, warmup_steps: int, lr: float) -> float:
    """Linear warmup to `lr`, then cosine decay to lr / 10."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def tag_weights(running: dict[str, float], family: dict[str, str]) -> list[float]:
    """Sampling weight per tag (in `running`'s order): w_tag = running_loss_tag / |tags of the tag's family|."""
    sizes = {name: list(family.values()).count(name) for name in set(family.values())}
    return [loss / sizes[family[tag]] for tag, loss in running.items()]


def train_supervised(model: PreTrainedModel, data: Sequence[Trajectory], *, pad_id: int, steps: int, batch_tokens: int,
                     lr: float, warmup_steps: int, weight_decay: float, seed: int, loss_mask: str = "assistant",
                     log: Callable[[int, dict[str, float]], None] | None = None) -> list[float]:
    """Minimise the NLL of the `loss_mask` tokens; each batch comes from one env tag (similar lengths, little padding).

    A batch holds about `batch_tokens` tokens: many short single-turn conversations (Bandit) or a few long
    multi-turn ones (Sokoban), so every step holds about as many tokens. The tag of each batch is drawn with probability
    proportional to its running loss divided by the number of tags of its env family (every tag is visited once
    first): each family (Bandit, Sokoban, FrozenLake, Countdown) gets steps by its mean loss, shared among its
    variants (sokoban, sokoban_large, sokoban_vocab) by theirs. So the envs that are harder to imitate (Countdown's
    number copying) get more of the steps, and three Sokoban variants do not take three shares. The rows of a
    batch share the system prompt and the env's instruction: the part of that prefix before the first loss token
    (all of it under `assistant`, the system prompt under `all`) runs once per step, its keys and values shared by
    all rows (`token_logprobs_shared_prefix`: the same loss and gradients as a full pass, at about half the compute
    under `assistant`). Returns the loss per step.
    """
    by_tag: dict[str, list[Trajectory]] = {}
    for traj in data:
        by_tag.setdefault(traj.tag, []).append(traj)
    tags = sorted(by_tag)
    batch_size = {tag: max(1, round(batch_tokens * len(pool) / sum(len(t.token_ids) for t in pool)))
                  for tag, pool in by_tag.items()}
    running = {tag: 0.0 for tag in tags}
    family = {tag: type(make_env(tag)).__name__ for tag in tags}
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    model.train()
    losses = []
    for step in range(steps):
        tag = tags[step] if step < len(tags) else rng.choices(tags, weights=tag_weights(running, family))[0]
        pool = by_tag[tag]
        batch = [pool[rng.randrange(len(pool))] for _ in range(batch_size[tag])]
        rows = build_batch(batch, pad_id=pad_id, device=model.device, loss_mask=loss_mask)  # left padded
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps=steps, warmup_steps=warmup_steps, lr=lr)
        # the rows of one tag share their prefix up to the first loss token: it runs once (same values)
        prefix_len = shareable_prefix(rows.input_ids, rows.attention_mask, rows.loss_mask)
        logprobs, _ = token_logprobs(model, rows.input_ids, rows.attention_mask, prefix_len=prefix_len)  # (B, T)
        loss = -(logprobs * rows.loss_mask).sum() / rows.loss_mask.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        running[tag] = loss.item() if step < len(tags) else 0.8 * running[tag] + 0.2 * loss.item()
        if log is not None:
            log(step, {"sft/loss": loss.item(), "sft/grad_norm": float(grad_norm), "sft/lr": optimizer.param_groups[0]["lr"],
                       "sft/tokens": float(rows.attention_mask.sum())})
    model.eval()
    return losses

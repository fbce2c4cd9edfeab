"""RAGEN's two-armed bandit: does the agent read risk and reward into the arms' names?"""

from __future__ import annotations

from dataclasses import dataclass

from ragen.envs.base import StepInfo, TextEnv

SAFE_PAYOUT = 0.1
RISKY_PAYOUT = 1.0
RISKY_PROBABILITY = 0.25

PROMPT = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n"
    "Game Rules: \n"
    "1. There are 2 arms, named {a} and {b}\n"
    "2. Each arm has its own reward distribution, related to their names. \n"
    "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
    "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher rewards "
    "on average? Choose between {a} and {b}, and output like <answer> {a} </answer> or <answer> {b} </answer>.\n"
)


@dataclass(frozen=True)
class Arm:
    name: str
    payout: float  # paid with `probability`, else 0
    probability: float

    @property
    def expected_reward(self) -> float:
        return self.payout * self.probability


class BanditEnv(TextEnv):
    """Pull one of two named arms, once.

    ## Description
    The safe arm always pays 0.1; the risky arm pays 1.0 with probability 0.25 (expected 0.25), so the risky
    arm is the better one. Only the names hint at which is which. Which arm is listed first is drawn from the
    seed. `bandit` names them Phoenix (safe) and Dragon (risky), as RAGEN's default; `bandit_test` uses unseen
    names, Trader (safe) and Librarian (risky); `bandit_rev` reverses the training names' semantics: Dragon is
    the safe arm and Phoenix the risky one.

    ## Action Space
    An arm's name, case-insensitive. Any other text is not an action.

    ## Observation
    RAGEN's bandit prompt naming both arms; after the pull, "{arm}: {reward} points".

    ## Rewards
    0.1 for the safe arm; 1.0 w.p. 0.25 else 0.0 for the risky arm, drawn from the seed's random stream (so
    every rollout of one group sees the same draw).

    ## Episode End
    Terminated after one pull. Success means the higher-expectation (risky) arm was chosen.
    """

    max_actions_per_traj = 1
    max_turns = 1
    instruction = ""

    def __init__(self, *, tag: str, safe_name: str, risky_name: str, description: str) -> None:
        super().__init__()
        self.tag = tag
        self.description = description
        self.arms = (Arm(safe_name, SAFE_PAYOUT, 1.0), Arm(risky_name, RISKY_PAYOUT, RISKY_PROBABILITY))
        self.order = self.arms
        self.action_names = (safe_name, risky_name)
        self.message = ""

    def _reset(self, layout: str | None) -> None:
        if layout is not None:
            raise ValueError(f"{self.tag}: the bandit takes no layout; its seed alone sets an episode (the arms' "
                             "order and the payout draw)")
        swap = self.rng.random() < 0.5
        self.order = self.arms[::-1] if swap else self.arms
        self.payout_draw = self.rng.random()  # drawn now: one stream per seed, whatever is chosen
        self.message = PROMPT.format(a=self.order[0].name, b=self.order[1].name)

    def _step(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        index = self.lookup_action(action)
        if index is None:
            return self.render(), 0.0, False, False, StepInfo(False, False, False)
        arm = self.arms[index]
        reward = arm.payout if self.payout_draw < arm.probability else 0.0
        best = max(self.arms, key=lambda a: a.expected_reward)
        self.message = f"{arm.name}: {reward} points"
        return self.render(), reward, True, False, StepInfo(True, True, arm == best)

    def render(self) -> str:
        return self.message

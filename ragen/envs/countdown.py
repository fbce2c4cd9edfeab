"""Countdown: combine the given numbers with + - * / into an expression that equals the target."""

from __future__ import annotations

from collections import Counter

from ragen.envs.arithmetic import ExpressionError, evaluate
from ragen.envs.base import LayoutError, StepInfo, TextEnv

CORRECT_REWARD = 1.0
WELL_FORMED_REWARD = 0.1
MIN_NUMBER, MAX_NUMBER = 1, 99
MIN_TARGET, MAX_TARGET = 1, 99


class CountdownEnv(TextEnv):
    """Write one arithmetic expression that uses each given number exactly once and equals the target.

    ## Description
    3 or 4 numbers in 1..99 and a target in 1..99 that some expression over all of them reaches with + - * / and
    parentheses (exact rational arithmetic). RAGEN loads these from a Hugging Face data set; here every instance
    is drawn from the seed and its reachability is proven by the exhaustive solver (`solvers.countdown_solve`).

    ## Action Space
    One arithmetic expression over integers with + - * / and parentheses, e.g. "(44 - 19) * 3 + 1". It is read by
    a small safe parser, never `eval`: text outside that grammar (names, calls, `**`, decimals, unary signs, more
    than 200 characters) is not an action.

    ## Observation
    "Target: {target}, nums: {nums}" (RAGEN's text); after the answer, the expression and its value.

    ## Rewards
    1.0 if the expression uses exactly the given numbers (as a multiset) and equals the target; 0.1 if it uses
    exactly the given numbers but misses the target (or divides by zero); 0 if it uses other numbers.

    ## Episode End
    Terminated after one valid answer. Success means reward 1.0.

    ## Arguments
    A layout "Target: 24, nums: [2, 3, 4]" fixes the instance.
    """

    tag = "countdown"
    description = "Countdown: reach the target with + - * / using each of 3-4 numbers once (single turn)"
    max_actions_per_traj = 1
    max_turns = 1

    def __init__(self) -> None:
        super().__init__()
        self.instruction = (
            "You are solving the Countdown puzzle. You should use the num list to create an equation that equals "
            "the target. Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check "
            "2 + 5 = 7, 7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
        )
        self.nums: list[int] = []
        self.target = 0
        self.feedback = ""

    def _reset(self, layout: str | None) -> None:
        from ragen.envs.solvers import countdown_reachable

        self.feedback = ""
        if layout is not None:
            self.target, self.nums = parse_countdown(layout)
            return
        while True:
            nums = [self.rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(self.rng.choice((3, 4)))]
            reachable = countdown_reachable(nums)
            targets = sorted(int(v) for v in reachable if v.denominator == 1 and MIN_TARGET <= v <= MAX_TARGET)
            if targets:
                self.nums, self.target = nums, self.rng.choice(targets)
                return

    def is_valid_action(self, action: str) -> bool:
        try:
            evaluate(action)
        except ExpressionError:
            return False
        return True

    def _step(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        try:
            value, used = evaluate(action)
        except ExpressionError:
            return self.render(), 0.0, False, False, StepInfo(False, False, False)
        uses_numbers = Counter(used) == Counter(self.nums)
        correct = uses_numbers and value is not None and value == self.target
        reward = CORRECT_REWARD if correct else WELL_FORMED_REWARD if uses_numbers else 0.0
        shown = "undefined (division by zero)" if value is None else str(value)
        self.feedback = f"{action.strip()} = {shown}; target {self.target}"
        return self.render(), reward, True, False, StepInfo(True, True, correct)

    def render(self) -> str:
        state = f"Target: {self.target}, nums: {self.nums}"
        return f"{state}\n{self.feedback}" if self.feedback else state


def parse_countdown(text: str) -> tuple[int, list[int]]:
    """Read "Target: T, nums: [a, b, c]" (the env's own observation text)."""
    import re

    match = re.fullmatch(r"\s*Target:\s*(\d{1,6}),\s*nums:\s*\[([\d,\s]{1,200})\]\s*", text)
    if match is None:
        raise LayoutError(f"countdown: layout {text[:60]!r} is not of the form 'Target: 24, nums: [2, 3, 4]'")
    nums = [int(n) for n in match.group(2).split(",") if n.strip()]
    if not 2 <= len(nums) <= 6:
        raise LayoutError(f"countdown: {len(nums)} numbers given; use 2 to 6")
    return int(match.group(1)), nums

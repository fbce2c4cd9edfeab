"""Trajectories -> padded tensors: left padding, loss masks, reward placement and turn ends."""

import pytest
import torch

from ragen.batching import build_batch
from ragen.records import EpisodeSpec
from tests.test_rollout import play, tokenizer  # noqa: F401  (the module fixture)

RESPONSES = ["a</think><answer>Up</answer>", "no tags", "c</think><answer>Down || Left</answer>", "d", "e"]


@pytest.fixture(scope="module")
def trajectories(tokenizer):  # noqa: F811
    long = play(tokenizer, RESPONSES)
    short = play(tokenizer, ["x</think><answer>Right</answer>"] * 5, spec=EpisodeSpec("sokoban", 7))
    return [long, short]


def test_rows_are_left_padded_with_masks_aligned(trajectories, tokenizer):  # noqa: F811
    batch = build_batch(trajectories, pad_id=tokenizer.pad_token_id, device=torch.device("cpu"))
    width = batch.input_ids.shape[1]
    for row, traj in enumerate(trajectories):
        offset = width - len(traj.token_ids)
        assert batch.attention_mask[row].tolist() == [0] * offset + [1] * len(traj.token_ids)
        assert batch.input_ids[row, offset:].tolist() == list(traj.token_ids)
        assert batch.loss_mask[row, offset:].tolist() == list(traj.sampled_mask)
        assert not batch.loss_mask[row, :offset].any()
        ends = batch.turn_end_mask[row].nonzero().flatten().tolist()
        assert ends == [offset + e for e in traj.turn_ends] and batch.loss_mask[row, ends].all()
        assert batch.token_rewards[row, -1].item() == pytest.approx(traj.traj_return)
        assert batch.token_rewards[row, :-1].abs().sum() == 0


def test_turn_rewards_sit_at_turn_ends_and_all_mask_starts_after_the_system_message(trajectories, tokenizer):  # noqa: F811
    batch = build_batch(trajectories, pad_id=tokenizer.pad_token_id, device=torch.device("cpu"), loss_mask="all",
                        reward_placement="turn")
    long = trajectories[0]
    offset = batch.input_ids.shape[1] - len(long.token_ids)
    assert batch.loss_mask[0].tolist() == [False] * (offset + long.system_len) + [True] * (
        len(long.token_ids) - long.system_len)
    expected = torch.zeros(batch.input_ids.shape[1])
    for turn, end in zip(long.turns, long.turn_ends):
        expected[offset + end] += turn.reward + turn.penalty
    assert torch.allclose(batch.token_rewards[0], expected)
    assert batch.token_rewards[0].sum().item() == pytest.approx(long.traj_return)
    assert long.turns[1].penalty == pytest.approx(-0.1)  # the untagged turn is penalised at its own end


def test_unknown_mask_or_placement_is_named(trajectories, tokenizer):  # noqa: F811
    with pytest.raises(ValueError, match="loss_mask 'tokens'"):
        build_batch(trajectories, pad_id=0, device=torch.device("cpu"), loss_mask="tokens")
    with pytest.raises(ValueError, match="reward_placement 'end'"):
        build_batch(trajectories, pad_id=0, device=torch.device("cpu"), reward_placement="end")

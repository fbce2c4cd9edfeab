"""bench/bench_learning.py: the instance mix behind each step of the rollout-success curve, the played and unseen
pool windows, and paired instances."""

import polars as pl
import pytest

from benchload import load_bench
from ragen.config import load_config

bench_learning = load_bench("bench_learning")


def test_moves_per_step_follows_the_pool_in_step_order(tmp_path):
    # train pool in seed order; with max_optimal_moves 3 the 5-move and unsolvable instances are left out
    (tmp_path / "sokoban").mkdir()
    pl.DataFrame({"seed": [10, 11, 12, 13, 14, 15, 16],
                  "optimal_moves": [1, 5, 3, 2, None, 2, 1]}).write_parquet(tmp_path / "sokoban" / "train.parquet")
    cfg = load_config(None, ["train.env=sokoban", "train.groups=2", "train.group_size=3",
                             "train.max_optimal_moves=3"])
    # pool [10, 12, 13, 15, 16] (moves 1, 3, 2, 2, 1); step s plays pool[2s], pool[2s + 1], wrapping around
    assert bench_learning.moves_per_step(cfg, str(tmp_path), "sokoban", 4) == pytest.approx([2.0, 2.0, 1.0, 2.5])


def test_pool_windows_compare_the_first_played_instances_with_the_first_unseen_ones():
    cfg = load_config(None, ["train.env=sokoban", "train.groups=16", "eval.episodes=256"])
    # 150 steps of 16 groups play pool[0:2400]; the next 256 were never played
    assert bench_learning.pool_windows(cfg, 24576, 150) == {"played": (0, 256), "unseen": (2400, 2656)}
    # a pool only a little longer than the run gives a shorter unseen window, one the run wraps around gives none
    assert bench_learning.pool_windows(cfg, 2500, 150) == {"played": (0, 256), "unseen": (2400, 2500)}
    assert bench_learning.pool_windows(cfg, 1024, 150) == {"played": (0, 256)}
    assert bench_learning.pool_windows(cfg, 100, 150) == {"played": (0, 100)}
    # a run shorter than the window played only steps x groups of it
    assert bench_learning.pool_windows(cfg, 24576, 10) == {"played": (0, 160), "unseen": (160, 416)}


def test_paired_episodes_average_each_instance_over_its_samples(tmp_path):
    (tmp_path / "sokoban").mkdir()
    pl.DataFrame({"seed": [7, 3, 5]}).write_parquet(tmp_path / "sokoban" / "val.parquet")
    # two passes over the first two val instances (7, 3), pass by pass, as evaluate writes them; a frozen_lake row
    # with the same seed belongs to another env
    pl.DataFrame({"tag": ["sokoban"] * 4 + ["frozen_lake"], "seed": [7, 3, 7, 3, 7],
                  "success": [True, False, True, True, False]}).write_parquet(tmp_path / "eval.parquet")
    pl.DataFrame({"tag": ["sokoban"] * 4, "seed": [7, 3, 7, 3],
                  "success": [False, False, True, False]}).write_parquet(tmp_path / "eval_base.parquet")
    both = bench_learning.paired_episodes(str(tmp_path), tmp_path, "sokoban", "val", 2, 2)
    assert both.to_dicts() == [{"seed": 7, "base": 0.5, "trained": 1.0}, {"seed": 3, "base": 0.0, "trained": 0.5}]
    gap, se = bench_learning.paired_gap(both)  # differences 0.5, 0.5: a gap of 0.5 with no spread
    assert (gap, se) == (0.5, 0.0)
    # a base evaluated with fewer samples than the trained policy is not a pair
    pl.DataFrame({"tag": ["sokoban"] * 2, "seed": [7, 3],
                  "success": [False, False]}).write_parquet(tmp_path / "eval_base.parquet")
    with pytest.raises(ValueError, match=r"eval_base.parquet: the sokoban instances were played 1 times each, not "
                                         r"eval.samples=2; .* rerun without --reuse"):
        bench_learning.paired_episodes(str(tmp_path), tmp_path, "sokoban", "val", 2, 2)


def test_success_by_moves_buckets_then_exact_short_counts(tmp_path):
    (tmp_path / "sokoban").mkdir()
    pl.DataFrame({"seed": [1, 2, 3, 4, 5], "optimal_moves": [1, 1, 2, 5, None]}).write_parquet(
        tmp_path / "sokoban" / "val.parquet")
    paired = pl.DataFrame({"seed": [1, 2, 3, 4, 5], "base": [0.5, 0.0, 1.0, 0.0, 0.0],
                           "trained": [1.0, 1.0, 0.0, 0.25, 0.0]})
    rows = bench_learning.success_by_moves(str(tmp_path), "sokoban", "val", paired)
    # the unsolvable instance (no optimal move count) is in no row; =3 is empty and left out
    assert rows == [("1-3", 3, 0.5, 2 / 3), ("4-6", 1, 0.0, 0.25), ("=1", 2, 0.25, 1.0), ("=2", 1, 1.0, 0.0)]
    assert bench_learning.by_moves_line(rows[:2]) == "1-3 (3): 0.500 -> 0.667 | 4-6 (1): 0.000 -> 0.250"
    bandit = tmp_path / "bandit"
    bandit.mkdir()
    pl.DataFrame({"seed": [1, 2], "optimal_moves": [1, 1]}).write_parquet(bandit / "val.parquet")
    one = bench_learning.success_by_moves(str(tmp_path), "bandit", "val", paired.head(2))
    assert one == [("1-3", 2, 0.25, 1.0)]  # one move count: no exact rows


def test_seed_summary_pools_gaps_over_training_seeds():
    def row(base, trained, gap, paired_se, gaps=None):
        extra = {"instances": [7, 8, 9], "instance_gaps": gaps} if gaps else {}
        return {"base": {"success_rate": base}, "trained": {"success_rate": trained}, "gap": gap,
                "paired_se": paired_se, **extra}

    # without per-instance gaps: gaps 0.03, -0.01, 0.01: mean 0.01, sample std 0.02, so 0.02 / sqrt(3) = 0.011547
    # between seeds; evaluation noise alone sqrt(0.01^2 + 0.02^2 + 0.02^2) / 3 = 0.01; two of three above their base
    line = bench_learning.seed_summary("sokoban", "val", [row(0.10, 0.13, 0.03, 0.01), row(0.12, 0.11, -0.01, 0.02),
                                                          row(0.11, 0.12, 0.01, 0.02)])
    assert "over 3 seeds: base 0.110, trained 0.120, paired gap +0.010 ± 0.012 between seeds, ± 0.010 from " \
           "evaluation noise alone (+0.9 SE of the larger; instances taken as independent), above base in 2 of 3: " \
           "+0.030, -0.010, +0.010" in line
    # with them, on the same instances: d_A = 0.5, 0, -0.25 and d_B = 0.25, 0, 0.25 give se_inst 0.125 and se_seed
    # 1/24 (tests/test_evaluation.py), so se = sqrt(0.125^2 + 0.041667^2) = 0.131762 and the gap 0.125 is 0.9 SE
    pooled = bench_learning.seed_summary("sokoban", "val", [row(0.2, 0.283, 1 / 12, 0.22, [0.5, 0.0, -0.25]),
                                                            row(0.2, 0.367, 1 / 6, 0.083, [0.25, 0.0, 0.25])])
    assert "paired gap +0.125 ± 0.132 (instances ± 0.125, seeds ± 0.042; +0.9 SE), above base in 2 of 2" in pooled
    # two seeds that agree on every instance: the instances' spread counts whole, as for one seed (0.5 ± 0.289)
    same = bench_learning.seed_summary("sokoban", "test", [row(0.1, 0.6, 0.5, 0.29, [1.0, 0.0, 0.5])] * 2)
    assert "paired gap +0.500 ± 0.289 (instances ± 0.289, seeds ± 0.000; +1.7 SE)" in same
    # different instances (another window): the fallback
    other = row(0.1, 0.6, 0.5, 0.29, [1.0, 0.0, 0.5]) | {"instances": [1, 2, 3]}
    assert "instances taken as independent" in bench_learning.seed_summary("sokoban", "test", [other, row(
        0.1, 0.6, 0.5, 0.29, [1.0, 0.0, 0.5])])


def test_first_action_line_and_windows(capsys):
    base = {"first_action_entropy": 1.4, "first_action_mi": 0.02, "first_action_top_share": 0.3}
    trained = {"first_action_entropy": 0.2, "first_action_mi": 0.01, "first_action_top_share": 0.95}
    assert bench_learning.first_action_line(base, trained) == (
        "first-action entropy (nats) 1.400 -> 0.200 | first action's information on the instance (nats) 0.020 -> "
        "0.010 | most common first action's share 0.300 -> 0.950")
    # one-sample evaluations have no information; evaluations from before the diagnostics have nothing
    one_sample = {k: v for k, v in base.items() if k != "first_action_mi"}
    assert "information" not in bench_learning.first_action_line(one_sample, trained)
    assert bench_learning.first_action_line({"success_rate": 0.1}, {"success_rate": 0.2}) == ""
    # 12 steps, 6 windows of 2: the entropy's window means; a column with gaps (older csv) is left out
    entropy = [1.4, 1.2, 1.0, 1.0, 0.8, 0.6, 0.5, 0.5, 0.4, 0.2, 0.2, 0.2]
    bench_learning.print_curve("sokoban/s0", [0.4] * 12, [2.0] * 12,
                               {"rollout/first_action_entropy": entropy,
                                "rollout/first_action_mi": [float("nan")] * 12})
    out = capsys.readouterr().out
    assert "sokoban/s0      first-action entropy (nats) in those windows: 2-3 1.300 4-5 1.000 6-7 0.700 8-9 0.500 " \
           "10-11 0.300 12-13 0.200" in out
    assert "information" not in out

"""The ablation report's paired val gaps: variants paired by seed and val instance, and each run against the
base policy's episodes, by hand."""

import polars as pl
import pytest

from flows.ablate import base_val_gap, generalisation_table, val_gap
from ragen.ablation import AblationRun


def evaluation(path, successes, name="eval.parquet"):
    """`name` of val instances 10, 11, 12 (one episode each) plus an episode of another env."""
    rows = [("sokoban", seed, ok) for seed, ok in zip((10, 11, 12), successes)] + [("bandit", 10, True)]
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows, schema=["tag", "seed", "success"], orient="row").write_parquet(path / name)


def test_val_gap_pairs_runs_by_seed_and_instance(tmp_path):
    envs = tmp_path / "envs" / "sokoban"
    envs.mkdir(parents=True)
    pl.DataFrame({"seed": [10, 11, 12, 13]}).write_parquet(envs / "val.parquet")
    runs = {("a", 0): [1, 0, 0], ("a", 1): [0, 0, 1], ("b", 0): [1, 1, 0], ("b", 1): [1, 0, 1]}
    for (variant, seed), successes in runs.items():
        evaluation(tmp_path / f"{variant}-s{seed}", [bool(x) for x in successes])
    results = {f"{v}-s{s}": {"env": "sokoban", "eval": {"sokoban": {"val": {"instances": 3}}}} for v, s in runs}
    a = [AblationRun(f"a-s{s}", "a", s, ()) for s in (0, 1)]
    b = [AblationRun(f"b-s{s}", "b", s, ()) for s in (1, 0)]  # listed in another order: paired by seed
    # b - a: seed 0 gaps 0, 1, 0; seed 1 gaps 1, 0, 0. Instance means 0.5, 0.5, 0: mean 1/3, sd sqrt(1/12),
    # se_inst = sqrt(1/12) / sqrt(3) = 1/6; seed means 1/3 and 1/3: se_seed 0. Gap 1/3 over 1/6 = 2.0 SE
    assert val_gap(tmp_path, b, a, results, str(tmp_path / "envs")) == "+0.333 ± 0.167 (+2.0 SE)"
    assert val_gap(tmp_path, a, a, results, str(tmp_path / "envs")) == "+0.000"
    results["b-s1"]["eval"]["sokoban"]["val"]["instances"] = 4  # b-s1 played instance 13 too: 3 are compared
    assert val_gap(tmp_path, b, a, results, str(tmp_path / "envs")).startswith("+0.333")
    results["a-s0"]["eval"]["sokoban"]["val"]["instances"] = 4  # but a-s0 never played 13
    results["b-s0"]["eval"]["sokoban"]["val"]["instances"] = 4
    with pytest.raises(ValueError, match="no sokoban episode of 1 of the 4 instances"):
        val_gap(tmp_path, b, a, results, str(tmp_path / "envs"))


def test_base_val_gap_pairs_each_run_with_its_own_base_episodes(tmp_path):
    envs = tmp_path / "envs" / "sokoban"
    envs.mkdir(parents=True)
    pl.DataFrame({"seed": [10, 11, 12]}).write_parquet(envs / "val.parquet")
    runs = {0: ([1, 1, 0], [0, 1, 0]), 1: ([1, 0, 1], [0, 0, 0])}  # seed: (trained, base) per instance
    for seed, (trained, base) in runs.items():
        evaluation(tmp_path / f"a-s{seed}", [bool(x) for x in trained])
        evaluation(tmp_path / f"a-s{seed}", [bool(x) for x in base], name="eval_base.parquet")
    results = {f"a-s{s}": {"env": "sokoban", "eval": {"sokoban": {"val": {"instances": 3}}}} for s in runs}
    a = [AblationRun(f"a-s{s}", "a", s, ()) for s in runs]
    # gaps: seed 0 1, 0, 0; seed 1 1, 0, 1. Instance means 1, 0, 0.5: mean 1/2, sd 1/2, se_inst 1/(2 sqrt 3);
    # seed means 1/3 and 2/3: sd sqrt(1/18), se_seed 1/6. se = sqrt(1/12 + 1/36) = 1/3: 1.5 SE
    assert base_val_gap(tmp_path, a, results, str(tmp_path / "envs")) == "+0.500 ± 0.333 (+1.5 SE)"
    (tmp_path / "a-s1" / "eval_base.parquet").unlink()  # eval.against_base was off for that run
    with pytest.raises(OSError):
        base_val_gap(tmp_path, a, results, str(tmp_path / "envs"))


def test_the_generalisation_table_gives_each_variants_seed_mean_per_env():
    def result(env, **success):
        return {"env": env, "eval": {tag: {"val": {"success_rate": rate[0], "base_success_rate": rate[1]}
                                            if isinstance(rate, tuple) else {"success_rate": rate}}
                                     for tag, rate in success.items()}}

    results = {"sok-s0": result("sokoban", sokoban=0.1, sokoban_vocab=(0.25, 0.125), frozen_lake=(0.2, 0.25)),
               "sok-s1": result("sokoban", sokoban=0.2, sokoban_vocab=(0.75, 0.375), frozen_lake=0.3),
               "ban-s0": result("bandit", bandit=1.0, bandit_test=0.5)}
    by_variant = {"sok": [AblationRun("sok-s0", "sok", 0, ()), AblationRun("sok-s1", "sok", 1, ())],
                  "ban": [AblationRun("ban-s0", "ban", 0, ())]}
    lines = generalisation_table(by_variant, results)
    assert lines[0].startswith("Generalisation (the paper's table 4): val success on the envs stage evaluate plays")
    # frozen_lake: one seed without the base's figure (eval.against_base off), so the cell gives none
    assert lines[2].splitlines() == ["| variant | trained on | sokoban_vocab | frozen_lake | bandit_test |",
                                     "|---|---|---|---|---|",
                                     "| sok | sokoban | 0.500 (base 0.250) | 0.250 | - |",
                                     "| ban | bandit | - | - | 0.500 |"]
    # no variant played anything beside its train env (e.g. countdown, which has none): no table
    assert generalisation_table({"ban": by_variant["ban"]}, {"ban-s0": result("bandit", bandit=1.0)}) == []

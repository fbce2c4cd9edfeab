"""Stage report's text: the headline against the base, the Echo Trap line's fall in standard errors, and its
refusal of metrics from another run than its settings describe."""

import json
import math
from pathlib import Path

import pytest
import yaml

from flows.cli import main
from flows.lineage import OtherSettings, made_with
from flows.report import (check_ran_with, check_trained_with, fall_sentence, gap_cell, headline,
                          other_val_text)
from flows.update import PLOT_KEYS, write_steps_csv
from ragen.config import load_config
from ragen.fileio import StageFileError
from ragen.report import echo_trap, other_val_envs, plot_curves, read_steps_csv, to_series


def test_the_fall_is_given_in_standard_errors_only_when_success_fell():
    text = fall_sentence({"best_val_success": 0.078, "final_val_success": 0.016}, 64)
    assert "1.7 SE below its best (0.078 -> 0.016, 64 episodes an evaluation)" in text
    assert fall_sentence({"best_val_success": 1.0, "final_val_success": 1.0}, 64) == ""  # bandit at its best
    assert fall_sentence({"collapse_step": None, "verdict": "no data"}, 64) == ""


def test_the_headline_is_the_evaluation_against_the_base_on_the_same_episodes():
    val = {"success_rate": 0.96875, "episodes": 256, "base_success_rate": 0.59375, "success_gap": 0.375,
           "success_gap_se": 0.03125}
    assert headline("bandit", val, 0.5) == (
        "Val success of `bandit` at temperature 0.5 (stage evaluate, 256 episodes): **0.594 for the base policy -> "
        "0.969 trained, gap +0.375 ± 0.031 (+12.0 SE)**, paired over the same instances.")
    assert gap_cell(val) == "+0.375 ± 0.031 (+12.0 SE)"
    assert gap_cell({**val, "success_gap": 0.0, "success_gap_se": 0.0}) == "+0.000 ± 0.000"  # identical results
    alone = {"success_rate": 0.96875, "episodes": 256}  # eval.against_base=false
    assert headline("bandit", alone, 0.5).endswith("**0.969** (eval.against_base was off: no base figure).")
    assert gap_cell(alone) == ""


def test_metrics_of_another_env_or_step_count_than_the_settings_say_are_refused(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps({"train/steps": 2, "val/frozen_lake/success": 0.17}))
    (tmp_path / "eval.json").write_text(json.dumps({"frozen_lake": {}, "sokoban": {}}))
    check_ran_with(load_config(None, ["train.env=frozen_lake", "train.steps=2"]), tmp_path)
    # the stages ran by hand with overrides, the report without them: it once ended in a KeyError traceback
    with pytest.raises(OtherSettings, match=r"train.json is of 2 steps on frozen_lake, and this report's settings "
                                            r"say train.steps=40 on train.env=bandit: write it with the settings the "
                                            r"stages ran with \(`ragen report train.env=frozen_lake "
                                            r"train.steps=2 \.\.\.`"):
        check_ran_with(load_config(None, ["train.env=bandit", "train.steps=40"]), tmp_path)
    with pytest.raises(OtherSettings, match="train.steps=3 on train.env=frozen_lake"):
        check_ran_with(load_config(None, ["train.env=frozen_lake", "train.steps=3"]), tmp_path)
    (tmp_path / "eval.json").write_text(json.dumps({"bandit": {}, "bandit_test": {}}))
    with pytest.raises(OtherSettings, match=r"eval.json holds no evaluation of frozen_lake \(it has bandit, "
                                            r"bandit_test\); run stage evaluate with this report's settings first"):
        check_ran_with(load_config(None, ["train.env=frozen_lake", "train.steps=2"]), tmp_path)


def test_a_policy_trained_with_other_settings_than_the_report_describes_is_refused(tmp_path):
    trained = load_config(None, ["preset=starpo_grpo", "train.env=frozen_lake"])
    record = made_with("update", trained, made_with("filter", trained, made_with("rollout", trained)))
    (tmp_path / "ragen_meta.json").write_text(json.dumps({"env": "frozen_lake", "settings": record}))
    check_trained_with(load_config(None, ["preset=starpo_grpo", "train.env=frozen_lake", "train.micro_batch_size=2"]),
                       str(tmp_path))
    check_trained_with(load_config(None, []), str(tmp_path / "no_policy"))  # no record: nothing to compare
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "ragen_meta.json").write_text(json.dumps({"settings": ["update"]}))
    with pytest.raises(StageFileError, match=r"damaged: its settings record is not a mapping of stage to settings"):
        check_trained_with(load_config(None, []), str(tmp_path / "damaged"))
    # each setting once, though rollout, filter and update all recorded train.env
    with pytest.raises(OtherSettings, match=r"was trained with other settings than this report's: train.env="
                                            r"frozen_lake \(this report: bandit\); algo.reward_norm=mean_std "
                                            r"\(this report: identity\); filter.keep_ratio=1.0 \(this report: "
                                            r"0.25\); algo.advantage=grpo .*; write it with the settings the stages "
                                            r"ran with \(`ragen report key=value ...`"):
        check_trained_with(load_config(None, []), str(tmp_path))


def test_ragen_report_and_nightly_refuse_in_one_line(prefect_harness, project, capsys, caplog):
    (project / "params.yaml").write_text("train:\n  env: bandit\n")
    # a config they cannot take: refused before a flow starts (it ended in Prefect's traceback, then the line)
    assert main(["report", "train.env=sokobn"]) == 2
    assert capsys.readouterr().err == ("ragen report: train.env: 'sokobn' is not one of bandit, bandit_test, "
                                       "bandit_rev, sokoban, sokoban_large, sokoban_vocab, frozen_lake, countdown "
                                       "(did you mean 'sokoban'?)\n")
    (project / "nightly.yaml").write_text("matrix:\n  a: [train.steps=2]\n")
    assert main(["nightly", "run", "--spec", "nightly.yaml", "train.stpes=2"]) == 2
    assert capsys.readouterr().err.startswith("ragen nightly: override 'train.stpes=2': unknown key 'train.stpes' "
                                              "(did you mean 'train.steps'?)")
    assert not [r for r in caplog.records if r.name == "prefect.flow_runs"]
    # a refusal inside the flow: Prefect's record of the failed run keeps its line, without the traceback
    (project / "metrics").mkdir()
    (project / "metrics" / "train.json").write_text(json.dumps({"train/steps": 2, "val/frozen_lake/success": 0.17}))
    (project / "metrics" / "eval.json").write_text(json.dumps({"frozen_lake": {}}))
    assert main(["report"]) == 2
    failed = [r for r in caplog.records if r.name == "prefect.flow_runs" and "OtherSettings(" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is None and "Traceback" not in caplog.text
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("ragen report: metrics/train.json is of 2 steps on frozen_lake")


def test_the_val_curve_ends_with_the_evaluation_after_the_last_update(tmp_path):
    # 3 steps, in-loop val at step 0 only (eval_every 10): the curve read the base's 0.4 throughout before
    history = [{"step": 0, "val/bandit/success": 0.4, "rollout/success_rate": 0.5, "rollout/in_group_std_mean": 0.3},
               {"step": 1, "rollout/success_rate": 0.6, "rollout/in_group_std_mean": 0.2},
               {"step": 2, "rollout/success_rate": 0.7, "rollout/in_group_std_mean": 0.2}]
    write_steps_csv(str(tmp_path / "steps.csv"), history, ["bandit"], {"val/bandit/success": 0.9})
    rows = read_steps_csv(tmp_path / "steps.csv")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["val_success"] for r in rows] == [0.4, 0.4, 0.4, 0.9]
    assert math.isnan(rows[3]["rollout/success_rate"]) and rows[2]["rollout/success_rate"] == 0.7
    series = to_series("bandit", rows)
    assert echo_trap(series, window=1)["final_val_success"] == 0.9  # the trap's "last" is the final evaluation


def test_val_envs_get_a_column_each_carried_forward_and_ended_by_the_final_evaluation(tmp_path):
    # train.val_envs=[bandit_test, bandit_rev], eval_every 2, 3 steps: evaluations before steps 0 and 2, then after 3
    history = [{"step": 0, "val/bandit/success": 0.4, "val/bandit_test/success": 0.3, "val/bandit_rev/success": 0.5,
                "rollout/in_group_std_mean": 0.3},
               {"step": 1, "rollout/in_group_std_mean": 0.2},
               {"step": 2, "val/bandit/success": 0.6, "val/bandit_test/success": 0.35, "val/bandit_rev/success": 0.45,
                "rollout/in_group_std_mean": 0.2}]
    final = {"val/bandit/success": 0.9, "val/bandit_test/success": 0.375, "val/bandit_rev/success": 0.25}
    write_steps_csv(str(tmp_path / "steps.csv"), history, ["bandit", "bandit_test", "bandit_rev"], final)
    rows = read_steps_csv(tmp_path / "steps.csv")
    assert list(rows[0])[-2:] == ["val_success/bandit_test", "val_success/bandit_rev"]  # after the fixed columns
    assert [r["val_success"] for r in rows] == [0.4, 0.4, 0.6, 0.9]
    assert [r["val_success/bandit_test"] for r in rows] == [0.3, 0.3, 0.35, 0.375]
    assert [r["val_success/bandit_rev"] for r in rows] == [0.5, 0.5, 0.45, 0.25]
    series = to_series("bandit", rows)
    assert other_val_envs(series) == ["bandit_test", "bandit_rev"]
    assert other_val_text(series) == ("; on the other val envs (train.val_envs) bandit_test 0.300 -> 0.375, "
                                      "bandit_rev 0.500 -> 0.250")
    assert echo_trap(series, window=1)["final_val_success"] == 0.9  # the markers read train.env's column alone
    assert plot_curves([series], tmp_path / "plots", "bandit")[0].exists()
    # a run validated on train.env alone writes the columns it always had, and the report says nothing more
    write_steps_csv(str(tmp_path / "alone.csv"), history, ["bandit"], final)
    alone = read_steps_csv(tmp_path / "alone.csv")
    assert not [k for k in alone[0] if k.startswith("val_success/")]
    assert other_val_envs(to_series("bandit", alone)) == [] and other_val_text(to_series("bandit", alone)) == ""


def test_dvc_plots_panels_are_named_and_read_columns_the_csv_has():
    # `dvc plots show` draws a panel per entry of dvc.yaml's plots and one per stage-level plot file; such a file
    # without a y drew its last column (pass_at_n, or the last val_success/<env>), so the csv is a plain output
    dvc = yaml.safe_load((Path(__file__).parents[2] / "dvc.yaml").read_text())
    assert not [stage for stage, spec in dvc["stages"].items() if spec.get("plots")]
    assert {"metrics/train_steps.csv": {"cache": False}} in dvc["stages"]["update"]["outs"]
    columns = {column for entry in dvc["plots"] for spec in entry.values() for column in spec["y"].values()}
    assert columns <= set(PLOT_KEYS) and "val_success" in columns
    assert all(file == "metrics/train_steps.csv" for entry in dvc["plots"] for spec in entry.values()
               for file in spec["y"])

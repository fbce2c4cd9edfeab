"""rollout -> filter -> critic_fit -> update -> evaluate on a small configuration; resume after a kill (slow)."""

import csv
import json
from dataclasses import replace

import pytest
import torch
from mlflow.tracking import MlflowClient

from flows.base import base
from flows.cli import main
from flows.critic_fit import critic_fit
from flows.envgen import envgen
from flows.evaluate import evaluate
from flows.filter import filter_rollouts
from flows.lineage import OtherSettings
from flows.rollout import rollout
from flows.update import update_policy
from ragen.checkpoint import CheckpointError
from ragen.policy import load_policy
from ragen.model_meta import read_meta
from ragen.trajectory_io import read_scores, read_settings, read_trajectories, write_trajectories

SMALL = ["envs.tags=[bandit,bandit_test]", "envs.train_size=16", "envs.val_size=6", "envs.test_size=4",
         "model.vocab_size=320", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "model.num_kv_heads=1", "model.intermediate_size=64", "base.tokenizer_episodes=4",
         "base.episodes_per_env=16", "base.steps=6", "base.batch_tokens=800", "base.warmup_steps=2",
         "base.eval_episodes=2", "rollout.max_new_tokens=16", "train.env=bandit", "train.groups=4",
         "train.group_size=4", "train.steps=4", "train.eval_every=2", "train.eval_episodes=4",
         "train.checkpoint_every=2", "train.mini_batch_size=8", "filter.keep_ratio=0.5", "critic.warmup_epochs=2",
         "eval.episodes=4"]


@pytest.fixture
def prepared(prefect_harness, project):
    params = str(project / "params.yaml")
    (project / "params.yaml").write_text("envs:\n  val_seed: 123\n")
    envgen(params=params, overrides=SMALL)
    base(params=params, overrides=SMALL)
    rollout(params=params, overrides=SMALL)
    filter_rollouts(params=params, overrides=SMALL)
    critic_fit(params=params, overrides=SMALL)
    return project, params


@pytest.mark.slow
def test_training_stages_end_to_end(prepared, capsys):
    project, params = prepared
    assert len(read_trajectories(project / "data/rollouts/base.parquet")) == 16
    kept = read_trajectories(project / "data/rollouts/filtered.parquet")
    assert len(kept) == 8 and len({t.group_id for t in kept}) == 2  # whole groups, top half
    # each output records the settings that made it, by stage
    assert set(read_settings(project / "data/rollouts/filtered.parquet")) == {"rollout", "filter"}
    made = read_meta(project / "models/critic_warm")["settings"]
    assert set(made) == {"rollout", "filter", "critic_fit"} and made["filter"]["filter.keep_ratio"] == 0.5
    # update by hand with a setting the stages before it ran otherwise: refused before it writes anything
    with pytest.raises(OtherSettings, match=r"filtered.parquet was made with other settings than this run's: "
                                            r"filter.keep_ratio=0.5 in stage filter \(this run: 1.0\); run stages "
                                            r"filter and critic_fit with this run's settings first"):
        update_policy(params=params, overrides=[*SMALL, "filter.keep_ratio=1.0"], policy_dir=str(project / "other"))
    assert not (project / "other").exists() and not (project / "checkpoints").exists()
    result = update_policy(params=params, overrides=SMALL)
    assert "val/bandit/success" in result
    trained = read_meta(project / "models/policy")["settings"]
    assert set(trained) == {"rollout", "filter", "critic_fit", "update"} and trained["update"]["train.steps"] == 4
    with pytest.raises(OtherSettings, match=r"models/policy was trained on bandit, and this run evaluates "
                                            r"train.env=bandit_test"):
        evaluate(params=params, overrides=[*SMALL, "train.env=bandit_test"])
    # the report of stages run with overrides: refused without them, written with them
    evaluate(params=params, overrides=SMALL)
    capsys.readouterr()
    assert main(["report"]) == 2 and "metrics/train.json is of 4 steps on bandit" in capsys.readouterr().err
    assert main(["report", *SMALL]) == 0 and (project / "reports/pipeline/report.md").exists()
    assert main(["report", "--ablation", "tiny", "train.steps=4"]) == 2
    assert "--ablation takes no key=value (train.steps=4)" in capsys.readouterr().err
    before = load_policy(project / "models/base", device="cpu").model.state_dict()
    after = load_policy(project / "models/policy", device="cpu").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = list(csv.DictReader(open(project / "metrics/train_steps.csv")))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3, 4]  # 4: the evaluation after the last update
    assert float(rows[4]["val_success"]) == result["val/bandit/success"] and rows[4]["rollout/success_rate"] == ""
    # step 1 trains on stage filter's batch, kept whole, and logs stage filter's figures (it logged kept_frac 1.0)
    filtered = json.loads((project / "metrics/filter.json").read_text())
    assert float(rows[0]["filter/kept_frac"]) == filtered["filter/kept_frac"] == 0.5
    # its rollout/ metrics are those of the whole batch stage rollout played, not of the kept groups alone
    played = json.loads((project / "metrics/rollout.json").read_text())
    for key in ("rollout/success_rate", "rollout/return_mean", "rollout/in_group_std_mean"):
        assert float(rows[0][key]) == pytest.approx(played[key]), key
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("ragen").experiment_id], "tags.`ragen.stage` = 'update'")[0]
    for key in ("rollout/success_rate", "rollout/in_group_std_mean", "filter/kept_frac", "filter/std_mass_kept",
                "actor/pg_loss", "actor/clipfrac_low", "actor/clipfrac_high", "actor/approx_kl", "actor/entropy",
                "actor/grad_norm", "actor/lr", "critic/value_loss", "critic/explained_var", "timing/rollout_s",
                "timing/update_s", "val/bandit/success", "rollout/first_action_entropy", "rollout/first_action_mi"):
        assert key in run.data.metrics, key
    assert len(client.get_metric_history(run.info.run_id, "actor/pg_loss")) == 4
    results = evaluate(params=params, overrides=SMALL)
    assert set(results) == {"bandit", "bandit_test"}
    assert results["bandit"]["val"]["success_ceiling"] == 1.0
    # one episode per instance: the opening's entropy and top share, no information estimate
    assert {"first_action_entropy", "first_action_top_share"} <= set(results["bandit"]["val"])
    assert "first_action_mi" not in results["bandit"]["val"]
    assert json.loads((project / "metrics/eval.json").read_text()) == json.loads(json.dumps(results))
    # eval.against_base (the default): the base on the same episodes, and the paired gap
    val = results["bandit"]["val"]
    assert val["success_gap"] == pytest.approx(val["success_rate"] - val["base_success_rate"])
    assert val["success_gap_se"] >= 0 and "base_return_mean" in val
    # the base against itself plays the very same episodes: the same success, a gap and its error exactly 0
    side = {"metrics_path": str(project / "side.json"), "trajectories_out": str(project / "side.parquet")}
    same = evaluate(params=params, overrides=SMALL, policy_dir=str(project / "models/base"), **side)
    for r in (r for splits in same.values() for r in splits.values()):
        assert (r["success_rate"], r["success_gap"], r["success_gap_se"]) == (r["base_success_rate"], 0.0, 0.0)
    off = evaluate(params=params, overrides=[*SMALL, "eval.against_base=false"], **side)
    assert "success_gap" not in off["bandit"]["val"] and off["bandit"]["val"]["success_rate"] == val["success_rate"]
    with pytest.raises(FileNotFoundError, match=r"nowhere is missing: eval.against_base plays the base policy .*"
                                                r"`dvc repro base`, or set eval.against_base=false"):
        evaluate(params=params, overrides=SMALL, base_dir=str(project / "nowhere"), **side)


@pytest.mark.slow
def test_evaluate_ends_between_splits_once_asked_to_stop(prepared):
    """An interrupted ablation set (`flows.common.stopping_threads`) ends a variant's evaluation before its next
    split, not after all of them; nothing is written."""
    from flows.common import STOP, Interrupted

    project, params = prepared
    update_policy(params=params, overrides=SMALL)
    STOP.set()
    try:
        with pytest.raises(Interrupted):
            evaluate(params=params, overrides=SMALL)
    finally:
        STOP.clear()
    assert not (project / "metrics/eval.json").exists()


@pytest.mark.slow
def test_resume_after_a_kill_ends_where_an_uninterrupted_run_ends(prepared, capsys):
    project, params = prepared
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "straight"))
    straight = load_policy(project / "straight", device="cpu").model.state_dict()
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "resumed"), stop_after=3)  # killed
    assert (project / "checkpoints/update/meta.json").exists()
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "resumed"))
    resumed = load_policy(project / "resumed", device="cpu").model.state_dict()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert not (project / "checkpoints/update").exists()
    # killed again; resumed in passes of 3 (as after running out of memory): the same run, to float rounding
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "smaller"), stop_after=3)  # killed
    capsys.readouterr()
    update_policy(params=params, overrides=[*SMALL, "train.micro_batch_size=3"], policy_dir=str(project / "smaller"))
    assert "resuming from the checkpoint after step 2" in capsys.readouterr().out
    smaller = load_policy(project / "smaller", device="cpu").model.state_dict()
    assert all(torch.allclose(straight[k], smaller[k], rtol=0, atol=1e-5) for k in straight)
    assert any(not torch.equal(straight[k], smaller[k]) for k in straight)  # other passes: other rounding


@pytest.mark.slow
def test_val_envs_are_validated_in_the_loop_and_change_nothing_the_training_does(prepared, capsys):
    """train.val_envs: every in-loop evaluation (and the one after the last step) plays those envs too, logged as
    val/<env>/success and written to the steps csv; training, and train.env's val, are those of a run without."""
    project, params = prepared
    alone = {"policy_dir": str(project / "alone"), "metrics_path": str(project / "alone.json"),
             "steps_csv": str(project / "alone.csv"), "critic_out": str(project / "alone_critic")}
    update_policy(params=params, overrides=SMALL, **alone)
    with_val = [*SMALL, "train.val_envs=[bandit_test]"]
    update_policy(params=params, overrides=with_val, stop_after=3)  # killed, then resumed: the same run
    result = update_policy(params=params, overrides=with_val)
    assert "val/bandit_test/success" in capsys.readouterr().out.splitlines()[-1]  # update | done | ... line
    before = load_policy(project / "alone", device="cpu").model.state_dict()
    after = load_policy(project / "models/policy", device="cpu").model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert json.loads((project / "metrics/train.json").read_text()) == json.loads((project / "alone.json").read_text())
    rows, plain = (list(csv.DictReader(open(path))) for path in (project / "metrics/train_steps.csv",
                                                                  alone["steps_csv"]))
    assert [r["val_success"] for r in rows] == [r["val_success"] for r in plain]
    assert [r.pop("val_success/bandit_test") != "" for r in rows] == [True] * 5 and rows == plain
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ragen").experiment_id], "tags.`ragen.stage` = 'update'")
    validated = [run for run in runs if "val/bandit_test/success" in run.data.metrics]
    assert len(validated) == 2 and len(runs) == 3  # the killed run and its resumption; the run without
    history = client.get_metric_history(validated[0].info.run_id, "val/bandit_test/success")  # the resumed run
    assert sorted(m.step for m in history) == [0, 2, 4]  # eval_every 2, then after the last of 4 steps
    assert history[-1].value == pytest.approx(float(list(csv.DictReader(open(project / "metrics/train_steps.csv")))
                                                     [-1]["val_success/bandit_test"]))
    assert result["val/bandit/success"] == json.loads((project / "alone.json").read_text())["val/bandit/success"]
    # the report draws them and names them; one written without the setting is refused, naming it
    evaluate(params=params, overrides=with_val)
    capsys.readouterr()
    assert main(["report", *with_val]) == 0
    assert "on the other val envs (train.val_envs) bandit_test " in (project / "reports/pipeline/report.md").read_text()
    assert main(["report", *SMALL]) == 2
    assert "train.val_envs=['bandit_test'] (this report: [])" in capsys.readouterr().err


@pytest.mark.slow
def test_a_checkpoint_of_other_params_is_not_resumed_and_a_damaged_one_is_named(prepared, capsys):
    project, params = prepared
    ckpt = project / "checkpoints/update"
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "p"), stop_after=3)  # killed
    assert json.loads((ckpt / "meta.json").read_text())["step"] == 2
    capsys.readouterr()
    # other params: step 0 afresh, said aloud (one step saves nothing at checkpoint_every=2, so the old one stands)
    update_policy(params=params, overrides=[*SMALL, "train.lr=0.002"], policy_dir=str(project / "p"), stop_after=1)
    out = capsys.readouterr().out
    assert "checkpoints/update holds a checkpoint of other params, inputs or code" in out
    assert "starting from step 0" in out
    assert "resuming" not in out and json.loads((ckpt / "meta.json").read_text())["step"] == 2
    # the run's own params, over weights damaged since: the error names the checkpoint and the fix
    (ckpt / "policy.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(CheckpointError, match=r"(?s)checkpoint checkpoints/update cannot be restored .*; delete it "
                                              r"\(rm -r checkpoints/update\) and the run starts again from step 0"):
        update_policy(params=params, overrides=SMALL, policy_dir=str(project / "p"))


@pytest.mark.slow
def test_a_checkpoint_of_other_inputs_or_code_is_not_resumed(prepared, capsys, monkeypatch):
    """The same params over another base policy (trained again after the kill) or other source code: step 0
    afresh; the same files under another path resume."""
    import shutil

    import flows.update
    from safetensors.torch import load_file, save_file

    project, params = prepared
    ckpt = project / "checkpoints/update"
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "p"), stop_after=3)  # killed
    assert json.loads((ckpt / "meta.json").read_text())["step"] == 2
    copy = project / "base_copy"
    shutil.copytree(project / "models/base", copy)
    capsys.readouterr()
    # each call plays one step, which saves nothing at checkpoint_every=2: the killed run's checkpoint stands
    update_policy(params=params, overrides=SMALL, base_dir=str(copy), policy_dir=str(project / "p"), stop_after=1)
    assert "resuming from the checkpoint after step 2" in capsys.readouterr().out
    weights = load_file(copy / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    update_policy(params=params, overrides=SMALL, base_dir=str(copy), policy_dir=str(project / "p"), stop_after=1)
    out = capsys.readouterr().out
    assert "holds a checkpoint of other params, inputs or code" in out and "resuming" not in out
    monkeypatch.setattr(flows.update, "source_digest", lambda: "the code of a later commit")
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "p"), stop_after=1)
    out = capsys.readouterr().out
    assert "holds a checkpoint of other params, inputs or code" in out and "resuming" not in out
    assert json.loads((ckpt / "meta.json").read_text())["step"] == 2


@pytest.mark.slow
def test_a_checkpoint_without_a_newer_metric_still_resumes(prepared):
    # a history without a metric that later steps log (as a run under code before 11b0f89 had, which no longer
    # resumes: its source differs) still finishes, each mean over the steps that logged it
    project, params = prepared
    update_policy(params=params, overrides=SMALL, policy_dir=str(project / "resumed"), stop_after=3)  # killed
    meta_path = project / "checkpoints/update/meta.json"
    meta = json.loads(meta_path.read_text())
    meta["history"] = [{k: v for k, v in row.items() if k != "perf/score_tokens_per_s"} for row in meta["history"]]
    meta_path.write_text(json.dumps(meta))
    metrics = update_policy(params=params, overrides=SMALL, policy_dir=str(project / "resumed"))
    assert metrics["perf/score_tokens_per_s_mean"] > 0  # over the steps that logged it
    assert not (project / "checkpoints/update").exists()


@pytest.mark.slow
def test_bilevel_gae_warms_a_critic_and_trains_through_the_stages(prepared):
    # algo.advantage=bilevel_gae reads critic values as gae does: critic_fit must warm a critic for it and update
    # must load it (both once looked for "gae" only, and update crashed on the missing values)
    project, params = prepared
    bilevel = [*SMALL, "algo.advantage=bilevel_gae", "algo.reward_placement=turn", "algo.lam=0.95"]
    out = {"critic_dir": str(project / "critic_bilevel"), "policy_dir": str(project / "policy_bilevel"),
           "critic_out": str(project / "critic_bilevel_out"), "metrics_path": str(project / "train_bilevel.json"),
           "steps_csv": str(project / "steps_bilevel.csv"), "checkpoint_dir": str(project / "ckpt_bilevel")}
    fit = critic_fit(params=params, overrides=bilevel, out_dir=out["critic_dir"],
                     metrics_path=str(project / "critic_fit_bilevel.json"))
    assert read_meta(out["critic_dir"])["critic"] == "warm"
    assert torch.isfinite(torch.tensor(fit["critic_fit/value_loss"]))
    result = update_policy(params=params, overrides=bilevel, **out)
    assert "val/bandit/success" in result and (project / "critic_bilevel_out").exists()
    before = load_policy(project / "models/base", device="cpu").model.state_dict()
    after = load_policy(out["policy_dir"], device="cpu").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # a critic_fit run for grpo leaves no critic; update with a critic estimator says which stage to rerun
    critic_fit(params=params, overrides=[*SMALL, "algo.advantage=grpo"], out_dir=str(project / "no_critic"),
               metrics_path=str(project / "critic_fit_grpo.json"))
    with pytest.raises(OtherSettings, match=r"no_critic was made with other settings than this run's: "
                                            r"algo.advantage=grpo in stage critic_fit \(this run: bilevel_gae\); .*"
                                            r"run stage critic_fit with this run's settings first"):
        update_policy(params=params, overrides=bilevel, **(out | {"critic_dir": str(project / "no_critic")}))
    (project / "no_critic" / "ragen_meta.json").write_text('{"critic": "none"}')  # written before records
    with pytest.raises(FileNotFoundError, match="run stage critic_fit with the same algo.advantage"):
        update_policy(params=params, overrides=bilevel, **(out | {"critic_dir": str(project / "no_critic")}))


@pytest.mark.slow
def test_rft_keeps_each_groups_best_success_and_trains_without_a_critic(prepared):
    project, params = prepared
    rft = [*SMALL, "preset=rft"]
    out = {"policy_dir": str(project / "policy_rft"), "critic_out": str(project / "critic_rft_out"),
           "metrics_path": str(project / "train_rft.json"), "steps_csv": str(project / "steps_rft.csv"),
           "checkpoint_dir": str(project / "ckpt_rft"), "rollouts": str(project / "filtered_rft.parquet")}
    # the 6-step base hardly ever wins: outcomes by hand on its rollouts (4 groups of 4, in order); group 0's best
    # is the win with fewer actions (index 1), group 2's the win with more reward (index 11); groups 1, 3 have none
    played = read_trajectories(project / "data/rollouts/base.parquet")
    wins = {0: (1.0, 2), 1: (1.0, 1), 10: (0.5, 1), 11: (1.0, 3)}  # index: (reward, actions)
    won = [replace(t, success=True, env_return=wins[i][0], penalty=0.0, num_actions=wins[i][1]) if i in wins
           else replace(t, success=False) for i, t in enumerate(played)]
    write_trajectories(project / "won.parquet", won)
    filter_rollouts(params=params, overrides=rft, rollouts=str(project / "won.parquet"), out=out["rollouts"],
                    metrics_path=str(project / "filter_rft.json"))
    assert read_trajectories(out["rollouts"]) == [won[1], won[11]]
    result = update_policy(params=params, overrides=rft, **out)
    assert "val/bandit/success" in result and read_meta(out["critic_out"]) == {"critic": "none"}
    before = load_policy(project / "models/base", device="cpu").model.state_dict()
    after = load_policy(out["policy_dir"], device="cpu").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # base rollouts without a success leave update's first step nothing: the filter says so and writes nothing
    lost = project / "lost.parquet"
    write_trajectories(lost, [replace(t, success=False) for t in won])
    with pytest.raises(ValueError, match=r"kept none of the 16 base rollouts .* \(0 succeeded"):
        filter_rollouts(params=params, overrides=rft, rollouts=str(lost), out=str(project / "nothing.parquet"),
                        metrics_path=str(project / "filter_nothing.json"))
    assert not (project / "nothing.parquet").exists()


@pytest.mark.slow
def test_batch_normalised_scores_go_from_filter_to_critic_fit_and_update(prepared):
    # with reward_norm_grouping batch the scores are centred on the whole rollout batch; the filtered file carries
    # them, since its kept groups alone have another mean, and critic_fit and update's first step train on them
    project, params = prepared
    batch_norm = [*SMALL, "algo.reward_norm=mean", "algo.reward_norm_grouping=batch"]
    played = read_trajectories(project / "data/rollouts/base.parquet")
    returns = {0: 1.0, 5: 1.0, 6: 1.0, 7: 1.0}  # by hand: groups 0 and 1 spread, the filter keeps them (ratio 0.5)
    scored = [replace(t, env_return=returns.get(i, 0.0), penalty=0.0) for i, t in enumerate(played)]
    write_trajectories(project / "scored.parquet", scored)
    out = {"policy_dir": str(project / "policy_bn"), "critic_out": str(project / "critic_bn_out"),
           "metrics_path": str(project / "train_bn.json"), "steps_csv": str(project / "steps_bn.csv"),
           "checkpoint_dir": str(project / "ckpt_bn"), "rollouts": str(project / "filtered_bn.parquet")}
    filter_rollouts(params=params, overrides=batch_norm, rollouts=str(project / "scored.parquet"),
                    out=out["rollouts"], metrics_path=str(project / "filter_bn.json"))
    assert read_trajectories(out["rollouts"]) == scored[:8]
    assert read_scores(out["rollouts"]) == [0.75, -0.25, -0.25, -0.25, -0.25, 0.75, 0.75, 0.75]  # batch mean 1/4
    fit = critic_fit(params=params, overrides=batch_norm, rollouts=out["rollouts"],
                     out_dir=str(project / "critic_bn"), metrics_path=str(project / "critic_fit_bn.json"))
    assert torch.isfinite(torch.tensor(fit["critic_fit/value_loss"]))
    result = update_policy(params=params, overrides=batch_norm, critic_dir=str(project / "critic_bn"), **out)
    assert "val/bandit/success" in result
    # a filtered file without the scores (written before they were stored) cannot be normalised again correctly
    write_trajectories(project / "unscored.parquet", scored[:8])
    with pytest.raises(ValueError, match=r"rerun stage filter \(dvc repro filter\)"):
        critic_fit(params=params, overrides=batch_norm, rollouts=str(project / "unscored.parquet"),
                   out_dir=str(project / "critic_unscored"), metrics_path=str(project / "critic_fit_unscored.json"))

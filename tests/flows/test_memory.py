"""What a stage says when it runs out of memory: the amount, the place in our code and the settings to lower."""

import sys

import pytest
import torch
from prefect import flow

from flows.common import SOURCE_ROOT, run_stage
from flows.filter import filter_rollouts
from flows.memory import (asked_for, is_out_of_memory, killed_message, machine_memory, memory_hint,
                          memory_limits_aside, out_of_memory_message, project_frame, stage_of)
from ragen.config import load_config
from ragen.fileio import StageFileError
from ragen.policy.scoring import score_values

# torch's wording for a CUDA allocation that does not fit (c10's caching allocator), as an H100 prints it
CUDA_TEXT = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 3.06 "
             "MiB is free. Including non-PyTorch memory, this process has 79.17 GiB memory in use. Of the allocated "
             "memory 78.54 GiB is allocated by PyTorch, and 143.87 MiB is reserved by PyTorch but unallocated. If "
             "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
             "to avoid fragmentation.")
IMPOSSIBLE = 1 << 58  # bytes: past any machine's address space, so the CPU allocator refuses it at once


class TooLarge(torch.nn.Module):
    """A critic whose forward pass asks for more memory than there is, as one far too large for the machine."""

    device = torch.device("cpu")

    def forward(self, **inputs):
        return torch.empty(IMPOSSIBLE, dtype=torch.uint8)


def cpu_refusal():
    try:
        torch.empty(IMPOSSIBLE, dtype=torch.uint8)
    except RuntimeError as error:
        return error
    raise AssertionError("the CPU allocator granted 2^58 bytes")


def config(tmp_path, *overrides):
    (tmp_path / "params.yaml").write_text("train:\n  mini_batch_size: 32\n")
    return load_config(str(tmp_path / "params.yaml"), list(overrides))


def test_only_an_allocation_that_failed_counts():
    assert is_out_of_memory(cpu_refusal()) and is_out_of_memory(torch.OutOfMemoryError(CUDA_TEXT))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not is_out_of_memory(KeyError("can't allocate memory"))


def test_the_amount_asked_for_in_the_errors_own_figures():
    assert asked_for(cpu_refusal()) == "cpu: 268435456.00 GiB asked"  # 2^58 bytes
    assert asked_for(torch.OutOfMemoryError(CUDA_TEXT)) == "cuda: 20.00 GiB asked, 3.06 MiB free of 79.19 GiB"
    assert asked_for(torch.OutOfMemoryError("HIP out of memory\nmore")) == "HIP out of memory"


def test_the_place_is_the_innermost_frame_of_our_own_code():
    ids, mask = torch.ones(3, 5, dtype=torch.long), torch.ones(3, 5, dtype=torch.long)
    with pytest.raises(RuntimeError) as caught:
        score_values(TooLarge(), ids, mask, passes=[torch.tensor([2, 0]), torch.tensor([1])])
    where = project_frame(caught.value, SOURCE_ROOT)
    assert where.startswith("ragen/policy/scoring.py:") and where.endswith(" (token_values)")
    assert project_frame(cpu_refusal(), SOURCE_ROOT) == ""  # raised in the tests' code only


def test_the_setting_that_changes_memory_only_comes_first(tmp_path):
    update = memory_hint("update", config(tmp_path))
    assert update[0] == ("train.micro_batch_size=4 runs scoring and the update in passes of 4 trajectories (now 0: "
                         "each mini-batch of train.mini_batch_size=32 in one pass, and each no-grad scoring pass over "
                         "the whole batch; it changes memory only, gradients accumulate exactly; update resumes from "
                         "its last checkpoint with another one; train.micro_batch_tokens bounds a pass's padded tokens "
                         "instead)")
    assert update[1:] == ["128 episodes sample at once (train.groups=8 x train.group_size=16): "
                          "rollout.max_episodes_per_pass=32 samples them in passes of that many (other random draws, "
                          "so what samples runs anew); fewer episodes change the experiment",
                          "64 episodes sample at once (train.eval_episodes=64, each val check): "
                          "rollout.max_episodes_per_pass=16 samples them in passes of that many (other random draws, "
                          "so what samples runs anew); fewer episodes change the experiment"]
    assert memory_hint("update", config(tmp_path, "rollout.max_episodes_per_pass=32"))[1:] == [
        "128 episodes (train.groups=8 x train.group_size=16) sample in passes of rollout.max_episodes_per_pass=32: "
        "rollout.max_episodes_per_pass=16 holds half as many (other random draws, so what samples runs anew); fewer "
        "episodes change the experiment",
        "64 episodes (train.eval_episodes=64, each val check) sample in passes of rollout.max_episodes_per_pass=32: "
        "rollout.max_episodes_per_pass=16 holds half as many (other random draws, so what samples runs anew); fewer "
        "episodes change the experiment"]
    assert memory_hint("rollout", config(tmp_path, "rollout.max_episodes_per_pass=1")) == [
        "128 episodes (train.groups=8 x train.group_size=16) sample one at a time (rollout.max_episodes_per_pass=1): "
        "fewer or shorter episodes change the experiment"]
    assert memory_hint("rollout", config(tmp_path, "rollout.max_episodes_per_pass=128")) == memory_hint(
        "rollout", config(tmp_path))  # a limit at or over the count samples them all at once
    halved = memory_hint("critic_fit", config(tmp_path, "train.micro_batch_size=6"))
    assert halved == ["train.micro_batch_size=3 runs scoring and the update in passes of 3 trajectories (now 6; it "
                      "changes memory only, gradients accumulate exactly; train.micro_batch_tokens bounds a pass's "
                      "padded tokens instead)"]
    assert memory_hint("update", config(tmp_path, "train.micro_batch_size=1", "train.micro_batch_tokens=3000"))[0] == (
        "train.micro_batch_tokens=1500 runs scoring and the update in passes of at most 1500 padded tokens (now 3000; "
        "it changes memory only, gradients accumulate exactly; update resumes from its last checkpoint with another "
        "one)")
    assert memory_hint("critic_fit", config(tmp_path, "train.micro_batch_size=1"))[0].startswith(
        "train.micro_batch_size is 1 already (one trajectory a pass): shorter episodes (rollout.max_turns=5, "
        "rollout.max_new_tokens=48) change the experiment")
    assert memory_hint("evaluate", config(tmp_path)) == [
        "256 episodes sample at once (eval.episodes=256 per split): rollout.max_episodes_per_pass=64 samples them in "
        "passes of that many (other random draws, so what samples runs anew); fewer episodes change the experiment"]
    assert memory_hint("filter", config(tmp_path)) == []
    assert memory_hint("rollout", config(tmp_path, "model.dtype=float32", "model.device=cuda"))[-1] == (
        "on CUDA, model.dtype=bf16-mixed (auto's choice there) computes in bfloat16 over float32 weights")


def test_the_message_joins_amount_place_and_settings(tmp_path):
    ids, mask = torch.ones(3, 5, dtype=torch.long), torch.ones(3, 5, dtype=torch.long)
    with pytest.raises(RuntimeError) as caught:
        score_values(TooLarge(), ids, mask, passes=[torch.tensor([2, 0]), torch.tensor([1])])
    message = out_of_memory_message("critic_fit", caught.value, config(tmp_path), SOURCE_ROOT)
    assert message.startswith("out of memory (cpu: 268435456.00 GiB asked) in ragen/policy/scoring.py:")
    assert message.endswith("(token_values); what it holds at once: " + memory_hint("critic_fit", config(tmp_path))[0])


def test_a_stage_killed_by_the_kernel_is_told_by_its_peak_and_the_settings(tmp_path):
    gib = 2**30
    line = killed_message("evaluate", 21 * gib, 24 * gib, config(tmp_path))
    assert line == ("killed by signal 9 (SIGKILL) at a peak of 21.0 GiB resident, 88% of the 24.0 GiB this machine "
                    "gives it; a SIGKILL no one sent is the kernel's out-of-memory killer (`dmesg` or `journalctl -k` "
                    "says so where you may read them); what it holds at once: 256 episodes sample at once "
                    "(eval.episodes=256 per split): rollout.max_episodes_per_pass=64 samples them in passes of that "
                    "many (other random draws, so what samples runs anew); fewer episodes change the experiment")
    assert killed_message("update", 3 * gib, 0, config(tmp_path)).startswith(
        "killed by signal 9 (SIGKILL) at a peak of 3.0 GiB resident; a SIGKILL no one sent")
    assert killed_message("update", 0, 0, None) == ("killed by signal 9 (SIGKILL); a SIGKILL no one sent is the kernel's "
                                                    "out-of-memory killer (`dmesg` or `journalctl -k` says so where "
                                                    "you may read them)")


def test_the_machines_memory_is_its_own_or_its_containers_limit():
    meminfo = open("/proc/meminfo").read().split("MemTotal:")[1].split()
    assert 2**28 < machine_memory() <= int(meminfo[0]) * 1024


@flow(name="critic_fit")
def scores_too_large(overrides=None):
    ids, mask = torch.ones(3, 5, dtype=torch.long), torch.ones(3, 5, dtype=torch.long)
    return score_values(TooLarge(), ids, mask, passes=[torch.tensor([2, 0]), torch.tensor([1])])


def test_a_stage_out_of_memory_ends_with_one_line_and_no_traceback(prefect_harness, project, monkeypatch, capsys,
                                                                   caplog):
    (project / "params.yaml").write_text("train:\n  micro_batch_size: 8\n")
    monkeypatch.setattr(sys, "argv", ["critic_fit", "train.mini_batch_size=16"])
    with pytest.raises(SystemExit) as exit_info:
        run_stage(scores_too_large)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("critic_fit: out of memory (cpu: 268435456.00 GiB asked) in ragen/policy/scoring.py:")
    assert last.endswith("(token_values); what it holds at once: train.micro_batch_size=4 runs scoring and the update "
                         "in passes of 4 trajectories (now 8; it changes memory only, gradients accumulate exactly; "
                         "train.micro_batch_tokens bounds a pass's padded tokens instead)")
    failed = [r for r in caplog.records if r.name == "prefect.flow_runs" and "Encountered exception" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is None and "Traceback" not in caplog.text


@flow(name="critic_fit")
def a_bug(overrides=None):
    raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")


def test_another_runtime_error_keeps_its_traceback(prefect_harness, project, monkeypatch):
    (project / "params.yaml").write_text("train:\n  micro_batch_size: 8\n")
    monkeypatch.setattr(sys, "argv", ["critic_fit"])
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        run_stage(a_bug)


def test_the_stage_is_the_stage_flow_the_error_came_up_through(prefect_harness, project):
    """A real stage's error (a damaged input of stage filter) came up through flows/filter.py; the tests' own
    errors through none."""
    (project / "params.yaml").write_text("filter:\n  keep_ratio: 0.5\n")
    (project / "data" / "rollouts").mkdir(parents=True)
    (project / "data" / "rollouts" / "base.parquet").write_text("not parquet")
    with pytest.raises(StageFileError) as caught:
        filter_rollouts(params=str(project / "params.yaml"))
    assert stage_of(caught.value, SOURCE_ROOT) == "filter"
    assert stage_of(cpu_refusal(), SOURCE_ROOT) == ""


def test_memory_limits_aside_resets_only_the_micro_batch_limits(tmp_path):
    cfg = config(tmp_path, "train.micro_batch_size=2", "train.micro_batch_tokens=900", "train.lr=0.002")
    aside = memory_limits_aside(cfg)
    assert (aside.train.micro_batch_size, aside.train.micro_batch_tokens, aside.train.lr) == (0, 0, 0.002)
    assert aside == memory_limits_aside(config(tmp_path, "train.lr=0.002"))


def test_a_variant_out_of_memory_ends_the_set_with_its_name_and_the_setting(tmp_path, monkeypatch):
    """`ragen ablate` prints an AblationError as its one line; the variant's own overrides decide the hint. Any
    other error of a variant passes through as it is."""
    import flows.ablate as ablate
    from ragen.ablation import AblationError, AblationRun

    (tmp_path / "params.yaml").write_text("train:\n  mini_batch_size: 32\n")
    run = AblationRun("starpo_s-s1", "starpo_s", 1, ("train.seed=1", "train.micro_batch_size=8"))
    monkeypatch.setattr(ablate, "rl_pipeline", lambda *args, **kw: cpu_refusal_raised())
    with pytest.raises(AblationError) as caught:
        ablate.run_variant.fn(run, "set", str(tmp_path / "ablations"), str(tmp_path / "params.yaml"), "stamp")
    text = str(caught.value)
    assert text.startswith("variant starpo_s-s1: out of memory (cpu: 268435456.00 GiB asked) in flows/ablate.py:")
    assert "; what it holds at once: train.micro_batch_size=4 runs scoring and the update in passes of 4 " \
           "trajectories (now 8; " in text  # the variant's own micro-batch size, halved
    assert text.endswith("; give the set the setting (`ragen ablate SET key=value`) and a rerun skips the variants "
                         "that finished")

    def shapes(*args, **kw):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")

    monkeypatch.setattr(ablate, "rl_pipeline", shapes)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        ablate.run_variant.fn(run, "set", str(tmp_path / "ablations"), str(tmp_path / "params.yaml"), "stamp")


def cpu_refusal_raised():
    raise cpu_refusal()

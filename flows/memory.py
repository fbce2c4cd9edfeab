"""What a stage says when it runs out of memory (`run_stage`): how much it asked for, where, and the settings that
bound what it holds at once, with the one that changes nothing but memory first.

CUDA raises torch.OutOfMemoryError. On the CPU an allocation the kernel refuses outright (more than the machine could
ever give) raises the allocator's RuntimeError; one it grants and cannot back later ends the process with signal 9,
where the stage can say nothing: run by DVC, its command (flows/run.py) says it instead (`killed_message`), from the
stage's peak memory as the kernel reports it to the stage's parent.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Iterator

import torch

from ragen.config import Config

CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
STAGES = ("envgen", "base", "rollout", "filter", "critic_fit", "update", "evaluate", "report")  # flows/<stage>.py


def memory_limits_aside(cfg: Config) -> Config:
    """`cfg` with the settings that change memory and nothing else (the micro-batch limits: their passes' gradients
    add up to the one-pass gradient, to float rounding) at their defaults: what a run's digest is taken of, so that a
    run that ran out of memory resumes, or is skipped as done, under smaller passes."""
    return replace(cfg, train=replace(cfg.train, micro_batch_size=0, micro_batch_tokens=0))


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's out-of-memory error, or the CPU allocator's refusal."""
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError)
                                                        and CPU_ALLOCATOR in str(error))


def asked_for(error: BaseException) -> str:
    """What the failed allocation was, in the error's own figures: "cuda: 20.00 GiB asked, 3.06 MiB free of
    79.19 GiB", "cpu: 37.25 GiB asked"; the error's first line where its wording is not the one known here."""
    text = str(error)
    cpu = re.search(r"allocate (\d+) bytes", text)
    if CPU_ALLOCATOR in text and cpu:
        return f"cpu: {int(cpu.group(1)) / 2**30:.2f} GiB asked"
    cuda = re.search(r"Tried to allocate ([\d.]+ [KMGTP]?i?B)", text)
    if cuda:
        free = re.search(r"total capacity of ([\d.]+ [KMGTP]?i?B) of which ([\d.]+ [KMGTP]?i?B) is free", text)
        return f"cuda: {cuda.group(1)} asked" + (f", {free.group(2)} free of {free.group(1)}" if free else "")
    return (text.strip().splitlines() or [type(error).__name__])[0][:200]


def own_frames(error: BaseException, root: Path) -> Iterator[tuple[Path, traceback.FrameSummary]]:
    """The frames of the project's own code (under `root`/ragen or `root`/flows) on the error's way up, innermost
    first, each with its path relative to `root`."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in ("ragen", "flows"):
            yield path.relative_to(root), frame


def project_frame(error: BaseException, root: Path) -> str:
    """The innermost frame of the project's own code: "ragen/policy/scoring.py:128 (token_logprobs)"; "" if none."""
    for path, frame in own_frames(error, root):
        return f"{path.as_posix()}:{frame.lineno} ({frame.name})"
    return ""


def stage_of(error: BaseException, root: Path) -> str:
    """The pipeline stage whose flow (`root`/flows/<stage>.py) the error came up through, the innermost one; ""."""
    for path, _ in own_frames(error, root):
        if path.parent == Path("flows") and path.stem in STAGES:
            return path.stem
    return ""


def micro_batch_hint(cfg: Config, stage: str) -> str:
    """The micro-batch limits: trajectories (train.micro_batch_size) or padded tokens (train.micro_batch_tokens) per
    forward (and backward) pass of scoring and the update. They change memory only."""
    micro, tokens, mini = cfg.train.micro_batch_size, cfg.train.micro_batch_tokens, cfg.train.mini_batch_size
    exact = "it changes memory only, gradients accumulate exactly" + (
        "; update resumes from its last checkpoint with another one" if stage == "update" else "")
    if tokens:
        return (f"train.micro_batch_tokens={max(1, tokens // 2)} runs scoring and the update in passes of at most "
                f"{max(1, tokens // 2)} padded tokens (now {tokens}; {exact})")
    if micro == 1:
        return (f"train.micro_batch_size is 1 already (one trajectory a pass): shorter episodes "
                f"(rollout.max_turns={cfg.rollout.max_turns}, rollout.max_new_tokens={cfg.rollout.max_new_tokens}) "
                f"change the experiment, or a device with more memory")
    now = (f"now 0: each mini-batch of train.mini_batch_size={mini} in one pass, and each no-grad scoring pass over the"
           f" whole batch" if micro == 0 else f"now {micro}")
    smaller = min(4, mini) if micro == 0 else max(1, micro // 2)
    rows = "1 trajectory" if smaller == 1 else f"{smaller} trajectories"
    return (f"train.micro_batch_size={smaller} runs scoring and the update in passes of {rows} ({now}; {exact}; "
            f"train.micro_batch_tokens bounds a pass's padded tokens instead)")


def sampling_hint(cfg: Config, count: int, what: str) -> str:
    """`count` episodes sampled together (`what` sets the count) and rollout.max_episodes_per_pass, which samples them
    in passes of at most that many: the same episodes with other random draws, so what samples runs anew."""
    k, draws = cfg.rollout.max_episodes_per_pass, "other random draws, so what samples runs anew"
    if 1 < k < count:
        return (f"{count} episodes ({what}) sample in passes of rollout.max_episodes_per_pass={k}: "
                f"rollout.max_episodes_per_pass={k // 2} holds half as many ({draws}); fewer episodes change the "
                "experiment")
    if k == 1 and count > 1:
        return (f"{count} episodes ({what}) sample one at a time (rollout.max_episodes_per_pass=1): fewer or shorter "
                "episodes change the experiment")
    return (f"{count} episodes sample at once ({what}): rollout.max_episodes_per_pass={max(1, count // 4)} samples "
            f"them in passes of that many ({draws}); fewer episodes change the experiment")


def memory_hint(stage: str, cfg: Config) -> list[str]:
    """The settings that bound what `stage` holds at once, the one that changes memory only first."""
    t, sampled = cfg.train, partial(sampling_hint, cfg)
    rollouts = sampled(t.groups * t.group_size, f"train.groups={t.groups} x train.group_size={t.group_size}")
    hints = {
        "base": [f"base.batch_tokens={cfg.base.batch_tokens} tokens make a supervised step (fewer train another base)",
                 sampled(cfg.base.eval_episodes, f"base.eval_episodes={cfg.base.eval_episodes} per env")],
        "rollout": [rollouts],
        "critic_fit": [micro_batch_hint(cfg, stage)],
        "update": [micro_batch_hint(cfg, stage), rollouts,
                   sampled(t.eval_episodes, f"train.eval_episodes={t.eval_episodes}, each val check")],
        "evaluate": [sampled(cfg.eval.episodes, f"eval.episodes={cfg.eval.episodes} per split")],
    }.get(stage, [])
    if cfg.model.dtype == "float32" and cfg.model.device != "cpu":
        hints.append("on CUDA, model.dtype=bf16-mixed (auto's choice there) computes in bfloat16 over float32 weights")
    return hints


def holding(hints: list[str], subject: str = "it") -> str:
    """"; what it holds at once: <hint>; <hint>" ending a memory message, "" without hints."""
    return f"; what {subject} holds at once: {'; '.join(hints)}" if hints else ""


def machine_memory() -> int:
    """The bytes this process may hold at most: the machine's memory, or its cgroup's limit where one is set lower
    (a container's); 0 where /proc/meminfo cannot be read."""
    limits = []
    try:
        total = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        limits.append(int(total.group(1)) * 1024 if total else 0)
    except OSError:
        return 0
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # cgroup v2, v1
        try:
            limits.append(int(Path(path).read_text().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return min(limits)


def killed_message(stage: str, peak_bytes: int, memory_bytes: int, cfg: Config | None) -> str:
    """"killed by signal 9 (SIGKILL) at a peak of 21.9 GiB resident, 95% of the 23.0 GiB this machine gives it; a
    SIGKILL no one sent is the kernel's out-of-memory killer ...; what it holds at once: ..." for a stage the kernel
    ended (flows/run.py); the settings from `memory_hint` when the stage's config is known."""
    line = "killed by signal 9 (SIGKILL)"
    if peak_bytes:
        line += f" at a peak of {peak_bytes / 2**30:.1f} GiB resident"
        if memory_bytes:
            line += f", {peak_bytes / memory_bytes:.0%} of the {memory_bytes / 2**30:.1f} GiB this machine gives it"
    line += ("; a SIGKILL no one sent is the kernel's out-of-memory killer (`dmesg` or `journalctl -k` says so where"
             " you may read them)")
    return line + holding(memory_hint(stage, cfg) if cfg is not None else [])


def worker_died_message(cfg: Config) -> str:
    """For a variant whose every Dask worker died while running it: the usual cause and what to lower (update's
    settings: the stage that holds the most)."""
    return ("every Dask worker that ran it died (distributed's KilledWorker), most often killed for memory, by its "
            "nanny at the worker's memory limit or by the kernel (the workers' logs say which)"
            + holding(memory_hint("update", cfg), "a variant"))


def out_of_memory_message(stage: str, error: BaseException, cfg: Config, root: Path) -> str:
    """"out of memory (cuda: 20.00 GiB asked, ...) in ragen/policy/scoring.py:128 (token_logprobs); what it holds
    at once: ..." for `run_stage`'s last line."""
    where = project_frame(error, root)
    return f"out of memory ({asked_for(error)})" + (f" in {where}" if where else "") + holding(memory_hint(stage, cfg))

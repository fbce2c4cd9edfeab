"""Resumable training checkpoints: model weights and optimizer state as safetensors, scalars as json.

Nothing is pickled: an AdamW state is a dict of tensors per parameter plus json-able param groups, so it is
flattened to "state.<param index>.<name>" tensors in one safetensors file. Writes go to a temp dir that replaces
the checkpoint at once, so a kill during a save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from ragen.fileio import staged_dir


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored (damaged, or of other code); the message names it and the fix."""


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors = {f"state.{index}.{name}": value.detach().contiguous().clone()
               for index, entries in state["state"].items() for name, value in entries.items()}
    return tensors, {"param_groups": state["param_groups"]}


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in group.items()} for group in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(path: str | Path, *, models: dict[str, torch.nn.Module],
                    optimizers: dict[str, torch.optim.Optimizer], meta: dict[str, Any]) -> None:
    with staged_dir(path) as staging:
        groups = {}
        for name, model in models.items():
            save_model(model, str(staging / f"{name}.safetensors"))  # handles tied embeddings
        for name, optimizer in optimizers.items():
            tensors, groups[name] = optimizer_tensors(optimizer)
            save_file(tensors, staging / f"{name}.optimizer.safetensors")
        (staging / "meta.json").write_text(json.dumps({**meta, "optimizers": groups}, indent=2, sort_keys=True))


def load_checkpoint(path: str | Path, *, models: dict[str, torch.nn.Module],
                    optimizers: dict[str, torch.optim.Optimizer]) -> dict[str, Any]:
    """Restore models and optimizers in place; returns the saved meta (e.g. the step).

    Raises:
        CheckpointError: a file is missing, damaged or does not fit the models (naming the checkpoint and the fix:
            delete it, and the stage starts from step 0).
    """
    path = Path(path)
    try:
        meta = read_checkpoint_meta(path)
        if meta is None:
            raise FileNotFoundError(f"{path / 'meta.json'} is missing")
        for name, model in models.items():
            load_model(model, str(path / f"{name}.safetensors"))
        for name, optimizer in optimizers.items():
            load_optimizer(optimizer, load_file(path / f"{name}.optimizer.safetensors"), meta["optimizers"][name])
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as error:
        raise unrestorable(path, f"{type(error).__name__}: {error}") from None
    return meta


def unrestorable(path: Path, cause: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} cannot be restored ({cause}); delete it (rm -r {path}) and the run "
                           "starts again from step 0")


def read_checkpoint_meta(path: str | Path) -> dict[str, Any] | None:
    """The meta.json of the checkpoint at `path` (its step, config digest, history); None when there is none.

    Raises:
        CheckpointError: meta.json is not valid JSON, naming the checkpoint and the fix.
    """
    file = Path(path) / "meta.json"
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise unrestorable(Path(path), f"{file} is not valid JSON: {error}") from None

"""The policy: a Hugging Face causal LM, its tokenizer and chat template, and KV-cache sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen.policy.chat import ChatRenderer
from ragen.policy.fingerprint import changes
from ragen.model_meta import read_meta
from ragen.policy.model import ModelLoadError, load_causal_lm, pick_device, stage_output_error
from ragen.policy.sampling import Sample, TokenTexts, sample
from ragen.policy.scoring import exact_context
from ragen.prompting import forced_prefix


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    token_texts: TokenTexts = field(init=False)

    def __post_init__(self) -> None:
        self.token_texts = TokenTexts(self.tokenizer, generation_eos_ids(self.model))

    @classmethod
    def from_dir(cls, path: str | Path, *, chat_template: str = "", device: str = "auto", dtype: str = "auto",
                 attn: str = "auto") -> Policy:
        model, tokenizer = load_causal_lm(path, chat_template=chat_template, device=device, dtype=dtype, attn=attn)
        return cls(model.eval(), tokenizer)

    @property
    def max_positions(self) -> int:
        """The longest conversation an episode may grow to (`exact_context`): the rollout ends an episode whose next
        turn would pass it ("context")."""
        return exact_context(self.model)

    def renderer(self, enable_think: bool) -> ChatRenderer:
        return ChatRenderer(self.tokenizer, forced_prefix(enable_think))

    def sample(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, top_k: int = 0, generator: torch.Generator | None = None) -> list[Sample]:
        return sample(self.model, self.token_texts, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                      top_p=top_p, top_k=top_k, generator=generator)


def generation_eos_ids(model: PreTrainedModel) -> list[int]:
    """The end tokens of the model's generation config (an id, a list of ids, or none)."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def load_policy(path: str | Path, *, device: str = "auto", dtype: str = "auto", attn: str = "auto") -> Policy:
    """A policy saved by a stage: the weights in `path`, or for `hf` the local checkpoint its meta points to, with
    the chat template stage base recorded there (`model.chat_template`; a trained policy's tokenizer keeps it).

    An hf checkpoint whose files changed since stage base recorded them (`ragen.policy.fingerprint`) is refused:
    the stage would otherwise use other weights than the stages before it, with DVC none the wiser. A directory of
    weights that is missing or does not load is named with the pipeline's fix (`stage_output_error`).
    """
    meta = read_meta(path)
    if meta.get("source") == "hf":
        if "files" in meta and Path(meta["path"]).is_dir() and (changed := changes(meta["path"], meta["files"])):
            raise ModelLoadError(
                f"{path}: the checkpoint {meta['path']} has changed since stage base recorded it "
                f"({'; '.join(changed)}), so this stage would use other weights than the stages before it; restore "
                "those files, or record them again with stage base and rerun every stage after it (`dvc repro -f -s "
                "base`, then `make run`)")
        return Policy.from_dir(meta["path"], chat_template=meta.get("chat_template", ""), device=device, dtype=dtype,
                               attn=attn)
    pick_device(device)  # a device this machine lacks is not the directory's fault
    try:
        return Policy.from_dir(path, device=device, dtype=dtype, attn=attn)
    except ModelLoadError as error:
        raise stage_output_error(path, error) from None


__all__ = ["Policy", "Sample", "load_policy"]

"""Build, load and save the policy and critic: Hugging Face causal LMs, safetensors only.

- `tiny` (the embedded default): a small Qwen2 built from a config whose size is set in params `model`.
- `hf`: a local checkpoint directory (e.g. Qwen2.5-0.5B-Instruct) with its own tokenizer and chat template.
  Nothing is downloaded (`local_files_only`), and weights load only from safetensors (never unpickled).
- The critic is the same architecture with a scalar value head (a token-classification head with one label, as
  RAGEN's critic), its own weights, initialised from the policy; the head starts at zero so V = 0 at first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from pathlib import Path
from typing import Any, get_args

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_layers import GenericForTokenClassification
from transformers.utils import logging as hf_logging

from ragen.fileio import staged_dir
from ragen.model_meta import write_meta
from ragen.policy.chat import ChatRenderer, ChatTemplateError

hf_logging.disable_progress_bar()  # no "Writing model shards" bars in stage logs


class ModelLoadError(RuntimeError):
    """A model path is missing, unreadable or not a causal language model, or its chat template cannot play an
    episode (none, one that rewrites earlier turns, one that refuses a system message)."""


def pick_device(device: str = "auto") -> torch.device:
    """`model.device` on this machine: auto is CUDA when torch sees a GPU, else the CPU. `cuda` where torch sees
    none is a `ModelLoadError` naming why (a CPU-only build of torch, or no GPU visible) and the fix; before, the
    first `.to()` failed in torch's AssertionError traceback."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    picked = torch.device(device)
    if picked.type == "cuda" and not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is a CPU-only build" if torch.version.cuda is None
               else f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) sees no GPU (CUDA_VISIBLE_DEVICES, "
                    "the driver)")
        raise ModelLoadError(f"model.device={device}: {why}; set model.device=auto (a GPU where torch sees one) or "
                             "cpu, or run on a machine with a GPU and a CUDA build of torch")
    return picked


COMPUTE_DTYPE = "ragen_compute_dtype"  # a model's attribute: the dtype its forward passes run in (`computing`)


def pick_precision(device: torch.device, dtype: str = "auto") -> tuple[torch.dtype, torch.dtype | None]:
    """`model.dtype` -> (the parameters' dtype, the dtype forward passes compute in under autocast, or None).

    bf16-mixed (auto on CUDA) keeps float32 parameters, gradients and AdamW state and runs the forward passes in
    bfloat16, as RAGEN's FSDP mixed precision does. Parameters stored in bfloat16 lose every AdamW step smaller
    than half their spacing (2^-9 to 2^-8 of the weight): at RAGEN's actor lr of 1e-6 a weight of 0.02 moves by
    about 1e-6 a step against a spacing of 1.2e-4, so a bfloat16 actor hardly trains (bench/RESULTS.md, "Weights
    in bfloat16"). `bfloat16` and `float16` still load so, for inference."""
    if dtype == "auto":
        dtype = "bf16-mixed" if device.type == "cuda" else "float32"
    if dtype == "bf16-mixed":
        return torch.float32, torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype], None


def set_compute_dtype(model: PreTrainedModel, dtype: torch.dtype | None) -> PreTrainedModel:
    """Mark `model`'s forward passes to run under autocast to `dtype` (None: in its parameters' dtype)."""
    setattr(model, COMPUTE_DTYPE, dtype)
    return model


def computing(model: PreTrainedModel) -> contextlib.AbstractContextManager:
    """The context the model's forward passes run in: autocast to its compute dtype (`pick_precision`), or none.
    Only the forward needs it; backward follows the dtypes autocast chose."""
    dtype = getattr(model, COMPUTE_DTYPE, None)
    return torch.autocast(model.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def pick_attn(device: torch.device, attn: str = "auto", model_class: type | None = None) -> str:
    """eager on CUDA (measured faster than SDPA with our padding masks, see ModelConfig.attn), sdpa on CPU where
    `model_class` has it (Bloom, MPT and XGLM do not)."""
    if attn == "auto":
        cpu_sdpa = device.type != "cuda" and getattr(model_class, "_supports_sdpa", True)
        return "sdpa" if cpu_sdpa else "eager"
    return attn


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int, num_layers: int, num_heads: int,
                     num_kv_heads: int, intermediate_size: int, max_positions: int, seed: int) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM over `tokenizer`'s vocabulary (deterministic by `seed`)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _check_dir(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist; set model.path to a local checkpoint directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model path {path} has no config.json; it is not a Hugging Face model directory")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"model path {path} has no *.safetensors weights (pickled .bin weights are not loaded)")
    return path


def read_chat_template(file: str | Path) -> str:
    """The text of a Jinja chat template file (`model.chat_template`); ModelLoadError naming the key otherwise."""
    path = Path(file).expanduser()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"model.chat_template: cannot read {path} ({error.__class__.__name__}); set it to a "
                             "Jinja chat template file, or leave it empty for the checkpoint's own") from None
    if not text.strip():
        raise ModelLoadError(f"model.chat_template: {path} is empty; set it to a Jinja chat template file, or leave "
                             "it empty for the checkpoint's own")
    return text


def load_causal_lm(path: str | Path, *, chat_template: str = "", device: str = "auto", dtype: str = "auto",
                   attn: str = "auto") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local directory; a clear ModelLoadError naming the path otherwise.

    `chat_template` (its text; empty: the checkpoint's own) replaces the tokenizer's template, so that a
    checkpoint whose template cannot play an episode token in, token out runs with one that can.
    """
    path = _check_dir(path)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as error:  # transformers raises several types for a bad config
        raise ModelLoadError(f"model path {path}: cannot read config.json ({error})") from None
    causal = AutoModelForCausalLM._model_mapping.get(type(config), None)  # the class transformers will build
    if not _is_causal_lm(config, causal):
        held = config.architectures or config.model_type
        if any(arch.endswith("ForConditionalGeneration") for arch in config.architectures or []):
            raise ModelLoadError(f"model path {path} holds {held}, a vision-language model whose text model "
                                 "transformers does not load as a causal LM; use a text-only checkpoint")
        raise ModelLoadError(f"model path {path} holds {held}, not a causal LM")
    if causal is not None and not takes_past_key_values(causal):
        raise ModelLoadError(f"model path {path}: {causal.__name__} keeps its state outside transformers' cache, "
                             "which the sampler extends turn by turn; use a family that takes past_key_values "
                             "(attention models, or hybrids such as Qwen3.5, Jamba, Falcon-H1, LFM2)")
    torch_device = pick_device(device)
    param_dtype, compute_dtype = pick_precision(torch_device, dtype)
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, use_safetensors=True, dtype=param_dtype,
            attn_implementation=pick_attn(torch_device, attn, causal))
    except Exception as error:
        raise ModelLoadError(f"model path {path}: cannot load the causal LM or its tokenizer ({error})") from None
    set_compute_dtype(model, compute_dtype)
    if chat_template:
        tokenizer.chat_template = chat_template
    whose = "model.chat_template" if chat_template else f"model path {path}: its chat template"
    if tokenizer.chat_template is None:
        raise ModelLoadError(f"model path {path}: the tokenizer has no chat template; use an instruct (chat) "
                             "checkpoint, or set model.chat_template to a Jinja template file")
    try:
        ChatRenderer(tokenizer, "<think>").check()
    except ChatTemplateError:
        raise ModelLoadError(
            f"{whose} rewrites earlier turns of a conversation (as Qwen3's drops earlier reasoning), and one token "
            "sequence per episode needs each turn's text to stay as it was sampled; set model.chat_template to a "
            "template file that keeps earlier turns (for Qwen3 and Qwen3.5, chat_templates/chatml.jinja, Qwen2.5's "
            "ChatML, in the ragen repository)") from None
    except Exception as error:  # the template's own error: Gemma 2's and early Mistral's refuse a system message
        raise ModelLoadError(
            f"{whose} cannot render an episode (a system message, then user and assistant turns): {error}; set "
            "model.chat_template to a template file that takes a system message") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.to(torch_device), tokenizer


def _is_causal_lm(config: Any, causal: type | None) -> bool:
    """A causal LM checkpoint (its class is the one AutoModelForCausalLM builds, `causal`: Qwen2ForCausalLM,
    GPT2LMHeadModel), or a vision-language one whose text model transformers loads as a causal LM (a Qwen3.5
    checkpoint holds Qwen3_5ForConditionalGeneration; AutoModelForCausalLM reads its Qwen3_5ForCausalLM)."""
    architectures = config.architectures or []
    if any(arch.endswith("ForCausalLM") for arch in architectures):
        return True
    if causal is None:
        return False
    return causal.__name__ in architectures or (causal.__name__.endswith("ForCausalLM") and any(
        arch.endswith("ForConditionalGeneration") for arch in architectures))


def takes_past_key_values(model_class: type) -> bool:
    """Whether the family keeps its state in transformers' cache, which the sampler extends turn by turn: its forward
    takes `past_key_values` and its output carries them. False for Mamba and RWKV, whose state lives in their own
    `cache_params` or `state`, and for RecurrentGemma, which takes `past_key_values` but keeps its state in its
    layers."""
    forward = inspect.signature(model_class.forward)
    outputs = [c for c in get_args(forward.return_annotation) or (forward.return_annotation,)
               if dataclasses.is_dataclass(c)]  # e.g. tuple | CausalLMOutputWithPast; none annotated: trusted
    return "past_key_values" in forward.parameters and all(
        "past_key_values" in {field.name for field in dataclasses.fields(output)} for output in outputs)


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer exactly as its tokenizer.json defines it.

    AutoTokenizer picks a tokenizer class from the model type in config.json (Qwen2Tokenizer for a qwen2 model)
    and rebuilds its pre-tokenizer, which would silently re-tokenise our own byte-level BPE differently from how
    it was trained. Loading tokenizer.json verbatim is right for both our tiny models and real checkpoints; only
    a directory without one (sentencepiece) goes through AutoTokenizer.
    """
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def register_critic_class(config: Any) -> None:
    """Let AutoModelForTokenClassification build and load a value model for `config`'s family: transformers' own
    token-classification model where it has one, else (Gemma 3, OLMo 2, Granite, ...) one built as transformers
    builds its own (its generic token-classification model over the family's base class), registered here so that
    a saved critic loads back."""
    if type(config) in AutoModelForTokenClassification._model_mapping:
        return
    causal = AutoModelForCausalLM._model_mapping[type(config)]
    base = next(c for c in causal.__mro__ if c.__name__.endswith("PreTrainedModel") and c is not PreTrainedModel)
    name = causal.__name__.replace("ForCausalLM", "ForTokenClassification")
    # the family's module: transformers treats a class from outside its package as remote code, whose loading skips
    # the init of modules without weights of their own (Falcon-H1's base model sets its mup_vector buffers there)
    cls = type(name, (GenericForTokenClassification, base), {"__module__": causal.__module__,
                                                             "config_class": type(config)})
    AutoModelForTokenClassification.register(type(config), cls, exist_ok=True)


def build_critic(policy: PreTrainedModel) -> PreTrainedModel:
    """A value model (see `register_critic_class`): the policy's backbone weights (copied) plus a zero-initialised
    scalar head."""
    # no dropout before the value head (transformers' token-classification default is 0.1): it would make the
    # critic random in train mode and runs irreproducible
    config = policy.config.__class__.from_dict(
        {**policy.config.to_dict(), "num_labels": 1, "id2label": {0: "value"}, "label2id": {"value": 0},
         "classifier_dropout": 0.0})
    register_critic_class(config)
    with torch.random.fork_rng(devices=[]):
        critic = AutoModelForTokenClassification.from_config(
            config, dtype=policy.dtype, attn_implementation=policy.config._attn_implementation)
    backbone(critic).load_state_dict(backbone(policy).state_dict())
    head = value_head(critic)
    torch.nn.init.zeros_(head.weight)
    if head.bias is not None:
        torch.nn.init.zeros_(head.bias)
    return set_compute_dtype(critic.to(policy.device).eval(), getattr(policy, COMPUTE_DTYPE, None))


def backbone(model: PreTrainedModel) -> torch.nn.Module:
    """The transformer under a model's head: the attribute its `base_model_prefix` names, or `model` where that
    names none (Llama 4's text model says "language_model" but keeps its layers in `model`)."""
    body = getattr(model, model.base_model_prefix, None)
    return body if isinstance(body, torch.nn.Module) else model.model


def value_head(critic: PreTrainedModel) -> torch.nn.Module:
    """The critic's scalar head: `score` in most families, `classifier` in GPT-2, GPT-NeoX, Falcon, Bloom, MPT."""
    head = getattr(critic, "score", None)
    return head if isinstance(head, torch.nn.Module) else critic.classifier


def stage_output_error(path: str | Path, error: ModelLoadError) -> ModelLoadError:
    """`error` from loading a model directory that a stage wrote (models/base, models/policy, a critic), with the
    pipeline's fix instead of a model path's: build it, or rebuild it. Before, a missing models/policy read "model
    path models/policy does not exist; set model.path to a local checkpoint directory", and damaged weights named no
    fix at all."""
    if not Path(path).exists():
        return ModelLoadError(f"{path} does not exist; the pipeline's stages write it: run `dvc repro` (or, by hand, "
                              "the stages before this one)")
    return ModelLoadError(f"{error}; delete {path} and run `dvc repro` to rebuild it")


def load_critic(path: str | Path, *, device: str = "auto", dtype: str = "auto", attn: str = "auto") -> PreTrainedModel:
    """A critic saved by a stage (`stage_output_error` when it does not load)."""
    torch_device = pick_device(device)  # a device this machine lacks is not the directory's fault
    param_dtype, compute_dtype = pick_precision(torch_device, dtype)
    try:
        path = _check_dir(path)
    except ModelLoadError as error:
        raise stage_output_error(path, error) from None
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        register_critic_class(config)
        critic_class = AutoModelForTokenClassification._model_mapping[type(config)]
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, local_files_only=True, use_safetensors=True, dtype=param_dtype,
            attn_implementation=pick_attn(torch_device, attn, critic_class))
    except Exception as error:
        raise stage_output_error(path, ModelLoadError(f"critic path {path}: cannot load ({error})")) from None
    return set_compute_dtype(model.to(torch_device), compute_dtype)


def save_model(model: PreTrainedModel, dest: str | Path, *, tokenizer: PreTrainedTokenizerBase | None = None,
               meta: dict[str, Any] | None = None) -> None:
    """Write weights (safetensors), config, tokenizer and meta to `dest` all at once (temp dir, then rename)."""
    with staged_dir(dest) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        write_meta(staging, meta)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

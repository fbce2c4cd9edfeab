"""Which Hugging Face causal LM families the hf path handles exactly: a sweep over transformers' model types.

    python bench/bench_families.py [--types llama qwen3_5_text ...] [--timeout 90]

For every model type AutoModelForCausalLM knows (or those named), a random model from a generic tiny config
(64 tokens, width 32, two layers, attention windows of 12 slots; a few families need their own keys, below) runs
the checks the rollout and the update rely on, each type in its own process (some build large default sub-models,
or run out of memory):

    load       stage base's checks: a causal LM that keeps its state in past_key_values (Mamba, RWKV,
               RecurrentGemma: refused)
    session    a sampling session whose rows wait, join with suffixes of different lengths and finish at different
               times: greedy tokens and log-probs equal fresh passes (to 1e-4)
    prefix     scoring with the shared prefix run once equals the full pass (1e-4), and zero on the prefix
    critic     the critic starts at zero, reads the shared prefix with the full pass's values, and a saved one
               loads back in a fresh registry with the same values (1e-5)

and prints a line per type: `ok`, or the first check that failed and why. `config` means the generic tiny config
is not valid for that family (not a finding about the family). Not a test: it prints, it does not judge
(tests/policy/test_families.py runs `check` on the families the hf path must handle).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, pad_token_id=0, eos_token_id=1, bos_token_id=2, max_position_embeddings=256,
              initializer_range=0.2)
# sliding windows (Mistral, Gemma 2 and 3, GPT-OSS, Phi-3, ...), Llama 4's attention chunks and GPT-Neo's local layers
# shrunk to 12 slots: the session's first call fits in them (9 slots), its later calls do not, and the prefix check's
# 8-token rows do
WINDOW_KEYS, WINDOW = ("sliding_window", "attention_chunk_size", "window_size"), 12
# latent attention (DeepSeek-V2/V3 and the families built on it: MiniCPM3, GLM-4 MoE Lite, DeepSeek-V3.2, ...)
MLA = dict(num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
           moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1)
# DeepSeek's sparse attention on top (deepseek_v32, glm_moe_dsa): its indexer keeps 4 keys a query, so the sessions
# here (up to 20 tokens) use it. With few indexer heads its ReLU scores tie at zero, and which of the tied keys a pass
# keeps depends on where the row's keys sit (left padding): 32 heads, as the real models have 32-64.
DSA = dict(MLA, index_topk=4, index_head_dim=16, index_n_heads=32)
# linear attention by gated delta rule beside full attention (Qwen3.5, Qwen3-Next), and Qwen's MoE block
GATED_DELTA = dict(layer_types=["linear_attention", "full_attention"], head_dim=16, linear_key_head_dim=8,
                   linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2)
QWEN_MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16)
# Mamba-2 layers beside attention (Bamba, Granite 4.0 hybrid)
MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=16)
# families whose required keys the generic config lacks (a hybrid's two layers must include an attention layer)
OWN_KEYS = {
    **{name: MLA for name in ("deepseek_v2", "deepseek_v3", "minicpm3", "glm4_moe_lite", "youtu", "axk1", "axk2")},
    **{name: DSA for name in ("deepseek_v32", "glm_moe_dsa")},
    "longcat_flash": dict(num_layers=2, num_key_value_heads=2, ffn_hidden_size=64, q_lora_rank=16, kv_lora_rank=16,
                          qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=8, moe_topk=2,
                          n_routed_experts=4, zero_expert_num=2, expert_ffn_hidden_size=16),
    "gptj": dict(n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=256),
    # CodeGen splits its heads over 4 model-parallel groups: 4 heads at least
    "codegen": dict(hidden_size=64, num_attention_heads=4, rotary_dim=8, n_positions=256, n_ctx=256),
    "gemma2": dict(head_dim=16),
    "gemma3n_text": dict(intermediate_size=64, layer_types=["sliding_attention", "full_attention"], head_dim=16,
                         num_kv_shared_layers=0, vocab_size_per_layer_input=64, hidden_size_per_layer_input=8,
                         laurel_rank=4, activation_sparsity_pattern=[0.0, 0.0]),
    "gpt_neo": dict(num_layers=2, attention_types=[[["global", "local"], 1]], intermediate_size=64),
    **{name: dict(head_dim=16) for name in ("hunyuan_v1_dense", "helium", "ministral")},
    "hunyuan_v1_moe": dict(head_dim=16, num_experts=2, moe_topk=1),
    "diffllama": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8),  # heads split in two: an even count
    "dots1": dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
                  first_k_dense_replace=1),
    "cohere_compass_text": dict(layer_types=["full_attention", "sliding_attention"], head_dim=16,
                                rope_parameters={kind: dict(rope_type="default", rope_theta=10000.0)
                                                 for kind in ("full_attention", "sliding_attention")}),
    # DBRX clamps q, k and v by clip_qkv, which its real checkpoints set (8)
    "dbrx": dict(d_model=32, n_heads=2, n_layers=2, max_seq_len=256,
                 attn_config=dict(kv_n_heads=1, clip_qkv=8.0, rope_theta=1e4),
                 ffn_config=dict(ffn_hidden_size=64, moe_num_experts=2, moe_top_k=1)),
    "llama4_text": dict(num_local_experts=2, intermediate_size_mlp=64),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=16),
    "minimax": dict(num_local_experts=2, num_experts_per_tok=1),
    "qwen3_5_text": GATED_DELTA,
    **{name: dict(GATED_DELTA, **QWEN_MOE) for name in ("qwen3_next", "qwen3_5_moe_text")},
    # Qwen4-Exp's sparse attention (QSA) keeps 4 compressed keys a query: the sessions here use it
    "qwen4_exp_text": dict(GATED_DELTA, **QWEN_MOE, layer_types=["linear_attention", "indexed_attention"],
                           indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4,
                           indexer_compress_ratio=2),
    **{name: dict(MLA, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
                  head_dim=16, linear_head_dim=8, linear_num_heads=4, num_experts_per_token=2, num_expert_group=1,
                  layer_group_size=2, num_experts=4) for name in ("kimi_linear", "bailing_hybrid")},
    "recurrent_gemma": dict(block_types=["recurrent", "attention"], lru_width=32, head_dim=16, num_key_value_heads=2),
    "jamba": dict(num_experts=2, mamba_d_state=8, mamba_dt_rank=4, attn_layer_offset=1, attn_layer_period=2,
                  expert_layer_period=2, expert_layer_offset=1),
    "falcon_h1": dict(mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, head_dim=16),
    "lfm2": dict(full_attn_idxs=[1]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=16),
    "bamba": dict(MAMBA2, attn_layer_indices=[1]),
    "granitemoehybrid": dict(MAMBA2, layer_types=["mamba", "attention"], num_local_experts=2, num_experts_per_tok=1),
    "zamba": dict(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid", "hybrid"], attn_layer_period=2,
                  attn_layer_offset=1, attention_head_dim=16, mamba_dt_rank=4, mamba_d_state=8,
                  use_mamba_kernels=False),
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"], hybrid_layer_ids=[1], attention_head_dim=16,
                   mamba_d_state=8, n_mamba_heads=4, mamba_headdim=16, chunk_size=16, use_mamba_kernels=False),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2),
    "bloom": dict(n_layer=2, n_head=2),
    "mpt": dict(d_model=32, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=256),
}


def fixed_texts():
    """TokenTexts for a 64-token vocabulary with no stop tokens and no tokenizer: every row samples its full
    budget (imported here: the sweep's parent process does not load torch)."""
    from ragen.policy.sampling import TokenTexts

    texts = object.__new__(TokenTexts)  # its methods, without a tokenizer to read
    texts.texts, texts.stop_ids, texts.pad_id = [f"t{i} " for i in range(64)], set(), 0
    return texts


def check(model_type: str) -> str:
    """The checks on one model type, in this process; returns `ok` or `<check>: <why>`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    from ragen.policy.model import build_critic, load_critic, save_model, takes_past_key_values, value_head
    from ragen.policy.sampling import SamplingSession, sample
    from ragen.policy.scoring import token_logprobs, token_values

    hf_logging.set_verbosity_error()
    step = "config"
    try:
        keys = {**COMMON, **OWN_KEYS.get(model_type, {})}
        try:
            config = AutoConfig.for_model(model_type, **keys)
        except Exception:
            config = AutoConfig.for_model(model_type, **{k: v for k, v in keys.items() if k != "num_key_value_heads"})
        for key in WINDOW_KEYS:  # a window the session outgrows after its first call
            if getattr(config, key, None):
                setattr(config, key, WINDOW)
        step = "build"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        step = "load"
        if not takes_past_key_values(type(model)):
            return "load: refused (its state lives outside transformers' cache)"
        step = "session"
        session, sequences = SamplingSession(model, fixed_texts(), 3), [[5, 6, 7, 8, 9], [12, 13], [5, 6, 7, 8, 9]]
        for turn, rows in enumerate(([0, 1, 2], [0, 1], [1, 2], [0, 1, 2])):
            got = session.sample(rows, [sequences[r] for r in rows], max_new_tokens=4, temperature=0.0)
            for row, a in zip(rows, got):
                b = sample(model, fixed_texts(), [sequences[row]], max_new_tokens=4, temperature=0.0)[0]
                gap = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs))
                if a.token_ids != b.token_ids or gap > 1e-4:
                    return f"session: turn {turn + 1} row {row} differs from a fresh pass (log-prob gap {gap:.1e})"
                sequences[row] += list(a.token_ids) + [30 + turn + row] * (row + 1)
        step = "prefix"
        ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 11, 12, 13, 14]])
        att = torch.ones_like(ids)
        full, shared = token_logprobs(model, ids, att)[0], token_logprobs(model, ids, att, prefix_len=4)[0]
        gap = (shared[:, 4:] - full[:, 4:]).abs().max()
        if gap > 1e-4 or torch.any(shared[:, :4] != 0):
            return f"prefix: {gap:.1e} off the full pass, or the prefix not zero"
        step = "critic"
        critic = build_critic(model)
        if torch.any(token_values(critic, ids, att) != 0):
            return "critic: does not start at zero"
        torch.nn.init.normal_(value_head(critic).weight)
        values = token_values(critic, ids, att)
        gap = (token_values(critic, ids, att, prefix_len=4)[:, 4:] - values[:, 4:]).abs().max()
        if gap > 1e-4:
            return f"critic: the shared prefix is {gap:.1e} off the full pass"
        with tempfile.TemporaryDirectory() as tmp:
            save_model(critic, Path(tmp) / "critic")
            AutoModelForTokenClassification._model_mapping._extra_content.pop(type(critic.config), None)
            gap = (token_values(load_critic(Path(tmp) / "critic", device="cpu"), ids, att) - values).abs().max()
        if gap > 1e-5:
            return f"critic: loads back {gap:.1e} off"
        return "ok"
    except Exception as error:
        return f"{step}: {type(error).__name__}: {' '.join(str(error).split())[:150]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="*", help="model types (default: every causal LM type transformers knows)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per type")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: check one type in this process
    args = parser.parse_args()
    if args.one:
        print(check(args.one))
        return
    from transformers import __version__
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = args.types or list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    print(f"transformers {__version__}: {len(types)} causal LM model types")
    outcomes = Counter()
    for model_type in types:
        try:
            run = subprocess.run([sys.executable, __file__, "--one", model_type], capture_output=True, text=True,
                                 timeout=args.timeout)
            lines = run.stdout.strip().splitlines()
            result = lines[-1] if run.returncode == 0 and lines else f"crash: exit {run.returncode}"
        except subprocess.TimeoutExpired:
            result = f"timeout: over {args.timeout:.0f} s (a large default sub-model)"
        outcomes[result.split(":")[0]] += 1
        print(f"{model_type:28s} {result}", flush=True)
    print("summary: " + ", ".join(f"{name} {count}" for name, count in outcomes.most_common()))


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)

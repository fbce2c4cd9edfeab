"""The hf path across model families (random tiny models built here): what the rollout and the update rely on.

For each family, `bench/bench_families.py`'s checks: a sampling session whose rows wait, join with suffixes of
different lengths and finish at different times gives the greedy tokens and log-probs of fresh passes; scoring with
the shared prefix run once gives the full pass's log-probs; a critic starts at zero, reads the shared prefix with the
full pass's values, and loads back with the same values. Attention windows are cut to 12 slots, which the sessions
outgrow. The families span attention by position ids (Llama, Llama 4, whose backbone is not where its
base_model_prefix says and whose attention runs in chunks, Mistral's, Gemma 2's, Gemma 3's and GPT-OSS's sliding
windows, GPT-Neo's local layers, Phi-3, GPT-2, GPT-NeoX, GPT-J's and CodeGen's partial rotary, DeepSeek-V3's latent
attention and DeepSeek-V3.2's sparse one, an MoE), caches of their own kind (DeepSeek-V4's compressed attention,
HY-V4's indexed one), recurrent hybrids (Qwen3-Next, Jamba, Falcon-H1, LFM2, MiniMax, whose cache keeps its
linear-attention states beside its layers, and Granite 4.0's Mamba-2 layers) and ALiBi (Bloom, MPT).
"""

import pytest
from benchload import load_bench

bench_families = load_bench("bench_families")

FAMILIES = ["llama", "llama4_text", "mistral", "phi3", "gemma2", "gemma3_text", "gpt_oss", "qwen2_moe", "deepseek_v3",
            "deepseek_v32", "deepseek_v4", "hy_v4", "gpt2", "gpt_neox", "gptj", "codegen", "gpt_neo", "qwen3_next", "jamba",
            "falcon_h1", "lfm2", "minimax", "granitemoehybrid", "bloom", "mpt"]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_sessions_the_shared_prefix_and_the_critic_match_full_passes(model_type):
    assert bench_families.check(model_type) == "ok"

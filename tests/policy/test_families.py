"""The hf path across model families (random tiny models built here): what the rollout and the update rely on.

For each family: a sampling session whose rows wait, join with suffixes of different lengths and finish at different
times gives the log-probs of fresh passes; scoring with the shared prefix run once gives the full pass's log-probs;
a critic starts at zero, reads the shared prefix with the full pass's values, and loads back with the same values.
The families span attention by position ids (Llama, Llama 4, whose backbone is not where its base_model_prefix
says, Mistral, Phi-3, Gemma 2, GPT-2, GPT-NeoX, DeepSeek-V3's latent attention, an MoE), caches of their own kind
(DeepSeek-V4's compressed attention, HY-V4's indexed one), recurrent hybrids (Qwen3-Next, Jamba, Falcon-H1, LFM2,
MiniMax, whose cache keeps its linear-attention states beside its layers) and ALiBi (Bloom, MPT).
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

from ragen.policy.model import build_critic, load_critic, save_model, value_head
from ragen.policy.sampling import SamplingSession, sample
from ragen.policy.scoring import token_logprobs, token_values

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, pad_token_id=0, eos_token_id=1, bos_token_id=2, max_position_embeddings=256,
              initializer_range=0.2)
FAMILIES = {
    "llama": {},
    "llama4_text": dict(num_local_experts=2, intermediate_size_mlp=64),
    "mistral": {},
    "phi3": {},
    "gemma2": dict(head_dim=16),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=16),
    "deepseek_v3": dict(num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                        qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=16, n_routed_experts=4,
                        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1),
    "deepseek_v4": {},
    "hy_v4": {},
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2),
    "gpt_neox": {},
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], head_dim=16, linear_key_head_dim=8,
                       linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, num_experts=2,
                       num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16),
    "jamba": dict(num_experts=2, mamba_d_state=8, mamba_dt_rank=4, attn_layer_offset=1, attn_layer_period=2,
                  expert_layer_period=2, expert_layer_offset=1),
    "falcon_h1": dict(mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, head_dim=16),
    "lfm2": dict(full_attn_idxs=[1]),
    "minimax": dict(num_local_experts=2, num_experts_per_tok=1),
    "bloom": dict(n_layer=2, n_head=2),
    "mpt": dict(d_model=32, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=256),
}


class Texts:
    """TokenTexts for a 64-token vocabulary with no stop tokens: every row samples its full budget."""

    texts = [f"t{i} " for i in range(64)]
    stop_ids: set[int] = set()
    pad_id = 0


@pytest.fixture(params=sorted(FAMILIES))
def model(request):
    config = AutoConfig.for_model(request.param, **{**COMMON, **FAMILIES[request.param]})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_a_sampling_session_gives_the_log_probs_of_fresh_passes(model):
    session = SamplingSession(model, Texts(), 3)
    sequences = [[5, 6, 7, 8, 9], [12, 13], [5, 6, 7, 8, 9]]
    for turn, rows in enumerate(([0, 1, 2], [0, 1], [1, 2], [0, 1, 2])):  # row 2 waits a turn, then row 0
        got = session.sample(rows, [sequences[r] for r in rows], max_new_tokens=4, temperature=0.0)
        for row, a in zip(rows, got):
            b = sample(model, Texts(), [sequences[row]], max_new_tokens=4, temperature=0.0)[0]
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
            sequences[row] += list(a.token_ids) + [30 + turn + row] * (row + 1)  # suffixes of different lengths


def test_the_shared_prefix_and_the_critic_match_full_passes(model, tmp_path):
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 11, 12, 13, 14]])
    att = torch.ones_like(ids)
    full, shared = token_logprobs(model, ids, att)[0], token_logprobs(model, ids, att, prefix_len=4)[0]
    assert torch.allclose(shared[:, 4:], full[:, 4:], atol=1e-4) and torch.all(shared[:, :4] == 0)
    critic = build_critic(model)
    assert torch.all(token_values(critic, ids, att) == 0)
    torch.nn.init.normal_(value_head(critic).weight)
    values = token_values(critic, ids, att)
    assert torch.allclose(token_values(critic, ids, att, prefix_len=4)[:, 4:], values[:, 4:], atol=1e-4)
    save_model(critic, tmp_path / "critic")
    AutoModelForTokenClassification._model_mapping._extra_content.pop(type(critic.config), None)  # a fresh process
    assert torch.allclose(token_values(load_critic(tmp_path / "critic", device="cpu"), ids, att), values, atol=1e-5)

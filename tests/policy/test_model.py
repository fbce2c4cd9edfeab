"""The hf path (a small random Qwen2 built here, no download), the critic, safe saving and clear load errors."""

import json

import pytest
import torch
from transformers import BloomForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from ragen.fileio import StageFileError
from ragen.policy import Policy, load_policy
from ragen.model_meta import read_meta
from ragen.policy.model import (ModelLoadError, build_critic, computing, load_causal_lm, load_critic, pick_attn,
                                pick_device, pick_precision, read_chat_template, save_model)
from ragen.policy.sampling import left_pad
from ragen.policy.scoring import score_sequences, token_logprobs, token_values
from ragen.prompting import SYSTEM_PROMPT


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tokenizer):
    """A Hugging Face checkpoint directory as a user would have one: Qwen2 config, safetensors, tokenizer."""
    path = tmp_path_factory.mktemp("qwen2_random")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def test_hf_path_loads_samples_and_scores(hf_dir):
    model, tokenizer = load_causal_lm(hf_dir, device="cpu")
    assert model.config.model_type == "qwen2" and tokenizer.chat_template
    policy = Policy(model.eval(), tokenizer)
    _, prompt, _ = policy.renderer(True).start("Turn 1:\nState:\nPG\n")
    samples = policy.sample([prompt, prompt[3:]], max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    seqs = [prompt + list(samples[0].token_ids), prompt[3:] + list(samples[1].token_ids)]
    ids, mask = left_pad(seqs, tokenizer.pad_token_id, model.device)
    logprobs, _ = score_sequences(model, ids, mask)
    for row, s in enumerate(samples):
        assert torch.allclose(logprobs[row, ids.shape[1] - len(s.token_ids):], torch.tensor(s.logprobs), atol=1e-4)


def test_eager_and_sdpa_attention_agree_on_padded_batches(hf_dir):
    """model.attn picks the attention kernel only: same samples, same log-probs, critic included."""
    assert pick_attn(torch.device("cuda")) == "eager" and pick_attn(torch.device("cpu")) == "sdpa"
    assert pick_attn(torch.device("cuda"), "sdpa") == "sdpa"
    assert pick_attn(torch.device("cpu"), "auto", BloomForCausalLM) == "eager"  # Bloom has no SDPA
    runs = {}
    for attn in ("eager", "sdpa"):
        model, tokenizer = load_causal_lm(hf_dir, device="cpu", attn=attn)
        assert model.config._attn_implementation == attn
        assert build_critic(model).config._attn_implementation == attn
        policy = Policy(model.eval(), tokenizer)
        prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ["State:\n#_P#", "Up", "Turn 1:\nState:"]]
        samples = policy.sample(prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(3))
        ids, mask = left_pad([p + list(s.token_ids) for p, s in zip(prompts, samples)], tokenizer.pad_token_id,
                             model.device)
        sampled = torch.zeros_like(mask, dtype=torch.bool)  # (B, T) the sampled tokens, right-aligned
        for row, s in enumerate(samples):
            sampled[row, ids.shape[1] - len(s.token_ids):] = True
        # a left-padded row's first real token has no real context: its score is arbitrary and never used
        runs[attn] = samples, score_sequences(model, ids, mask)[0][sampled]
    assert [s.token_ids for s in runs["eager"][0]] == [s.token_ids for s in runs["sdpa"][0]]
    assert torch.allclose(runs["eager"][1], runs["sdpa"][1], atol=1e-4)
    assert load_critic(hf_dir, device="cpu", attn="eager").config._attn_implementation == "eager"


def test_critic_starts_from_the_policy_with_zero_values(policy, tmp_path):
    critic = build_critic(policy.model)
    for name, weight in policy.model.model.state_dict().items():
        assert torch.equal(critic.model.state_dict()[name], weight)
    ids = torch.tensor([[5, 6, 7, 8]])
    values = token_values(critic, ids, torch.ones_like(ids))
    assert values.shape == (1, 4) and torch.all(values == 0)
    critic.train()  # no dropout: the value of a sequence does not depend on the mode
    assert torch.equal(token_values(critic, ids, torch.ones_like(ids)), values)
    critic.score.weight.data.fill_(0.01)  # its own weights: the policy is untouched
    assert torch.equal(policy.model.model.embed_tokens.weight, critic.model.embed_tokens.weight)
    save_model(critic, tmp_path / "critic")
    again = load_critic(tmp_path / "critic", device="cpu")
    assert torch.equal(again.score.weight, critic.score.weight)


@pytest.mark.parametrize("family", ["gpt2", "bloom"])
def test_older_families_load_and_get_a_critic(tmp_path, tokenizer, family):
    """GPT-2 (GPT2LMHeadModel, not ...ForCausalLM) and Bloom (no SDPA, so `model.attn: auto` takes eager on the CPU):
    each loads as a causal LM; its critic's head is `classifier`, not `score`; it starts at zero, reads the shared
    prompt once with the values of a full pass, and loads back."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ragen.policy.model import value_head

    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), hidden_size=32, n_embd=32, n_layer=2, n_head=2,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "ckpt")
    model, _ = load_causal_lm(tmp_path / "ckpt", device="cpu")
    assert model.config._attn_implementation == ("sdpa" if family == "gpt2" else "eager")
    critic = build_critic(model)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12, 13]])
    att = torch.ones_like(ids)
    assert value_head(critic) is critic.classifier and torch.all(token_values(critic, ids, att) == 0)
    critic.classifier.weight.data.normal_()
    values = token_values(critic, ids, att)
    assert torch.allclose(token_values(critic, ids, att, prefix_len=3)[:, 3:], values[:, 3:], atol=1e-5)
    save_model(critic, tmp_path / "critic")
    assert torch.allclose(token_values(load_critic(tmp_path / "critic", device="cpu"), ids, att), values)


FALCON_H1 = dict(mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, head_dim=16)


@pytest.mark.parametrize("model_type, family, extra", [("gemma3_text", "Gemma3", {}), ("olmo2", "Olmo2", {}),
                                                       ("granite", "Granite", {}),
                                                       ("falcon_h1", "FalconH1", FALCON_H1)])
def test_a_family_without_a_token_classification_model_gets_a_critic(tmp_path, model_type, family, extra):
    """Gemma 3, OLMo 2, Granite and Falcon-H1 (like most causal LM families) have no token-classification class in
    transformers: the critic is built the way transformers builds its own, and a saved one loads back in a fresh
    process (Falcon-H1's with the mup_vector buffers its base model's init sets)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                  eos_token_id=1, pad_token_id=0, bos_token_id=2, **extra)
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(config)
    critic = build_critic(policy)
    assert type(critic).__name__ == f"{family}ForTokenClassification"
    for name, weight in policy.model.state_dict().items():
        assert torch.equal(critic.model.state_dict()[name], weight)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12, 13]])
    att = torch.ones_like(ids)
    assert torch.all(token_values(critic, ids, att) == 0)
    critic.score.weight.data.normal_()
    values = token_values(critic, ids, att)
    shared = token_values(critic, ids, att, prefix_len=3)  # the shared prompt once, through the family's cache
    assert torch.allclose(shared[:, 3:], values[:, 3:], atol=1e-5)
    save_model(critic, tmp_path / "critic")
    AutoModelForTokenClassification._model_mapping._extra_content.pop(type(config))  # as in a fresh process
    again = load_critic(tmp_path / "critic", device="cpu")
    assert type(again).__name__ == f"{family}ForTokenClassification"
    assert torch.allclose(token_values(again, ids, att), values)


def test_the_value_of_a_token_is_read_before_the_token(policy):
    """values[t] = V(x_<t): the baseline of token t must not see x_t (else a good critic cancels its advantage)."""
    critic = build_critic(policy.model)
    torch.manual_seed(0)
    critic.score.weight.data.normal_()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    changed = ids.clone()
    changed[0, 2] = 11  # another token at position 2
    mask = torch.ones_like(ids)
    values, other = token_values(critic, ids, mask), token_values(critic, changed, mask)
    assert values[0, 0] == 0  # no state before the first token
    assert torch.equal(values[:, :3], other[:, :3])  # positions 0..2 read tokens 0..1 only
    assert not torch.allclose(values[:, 3], other[:, 3])  # position 3 has read the changed token
    head = critic(input_ids=ids, attention_mask=mask).logits.squeeze(-1)  # (1, 5): head(h_t)
    assert torch.allclose(values[:, 1:], head[:, :-1])


def test_save_model_is_complete_and_loads(policy, tmp_path):
    save_model(policy.model, tmp_path / "policy", tokenizer=policy.tokenizer, meta={"source": "tiny"})
    files = {p.name for p in (tmp_path / "policy").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "ragen_meta.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    assert read_meta(tmp_path / "policy") == {"source": "tiny"}
    again = load_policy(tmp_path / "policy", device="cpu")
    # the tokenizer comes back exactly: same ids for env text (config.json's qwen2 type must not swap it for
    # Qwen2Tokenizer, whose pre-tokenizer splits differently)
    for text in ["Target: 76, nums: [35, 12, 99]", "You have 9 actions left. Always output:", "######\n#_P__#"]:
        assert again.tokenizer.encode(text) == policy.tokenizer.encode(text)
    ids = torch.tensor([[3, 4, 5]])
    assert torch.equal(again.model(input_ids=ids).logits, policy.model(input_ids=ids).logits)
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]  # no staging left behind


def test_load_policy_follows_an_hf_meta(hf_dir, tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "ragen_meta.json").write_text(json.dumps({"source": "hf", "path": str(hf_dir)}))
    assert load_policy(tmp_path / "base", device="cpu").model.config.hidden_size == 64


def test_a_damaged_meta_file_is_named_with_the_fix(policy, tmp_path):
    save_model(policy.model, tmp_path / "policy", tokenizer=policy.tokenizer, meta={"source": "tiny"})
    (tmp_path / "policy" / "ragen_meta.json").write_text('{"source": ')
    with pytest.raises(StageFileError, match=r"policy/ragen_meta.json: this model meta file is not valid JSON .*; "
                                             r"delete it and run `dvc repro`"):
        load_policy(tmp_path / "policy", device="cpu")


def test_a_stage_model_missing_or_damaged_is_named_with_the_pipelines_fix(policy, tmp_path):
    """A stage's own model directory (models/policy, a critic) is rebuilt by the pipeline. Before: "model path
    models/policy does not exist; set model.path to a local checkpoint directory" (model.path has nothing to do with
    it), and damaged weights or a damaged tokenizer named no fix."""
    missing = tmp_path / "policy"
    with pytest.raises(ModelLoadError) as raised:
        load_policy(missing, device="cpu")
    assert str(raised.value) == (f"{missing} does not exist; the pipeline's stages write it: run `dvc repro` (or, by "
                                 "hand, the stages before this one)")
    save_model(policy.model, missing, tokenizer=policy.tokenizer, meta={"source": "tiny"})
    weights = missing / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy cut short
    with pytest.raises(ModelLoadError, match=rf"^model path {missing}: cannot load the causal LM or its tokenizer "
                                             rf"\(.*\); delete {missing} and run `dvc repro` to rebuild it$"):
        load_policy(missing, device="cpu")
    critic = tmp_path / "critic"
    save_model(build_critic(policy.model), critic, meta={"source": "tiny"})
    (critic / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"^critic path {critic}: cannot load \(.*\); delete {critic} and run "
                                             r"`dvc repro` to rebuild it$"):
        load_critic(critic, device="cpu")
    (critic / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=rf"has no \*.safetensors weights .*; delete {critic} and run `dvc repro`"):
        load_critic(critic, device="cpu")


def test_missing_path_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match=str(tmp_path / "nope")):
        load_causal_lm(tmp_path / "nope")


def test_not_a_causal_lm_is_named(tmp_path, tokenizer):
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1)
    Qwen2ForTokenClassification(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ModelLoadError, match="not a causal LM"):
        load_causal_lm(tmp_path)


def test_a_qwen3_5_checkpoint_loads_its_text_model(tmp_path, tokenizer):
    """A Qwen3.5 checkpoint as published holds Qwen3_5ForConditionalGeneration (a vision tower beside the LM): its
    text model loads as the causal LM, with the checkpoint's weights, and has recurrent layers."""
    import qwen3_5
    from ragen.policy.scoring import has_recurrent_layers

    published = qwen3_5.save_published(tmp_path, tokenizer)
    model, _ = load_causal_lm(tmp_path, device="cpu")
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and has_recurrent_layers(model)
    language = published.model.language_model.state_dict()
    assert all(torch.equal(weight, language[name]) for name, weight in model.model.state_dict().items())
    assert torch.equal(model.lm_head.weight, published.lm_head.weight)
    assert not has_recurrent_layers(Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=1, hidden_size=16,
                                                                 intermediate_size=32, num_attention_heads=2,
                                                                 num_key_value_heads=1, vocab_size=64)))


def test_a_vision_language_model_transformers_cannot_load_as_a_causal_lm_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava",
                                                      "architectures": ["LlavaForConditionalGeneration"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # refused before the weights are read
    with pytest.raises(ModelLoadError, match="vision-language model .* use a text-only checkpoint"):
        load_causal_lm(tmp_path)


@pytest.mark.parametrize("model_type, keys", [
    ("mamba", dict(hidden_size=16, num_hidden_layers=1, state_size=4)),
    ("recurrent_gemma", dict(hidden_size=16, lru_width=16, num_hidden_layers=2, num_attention_heads=2, head_dim=8,
                             num_key_value_heads=1, intermediate_size=32, block_types=["recurrent", "attention"])),
])
def test_a_family_that_keeps_its_state_outside_the_cache_is_named(tmp_path, tokenizer, model_type, keys):
    """Mamba keeps its state in its own `cache_params`, and RecurrentGemma (whose forward takes `past_key_values`
    and returns none) in its layers: the sampler cannot extend either turn by turn."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **keys))
    model.save_pretrained(tmp_path, safe_serialization=True)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=f"{type(model).__name__} keeps its state outside transformers' cache"):
        load_causal_lm(tmp_path)


def test_pickled_weights_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_causal_lm(tmp_path)


def test_directory_without_config_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_causal_lm(tmp_path)


def with_template(hf_dir, dest, template):
    """A copy of the checkpoint whose tokenizer has another chat template."""
    import shutil

    shutil.copytree(hf_dir, dest)
    config_file = dest / "tokenizer_config.json"
    (dest / "chat_template.jinja").unlink(missing_ok=True)  # where transformers 5 keeps it
    config = {k: v for k, v in json.loads(config_file.read_text()).items() if k != "chat_template"}
    config_file.write_text(json.dumps(config | ({"chat_template": template} if template else {})))
    return dest


def test_a_template_that_rewrites_earlier_turns_is_named_at_load(hf_dir, tmp_path):
    """A Qwen3-like template drops earlier reasoning: refused when the checkpoint loads, not mid-rollout."""
    from chat_templates import THINK_STRIPPING

    ckpt = with_template(hf_dir, tmp_path / "ckpt", THINK_STRIPPING)
    with pytest.raises(ModelLoadError, match=r"ckpt: its chat template rewrites earlier turns .* set model.chat_"
                                             r"template to a template file that keeps earlier turns \(for Qwen3 and "
                                             r"Qwen3.5, chat_templates/chatml.jinja"):
        load_causal_lm(ckpt, device="cpu")


def test_model_chat_template_replaces_the_checkpoints_own(hf_dir, tmp_path, tokenizer):
    """The Qwen3-like checkpoint runs with the ChatML template we ship (chat_templates/chatml.jinja) given in its
    place; a bad override is named as one."""
    from pathlib import Path

    from chat_templates import THINK_STRIPPING

    ckpt = with_template(hf_dir, tmp_path / "ckpt", THINK_STRIPPING)
    shipped = Path(__file__).resolve().parents[2] / "chat_templates/chatml.jinja"
    model, loaded = load_causal_lm(ckpt, chat_template=read_chat_template(shipped), device="cpu")
    assert loaded.chat_template == shipped.read_text()
    renderer = Policy(model.eval(), loaded).renderer(enable_think=True)
    messages, ids, _ = renderer.start("Turn 1:")
    response = "Go.</think><answer>Up</answer>"
    ids += loaded.encode(response, add_special_tokens=False)
    ids += renderer.continue_ids(messages, response, "", "Turn 2:")  # the checkpoint's own template refuses this
    assert loaded.decode(ids) == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nTurn 1:"
                                  f"<|im_end|>\n<|im_start|>assistant\n<think>{response}<|im_end|>\n<|im_start|>"
                                  "user\nTurn 2:<|im_end|>\n<|im_start|>assistant\n<think>")
    with pytest.raises(ModelLoadError, match=r"^model.chat_template rewrites earlier turns"):
        load_causal_lm(hf_dir, chat_template=THINK_STRIPPING, device="cpu")


def test_model_chat_template_file_is_checked(tmp_path):
    with pytest.raises(ModelLoadError, match=r"model.chat_template: cannot read .*nope.jinja \(FileNotFoundError\); "
                                             r"set it to a Jinja chat template file, or leave it empty"):
        read_chat_template(tmp_path / "nope.jinja")
    (tmp_path / "blank.jinja").write_text("\n")
    with pytest.raises(ModelLoadError, match=r"model.chat_template: .*blank.jinja is empty"):
        read_chat_template(tmp_path / "blank.jinja")


def test_a_template_without_a_system_role_is_named_at_load(hf_dir, tmp_path):
    refusing = ("{%- for m in messages %}{%- if m['role'] == 'system' %}{{ raise_exception('System role not "
                "supported') }}{%- endif %}{{ m['content'] }}{%- endfor %}")
    ckpt = with_template(hf_dir, tmp_path / "ckpt", refusing)
    with pytest.raises(ModelLoadError, match=r"ckpt: its chat template cannot render an episode .*: System role not "
                                             r"supported; set model.chat_template to a template file that takes a "):
        load_causal_lm(ckpt, device="cpu")


def test_a_template_that_drops_the_system_message_is_named_at_load(hf_dir, tmp_path):
    dropping = "{%- for m in messages %}{%- if m['role'] != 'system' %}{{ m['content'] }}{%- endif %}{%- endfor %}"
    ckpt = with_template(hf_dir, tmp_path / "ckpt", dropping)
    with pytest.raises(ModelLoadError, match=r"ckpt: its chat template cannot render an episode .*: the chat template "
                                             r"drops the system message; set model.chat_template to a template "):
        load_causal_lm(ckpt, device="cpu")


def test_a_tokenizer_without_a_chat_template_is_named(hf_dir, tmp_path):
    ckpt = with_template(hf_dir, tmp_path / "ckpt", None)
    with pytest.raises(ModelLoadError, match=r"ckpt: the tokenizer has no chat template; use an instruct \(chat\) "
                                             r"checkpoint, or set model.chat_template to a Jinja template file"):
        load_causal_lm(ckpt, device="cpu")


@pytest.mark.parametrize("build, why", [
    (None, "this torch (2.13.0+cpu) is a CPU-only build"),
    ("12.8", "this torch (2.13.0+cpu, CUDA 12.8) sees no GPU (CUDA_VISIBLE_DEVICES, the driver)"),
])
def test_cuda_where_torch_sees_none_is_named_with_the_fix(monkeypatch, build, why):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    monkeypatch.setattr(torch.version, "cuda", build)
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelLoadError) as raised:
        pick_device("cuda")
    assert str(raised.value) == (f"model.device=cuda: {why}; set model.device=auto (a GPU where torch sees one) or "
                                 "cpu, or run on a machine with a GPU and a CUDA build of torch")


def test_precision_of_each_model_dtype():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pick_precision(cuda, "auto") == (torch.float32, torch.bfloat16)  # RAGEN's mixed precision
    assert pick_precision(cpu, "auto") == (torch.float32, None)
    assert pick_precision(cpu, "bf16-mixed") == (torch.float32, torch.bfloat16)
    assert pick_precision(cuda, "bfloat16") == (torch.bfloat16, None)
    assert pick_precision(cpu, "float16") == (torch.float16, None)


def changed_share_after_steps(policy, lr, steps=5):
    """The share of the policy's weights that AdamW steps at `lr` on a sampled episode's log-likelihood move."""
    _, prompt, _ = policy.renderer(True).start("Turn 1:\nState:\nPG\n")
    ids = torch.tensor([prompt + list(policy.sample([prompt], max_new_tokens=8,
                                                    generator=torch.Generator().manual_seed(0))[0].token_ids)])
    before = [p.detach().clone() for p in policy.model.parameters()]
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.01)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        logprobs, _ = token_logprobs(policy.model, ids, torch.ones_like(ids))
        (-logprobs[0, len(prompt):].mean()).backward()
        optimizer.step()
    moved = sum(int((a != b).sum()) for a, b in zip(before, policy.model.parameters()))
    return moved / sum(p.numel() for p in policy.model.parameters())


def test_bf16_mixed_keeps_float32_weights_that_learn_at_ragens_lr(hf_dir, tmp_path):
    """With bfloat16 weights an AdamW step of RAGEN's actor lr (1e-6) is below a weight's rounding step and is lost:
    the policy does not train. bf16-mixed (auto on CUDA) keeps float32 weights, computes in bfloat16 (logits come
    out in bfloat16), and its steps land; its critic computes the same way."""
    mixed = load_policy(hf_dir, device="cpu", dtype="bf16-mixed")
    assert next(mixed.model.parameters()).dtype == torch.float32
    ids = torch.tensor([[5, 6, 7, 8]])
    with computing(mixed.model):
        assert mixed.model(input_ids=ids).logits.dtype == torch.bfloat16
    assert mixed.model(input_ids=ids).logits.dtype == torch.float32  # outside the stages' calls: as loaded
    critic = build_critic(mixed.model)
    with computing(critic):
        assert critic(input_ids=ids).logits.dtype == torch.bfloat16
    save_model(critic, tmp_path / "critic")
    loaded = load_critic(tmp_path / "critic", device="cpu", dtype="bf16-mixed")
    with computing(loaded):
        assert next(loaded.parameters()).dtype == torch.float32 and loaded(input_ids=ids).logits.dtype == torch.bfloat16
    assert changed_share_after_steps(mixed, 1e-6) > 0.5
    pure = load_policy(hf_dir, device="cpu", dtype="bfloat16")
    assert next(pure.model.parameters()).dtype == torch.bfloat16
    assert changed_share_after_steps(pure, 1e-6) < 0.05

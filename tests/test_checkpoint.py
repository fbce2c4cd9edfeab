"""Training checkpoints: an exact round trip of weights and AdamW state, and a damaged checkpoint named with its fix."""

import json

import pytest
import torch

from ragen.checkpoint import CheckpointError, load_checkpoint, read_checkpoint_meta, save_checkpoint


def trained(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    return model, opt


def test_a_checkpoint_restores_weights_and_optimizer_exactly(tmp_path):
    model, opt = trained(0)
    save_checkpoint(tmp_path / "ckpt", models={"policy": model}, optimizers={"actor": opt},
                    meta={"step": 3, "digest": "abc"})
    again, again_opt = trained(1)  # other weights, other moments
    meta = load_checkpoint(tmp_path / "ckpt", models={"policy": again}, optimizers={"actor": again_opt})
    assert meta["step"] == 3 and read_checkpoint_meta(tmp_path / "ckpt")["digest"] == "abc"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    state, again_state = opt.state_dict()["state"], again_opt.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg_sq"], again_state[i]["exp_avg_sq"]) for i in state)
    assert read_checkpoint_meta(tmp_path / "none") is None


@pytest.mark.parametrize("damage", ["meta", "weights", "optimizer", "shape"])
def test_a_damaged_checkpoint_is_named_with_the_fix(tmp_path, damage):
    model, opt = trained(0)
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, models={"policy": model}, optimizers={"actor": opt}, meta={"step": 3})
    if damage == "meta":
        (ckpt / "meta.json").write_text('{"step": 3, "optimizers"')
    elif damage == "weights":
        (ckpt / "policy.safetensors").write_bytes((ckpt / "policy.safetensors").read_bytes()[:40])
    elif damage == "optimizer":
        (ckpt / "actor.optimizer.safetensors").unlink()
    else:  # a checkpoint of another model size
        meta = json.loads((ckpt / "meta.json").read_text())
        save_checkpoint(ckpt, models={"policy": torch.nn.Linear(3, 2)}, optimizers={"actor": opt}, meta=meta)
    fresh, fresh_opt = trained(1)
    with pytest.raises(CheckpointError, match=rf"(?s)checkpoint {ckpt} cannot be restored \(.+\); delete it "
                                              rf"\(rm -r {ckpt}\) and the run starts again from step 0"):
        load_checkpoint(ckpt, models={"policy": fresh}, optimizers={"actor": fresh_opt})
    if damage == "meta":
        with pytest.raises(CheckpointError, match="meta.json is not valid JSON"):
            read_checkpoint_meta(ckpt)

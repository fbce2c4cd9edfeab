"""bench/bench_micro_batch.py: its synthetic batch, and the table from fresh processes at a small shape."""

import pytest

from benchload import load_bench

bench_micro_batch = load_bench("bench_micro_batch")


def test_the_synthetic_batch_is_shaped_like_the_pipelines():
    batch = bench_micro_batch.synthetic_batch(rows=4, tokens=160, vocab=50)
    lengths = batch.attention_mask.sum(-1).tolist()
    assert lengths == [80, 107, 133, 160]  # tokens/2 .. tokens, left padded
    assert batch.loss_mask.sum(-1).tolist() == [n - bench_micro_batch.PROMPT for n in lengths]
    prompts = [batch.input_ids[row, 160 - n:160 - n + bench_micro_batch.PROMPT] for row, n in enumerate(lengths)]
    assert all((p == prompts[0]).all() for p in prompts)  # one shared prompt, never trained
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.token_rewards[:, -1].tolist() == pytest.approx([-1, -1 / 3, 1 / 3, 1])
    with pytest.raises(ValueError, match="must outlast the 64-token prompt"):
        bench_micro_batch.synthetic_batch(rows=4, tokens=128, vocab=50)
    spread = bench_micro_batch.synthetic_batch(rows=4, tokens=400, vocab=50, shortest=0.2)
    assert spread.attention_mask.sum(-1).tolist() == [80, 187, 293, 400]


def test_each_limit_runs_in_its_own_process_with_the_same_gradient(capsys):
    assert bench_micro_batch.main(["--micro", "0", "2", "--budgets", "300", "--rows", "4", "--tokens", "160",
                                   "--layers", "1", "--vocab", "512", "--shape", "small"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| all |", "| 2 rows |", "| 300 tokens |"))]
    assert len(rows) == 3
    whole, micro, budget = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert (whole[1], micro[1], budget[1]) == ("1", "2", "3")  # 300 tokens: rows of 160, of 133 + 107, of 80
    assert float(whole[2]) == pytest.approx(640 * 512 * 4 / 2**20, abs=0.005)  # 4 rows x 160 tokens x 512 floats
    assert float(micro[2]) == pytest.approx(float(whole[2]) / 2, abs=0.01)  # half the logits a pass
    assert float(budget[2]) == pytest.approx(float(whole[2]) * 266 / 640, abs=0.01)  # 2 x 133 of 4 x 160
    assert float(whole[3]) > 0 and float(micro[3]) > 0  # peak memory measured in each process
    for other in (micro, budget):
        for column in (7, 8, 9):  # grad norms and value loss agree: accumulation is exact
            assert float(other[column]) == pytest.approx(float(whole[column]), rel=1e-4)


def test_bf16_mixed_compute_keeps_the_passes_in_agreement(capsys):
    """--dtype bf16-mixed: float32 weights computing in bfloat16 (`auto` on CUDA); passes of 2 give the one pass's
    gradient to bfloat16's rounding."""
    assert bench_micro_batch.main(["--micro", "0", "2", "--budgets", "--rows", "4", "--tokens", "160", "--layers", "1",
                                   "--vocab", "512", "--shape", "small", "--dtype", "bf16-mixed"]) == 0
    out = capsys.readouterr().out
    assert ", bf16-mixed on " in out.splitlines()[0]
    rows = [line for line in out.splitlines() if line.startswith(("| all |", "| 2 rows |"))]
    whole, micro = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    for column in (7, 8, 9):
        assert float(micro[column]) == pytest.approx(float(whole[column]), rel=2e-2)

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


def test_each_micro_batch_runs_in_its_own_process_with_the_same_gradient(capsys):
    assert bench_micro_batch.main(["--micro", "0", "2", "--rows", "4", "--tokens", "160", "--layers", "1",
                                   "--vocab", "512", "--shape", "small"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| all |") or
            line.startswith("| 2 |")]
    assert len(rows) == 2
    whole, micro = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert (whole[1], micro[1]) == ("1", "2")  # passes a mini-batch
    assert float(micro[2]) == pytest.approx(float(whole[2]) / 2, rel=0.01)  # half the logits a pass
    assert float(whole[3]) > 0 and float(micro[3]) > 0  # peak memory measured in each process
    for column in (7, 8, 9):  # grad norms and value loss agree: accumulation is exact
        assert float(micro[column]) == pytest.approx(float(whole[column]), rel=1e-4)

"""bench/bench_sampling_memory.py: one evaluation per limit, each in a fresh process, at a small size."""

import pytest

from benchload import load_bench

bench_sampling_memory = load_bench("bench_sampling_memory")


def test_each_limit_plays_its_passes_in_its_own_process(capsys, tmp_path):
    assert bench_sampling_memory.main(["--model", str(tmp_path / "none"), "--episodes", "6", "--turns", "2",
                                       "--limits", "0", "2"]) == 0
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith(("| all (6) |", "| 2 |"))]
    assert [row[1] for row in rows] == ["1", "3"]  # passes: 6 | 2 + 2 + 2
    whole, pairs = (float(row[2]) for row in rows)  # the KV estimate: a pass's episodes x its longest sequence
    assert 0 < pairs < whole / 2  # a third of the episodes a pass (other draws: other lengths)
    assert all(float(row[4]) > 0 and float(row[5]) > 0 for row in rows)  # peak memory and seconds measured
    assert "untrained tiny model" in out


def test_kv_bytes_count_keys_and_values_of_every_layer():
    class Config:
        hidden_size, num_attention_heads, num_key_value_heads, num_hidden_layers = 896, 14, 2, 24

    class Model:
        config = Config()

        def parameters(self):
            import torch
            return iter([torch.zeros(1, dtype=torch.bfloat16)])

    assert bench_sampling_memory.kv_bytes_per_token(Model()) == 2 * 24 * 2 * 64 * 2  # Qwen2.5-0.5B: 12 KiB a token
    with pytest.raises(SystemExit):
        bench_sampling_memory.main(["--limits", "-1"])

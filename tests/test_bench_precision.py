"""bench/bench_precision.py at a small shape: bfloat16 weights lose RAGEN's lr 1e-6 steps, bf16-mixed keeps them."""

from benchload import load_bench

bench_precision = load_bench("bench_precision")


def test_bfloat16_weights_lose_the_steps_that_bf16_mixed_keeps(capsys):
    assert bench_precision.main(["--shape", "small", "--layers", "1", "--steps", "2", "--lrs", "1e-6"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| 1e-06 |"):
            rows[cells[1]] = float(cells[2].rstrip("%")) / 100, float(cells[3])
    assert set(rows) == {"float32", "bf16-mixed", "bfloat16"}
    assert rows["float32"] == (1.0, 1.0)
    assert rows["bf16-mixed"][0] > 0.99 and abs(rows["bf16-mixed"][1] - 1) < 0.01
    assert rows["bfloat16"][0] < 0.1 and rows["bfloat16"][1] < 0.1

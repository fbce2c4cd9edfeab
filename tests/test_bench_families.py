"""bench/bench_families.py: its checks pass on a family the hf path handles, and name the one that fails."""

from benchload import load_bench

bench_families = load_bench("bench_families")


def test_the_checks_pass_on_llama_and_name_what_stops_mamba_and_a_bad_config():
    assert bench_families.check("llama") == "ok"
    assert bench_families.check("mamba").startswith("load: refused")
    assert bench_families.check("no_such_model_type").startswith("config: ")

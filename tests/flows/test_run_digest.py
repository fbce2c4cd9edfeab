"""What decides whether `ragen ablate` (and bench_learning's --reuse) may read a finished run back: the digests of
the source code and of the base policy's files."""

from flows.common import SOURCE_ROOT, source_digest, tree_digest


def test_tree_digest_follows_paths_and_bytes_of_the_matching_files(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    first = tree_digest(tmp_path / "pkg", "*.py")
    assert len(first) == 64 and first == tree_digest(tmp_path / "pkg", "*.py")
    (tmp_path / "pkg" / "notes.txt").write_text("edited, still not code")
    assert tree_digest(tmp_path / "pkg", "*.py") == first  # only the pattern's files count
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 3\n")
    edited = tree_digest(tmp_path / "pkg", "*.py")
    assert edited != first
    (tmp_path / "pkg" / "sub" / "b.py").rename(tmp_path / "pkg" / "c.py")  # same bytes, another module
    assert tree_digest(tmp_path / "pkg", "*.py") not in (first, edited)
    # a single file: its bytes; nothing there: ""
    assert tree_digest(tmp_path / "pkg" / "a.py") != "" and tree_digest(tmp_path / "none") == ""


def test_source_digest_covers_the_library_and_the_flows():
    assert (SOURCE_ROOT / "ragen" / "losses.py").is_file() and (SOURCE_ROOT / "flows" / "ablate.py").is_file()
    digest = source_digest()
    assert digest == tree_digest(SOURCE_ROOT / "ragen", "*.py") + tree_digest(SOURCE_ROOT / "flows", "*.py")
    assert len(digest) == 128 and source_digest() == digest


def test_an_update_checkpoint_resumes_with_other_micro_batch_limits_and_nothing_else(tmp_path):
    """Passes of another size change a step's memory, not its result: a run that ran out of memory resumes in
    smaller ones. Any other param, or an input's bytes, starts the run afresh."""
    from flows.update import run_digest
    from ragen.config import load_config

    (tmp_path / "params.yaml").write_text("train:\n  env: bandit\n")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "model.safetensors").write_bytes(b"weights")

    def digest(*overrides):
        cfg = load_config(str(tmp_path / "params.yaml"), list(overrides))
        return run_digest(cfg, str(tmp_path / "envs"), str(tmp_path / "base"), str(tmp_path / "critic"),
                          str(tmp_path / "filtered.parquet"), None)

    first = digest()
    assert digest("train.micro_batch_size=1") == first == digest("train.micro_batch_size=4")
    assert digest("train.micro_batch_tokens=2048") == first
    assert digest("train.mini_batch_size=16") != first and digest("train.lr=0.002") != first
    assert digest("rollout.max_episodes_per_pass=32") != first  # passes of episodes sample other draws
    (tmp_path / "base" / "model.safetensors").write_bytes(b"trained again")
    assert digest() != first


def test_a_finished_variant_is_skipped_under_other_micro_batch_limits(tmp_path):
    """`ragen ablate SET train.micro_batch_size=4` (after a variant ran out of memory) reruns only what had not
    finished: a finished variant's record digest ignores the limits, and nothing else."""
    from flows.ablate import run_record_digest
    from ragen.config import load_config

    (tmp_path / "params.yaml").write_text("train:\n  env: bandit\n")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "model.safetensors").write_bytes(b"weights")

    def digest(*overrides):
        return run_record_digest(load_config(str(tmp_path / "params.yaml"), list(overrides)), str(tmp_path / "base"))

    first = digest()
    assert digest("train.micro_batch_size=4", "train.micro_batch_tokens=8192") == first
    assert digest("train.steps=20") != first and digest("algo.gamma=0.99") != first
    assert digest("rollout.max_episodes_per_pass=32") != first

"""``python -m torchrec_frugal.estimate``: the DLRM workloads it builds and what it writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torchrec_frugal import datasets
from torchrec_frugal.estimate.cost_model import SHARDINGS, TERMS, shardings_for
from torchrec_frugal.estimate.cli import dense_model, dlrm_workload, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_json_has_every_sharding_with_samples_per_second_and_terms(tmp_path, capsys):
    out = tmp_path / "est.json"
    assert main(["--config", "avazu", "--scale", "0.05", "--gpus", "4", "--batch-size", "128",
                 "--hardware", "rtx3090", "--json", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["prediction"] is True and doc["gpus"] == 4 and doc["hardware"] == "rtx3090"
    assert set(doc["shardings"]) == set(shardings_for(1))
    for name, s in doc["shardings"].items():
        assert s["samples_per_second"] > 0, name
        assert set(s["terms"]) == set(TERMS)
        assert sum(s["terms"].values()) * 1e3 == pytest.approx(s["step_ms"])
    rec = doc["recommended"]
    assert rec["sharding"] in SHARDINGS and 0 < rec["cache_ratio"] <= 1 and rec["lookahead"] >= 0
    text = capsys.readouterr().out
    assert "PREDICTED" in text and "frugal settings" in text and "| output_all_to_all |" in text


def test_fixed_frugal_settings_are_used(tmp_path):
    out = tmp_path / "est.json"
    main(["--config", "criteo-kaggle", "--gpus", "2", "--hardware", "cpu", "--cache-ratio", "0.1", "--lookahead", "0",
          "--json", str(out)])  # fmt: skip
    details = json.loads(out.read_text())["shardings"]["frugal"]["details"]
    assert details["cache_ratio"] == 0.1 and details["lookahead"] == 0


def test_plot_is_written(tmp_path):
    png = tmp_path / "scaling.png"
    assert main(["--config", "avazu", "--scale", "0.05", "--gpus", "2", "--hardware", "a30", "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_a_malformed_profile_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad"}))
    assert main(["--hardware", str(bad)]) == 2
    assert "missing field(s)" in capsys.readouterr().err


def test_dlrm_workload_and_dense_model_follow_the_example():
    w = dlrm_workload("criteo-kaggle", world_size=2, batch_size=512, scale=0.01)
    ds = datasets.DATASETS["criteo-kaggle"]
    assert [t.rows for t in w.tables] == ds.rows(0.01)
    assert w.presample_draws == 50 * 512 * 2
    assert w.tables[2].distribution.rows == ds.rows(0.01)[2]
    m = dense_model(datasets.ModelConfig(), ds)
    mac = 13 * 512 + 512 * 256 + 256 * 32 + 383 * 512 + 512 * 256 + 256 * 1
    assert m.flops_per_sample == pytest.approx(2 * mac + 2 * 27**2 * 32)
    with pytest.raises(ValueError, match="unknown config"):
        dlrm_workload("movielens", 1, 1)


def test_the_example_configs_are_the_package_catalogue():
    sys.path.insert(0, ROOT)
    from examples.dlrm import configs

    assert configs.DATASETS is datasets.DATASETS and configs.get_config is datasets.get_config
    assert configs.get_config("avazu", batch_size=128).rows() == datasets.DATASETS["avazu"].rows(0.25)


def test_the_module_runs_without_the_repository_examples(tmp_path):
    """From another directory, with only the package importable: no examples/ import."""
    code = ("import sys, torchrec_frugal.estimate.cli as e; e.main(['--gpus', '2', '--hardware', 'rtx4090']); "
            "assert not any(m.startswith('examples') for m in sys.modules), 'imports examples/'; "
            "assert 'torchrec' not in sys.modules, 'imports torchrec'")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "samples/s" in r.stdout


def test_the_verdict_on_one_cpu_rank_says_frugal_is_not_offered(capsys):
    """As the planner (frugal_offered): one rank of a host-memory device gets no Frugal, and the
    rank counts where Frugal is predicted faster leave one rank out."""
    assert main(["--config", "criteo-kaggle", "--gpus", "1", "--batch-size", "128", "--hardware", "cpu"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "does not offer Frugal to one rank" in first and "predicted faster at 1," not in first
    assert main(["--config", "criteo-kaggle", "--gpus", "2", "--batch-size", "1024", "--hardware", "cpu"]) == 0
    assert "does not offer" not in capsys.readouterr().out.splitlines()[0]


def test_the_verdict_opens_the_output_and_offloading_is_priced_where_nothing_fits(capsys):
    assert main(["--config", "criteo-tb", "--scale", "1", "--gpus", "2", "--batch-size", "1024",
                 "--hardware", "rtx3090"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("on 2x rtx3090, criteo-tb at full size, batch 1024: ")
    assert "fused_uvm" in first and "none fits" not in out  # the stock choice is an offloaded one
    assert "- uvm_reads:" in out and "cache_load_factor" in out

"""``python -m torchrec_frugal.estimate``: the DLRM workloads it builds and what it writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from dataclasses import replace

import pytest

from torchrec_frugal import datasets
from torchrec_frugal.estimate.cost_model import SHARDINGS, TERMS, shardings_for
from torchrec_frugal.estimate import cli
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
    assert "PREDICTED" in text and "frugal settings" in text and "| output_all_to_all |" not in text


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


def refusal(argv, capsys) -> str:
    """main(argv)'s refusal: exit status 2 before any prediction, stderr the usage line and one
    ``error:`` line (argparse's form), returned."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("usage: python -m torchrec_frugal.estimate "), err
    assert lines[1].startswith("python -m torchrec_frugal.estimate: error: "), err
    assert len(lines[0]) <= cli.WIDTH
    return lines[1]


@pytest.mark.parametrize("argv, message", [
    (["--cache-ratio", "1.5"], "argument --cache-ratio: expected a number in [0, 1], got 1.5"),
    (["--cache-ratio", "-0.1"], "argument --cache-ratio: expected a number in [0, 1], got -0.1"),
    (["--presample-steps", "-3"], "argument --presample-steps: expected an integer >= 0, got -3"),
    (["--scale", "0"], "argument --scale: expected a number in (0, 1], got 0"),
    (["--scale", "1.5"], "argument --scale: expected a number in (0, 1], got 1.5"),
    (["--scale", "nan"], "argument --scale: expected a number in (0, 1], got nan"),
    (["--lookahead", "-1"], "argument --lookahead: expected an integer >= 0, got -1"),
    (["--lookahead", "2.5"], "argument --lookahead: expected an integer >= 0, got '2.5'"),
    (["--gpus", "0"], "argument --gpus: expected an integer >= 1, got 0"),
    (["--nodes", "0"], "argument --nodes: expected an integer >= 1, got 0"),
    (["--batch-size", "many"], "argument --batch-size: expected an integer >= 1, got 'many'"),
    (["--config", "movielens"], "argument --config: invalid choice: 'movielens'"),
    (["--hardware", "rtx9090"], "--hardware: no profile 'rtx9090': not a file, and not one of"),
    (["--calibrate", "out.json", "--base", "rtx9090"], "--base: no profile 'rtx9090'"),
])  # fmt: skip
def test_every_bad_value_is_refused_in_one_line(argv, message, capsys):
    assert message in refusal(argv, capsys)


def test_a_malformed_or_missing_profile_file_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad"}))
    assert "missing field(s)" in refusal(["--hardware", str(bad)], capsys)
    bad.write_text("{not json")
    assert "not valid JSON" in refusal(["--hardware", str(bad)], capsys)
    assert "not a file" in refusal(["--hardware", str(tmp_path / "absent.json")], capsys)
    assert "not a file" in refusal(["--hardware", str(tmp_path)], capsys)


def test_the_module_refuses_a_bad_value_without_a_traceback():
    r = subprocess.run([sys.executable, "-m", "torchrec_frugal.estimate", "--cache-ratio", "1.5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].endswith("error: argument --cache-ratio: expected a number in [0, 1], got 1.5")


def test_help_says_what_each_default_scale_means(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "0.004 of Criteo 1TB's 882,774,559 rows (26 tables): 3,540,986 rows" in text
    assert "0.05 of the authors' 73,391,341-row table: 3,669,568 rows" in text
    for name in datasets.DATASETS:
        dlrm, paper = datasets.DATASETS[name], datasets.PAPER_DATASETS[name]
        assert f"{dlrm.default_scale:g} of " in text and f"{sum(dlrm.rows()):,} rows" in text
        assert f"{paper.default_scale:g} of the authors' {paper.total_rows:,}-row table: {sum(paper.rows()):,} rows" in text
    assert "--terms" in text


@pytest.mark.parametrize("argv", [
    [],
    ["--config", "criteo-tb", "--scale", "1", "--gpus", "2", "--hardware", "rtx3090"],
    ["--model", "paper", "--config", "criteo-tb", "--gpus", "8", "--hardware", "h200"],
    ["--config", "avazu", "--gpus", "4", "--nodes", "2", "--batch-size", "512", "--hardware", "cpu"],
    ["--config", "criteo-kaggle", "--gpus", "1", "--batch-size", "128", "--hardware", "cpu"],
])  # fmt: skip
def test_the_default_output_fits_100_columns_and_the_terms_are_behind_a_flag(argv, capsys):
    assert main(argv) == 0
    text = capsys.readouterr().out
    widest = max(text.splitlines(), key=len)
    assert len(widest) <= 100, widest
    assert "| term (ms per step) |" not in text and "- framework:" not in text
    table = text.split("not measured:\n\n")[1].split("\nvs Frugal: ")[0].splitlines()
    assert table[0].split() == ["sharding", "step", "ms", "samples/s", "vs", "Frugal", "fits", "what", "bounds", "the", "step"]
    shown = [row.split()[0] for row in table[1:]]
    assert shown == list(shardings_for(2 if "--nodes" in argv else 1, "cpu" if "cpu" in argv else "cuda"))
    assert main(argv + ["--terms"]) == 0
    full = capsys.readouterr().out
    assert "| term (ms per step) |" in full and "- framework: " in full and full.startswith(text.split("\n")[0])


def test_the_table_rows_are_the_predictions(tmp_path, capsys):
    out = tmp_path / "e.json"
    assert main(["--config", "avazu", "--gpus", "4", "--batch-size", "128", "--hardware", "a30", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())["shardings"]
    rows = {r.split()[0]: r.split() for r in text.split("not measured:\n\n")[1].split("\nvs Frugal: ")[0].splitlines()[1:]}
    fr = doc["frugal"]["samples_per_second"]
    for name, s in doc.items():
        cells = rows[name]
        assert float(cells[1]) == pytest.approx(s["step_ms"], abs=5e-4)
        assert float(cells[2].replace(",", "")) == pytest.approx(s["samples_per_second"], abs=0.5)
        assert cells[3] == ("-" if name == "frugal" else cli.ratio_text(s["samples_per_second"] / fr))
        assert cells[4] == ("yes" if s["fits"] else "no")


def test_predictions_within_2_percent_read_as_a_tie(monkeypatch, capsys):
    """Frugal set 1% below the fastest stock choice at every rank count: the verdict calls it a tie
    (never "1.01x faster"), and so do the table and the fastest-choice line."""
    real = cli.predict_all

    def close(model, w, frugal=None, shardings=None):
        costs = real(model, w, frugal, shardings)
        best = max((c for n, c in costs.items() if n != "frugal" and c.fits), key=lambda c: c.samples_per_second)
        costs["frugal"] = replace(costs["frugal"], samples_per_second=0.99 * best.samples_per_second)
        return costs

    monkeypatch.setattr(cli, "predict_all", close)
    assert main(["--config", "criteo-kaggle", "--gpus", "2", "--hardware", "rtx3090"]) == 0
    text = capsys.readouterr().out
    verdict = text.split("\n\n")[0].replace("\n", " ")
    assert "is predicted within 2% of Frugal, a tie" in verdict and "x faster" not in verdict
    assert "predicted faster at none of 1, 2, 4, 8 GPUs at this batch, within 2% (a tie) at 1, 2, 4, 8" in verdict
    assert "; Frugal is within 2% of it, a tie" in " ".join(text.split())
    assert [cli.ratio_text(r) for r in (1.0, 1.019, 0.981, 1.021, 0.979, 1.5, 0.0025)] == ["tie", "tie", "tie", "1.02x", "0.98x", "1.50x", "<0.01x"]


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
    first = capsys.readouterr().out.split("\n\n")[0].replace("\n", " ")
    assert "does not offer Frugal to one rank" in first and "predicted faster at 1," not in first
    assert " 1, 2, 4, 8 GPUs" not in first
    assert main(["--config", "criteo-kaggle", "--gpus", "2", "--batch-size", "1024", "--hardware", "cpu"]) == 0
    assert "does not offer" not in capsys.readouterr().out.split("\n\n")[0]


def test_the_verdict_opens_the_output_and_offloading_is_priced_where_nothing_fits(capsys):
    assert main(["--config", "criteo-tb", "--scale", "1", "--gpus", "2", "--batch-size", "1024",
                 "--hardware", "rtx3090", "--terms"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    first = out.split("\n\n")[0].replace("\n", " ")
    assert first.startswith("on 2x rtx3090, criteo-tb at full size, batch 1024: ")
    assert "fused_uvm" in first and "none fits" not in out  # the stock choice is an offloaded one
    assert "- uvm_reads:" in out and "cache_load_factor" in out

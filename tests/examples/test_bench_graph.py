"""benchmarks/bench_graph.py's paired ratios, one result's and several pooled, without training anything."""
from __future__ import annotations

import json
from typing import Dict, List

import pytest

from benchmarks import bench_graph as bench


def _runs(reps: List[Dict[str, float]]) -> List[dict]:
    """A speed result's runs: triples/s by repetition and variant (a failed run has no summary)."""
    out = [
        {"variant": v, "repeat": i, "summary": {"samples_per_second": x}}
        for i, rep in enumerate(reps)
        for v, x in rep.items()
    ]
    out.append({"variant": "row_wise", "repeat": len(reps), "error": "timed out"})
    return out


def test_paired_ratios_divide_by_the_fastest_rival_of_the_same_repetition() -> None:
    runs = _runs([
        {"frugal": 90.0, "row_wise": 60.0, "column_wise": 45.0, "pbg": 50.0},
        {"frugal": 80.0, "row_wise": 40.0, "column_wise": 64.0},
        {"row_wise": 70.0},  # no frugal run: no ratio
        {"frugal": 100.0, "pbg": 40.0},  # no stock run: no stock ratio
    ])  # fmt: skip
    assert bench.paired_ratios(runs, "frugal", bench.STOCK_VARIANTS) == [1.5, 1.25]
    assert bench.paired_ratios(runs, "frugal", ["pbg"]) == [1.8, 2.5]


def test_pooled_table_gives_each_result_and_all_repetitions_together(tmp_path) -> None:
    first = {"runs": _runs([
        {"frugal": 3.0, "row_wise": 2.0, "pbg": 1.0},
        {"frugal": 2.0, "row_wise": 1.0, "pbg": 0.8},
    ])}
    second = {"runs": _runs([{"frugal": 1.2, "column_wise": 1.0, "pbg": 0.5}])}
    paths = []
    for name, result in (("a.json", first), ("b.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(result))
    table, facts = bench.pooled_table([(p.name, json.loads(p.read_text())) for p in paths])
    assert "| a.json | 2 | 1.750x (1.50, 2.00) | 2.75x |" in table
    assert "| b.json | 1 | 1.200x (1.20) | 2.40x |" in table
    assert facts["repetitions"] == 3
    assert facts["frugal_vs_best_stock_paired"] == pytest.approx(1.5)  # the median of 1.5, 2.0, 1.2
    assert facts["frugal_vs_pbg_paired"] == pytest.approx(2.5)  # of 3.0, 2.5, 2.4
    assert facts["frugal_vs_best_stock_sorted"] == pytest.approx([1.2, 1.5, 2.0])
    assert bench.main(["--pool", *map(str, paths)]) == 0

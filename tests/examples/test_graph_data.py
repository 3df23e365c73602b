"""examples/graph/data.py: wheel and TSV readers, label indexing, splits, the synthetic generator."""
from __future__ import annotations

import os
import sys
import time
import zipfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.graph.data import (  # noqa: E402
    DATASETS,
    ML100K_HEADER,
    DatasetUnavailableError,
    KGData,
    TripleFormatError,
    fetch_wheel,
    load_dataset,
    load_triples_dir,
    random_split,
    synthetic_kg,
)

SPLITS = {
    "train": ["uk\tally\tusa", "usa\tally\tuk", "cuba\tembassy\tussr", "ussr\tembassy\tcuba", "uk\ttrade\tcuba"],
    "valid": ["usa\ttrade\tussr"],
    "test": ["cuba\tally\tussr", "uk\tembassy\tusa"],
}
ENTITIES = ["cuba", "uk", "usa", "ussr"]
RELATIONS = ["ally", "embassy", "trade"]


def write_wheel(path: str, members: dict) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path


def fake_pykeen(cache: str, name: str = "nations", skip: str = "") -> str:
    members = {
        f"pykeen/datasets/{name}/{s}.txt": "\n".join(lines) + "\n" for s, lines in SPLITS.items() if s != skip
    }
    members["pykeen/__init__.py"] = ""
    return write_wheel(os.path.join(cache, "pykeen-1.11.1-py3-none-any.whl"), members)


def label_triples(data: KGData, split: str) -> list:
    x = getattr(data, split).tolist()
    return [(data.entity_names[h], data.relation_names[r], data.entity_names[t]) for h, r, t in x]


def expected(split: str) -> list:
    return [tuple(line.split("\t")) for line in SPLITS[split]]


# ------------------------------------------------------------------ wheels (fake, no network)
def test_pykeen_wheel_reads_splits_with_sorted_label_ids(tmp_path):
    fake_pykeen(str(tmp_path))
    d = load_dataset("nations", cache_dir=str(tmp_path))
    assert (d.num_entities, d.num_relations) == (4, 3)
    assert d.entity_names == ENTITIES and d.relation_names == RELATIONS
    for s in SPLITS:
        assert getattr(d, s).dtype == torch.int64
        assert label_triples(d, s) == expected(s)
    assert d.train[0].tolist() == [1, 0, 2]  # uk ally usa
    assert torch.equal(d.known, torch.cat([d.train, d.valid, d.test]))
    assert d.summary() == "nations: 4 entities, 3 relations; triples train 5 / valid 1 / test 2"
    assert d.entity_counts().tolist() == [3, 3, 2, 2]


def test_wheel_missing_member_is_named(tmp_path):
    fake_pykeen(str(tmp_path), name="umls", skip="test")
    with pytest.raises(DatasetUnavailableError, match=r"pykeen/datasets/umls/test\.txt"):
        load_dataset("umls", cache_dir=str(tmp_path))


def test_corrupt_wheel_says_delete_it(tmp_path):
    (tmp_path / "pykeen-1.11.1-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(DatasetUnavailableError, match="not a valid wheel.*delete it"):
        load_dataset("kinships", cache_dir=str(tmp_path))


def test_malformed_line_in_wheel_names_member_and_line(tmp_path):
    members = {f"pykeen/datasets/nations/{s}.txt": "\n".join(v) + "\n" for s, v in SPLITS.items()}
    members["pykeen/datasets/nations/valid.txt"] = "a\tb\tc\na\tb\n"
    write_wheel(str(tmp_path / "pykeen-1.11.1-py3-none-any.whl"), members)
    with pytest.raises(TripleFormatError, match=r"nations/valid\.txt:2: expected 3 tab-separated fields"):
        load_dataset("nations", cache_dir=str(tmp_path))


def fake_recbole(cache: str, n: int = 3000, header: str = ML100K_HEADER) -> list:
    g = torch.Generator().manual_seed(5)
    h = torch.randint(0, 300, (n,), generator=g).tolist()
    r = torch.randint(0, 6, (n,), generator=g).tolist()
    t = torch.randint(300, 2000, (n,), generator=g).tolist()  # many tails occur once
    rows = sorted({(f"m.{a:x}", f"film.rel_{b}", f"m.{c:x}") for a, b, c in zip(h, r, t)})
    text = header + "\n" + "\n".join("\t".join(x) for x in rows) + "\n"
    write_wheel(os.path.join(cache, "recbole-1.2.1-py3-none-any.whl"), {"recbole/dataset_example/ml-100k/ml-100k.kg": text})
    return rows


def test_recbole_kg_split_is_deterministic_complete_and_closed(tmp_path):
    rows = fake_recbole(str(tmp_path))
    d = load_dataset("ml100k-kg", cache_dir=str(tmp_path))
    again = load_dataset("ml100k-kg", cache_dir=str(tmp_path))
    for s in ("train", "valid", "test"):
        assert torch.equal(getattr(d, s), getattr(again, s))
    n = len(rows)
    assert len(d.train) + len(d.valid) + len(d.test) == n
    all_labels = sorted(label_triples(d, "train") + label_triples(d, "valid") + label_triples(d, "test"))
    assert all_labels == rows
    # valid/test drawn as 5% each, then the ones with an entity unseen in train moved to train
    assert 0 < len(d.valid) <= round(0.05 * n) and 0 < len(d.test) <= round(0.05 * n)
    assert len(d.valid) < round(0.05 * n)  # some single-occurrence tails were moved
    seen_e = set(d.train[:, 0].tolist()) | set(d.train[:, 2].tolist())
    seen_r = set(d.train[:, 1].tolist())
    for s in ("valid", "test"):
        x = getattr(d, s)
        assert set(x[:, 0].tolist()) <= seen_e and set(x[:, 2].tolist()) <= seen_e
        assert set(x[:, 1].tolist()) <= seen_r


def test_recbole_kg_bad_header(tmp_path):
    fake_recbole(str(tmp_path), n=50, header="head\trel\ttail")
    with pytest.raises(TripleFormatError, match=r"ml-100k\.kg:1: expected the header"):
        load_dataset("ml100k-kg", cache_dir=str(tmp_path))


def test_recbole_kg_malformed_line_counts_the_header(tmp_path):
    text = ML100K_HEADER + "\nm.1\tfilm.rel\tm.2\nm.1\tfilm.rel\n"
    write_wheel(str(tmp_path / "recbole-1.2.1-py3-none-any.whl"), {"recbole/dataset_example/ml-100k/ml-100k.kg": text})
    with pytest.raises(TripleFormatError, match=r"ml-100k\.kg:3: expected 3 tab-separated fields"):
        load_dataset("ml100k-kg", cache_dir=str(tmp_path))


def test_random_split_seeds_differ_and_preserve_triples():
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randint(0, 20, (500,), generator=g), torch.randint(0, 3, (500,), generator=g),
                     torch.randint(0, 20, (500,), generator=g)], 1)
    a = random_split(x, 20, 3, 0.1, 0.1, seed=1)
    b = random_split(x, 20, 3, 0.1, 0.1, seed=2)
    assert not torch.equal(a[1], b[1])
    assert sum(len(s) for s in a) == 500
    assert sorted(map(tuple, torch.cat(a).tolist())) == sorted(map(tuple, x.tolist()))
    with pytest.raises(ValueError, match="sum < 1"):
        random_split(x, 20, 3, 0.5, 0.5, seed=0)


def test_offline_fetch_names_package_and_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    cache = tmp_path / "empty-cache"
    with pytest.raises(DatasetUnavailableError) as e:
        fetch_wheel("pykeen", "1.11.1", cache_dir=str(cache), timeout=60)
    msg = str(e.value)
    assert "pykeen==1.11.1" in msg and "offline" in msg
    assert f"python -m pip download --no-deps --only-binary=:all: pykeen==1.11.1 -d {cache}" in msg
    assert "pip said:" in msg and "pykeen" in msg.split("pip said:")[1]
    assert os.listdir(cache) == []  # the temporary download folder is gone, no partial wheel


def test_cached_wheel_needs_no_network(tmp_path, monkeypatch):
    fake_pykeen(str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # unreachable if ever used
    monkeypatch.setenv("TORCHREC_FRUGAL_DATA", str(tmp_path))
    assert fetch_wheel("pykeen", "1.11.1") == str(tmp_path / "pykeen-1.11.1-py3-none-any.whl")
    assert load_dataset("nations").num_entities == 4


# ------------------------------------------------------------------ TSV directories
def write_dir(path, names: dict, splits: dict = SPLITS, newline: str = "\n") -> str:
    os.makedirs(path, exist_ok=True)
    for s, fname in names.items():
        with open(os.path.join(path, fname), "w", newline="") as f:
            f.write(newline.join(splits[s]) + newline)
    return str(path)


def test_tsv_dir_txt_tsv_and_fb15k_names(tmp_path):
    a = write_dir(tmp_path / "plain", {"train": "train.txt", "valid": "valid.tsv", "test": "test.txt"})
    b = write_dir(
        tmp_path / "FB15k",
        {s: f"freebase_mtr100_mte100-{s}.txt" for s in SPLITS},
        newline="\r\n",
    )
    with open(os.path.join(b, "freebase_mtr100_mte100-train.txt"), "a") as f:
        f.write("\n   \n")  # blank lines are skipped
    with open(os.path.join(b, "freebase_mtr100_mte100-test.txt"), "w") as f:
        f.write("cuba\tally \tussr\n\nuk\tembassy\tusa")  # spaces around fields, no final newline
    for path in (a, b):
        d = load_dataset("tsv", data_path=path)
        assert d.entity_names == ENTITIES and d.relation_names == RELATIONS
        for s in SPLITS:
            assert label_triples(d, s) == expected(s)
    assert load_triples_dir(b).name == "FB15k"


def test_tsv_malformed_line_names_file_and_line(tmp_path):
    bad = dict(SPLITS, test=["cuba\tally\tussr", "", "uk embassy usa"])
    path = write_dir(tmp_path, {s: f"{s}.txt" for s in SPLITS}, splits=bad)
    with pytest.raises(TripleFormatError, match=r"test\.txt:3: expected 3 tab-separated fields .* got 1"):
        load_triples_dir(path)
    bad = dict(SPLITS, train=SPLITS["train"] + ["uk\t\tusa"])
    write_dir(tmp_path, {s: f"{s}.txt" for s in SPLITS}, splits=bad)
    with pytest.raises(TripleFormatError, match=r"train\.txt:6: empty relation field"):
        load_triples_dir(path)


def test_tsv_missing_or_ambiguous_split(tmp_path):
    path = write_dir(tmp_path, {"train": "train.txt", "valid": "valid.txt"})
    with pytest.raises(FileNotFoundError, match=r"no test split; expected one of test\.txt"):
        load_triples_dir(path)
    write_dir(tmp_path, {"test": "test.txt"})
    write_dir(tmp_path, {"test": "test.tsv"})
    with pytest.raises(ValueError, match="several test files"):
        load_triples_dir(path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_triples_dir(str(tmp_path / "nope"))


# ------------------------------------------------------------------ KGData and dispatch
def test_kgdata_validation_names_split_and_value():
    ok = torch.tensor([[0, 0, 1]])
    with pytest.raises(ValueError, match=r"valid\[1, 2\] \(tail\) = 7 is out of range \[0, 5\)"):
        KGData("x", 5, 2, ok, torch.tensor([[0, 1, 1], [1, 1, 7]]), ok)
    with pytest.raises(ValueError, match=r"test\[0, 1\] \(relation\) = -1"):
        KGData("x", 5, 2, ok, ok, torch.tensor([[0, -1, 1]]))
    with pytest.raises(ValueError, match=r"train must be int64 \[N, 3\]"):
        KGData("x", 5, 2, ok.to(torch.int32), ok, ok)
    with pytest.raises(ValueError, match="3 entity_names for 5 ids"):
        KGData("x", 5, 2, ok, ok, ok, entity_names=["a", "b", "c"])


def test_load_dataset_dispatch_errors():
    assert DATASETS == ("nations", "kinships", "umls", "ml100k-kg", "tsv", "synthetic")
    with pytest.raises(ValueError, match="unknown dataset 'fb15k'"):
        load_dataset("fb15k")
    with pytest.raises(ValueError, match="'tsv' needs data_path"):
        load_dataset("tsv")
    with pytest.raises(ValueError, match="needs synthetic=.*num_triples"):
        load_dataset("synthetic", synthetic={"num_entities": 10, "num_relations": 2})
    d = load_dataset("synthetic", synthetic=dict(num_entities=50, num_relations=3, num_triples=400, seed=3))
    assert len(d.known) == 400


# ------------------------------------------------------------------ synthetic
def test_synthetic_is_deterministic_distinct_and_exact():
    kw = dict(num_entities=5000, num_relations=20, num_triples=40_000, skew=1.2)
    a, b = synthetic_kg(**kw, seed=7), synthetic_kg(**kw, seed=7)
    c = synthetic_kg(**kw, seed=8)
    for s in ("train", "valid", "test"):
        assert torch.equal(getattr(a, s), getattr(b, s))
    assert not torch.equal(a.train[:100], c.train[:100])
    k = a.known
    assert k.shape == (40_000, 3)
    assert torch.unique(k, dim=0).shape[0] == 40_000
    assert 0 < len(a.test) <= 400 and 0 < len(a.valid) <= 400


def test_synthetic_skew_and_permuted_ids():
    d = synthetic_kg(num_entities=20_000, num_relations=50, num_triples=200_000, skew=1.2, seed=0)
    counts = d.entity_counts("train")
    top = torch.argsort(counts, descending=True)[:200]  # top 1% of entities
    share = float(counts[top].sum()) / float(counts.sum())
    assert share > 0.5, share
    # hotness is not id order: the hottest ids are spread over the whole id range
    assert len(set(top.tolist()) & set(range(200))) < 20
    assert float(top.to(torch.float64).mean()) > 5000
    flat = synthetic_kg(num_entities=20_000, num_relations=50, num_triples=200_000, skew=0.0, seed=0).entity_counts()
    assert float(flat.sort(descending=True).values[:200].sum()) / float(flat.sum()) < 0.05
    rel = torch.bincount(d.train[:, 1], minlength=50)
    assert int(rel.max()) > 5 * int(rel.min())  # relations are skewed too


def test_synthetic_is_vectorized():
    t0 = time.perf_counter()
    d = synthetic_kg(num_entities=100_000, num_relations=100, num_triples=1_000_000, skew=1.1, seed=1)
    assert len(d.known) == 1_000_000
    assert time.perf_counter() - t0 < 15.0  # coarse (shared CI machines): about 0.5 s when idle


def test_synthetic_too_dense_is_refused():
    with pytest.raises(ValueError, match="possible"):
        synthetic_kg(num_entities=3, num_relations=1, num_triples=8)


# ------------------------------------------------------------------ real data (PyPI wheels)
@pytest.fixture(scope="module")
def wheel_cache():
    """The real wheels, fetched once into the user cache. Failing to fetch is a failure, unless
    FRUGAL_OFFLINE=1 says this machine is known to be offline."""
    try:
        fetch_wheel("pykeen", "1.11.1")
        fetch_wheel("recbole", "1.2.1")
    except DatasetUnavailableError as e:
        if os.environ.get("FRUGAL_OFFLINE") == "1":
            pytest.skip(f"FRUGAL_OFFLINE=1 and the wheels are not cached: {str(e).splitlines()[0]}")
        pytest.fail(f"could not fetch the dataset wheels (set FRUGAL_OFFLINE=1 on an offline machine):\n{e}")
    return None


@pytest.mark.parametrize(
    "name, entities, relations, sizes",
    [
        ("umls", 135, 46, (5216, 652, 661)),
        ("kinships", 104, 25, (8544, 1068, 1074)),
        ("nations", 14, 55, (1592, 199, 201)),
    ],
)
def test_real_pykeen_statistics(wheel_cache, name, entities, relations, sizes):
    d = load_dataset(name)
    assert (d.num_entities, d.num_relations) == (entities, relations)
    assert (len(d.train), len(d.valid), len(d.test)) == sizes
    assert torch.unique(d.known, dim=0).shape[0] == sum(sizes)


def test_real_ml100k_kg(wheel_cache):
    d = load_dataset("ml100k-kg")
    assert len(d.known) == 91_631
    assert (d.num_entities, d.num_relations) == (34_628, 24)
    assert d.relation_names[0] == "film.actor.film" and d.entity_names[-1].startswith("m.")
    seen = torch.zeros(d.num_entities, dtype=torch.bool)
    seen[d.train[:, [0, 2]].reshape(-1)] = True
    assert bool(seen[d.test[:, [0, 2]].reshape(-1)].all())

"""examples/dlrm: configurations, the synthetic click generator, the Criteo TSV/NPY readers."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.dlrm.configs import DATASETS, get_config  # noqa: E402
from examples.dlrm.data import (  # noqa: E402
    SyntheticClickData,
    auc,
    count_ids,
    criteo_npy_batches,
    criteo_tsv_batches,
    npy_files,
)

SMALL = 0.002  # criteo-kaggle at this scale: largest table 20k rows


def small_data(batch_size: int = 256, seed: int = 0, name: str = "criteo-kaggle", scale: float = SMALL) -> SyntheticClickData:
    cfg = get_config(name, scale=scale)
    return SyntheticClickData(cfg.dataset, cfg.rows(), batch_size, seed=seed)


# ------------------------------------------------------------------ configurations
def test_configs_have_the_published_cardinalities():
    ck, av, tb = DATASETS["criteo-kaggle"], DATASETS["avazu"], DATASETS["criteo-tb"]
    assert (ck.num_sparse, ck.total_rows, ck.num_dense) == (26, 33_762_577, 13)
    assert (av.num_sparse, av.total_rows, av.num_dense) == (22, 9_449_445, 0)
    assert (tb.num_sparse, tb.total_rows, tb.num_dense) == (26, 882_774_559, 13)
    assert ck.cardinalities[2] == 10_131_227 and tb.cardinalities[0] == 227_605_432
    for d in DATASETS.values():
        # the default scale fits the 24 GiB machine with room for replicas and optimizer state
        assert d.table_bytes() < 1 << 30, d.name


def test_scaling_keeps_small_tables_and_shrinks_large_ones():
    rows = DATASETS["criteo-kaggle"].rows(0.1)
    assert rows[8] == 3 and rows[5] == 24  # small fields keep their true size
    assert rows[2] == 1_013_123  # ceil(10,131,227 * 0.1)
    assert rows[0] == 1000  # 1460 * 0.1 = 146 is raised to min_rows
    assert sum(rows) == 3_381_001
    cfg = get_config("criteo-kaggle", batch_size=128, cache_ratio=0.01)
    assert cfg.lookahead == 10 and cfg.model.embedding_dim == 32 and cfg.model.mlp_layers == (512, 256, 1)
    with pytest.raises(ValueError):
        DATASETS["avazu"].rows(0.0)
    with pytest.raises(ValueError):
        get_config("criteo-kaggle", cache_ratio=2.0)
    with pytest.raises(ValueError):
        get_config("movielens")


# ------------------------------------------------------------------ synthetic data
def test_synthetic_batches_are_deterministic_per_seed_rank_step():
    a, b = small_data(seed=3), small_data(seed=3)
    x, y = a.batch(1, 7), b.batch(1, 7)
    assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
    assert torch.equal(x.dense_features, y.dense_features) and torch.equal(x.labels, y.labels)
    assert not torch.equal(x.sparse_features.values(), a.batch(0, 7).sparse_features.values())  # other rank
    assert not torch.equal(x.sparse_features.values(), a.batch(1, 8).sparse_features.values())  # other step
    assert not torch.equal(x.sparse_features.values(), a.batch(1, 7, split="eval").sparse_features.values())
    assert not torch.equal(x.sparse_features.values(), small_data(seed=4).batch(1, 7).sparse_features.values())
    it = a.batches(rank=1, start=6, num=3)
    assert torch.equal(list(it)[1].labels, x.labels)


def test_synthetic_batch_shapes_match_criteo():
    d = small_data(batch_size=64)
    b = d.batch(0, 0)
    kjt = b.sparse_features
    assert kjt.keys() == [f"cat_{i}" for i in range(26)]
    assert kjt.stride() == 64 and kjt.values().dtype == torch.int64
    assert torch.equal(kjt.lengths(), torch.ones(26 * 64, dtype=torch.int32))
    for key, rows in zip(kjt.keys(), d.rows):
        v = kjt[key].values()
        assert v.numel() == 64 and int(v.min()) >= 0 and int(v.max()) < rows
    assert b.dense_features.shape == (64, 13) and b.dense_features.dtype == torch.float32
    assert bool((b.dense_features >= 0).all())  # log-transformed counts
    assert b.labels.shape == (64,) and set(b.labels.unique().tolist()) <= {0.0, 1.0}
    av = small_data(batch_size=32, name="avazu", scale=0.01).batch(0, 0)
    assert av.dense_features.shape == (32, 1) and len(av.sparse_features.keys()) == 22


def test_synthetic_ids_are_zipf_skewed_and_permuted():
    d = small_data(batch_size=1024)  # t_cat_2 has 20,263 rows (s = 1.2); t_cat_8 has 3 (s = 0.3)
    counts = d.presample_counts([0], 20)
    big = counts["t_cat_2"].double()
    top = big.sort(descending=True)
    share_top1pct = float(top.values[: big.numel() // 100].sum() / big.sum())
    assert share_top1pct > 0.5, share_top1pct  # heavy head
    assert int((top.indices[:100] < 100).sum()) < 10  # hot ids are spread over the table, not 0..99
    small = counts["t_cat_17"].double()  # 1000 rows, s = 0.3: mild skew (Zipf 0.3 head is 5.6x the mean)
    assert float(small.max() / small.mean()) < 8.0
    assert float(small.sort(descending=True).values[:10].sum() / small.sum()) < 0.1
    assert float(small[small > 0].numel()) > 0.9 * small.numel()
    # counts are the bincount of the ids
    assert int(counts["t_cat_0"].sum()) == 20 * 1024
    ids = d.ids(0, 0)
    assert torch.equal(
        d.presample_counts([0], 1)["t_cat_5"], torch.from_numpy(np.bincount(ids[5], minlength=d.rows[5]))
    )
    both = d.presample_counts([0, 1], 2)["t_cat_5"]
    assert int(both.sum()) == 4 * 1024


def test_synthetic_batch_generation_is_fast():
    import time

    cfg = get_config("criteo-kaggle")  # default scale 0.1: 3.4M rows, largest table 1M
    d = SyntheticClickData(cfg.dataset, cfg.rows(), 1024)
    d.batch(0, 0)
    t = time.process_time()
    for s in range(20):
        d.batch(0, s)
    per_batch = (time.process_time() - t) / 20
    assert per_batch < 0.02, per_batch  # ~1-2 ms on this 2-core machine; generous for a loaded CI box


def test_planted_labels_are_learnable():
    """Logistic regression on the true features (per-row weights, dense) beats AUC 0.5 clearly."""
    torch.manual_seed(0)
    d = small_data(batch_size=1024)
    assert d.bayes_auc() > 0.8
    f = len(d.rows)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(d.rows)[:-1]]))
    emb = torch.nn.EmbeddingBag(int(sum(d.rows)), 1, mode="sum")
    torch.nn.init.zeros_(emb.weight)
    lin = torch.nn.Linear(13, 1)
    opt = torch.optim.Adagrad(list(emb.parameters()) + list(lin.parameters()), lr=0.1)

    def logits(b):
        ids = b.sparse_features.values().view(f, -1) + offsets[:, None]
        return (emb(ids.t().contiguous()) + lin(b.dense_features)).squeeze(1)

    for s in range(150):
        b = d.batch(0, s)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(b), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        held = [d.batch(0, s, split="eval") for s in range(10)]
        scores = torch.cat([logits(b) for b in held]).numpy()
        labels = torch.cat([b.labels for b in held]).numpy()
    assert auc(scores, labels) > 0.7
    # a model that learned nothing is at 0.5
    assert abs(auc(np.zeros_like(scores), labels) - 0.5) < 1e-9


def test_auc_matches_torchmetrics():
    from torchmetrics.functional.classification import binary_auroc

    rng = np.random.default_rng(0)
    s = rng.normal(size=5000).round(1)  # with ties
    y = (rng.random(5000) < 1 / (1 + np.exp(-s))).astype(np.float32)
    assert auc(s, y) == pytest.approx(float(binary_auroc(torch.tensor(s), torch.tensor(y).long())), abs=1e-6)


def test_auc_is_undefined_with_one_class():
    """The training summary and the data's Bayes AUC share this one function: a window of one
    class has no AUC (NaN), not the 0.5 of a model that learned nothing."""
    assert np.isnan(auc(np.arange(4.0), np.ones(4))) and np.isnan(auc(np.arange(4.0), np.zeros(4)))
    assert np.isnan(auc(np.zeros(0), np.zeros(0)))
    assert auc(np.array([0.1, 0.9]), np.array([0.0, 1.0])) == 1.0


@pytest.mark.parametrize("name", ["criteo-kaggle", "avazu"])  # 13 dense features, and none (one constant column)
def test_loader_workers_make_the_same_batches_off_the_training_process(name: str):
    d = small_data(batch_size=64, seed=5, name=name)
    inline = list(d.batches(1, 4, 6))
    made = list(d.batches(1, 4, 6, workers=2))  # each sent as one packed buffer, unpacked as views
    assert len(made) == 6
    for x, y in zip(inline, made):
        kx, ky = x.sparse_features, y.sparse_features
        assert kx.keys() == ky.keys() and kx.stride() == ky.stride() == 64
        for a, b in [(kx.values(), ky.values()), (kx.lengths(), ky.lengths()), (kx.offsets(), ky.offsets()),
                     (x.dense_features, y.dense_features), (x.labels, y.labels)]:  # fmt: skip
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        assert kx.length_per_key() == ky.length_per_key() and kx.offset_per_key() == ky.offset_per_key()


def test_count_ids_of_batches():
    d = small_data(batch_size=32)
    names = d.dataset.table_names()
    counts = count_ids(d.batches(0, 0, 3), names, d.rows)
    assert torch.equal(counts["t_cat_3"], d.presample_counts([0], 3)["t_cat_3"])
    both = d.presample_counts([0, 1], 3)
    assert torch.equal(both["t_cat_3"], counts["t_cat_3"] + count_ids(d.batches(1, 0, 3), names, d.rows)["t_cat_3"])


# ------------------------------------------------------------------ real Criteo files
def _criteo_rows(scale: float = SMALL):
    cfg = get_config("criteo-kaggle", scale=scale)
    return cfg.dataset, cfg.rows()


def test_criteo_tsv_reader_deals_complete_rounds_to_ranks():
    from torchrec.datasets.test_utils.criteo_test_utils import CriteoTest

    dataset, rows = _criteo_rows()
    with CriteoTest._create_dataset_tsv(num_rows=50) as path:
        with open(path) as f:
            lines = [line.rstrip("\n").split("\t") for line in f]
        per_rank = [list(criteo_tsv_batches([path], dataset, rows, 8, r, 2)) for r in range(2)]
        endless = criteo_tsv_batches([path], dataset, rows, 8, 1, 2, repeat=True)
        again = [next(endless) for _ in range(4)]
    # 50 rows = 3 complete rounds of 2 x 8 (2 rows left over, dropped on every rank)
    assert [len(p) for p in per_rank] == [3, 3]
    b = per_rank[1][2]  # round 2, rank 1: rows 40..47
    src = lines[40:48]
    assert b.labels.tolist() == [float(r[0]) for r in src]
    expect_dense = np.log1p(np.maximum(np.array([[int(x or 0) for x in r[1:14]] for r in src], dtype=np.float32), 0))
    assert np.allclose(b.dense_features.numpy(), expect_dense)
    kjt = b.sparse_features
    assert kjt.keys()[0] == "cat_0" and kjt.stride() == 8
    for i in (0, 7, 25):
        expect = [int(r[14 + i] or "0", 16) % rows[i] for r in src]
        assert kjt[f"cat_{i}"].values().tolist() == expect
    assert torch.equal(again[3].labels, per_rank[1][0].labels)  # repeat cycles the files


def test_criteo_npy_reader_hashes_ids_into_scaled_tables():
    from torchrec.datasets.test_utils.criteo_test_utils import CriteoTest

    dataset, rows = _criteo_rows()
    rng = np.random.default_rng(0)
    sparse = rng.integers(0, 2**31 - 1, size=(40, 26), dtype=np.int32)
    labels = rng.integers(0, 2, size=(40, 1), dtype=np.int32)
    with CriteoTest._create_dataset_npys(num_rows=40, filename="day_0", sparse=sparse.copy(), labels=labels) as paths:
        d, s, l = npy_files(os.path.dirname(paths[0]))
        assert [os.path.basename(p) for p in (d[0], s[0], l[0])] == ["day_0_dense.npy", "day_0_sparse.npy", "day_0_labels.npy"]
        dense = np.load(d[0])
        per_rank = [list(criteo_npy_batches(os.path.dirname(paths[0]), dataset, rows, 8, r, 2)) for r in range(2)]
        endless = criteo_npy_batches(os.path.dirname(paths[0]), dataset, rows, 8, 0, 2, repeat=True)
        many = [next(endless) for _ in range(7)]
    assert [len(p) for p in per_rank] == [2, 2]  # 40 rows = 5 batches of 8, 4 dealt evenly
    b = per_rank[1][0]  # rows 8..15
    assert b.labels.dtype == torch.float32 and b.labels.tolist() == labels[8:16, 0].astype(float).tolist()
    assert np.allclose(b.dense_features.numpy(), dense[8:16])
    kjt = b.sparse_features
    assert kjt.values().dtype == torch.int64
    for i in (0, 2, 25):
        assert kjt[f"cat_{i}"].values().tolist() == (sparse[8:16, i].astype(np.int64) % rows[i]).tolist()
    assert torch.equal(many[2].labels, many[0].labels)  # repeat cycles the files


def test_criteo_readers_refuse_non_criteo_configs():
    cfg = get_config("avazu", scale=0.01)
    with pytest.raises(ValueError, match="criteo"):
        next(criteo_tsv_batches(["/nonexistent"], cfg.dataset, cfg.rows(), 8, 0, 1))


# ------------------------------------------------------------------ the paper's benchmark
def paper_data(batch_size: int = 64, name: str = "criteo-kaggle", scale: float = 0.001):
    from examples.dlrm.data import SyntheticPaperData
    from torchrec_frugal.datasets import ModelConfig

    cfg = get_config(name, model=ModelConfig(kind="paper"), scale=scale)
    return cfg, SyntheticPaperData(cfg.dataset, cfg.rows(), batch_size, seed=0)


def test_the_paper_configs_are_the_authors_one_table():
    from torchrec_frugal.datasets import PAPER_DATASETS, ModelConfig

    want = {"avazu": (9_449_206, 21), "criteo-kaggle": (33_762_578, 26), "criteo-tb": (73_391_341, 26)}
    for name, (rows, ids) in want.items():
        cfg = get_config(name, model=ModelConfig(kind="paper"), scale=1.0)
        assert cfg.dataset is PAPER_DATASETS[name] and cfg.rows() == [rows] and cfg.dataset.ids_per_sample == ids
        assert cfg.dataset.num_dense == 0 and cfg.dataset.table_names() == ["t_ids"]
        # the authors' optimizers: SGD at 0.01 on table and MLP
        assert (cfg.embedding_optimizer, cfg.embedding_lr, cfg.dense_optimizer, cfg.dense_lr) == ("sgd", 0.01, "sgd", 0.01)
        assert cfg.model.mlp_layers == (512, 256, 1)
    assert get_config("criteo-kaggle", model=ModelConfig(kind="paper"), scale=0.05).rows() == [1_688_129]
    assert get_config("criteo-kaggle").embedding_optimizer == "rowwise_adagrad"  # the DLRM keeps its own
    with pytest.raises(ValueError, match="model must be one of"):
        ModelConfig(kind="mlp")


def test_paper_batches_pool_the_ids_of_one_table_sample_by_sample():
    cfg, data = paper_data(batch_size=64)
    b = data.batch(rank=1, step=3)
    kjt = b.sparse_features
    assert kjt.keys() == ["ids"] and kjt.stride() == 64
    assert torch.equal(kjt.lengths(), torch.full((64,), 26, dtype=torch.int32))
    assert kjt.values().numel() == 64 * 26 and int(kjt.values().max()) < cfg.rows()[0]
    assert b.dense_features.shape == (64, 0)
    assert set(b.labels.unique().tolist()) <= {0.0, 1.0} and 10 < int(b.labels.sum()) < 54  # random labels
    again = data.batch(rank=1, step=3)
    assert torch.equal(again.sparse_features.values(), kjt.values()) and torch.equal(again.labels, b.labels)
    assert not torch.equal(data.batch(rank=0, step=3).sparse_features.values(), kjt.values())
    # the loader workers make the same batches
    made = list(data.batches(rank=1, start=2, num=3, workers=1))
    assert torch.equal(made[1].sparse_features.values(), kjt.values()) and torch.equal(made[1].labels, b.labels)
    assert made[1].dense_features.shape == (64, 0)
    counts = data.presample_counts([0, 1], 4)
    assert list(counts) == ["t_ids"] and int(counts["t_ids"].sum()) == 2 * 4 * 64 * 26


def test_paper_ids_are_zipf_over_one_permuted_space():
    _, data = paper_data(batch_size=1024, scale=0.01)  # 337,626 rows
    counts = data.presample_counts([0], 20)["t_ids"].numpy()
    top = np.sort(counts)[::-1]
    assert top[: len(top) // 100].sum() > 0.7 * counts.sum()  # Zipf(1.2): the top 1% take most draws
    assert np.argmax(counts) != 0 and np.argsort(counts)[-2] != 1  # hotness is not row order


def write_paper_files(tmp_path, lengths, ids):
    prefix = tmp_path / "criteo_binary"
    np.save(f"{prefix}.npy", np.asarray(ids, dtype=np.int64))
    np.save(f"{prefix}_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    return str(prefix)


def test_paper_npy_reader_deals_batches_as_the_authors_loader(tmp_path):
    from examples.dlrm.data import paper_npy_batches
    from torchrec_frugal.datasets import ModelConfig

    cfg = get_config("criteo-kaggle", model=ModelConfig(kind="paper"), scale=1.0)
    rng = np.random.default_rng(0)
    samples, batch, world = 37, 4, 2  # 4 complete rounds of 2 ranks x 4 samples; 5 samples left out
    lengths = np.full(samples, 26)
    ids = rng.integers(0, cfg.rows()[0], size=samples * 26)
    prefix = write_paper_files(tmp_path, lengths, ids)
    per_sample = ids.reshape(samples, 26)
    for rank in range(world):
        it = paper_npy_batches(prefix, cfg.dataset, rows=1000, batch_size=batch, rank=rank, world_size=world)
        for step in range(6):  # past the end: the file is cycled over its 32 usable samples
            b = next(it)
            first = ((step * world + rank) * batch) % 32
            want = per_sample[first : first + batch].reshape(-1) % 1000
            assert torch.equal(b.sparse_features.values(), torch.from_numpy(want)), (rank, step)
            assert b.sparse_features.lengths().tolist() == [26] * batch and b.dense_features.shape == (batch, 0)
    # samples of varied lengths keep their own ids
    prefix = write_paper_files(tmp_path, [1, 3, 2, 2], [5, 6, 7, 8, 9, 10, 11, 12])
    b = next(paper_npy_batches(prefix, cfg.dataset, rows=100, batch_size=2, rank=1, world_size=2))
    assert b.sparse_features.lengths().tolist() == [2, 2] and b.sparse_features.values().tolist() == [9, 10, 11, 12]


def test_paper_npy_reader_names_a_bad_id_and_bad_files(tmp_path):
    from examples.dlrm.data import paper_npy_batches, paper_npy_files
    from torchrec_frugal.datasets import ModelConfig

    cfg = get_config("avazu", model=ModelConfig(kind="paper"), scale=1.0)
    prefix = write_paper_files(tmp_path, [2, 2], [0, 1, 9_449_206, 3])  # one past avazu's capacity
    with pytest.raises(ValueError, match=r"id 9449206 is outside table t_ids's \[0, 9449206\).*avazu"):
        next(paper_npy_batches(prefix, cfg.dataset, rows=1000, batch_size=1, rank=0, world_size=1))
    prefix = write_paper_files(tmp_path, [2, 2], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="fewer than one round of 2 ranks x 2"):
        next(paper_npy_batches(prefix, cfg.dataset, rows=1000, batch_size=2, rank=0, world_size=2))
    np.save(f"{prefix}_offsets.npy", np.array([0, 3, 2, 4]))
    with pytest.raises(ValueError, match="nondecreasing sample offsets"):
        next(paper_npy_batches(prefix, cfg.dataset, rows=1000, batch_size=1, rank=0, world_size=1))
    with pytest.raises(FileNotFoundError, match="missing_offsets.npy"):
        np.save(tmp_path / "missing.npy", np.zeros(3, dtype=np.int64))
        paper_npy_files(str(tmp_path / "missing"))

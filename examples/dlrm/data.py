"""Data for the DLRM example: a learnable synthetic click log, and real Criteo (TSV or NPY).

Every source yields ``torchrec.datasets.utils.Batch``: ``dense_features`` float32 ``[B, W]``,
``sparse_features`` a KJT with one id per feature per sample (as Criteo), ``labels`` float32 ``[B]``.

Synthetic data (:class:`SyntheticClickData`): the dataset's (scaled) cardinalities, ids of each
table drawn from Zipf(s) over a random permutation of its rows (s = 1.2 on large tables, near
uniform on small ones; :class:`configs.SkewConfig`), 13 Criteo-like dense features, and labels
drawn from a planted logistic model: every row of every table has a hidden weight, every dense
feature a hidden coefficient, and ``P(click) = sigmoid(bias + sum_t w_t[id_t] + z . v)``. A model
that learns the rows it sees raises AUC above 0.5, so convergence is observable. Batches are
deterministic functions of (seed, split, rank, step): any process can regenerate any rank's batch,
which is what a lookahead pipeline and a side-by-side benchmark need.

Real data: :func:`criteo_tsv_batches` streams TorchRec's TSV reader (``criteo_terabyte`` /
``CriteoIterDataPipe``; the Kaggle ``train.txt`` and the 1TB ``day_*`` files share the format) and
:func:`criteo_npy_batches` TorchRec's ``InMemoryBinaryCriteoIterDataPipe`` over the NPY files of
``BinaryCriteoUtils.tsv_to_npys``. Categorical ids are reduced modulo the scaled table sizes.
"""
from __future__ import annotations

import glob
import itertools
import math
import os
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_frugal import presample
from torchrec_frugal.synthetic_ids import ZipfIds

try:  # run as a script (sys.path[0] = examples/dlrm) or imported as examples.dlrm.data
    from examples.dlrm.configs import DatasetConfig, SkewConfig
except ImportError:  # pragma: no cover
    from configs import DatasetConfig, SkewConfig  # type: ignore[no-redef]

SPLITS = {"train": 0, "eval": 1}


class _KJTLayout:
    """KJT metadata for ``F`` features with exactly ``ids_per_sample`` ids each and batch size ``B`` (cached)."""

    def __init__(self, keys: Sequence[str], ids_per_sample: int = 1) -> None:
        self.keys = list(keys)
        self.ids_per_sample = ids_per_sample
        self.index_per_key = {k: i for i, k in enumerate(self.keys)}
        self._by_batch: Dict[int, Tuple[torch.Tensor, torch.Tensor, List[int], List[int]]] = {}

    def kjt(self, ids: torch.Tensor, batch_size: int) -> KeyedJaggedTensor:
        """``ids``: int64, feature-major ``[F * B * ids_per_sample]`` (feature 0's samples, then feature 1's, ...)."""
        if batch_size not in self._by_batch:
            k, n = self.ids_per_sample, len(self.keys) * batch_size
            per_key = batch_size * k
            self._by_batch[batch_size] = (
                torch.full((n,), k, dtype=torch.int32),
                torch.arange(0, n * k + 1, k, dtype=torch.int32),
                [per_key] * len(self.keys),
                [per_key * i for i in range(len(self.keys) + 1)],
            )
        lengths, offsets, lpk, opk = self._by_batch[batch_size]
        return KeyedJaggedTensor(
            keys=self.keys,
            values=ids,
            lengths=lengths,
            offsets=offsets,
            stride=batch_size,
            length_per_key=lpk,
            offset_per_key=opk,
            index_per_key=self.index_per_key,
        )


def pack_arrays(dense: np.ndarray, ids: np.ndarray, labels: np.ndarray) -> torch.Tensor:
    """One batch's ids, dense features and labels in one byte buffer (ids first, 8-byte aligned).

    A DataLoader worker sends every tensor of what it returns as a shared-memory segment of its
    own, and the training process receives each through a connection to the worker: one tensor
    a batch instead of five (the KJT's lengths and offsets are the same every batch, rebuilt on
    the receiving side) halves what receiving a batch costs the training thread."""
    parts = [np.ascontiguousarray(ids, dtype=np.int64).reshape(-1), np.ascontiguousarray(dense, dtype=np.float32).reshape(-1),
             np.ascontiguousarray(labels, dtype=np.float32).reshape(-1)]  # fmt: skip
    return torch.from_numpy(np.concatenate([p.view(np.uint8) for p in parts]))


def unpack_batch(layout: _KJTLayout, packed: torch.Tensor, batch_size: int, num_dense: int) -> Batch:
    """The :class:`Batch` that :func:`pack_arrays` packed: views of ``packed``, no copy."""
    n_ids, n_dense = len(layout.keys) * batch_size * layout.ids_per_sample, batch_size * num_dense
    dense_at, labels_at = 8 * n_ids, 8 * n_ids + 4 * n_dense
    return Batch(
        dense_features=packed[dense_at:labels_at].view(torch.float32).view(batch_size, num_dense),
        sparse_features=layout.kjt(packed[:dense_at].view(torch.int64), batch_size),
        labels=packed[labels_at : labels_at + 4 * batch_size].view(torch.float32),
    )


def make_batch(layout: _KJTLayout, dense: np.ndarray, ids: np.ndarray, labels: np.ndarray) -> Batch:
    """Batch from numpy ``dense [B, W]``, ``ids [F, B * ids_per_sample]`` and ``labels [B]``."""
    b = dense.shape[0]
    return Batch(
        dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
        sparse_features=layout.kjt(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)), b),
        labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32).reshape(-1)),
    )


class _SyntheticBatches:
    """What every synthetic source shares: batches as functions of (seed, split, rank, step), made
    in the training process or by DataLoader workers, and the pre-sample's id counts.

    A subclass sets ``dataset``, ``rows``, ``batch_size``, ``seed``, ``dense_width`` (columns of
    ``Batch.dense_features``) and ``_layout``, and implements ``_sample`` (the ids of one batch,
    int64 ``[F, B * ids_per_sample]``, and the generator that drew them) and ``arrays``."""

    dataset: DatasetConfig
    rows: List[int]
    batch_size: int
    seed: int
    dense_width: int
    _layout: _KJTLayout

    def _rng(self, rank: int, step: int, split: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, SPLITS[split], rank, step])

    def _sample(self, rng: np.random.Generator) -> Tuple[np.ndarray, np.random.Generator]:
        raise NotImplementedError

    def arrays(self, rank: int, step: int, split: str = "train") -> Tuple[np.ndarray, ...]:
        """(dense [B, W], ids [F, B * ids_per_sample], labels [B], ...) of one batch."""
        raise NotImplementedError

    def ids(self, rank: int, step: int, split: str = "train") -> np.ndarray:
        """The ids of batch ``step`` of ``rank``: int64 ``[F, B * ids_per_sample]``."""
        return self._sample(self._rng(rank, step, split))[0]

    def batch(self, rank: int, step: int, split: str = "train") -> Batch:
        dense, ids, labels = self.arrays(rank, step, split)[:3]
        return make_batch(self._layout, dense, ids, labels)

    def packed_batch(self, rank: int, step: int, split: str = "train") -> torch.Tensor:
        """:meth:`batch` packed into one buffer (:func:`pack_arrays`), as a loader worker sends it."""
        dense, ids, labels = self.arrays(rank, step, split)[:3]
        return pack_arrays(dense, ids, labels)

    def batches(
        self, rank: int, start: int = 0, num: Optional[int] = None, split: str = "train", workers: int = 0,
        pin: bool = False,
    ) -> Iterator[Batch]:
        """Batches ``start, start + 1, ...`` of ``rank`` (endless if ``num`` is None).

        With ``workers`` > 0 (``num`` given) they are made by that many DataLoader worker
        processes, ahead of use and off the training thread, as a real input pipeline makes
        them; the batches and their order are the same. The workers start here, so call this
        before the training process starts threads of its own. ``pin``: batches come in
        page-locked memory (for an asynchronous copy to an accelerator). Each batch travels as
        one buffer (:func:`pack_arrays`) and is unpacked here as views of it.
        """
        if workers > 0 and num is not None:
            dataset = _SyntheticSteps(self, rank, start, num, split)
            # A generator of its own: the workers' seeds must not be drawn from the global RNG,
            # which the model's initial weights come from next.
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=None, num_workers=workers, prefetch_factor=4, pin_memory=pin,
                generator=torch.Generator().manual_seed(0),
            )  # fmt: skip
            return (unpack_batch(self._layout, packed, self.batch_size, self.dense_width) for packed in loader)
        steps = itertools.count(start) if num is None else range(start, start + num)
        return (self.batch(rank, s, split) for s in steps)

    # ------------------------------------------------------------------ pre-sample
    def presample_counts(
        self, ranks: Iterable[int], steps: int, table_names: Optional[Sequence[str]] = None
    ) -> Dict[str, torch.Tensor]:
        """Per-table id counts over the first ``steps`` training batches of each of ``ranks``.

        Keys are ``table_names`` (default ``dataset.table_names()``); values int64 ``[rows]``.
        """
        names = list(table_names) if table_names is not None else self.dataset.table_names()
        batches = (torch.from_numpy(self.ids(r, s)) for r in ranks for s in range(steps))
        return dict(zip(names, presample.count_ids(batches, self.rows)))


class SyntheticClickData(_SyntheticBatches):
    """Skewed, learnable synthetic click data with a dataset's shape.

    Args:
        dataset: the dataset shape (feature names, dense feature count).
        rows: per-table row counts (the scaled cardinalities), one per feature.
        batch_size: samples per batch (per rank).
        seed: fixes the permutations, hidden weights and every batch.
        skew: Zipf exponent per table size.
        logit_std: standard deviation of the planted sparse part of the logit (all tables).
        dense_std: standard deviation of the planted dense part of the logit.
        bias: planted intercept (sets the click rate; -1.2 gives about 0.3).
    """

    def __init__(
        self,
        dataset: DatasetConfig,
        rows: Sequence[int],
        batch_size: int,
        seed: int = 0,
        skew: SkewConfig = SkewConfig(),
        logit_std: float = 1.6,
        dense_std: float = 0.6,
        bias: float = -1.2,
    ) -> None:
        if len(rows) != dataset.num_sparse:
            raise ValueError(f"{dataset.name}: {dataset.num_sparse} features, got {len(rows)} row counts")
        self.dataset = dataset
        self.rows = [int(r) for r in rows]
        self.batch_size = batch_size
        self.seed = seed
        self.skew = skew
        self.bias = bias
        self.feature_names = list(dataset.feature_names)
        self.samplers = [ZipfIds(n, skew.s_for(n), seed * 1000 + t) for t, n in enumerate(self.rows)]
        f = len(self.rows)
        self._offsets = np.concatenate([[0], np.cumsum(self.rows)[:-1]]).astype(np.int64)[:, None]
        hidden = np.random.default_rng([seed, 0x5EED, 1])
        sigma = logit_std / math.sqrt(f)
        self._row_weights = np.concatenate([hidden.normal(0.0, sigma, n) for n in self.rows]).astype(np.float32)
        self.num_dense = dataset.num_dense
        self._dense_mu = hidden.uniform(-1.0, 3.0, self.num_dense).astype(np.float32)
        self._dense_coef = (hidden.normal(0.0, 1.0, self.num_dense) * dense_std / math.sqrt(max(1, self.num_dense))).astype(
            np.float32
        )
        self.dense_width = max(1, self.num_dense)  # a dataset without numeric fields has one constant column
        self._layout = _KJTLayout(self.feature_names)

    # ------------------------------------------------------------------ generation
    def _sample(self, rng: np.random.Generator) -> Tuple[np.ndarray, np.random.Generator]:
        ids = np.empty((len(self.samplers), self.batch_size), dtype=np.int64)
        for t, z in enumerate(self.samplers):
            ids[t] = z.sample(self.batch_size, rng)
        return ids, rng

    def arrays(self, rank: int, step: int, split: str = "train") -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(dense [B, W], ids [F, B], labels [B], true click probability [B]) of one batch."""
        ids, rng = self._sample(self._rng(rank, step, split))
        b = self.batch_size
        logit = self._row_weights[ids + self._offsets].sum(axis=0) + self.bias
        if self.num_dense:
            z = rng.standard_normal((b, self.num_dense), dtype=np.float32)
            logit += z @ self._dense_coef
            # Criteo's dense columns are log-transformed counts: nonnegative, skewed, monotone in z.
            dense = np.logaddexp(0.0, self._dense_mu + 1.5 * z).astype(np.float32)
        else:
            dense = np.ones((b, 1), dtype=np.float32)  # the data has no numeric field: a constant
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(b, dtype=np.float32) < prob).astype(np.float32)
        return dense, ids, labels, prob

    def bayes_auc(self, rank: int = 0, steps: int = 20, split: str = "eval") -> float:
        """AUC of the planted click probability itself: the ceiling any model can reach."""
        probs, labels = [], []
        for s in range(steps):
            _, _, y, p = self.arrays(rank, s, split)
            probs.append(p)
            labels.append(y)
        return auc(np.concatenate(probs), np.concatenate(labels))


class SyntheticPaperData(_SyntheticBatches):
    """The input of the paper's DLRM benchmark: ``ids_per_sample`` ids a sample from one table,
    Zipf(s) over a random permutation of its rows (s by table size, :class:`SkewConfig`), no dense
    features (``dense_features`` is ``[B, 0]``), and labels 0 or 1 at random, as the authors'
    throughput benchmark draws them (``torch.randint(0, 2, ...)`` each step): nothing to learn,
    only a step to time. Batches are functions of (seed, split, rank, step)."""

    def __init__(
        self, dataset: DatasetConfig, rows: Sequence[int], batch_size: int, seed: int = 0, skew: SkewConfig = SkewConfig()
    ) -> None:
        if dataset.num_sparse != 1 or len(rows) != 1:
            raise ValueError(f"{dataset.name}: the paper's benchmark has one table, got {len(rows)} row counts")
        self.dataset = dataset
        self.rows = [int(rows[0])]
        self.batch_size = batch_size
        self.seed = seed
        self.ids_per_sample = dataset.ids_per_sample
        self.sampler = ZipfIds(self.rows[0], skew.s_for(self.rows[0]), seed * 1000)
        self.dense_width = 0
        self._layout = _KJTLayout(dataset.feature_names, self.ids_per_sample)

    def _sample(self, rng: np.random.Generator) -> Tuple[np.ndarray, np.random.Generator]:
        return self.sampler.sample(self.batch_size * self.ids_per_sample, rng).reshape(1, -1), rng

    def arrays(self, rank: int, step: int, split: str = "train") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dense [B, 0], ids [1, B * ids_per_sample] sample by sample, labels [B])."""
        ids, rng = self._sample(self._rng(rank, step, split))
        labels = rng.integers(0, 2, self.batch_size).astype(np.float32)
        return np.empty((self.batch_size, 0), dtype=np.float32), ids, labels


class _SyntheticSteps(torch.utils.data.Dataset):
    """Batches ``start .. start + num - 1`` of one rank, by index, packed, for DataLoader workers."""

    def __init__(self, data: SyntheticClickData, rank: int, start: int, num: int, split: str) -> None:
        self.data, self.rank, self.start, self.num, self.split = data, rank, start, num, split

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data.packed_batch(self.rank, self.start + i, self.split)


def count_ids(
    batches: Iterable[Batch], table_names: Sequence[str], rows: Sequence[int]
) -> Dict[str, torch.Tensor]:
    """Per-table id counts of ``batches`` (feature i feeds table i): a pre-sample of real data."""
    kjts = (b.sparse_features for b in batches)
    return dict(zip(table_names, presample.count_ids((k.values().split(k.length_per_key()) for k in kjts), rows)))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC (ties averaged) without extra dependencies; NaN where it is undefined (a window
    with one class only, or none): a number there would pass for a measurement."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1) > 0.5
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # average ranks over ties
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], s.size]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# ---------------------------------------------------------------------- real Criteo data
def _criteo_keys(dataset: DatasetConfig) -> List[str]:
    from torchrec.datasets.criteo import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES, INT_FEATURE_COUNT

    if list(dataset.feature_names) != DEFAULT_CAT_NAMES or dataset.num_dense != INT_FEATURE_COUNT:
        raise ValueError(
            f"Criteo files have {INT_FEATURE_COUNT} dense and {CAT_FEATURE_COUNT} categorical columns; "
            f"config {dataset.name!r} has {dataset.num_dense} and {dataset.num_sparse}: use criteo-kaggle or criteo-tb"
        )
    return DEFAULT_CAT_NAMES


def _tsv_row(row: List[str]) -> Tuple[List[int], List[int], int]:
    # label, 13 integer columns, 26 hex-hashed categorical columns; missing values are 0 (as
    # BinaryCriteoUtils.tsv_to_npys maps them).
    label = int(row[0] or "0")
    dense = [int(x or "0") for x in row[1:14]]
    sparse = [int(x or "0", 16) for x in row[14:40]]
    return dense, sparse, label


def _passes(one_pass: Callable[[], Iterator[Batch]], repeat: bool) -> Iterator[Batch]:
    """The batches of ``one_pass()``; with ``repeat``, pass after pass until a pass yields none."""
    while True:
        produced = False
        for b in one_pass():
            produced = True
            yield b
        if not repeat or not produced:
            return


def tsv_paths(path: str) -> List[str]:
    """A TSV file, or every ``*.tsv`` / ``*.txt`` / ``day_*`` file of a directory (sorted)."""
    if os.path.isdir(path):
        files = sorted(
            set(glob.glob(os.path.join(path, "*.tsv")))
            | set(glob.glob(os.path.join(path, "*.txt")))
            | {p for p in glob.glob(os.path.join(path, "day_*")) if not p.endswith(".npy")}
        )
        if not files:
            raise FileNotFoundError(f"no *.tsv, *.txt or day_* file in {path}")
        return files
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return [path]


def criteo_tsv_batches(
    paths: Sequence[str],
    dataset: DatasetConfig,
    rows: Sequence[int],
    batch_size: int,
    rank: int,
    world_size: int,
    repeat: bool = False,
) -> Iterator[Batch]:
    """Batches of this rank from Criteo TSV files, through TorchRec's ``criteo_terabyte`` reader.

    Batches are dealt round-robin (batch i to rank i % world_size); a round is yielded only when
    complete, so every rank sees the same number of batches. Dense values: ``log(1 + max(x, 0))``.
    Categorical ids: hex value modulo the table's (scaled) row count. ``repeat`` cycles the files.
    """
    from torchrec.datasets.criteo import criteo_terabyte

    layout = _KJTLayout(_criteo_keys(dataset))
    mod = np.asarray(rows, dtype=np.int64)[:, None]
    per_round = batch_size * world_size

    def one_pass() -> Iterator[Batch]:
        buf_d: List[List[int]] = []
        buf_s: List[List[int]] = []
        buf_l: List[int] = []
        for dense, sparse, label in criteo_terabyte(list(paths), row_mapper=_tsv_row):
            buf_d.append(dense)
            buf_s.append(sparse)
            buf_l.append(label)
            if len(buf_l) == per_round:
                lo, hi = rank * batch_size, (rank + 1) * batch_size
                d = np.log1p(np.maximum(np.asarray(buf_d[lo:hi], dtype=np.float32), 0.0))
                s = np.asarray(buf_s[lo:hi], dtype=np.int64).T % mod
                lab = np.asarray(buf_l[lo:hi], dtype=np.float32)
                buf_d, buf_s, buf_l = [], [], []
                yield make_batch(layout, d, s, lab)

    yield from _passes(one_pass, repeat)


def npy_files(path: str) -> Tuple[List[str], List[str], List[str]]:
    """(dense, sparse, labels) NPY paths under ``path``: every ``<prefix>_dense.npy`` with its
    ``<prefix>_sparse.npy`` and ``<prefix>_labels.npy`` (the names ``tsv_to_npys`` users write,
    e.g. ``day_0_dense.npy``), sorted by prefix. ``path`` may also be one ``<prefix>`` itself."""
    if os.path.isdir(path):
        prefixes = sorted(p[: -len("_dense.npy")] for p in glob.glob(os.path.join(path, "*_dense.npy")))
    else:
        prefixes = [path]
    if not prefixes:
        raise FileNotFoundError(f"no *_dense.npy in {path}")
    out: Tuple[List[str], List[str], List[str]] = ([], [], [])
    for p in prefixes:
        for lst, kind in zip(out, ("dense", "sparse", "labels")):
            f = f"{p}_{kind}.npy"
            if not os.path.exists(f):
                raise FileNotFoundError(f)
            lst.append(f)
    return out


def criteo_npy_batches(
    path: str,
    dataset: DatasetConfig,
    rows: Sequence[int],
    batch_size: int,
    rank: int,
    world_size: int,
    repeat: bool = False,
    mmap: bool = False,
) -> Iterator[Batch]:
    """Batches of this rank from Criteo NPY files, through TorchRec's ``InMemoryBinaryCriteoIterDataPipe``.

    Incomplete batches are dropped so every rank sees the same number; ids are taken modulo the
    (scaled) row counts (TorchRec's ``hashes``); labels become float32.
    """
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    _criteo_keys(dataset)
    dense, sparse, labels = npy_files(path)
    pipe = InMemoryBinaryCriteoIterDataPipe(
        stage="train",
        dense_paths=dense,
        sparse_paths=sparse,
        labels_paths=labels,
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        drop_last=True,
        mmap_mode=mmap,
        hashes=list(rows),
    )

    def one_pass() -> Iterator[Batch]:
        for b in pipe:
            sf = b.sparse_features
            if sf.values().dtype != torch.int64:
                sf = KeyedJaggedTensor(
                    keys=sf.keys(),
                    values=sf.values().to(torch.int64),
                    lengths=sf.lengths(),
                    stride=sf.stride(),
                    length_per_key=sf.length_per_key(),
                    offset_per_key=sf.offset_per_key(),
                )
            yield Batch(
                dense_features=b.dense_features.to(torch.float32),
                sparse_features=sf,
                labels=b.labels.to(torch.float32).reshape(-1),
            )

    yield from _passes(one_pass, repeat)


# ---------------------------------------------------------------------- the authors' binary format
def paper_npy_files(prefix: str) -> Tuple[str, str]:
    """(``<prefix>.npy``, ``<prefix>_offsets.npy``): the authors' files of a dataset's ids in one ID
    space, sample after sample, and each sample's start in them (one more entry than samples)."""
    if prefix.endswith(".npy"):
        prefix = prefix[: -len(".npy")]
    files = (f"{prefix}.npy", f"{prefix}_offsets.npy")
    for f in files:
        if not os.path.exists(f):
            raise FileNotFoundError(f)
    return files


def paper_npy_batches(
    prefix: str,
    dataset: DatasetConfig,
    rows: int,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int = 0,
    capacity: Optional[int] = None,
) -> Iterator[Batch]:
    """Endless batches of this rank from the authors' binary files (:func:`paper_npy_files`), dealt
    as their ``RecDatasetLoader`` deals them: the samples cut to a multiple of ``world_size *
    batch_size``, rank r's i-th batch the samples from ``(i * world_size + r) * batch_size``, the
    file cycled. Ids must lie in ``[0, capacity)`` (default: the dataset's one cardinality); they
    are taken modulo ``rows`` (the scaled table). Labels are 0 or 1 at random, as the authors draw
    them, from (seed, rank, step)."""
    ids_path, offsets_path = paper_npy_files(prefix)
    ids = np.load(ids_path, mmap_mode="r")
    offsets = np.asarray(np.load(offsets_path), dtype=np.int64)
    capacity = dataset.cardinalities[0] if capacity is None else capacity
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{ids_path}: expected a 1-D array of integer ids, got {ids.dtype} of shape {ids.shape}")
    if offsets.ndim != 1 or offsets.size < 2 or offsets[0] != 0 or offsets[-1] != ids.size or (np.diff(offsets) < 0).any():
        raise ValueError(f"{offsets_path}: expected nondecreasing sample offsets from 0 to {ids.size} (the ids' count)")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= capacity:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{ids_path}: id {bad} is outside table t_{dataset.feature_names[0]}'s [0, {capacity}) "
                         f"(feature {dataset.feature_names[0]!r}, config {dataset.name})")  # fmt: skip
    per_round = world_size * batch_size
    samples = (offsets.size - 1) // per_round * per_round
    if samples == 0:
        raise ValueError(f"{offsets_path}: {offsets.size - 1} samples, fewer than one round of {world_size} ranks x {batch_size}")
    layout = _KJTLayout(dataset.feature_names)
    for step in itertools.count():
        first = ((step * world_size + rank) * batch_size) % samples
        span = offsets[first : first + batch_size + 1]
        values = torch.from_numpy(np.asarray(ids[span[0] : span[-1]], dtype=np.int64) % rows)
        labels = np.random.default_rng([seed, SPLITS["train"], rank, step]).integers(0, 2, batch_size)
        yield Batch(
            dense_features=torch.empty((batch_size, 0)),
            sparse_features=KeyedJaggedTensor(
                keys=layout.keys, values=values, lengths=torch.from_numpy(np.diff(span).astype(np.int32)),
                stride=batch_size, length_per_key=[values.numel()], offset_per_key=[0, values.numel()],
            ),  # fmt: skip
            labels=torch.from_numpy(labels.astype(np.float32)),
        )

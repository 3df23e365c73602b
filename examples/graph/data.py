"""Knowledge graphs for the graph example: real small KGs read from PyPI wheels, user TSV triples,
and a Freebase-shaped power-law generator for scale tests.

Every source yields a :class:`KGData`: int64 ``[N, 3]`` (head, relation, tail) id triples per
split. Labels map to ids through the *sorted* labels over all three splits (entities over heads and
tails, relations separately), so ids are deterministic and independent of file order. Note that
this is string order: ``person10`` comes before ``person2``.

Real data ships inside wheels, which are fetched once with ``pip download --no-deps`` into a cache
folder (``$TORCHREC_FRUGAL_DATA``, default ``~/.cache/torchrec_frugal/wheels``) and read as zip
files; the packages are never installed (they would pull large dependency trees):

- ``nations`` (14 entities, 55 relations), ``kinships`` (104, 25), ``umls`` (135, 46): pykeen
  1.11.1, ``pykeen/datasets/<name>/{train,valid,test}.txt``, tab-separated label triples, with the
  published splits (no duplicates; every valid/test entity and relation occurs in train).
- ``ml100k-kg``: recbole 1.2.1, ``recbole/dataset_example/ml-100k/ml-100k.kg``, 91,631 Freebase
  triples about the MovieLens-100k films (34,628 entities, 24 relations, ``m.0abc`` ids and
  ``film.film.actor``-style relation labels; 89 entities are ``g.`` ids). It has no split, so
  :func:`load_ml100k_kg` makes a seeded 90/5/5 one. 21,215 entities occur in a single triple, so
  about a quarter of the drawn valid/test triples are moved to train (seed 0: 84,723 / 3,474 /
  3,434). Most relations come in inverse pairs (``film.film.genre`` and
  ``film.film_genre.films_in_this_genre``), as in FB15k: about half of the test triples have
  their reverse in train, so scores on it are optimistic.

With no cached wheel and no network, :class:`DatasetUnavailableError` says what to fetch by hand.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from operator import methodcaller
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torchrec_frugal.presample import count_ids

SPLIT_NAMES = ("train", "valid", "test")
COLUMNS = ("head", "relation", "tail")
DATASETS = ("nations", "kinships", "umls", "ml100k-kg", "tsv", "synthetic")

ML100K_HEADER = "head_id:token\trelation_id:token\ttail_id:token"


class DatasetUnavailableError(RuntimeError):
    """A dataset wheel could not be fetched, or the cached wheel is not what was expected."""


class TripleFormatError(ValueError):
    """A malformed line in a triple file (the message names the file and the line number)."""


# ---------------------------------------------------------------------- the dataset
@dataclass(frozen=True, eq=False)
class KGData:
    """A knowledge graph split into train / valid / test id triples.

    ``train``, ``valid``, ``test``: int64 ``[N, 3]``, columns (head, relation, tail), heads and tails
    in ``[0, num_entities)``, relations in ``[0, num_relations)``. ``num_entities`` may exceed the
    largest id (a synthetic graph's cold entities may never occur). ``entity_names[i]`` /
    ``relation_names[j]`` are the labels of ids ``i`` / ``j`` when the source has labels.
    """

    name: str
    num_entities: int
    num_relations: int
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    entity_names: Optional[List[str]] = None
    relation_names: Optional[List[str]] = None

    def __post_init__(self) -> None:
        if self.num_entities < 1 or self.num_relations < 1:
            raise ValueError(
                f"KGData {self.name!r}: num_entities={self.num_entities} and num_relations="
                f"{self.num_relations} must be positive"
            )
        bounds = (self.num_entities, self.num_relations, self.num_entities)
        for split in SPLIT_NAMES:
            x = getattr(self, split)
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"KGData {self.name!r}: {split} must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype != torch.int64 or x.dim() != 2 or x.shape[1] != 3:
                raise ValueError(
                    f"KGData {self.name!r}: {split} must be int64 [N, 3] (head, relation, tail), "
                    f"got {x.dtype} {list(x.shape)}"
                )
            for c, (col, hi) in enumerate(zip(COLUMNS, bounds)):
                v = x[:, c]
                bad = torch.nonzero((v < 0) | (v >= hi)).flatten()
                if bad.numel():
                    i = int(bad[0])
                    raise ValueError(
                        f"KGData {self.name!r}: {split}[{i}, {c}] ({col}) = {int(v[i])} is out of range "
                        f"[0, {hi}) ({bad.numel()} bad {col} ids in {split})"
                    )
        for what, names, n in (
            ("entity_names", self.entity_names, self.num_entities),
            ("relation_names", self.relation_names, self.num_relations),
        ):
            if names is not None and len(names) != n:
                raise ValueError(f"KGData {self.name!r}: {len(names)} {what} for {n} ids")

    @functools.cached_property
    def known(self) -> torch.Tensor:
        """All triples of the three splits (train, valid, test): the filter of filtered ranking."""
        return torch.cat([self.train, self.valid, self.test])

    def entity_counts(self, split: str = "train") -> torch.Tensor:
        """Occurrences of each entity as head or tail in ``split``: int64 ``[num_entities]``
        (the access frequencies a hot-row cache is planned from)."""
        return count_ids([[getattr(self, split)[:, [0, 2]]]], [self.num_entities])[0]

    def summary(self) -> str:
        return (
            f"{self.name}: {self.num_entities:,} entities, {self.num_relations:,} relations; triples "
            f"train {len(self.train):,} / valid {len(self.valid):,} / test {len(self.test):,}"
        )


# ---------------------------------------------------------------------- label triples
def parse_triples(text: str, source: str, first_line: int = 1) -> List[List[str]]:
    """Label columns ``[heads, relations, tails]`` of tab-separated triples, one per line.

    Blank lines are skipped; ``\r\n`` line ends are accepted; spaces around a field are dropped.
    Any other line must have exactly three non-empty tab-separated fields, else
    :class:`TripleFormatError` names ``source`` and the line number (``first_line`` is the number
    of the first line of ``text``). Per-line work runs in C-level ``map``, not a Python loop body.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    n = len(lines)
    tabs = np.fromiter(map(methodcaller("count", "\t"), lines), dtype=np.int64, count=n)
    blank = np.fromiter(map(methodcaller("isspace"), lines), dtype=bool, count=n)
    blank |= np.fromiter(map(len, lines), dtype=np.int64, count=n) == 0
    bad = np.flatnonzero((tabs != 2) & ~blank)
    if bad.size:
        i = int(bad[0])
        raise TripleFormatError(
            f"{source}:{i + first_line}: expected 3 tab-separated fields (head, relation, tail), got "
            f"{tabs[i] + 1}: {lines[i][:200]!r} ({bad.size} malformed lines)"
        )
    keep = np.flatnonzero(~blank)
    if keep.size < n:
        lines = [lines[i] for i in keep.tolist()]
    fields = list(map(str.strip, "\t".join(lines).split("\t"))) if lines else []
    empty = np.flatnonzero(np.fromiter(map(len, fields), dtype=np.int64, count=len(fields)) == 0)
    if empty.size:
        j = int(empty[0])
        raise TripleFormatError(
            f"{source}:{int(keep[j // 3]) + first_line}: empty {COLUMNS[j % 3]} field: {lines[j // 3][:200]!r}"
        )
    return [fields[0::3], fields[1::3], fields[2::3]]


def _ids(labels: Sequence[str], index: Dict[str, int]) -> torch.Tensor:
    return torch.from_numpy(np.fromiter(map(index.__getitem__, labels), dtype=np.int64, count=len(labels)))


def index_label_splits(name: str, splits: Dict[str, List[List[str]]]) -> KGData:
    """:class:`KGData` from label columns per split; ids are positions in the sorted labels."""
    ent_set: set = set()
    rel_set: set = set()
    for h, r, t in splits.values():
        ent_set.update(h)
        ent_set.update(t)
        rel_set.update(r)
    entities, relations = sorted(ent_set), sorted(rel_set)
    e_index = {s: i for i, s in enumerate(entities)}
    r_index = {s: i for i, s in enumerate(relations)}
    tensors = {
        k: torch.stack([_ids(h, e_index), _ids(r, r_index), _ids(t, e_index)], dim=1)
        if len(h)
        else torch.empty(0, 3, dtype=torch.int64)
        for k, (h, r, t) in splits.items()
    }
    return KGData(
        name=name,
        num_entities=max(1, len(entities)),
        num_relations=max(1, len(relations)),
        train=tensors["train"],
        valid=tensors["valid"],
        test=tensors["test"],
        entity_names=entities if entities else None,
        relation_names=relations if relations else None,
    )


def _read_text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TripleFormatError(f"{source}:{line}: not UTF-8 ({e.reason} at byte {e.start})") from None


# ---------------------------------------------------------------------- user TSV directories
_SPLIT_FILES = {
    s: (f"{s}.txt", f"{s}.tsv", f"freebase_mtr100_mte100-{s}.txt", f"freebase_mtr100_mte100-{s}.tsv")
    for s in SPLIT_NAMES
}


def triple_files(path: str) -> Dict[str, str]:
    """The train / valid / test files of a triple directory: ``<split>.txt``, ``<split>.tsv`` or
    FB15k's ``freebase_mtr100_mte100-<split>.txt``. All three are required."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a directory (expected train/valid/test triple files in it)")
    out: Dict[str, str] = {}
    for split, names in _SPLIT_FILES.items():
        found = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        if not found:
            raise FileNotFoundError(f"{path}: no {split} split; expected one of {', '.join(names)}")
        if len(found) > 1:
            raise ValueError(f"{path}: several {split} files, keep one: {', '.join(os.path.basename(f) for f in found)}")
        out[split] = found[0]
    return out


def load_triples_dir(path: str, name: Optional[str] = None) -> KGData:
    """A KG from tab-separated label triples (head, relation, tail per line; the FB15k layout)."""
    files = triple_files(path)
    splits = {}
    for split, f in files.items():
        with open(f, "rb") as fh:
            splits[split] = parse_triples(_read_text(fh.read(), f), f)
    return index_label_splits(name or os.path.basename(os.path.normpath(path)), splits)


# ---------------------------------------------------------------------- wheels
@dataclass(frozen=True)
class WheelDataset:
    """Where a dataset lives inside a PyPI wheel: ``members`` maps split (or ``"all"``) to a path."""

    package: str
    version: str
    members: Dict[str, str]


WHEEL_DATASETS: Dict[str, WheelDataset] = {
    **{
        n: WheelDataset("pykeen", "1.11.1", {s: f"pykeen/datasets/{n}/{s}.txt" for s in SPLIT_NAMES})
        for n in ("nations", "kinships", "umls")
    },
    "ml100k-kg": WheelDataset("recbole", "1.2.1", {"all": "recbole/dataset_example/ml-100k/ml-100k.kg"}),
}


def default_cache_dir() -> str:
    """``$TORCHREC_FRUGAL_DATA``, else ``~/.cache/torchrec_frugal/wheels``."""
    return os.environ.get("TORCHREC_FRUGAL_DATA") or os.path.join(
        os.path.expanduser("~"), ".cache", "torchrec_frugal", "wheels"
    )


def _cached_wheel(package: str, version: str, cache_dir: str) -> Optional[str]:
    stem = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(glob.glob(os.path.join(glob.escape(cache_dir), f"{stem}-{glob.escape(version)}-*.whl")))
    return found[0] if found else None


def _download_command(package: str, version: str, dest: str, python: str = "python") -> List[str]:
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{package}=={version}", "-d", dest]


def fetch_wheel(package: str, version: str, cache_dir: Optional[str] = None, timeout: float = 300.0) -> str:
    """Path of ``package==version``'s wheel in ``cache_dir``, downloading it once if absent.

    A cached wheel means no network. The download goes to a temporary folder inside the cache and is
    moved in when complete, so an interrupted fetch never leaves a truncated wheel behind.
    """
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
    hit = _cached_wheel(package, version, cache_dir)
    if hit:
        return hit
    os.makedirs(cache_dir, exist_ok=True)
    by_hand = shlex.join(_download_command(package, version, cache_dir))
    tmp = tempfile.mkdtemp(prefix=".download-", dir=cache_dir)
    try:
        cmd = _download_command(package, version, tmp, python=sys.executable)
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            code, err = proc.returncode, proc.stderr or proc.stdout or ""
        except subprocess.TimeoutExpired as e:
            code, err = None, f"timed out after {timeout:.0f} s; {e.stderr or ''}"
        got = _cached_wheel(package, version, tmp)
        if code != 0 or got is None:
            tail = "\n".join(str(err).strip().splitlines()[-8:]) or "(no output)"
            raise DatasetUnavailableError(
                f"could not fetch the {package}=={version} wheel (pip exit status {code}); this machine may be "
                f"offline or unable to reach the package index.\npip said:\n{tail}\n"
                f"Fetch it by hand (on any machine with internet access) with\n    {by_hand}\n"
                f"or put {package}-{version}-*.whl into {cache_dir} (or $TORCHREC_FRUGAL_DATA / cache_dir=...)."
            )
        dest = os.path.join(cache_dir, os.path.basename(got))
        os.replace(got, dest)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_wheel_members(wheel: str, members: Sequence[str]) -> Dict[str, bytes]:
    """The bytes of ``members`` of a wheel (a zip file), with a clear error for a missing one."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            missing = [m for m in members if m not in names]
            if missing:
                folder = os.path.dirname(missing[0]) + "/"
                near = sorted(n for n in names if n.startswith(folder))[:10]
                raise DatasetUnavailableError(
                    f"{wheel} has no {', '.join(missing)} (is it the expected version?); "
                    f"under {folder}: {near if near else 'nothing'}"
                )
            return {m: z.read(m) for m in members}
    except zipfile.BadZipFile as e:
        raise DatasetUnavailableError(f"{wheel} is not a valid wheel ({e}); delete it and fetch again") from None


def load_pykeen(name: str, cache_dir: Optional[str] = None) -> KGData:
    """``nations``, ``kinships`` or ``umls`` with their published splits, from the pykeen wheel."""
    if name not in ("nations", "kinships", "umls"):
        raise ValueError(f"pykeen dataset must be nations, kinships or umls, got {name!r}")
    src = WHEEL_DATASETS[name]
    wheel = fetch_wheel(src.package, src.version, cache_dir)
    raw = read_wheel_members(wheel, list(src.members.values()))
    splits = {}
    for split, member in src.members.items():
        where = f"{os.path.basename(wheel)}!{member}"
        splits[split] = parse_triples(_read_text(raw[member], where), where)
    return index_label_splits(name, splits)


def load_ml100k_kg(cache_dir: Optional[str] = None, seed: int = 0) -> KGData:
    """recbole's MovieLens-100k knowledge graph (91,631 triples) with a seeded 90/5/5 split.

    See :func:`random_split` for the split: valid/test triples with an entity or relation unseen in
    train are moved to train, so valid/test are somewhat under 5% each.
    """
    src = WHEEL_DATASETS["ml100k-kg"]
    wheel = fetch_wheel(src.package, src.version, cache_dir)
    member = src.members["all"]
    where = f"{os.path.basename(wheel)}!{member}"
    text = _read_text(read_wheel_members(wheel, [member])[member], where)
    header, _, body = text.partition("\n")
    if header.rstrip("\r") != ML100K_HEADER:
        raise TripleFormatError(f"{where}:1: expected the header {ML100K_HEADER!r}, got {header[:200]!r}")
    h, r, t = parse_triples(body, where, first_line=2)
    whole = index_label_splits("ml100k-kg", {"train": [h, r, t], "valid": [[], [], []], "test": [[], [], []]})
    train, valid, test = random_split(whole.train, whole.num_entities, whole.num_relations, 0.05, 0.05, seed)
    return KGData("ml100k-kg", whole.num_entities, whole.num_relations, train, valid, test,
                  whole.entity_names, whole.relation_names)


# ---------------------------------------------------------------------- splitting
def random_split(
    triples: torch.Tensor,
    num_entities: int,
    num_relations: int,
    valid_fraction: float,
    test_fraction: float,
    seed: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A seeded (train, valid, test) split of ``triples``, each split in input order.

    ``round(fraction * N)`` triples are drawn for valid and for test. Then every valid/test triple
    whose head, tail or relation never occurs in the drawn train part is moved to train: such an
    entity's embedding would never be trained, so ranking it measures initialisation noise, not the
    model (the published pykeen splits satisfy the same rule by construction).
    """
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(f"valid_fraction={valid_fraction}, test_fraction={test_fraction}: need >= 0 and sum < 1")
    n = triples.shape[0]
    n_valid, n_test = round(valid_fraction * n), round(test_fraction * n)
    perm = torch.from_numpy(np.random.default_rng([seed, 0x6B67]).permutation(n))
    # (index_select / index_fill_ rather than advanced indexing: many times faster on CPU)
    part = torch.zeros(n, dtype=torch.int8)  # 0 train, 1 valid, 2 test
    part.index_fill_(0, perm[:n_valid], 1)
    part.index_fill_(0, perm[n_valid : n_valid + n_test], 2)
    train = torch.nonzero(part == 0).squeeze(1)
    seen_e = torch.zeros(num_entities, dtype=torch.bool)
    seen_e.index_fill_(0, triples[:, 0].index_select(0, train), True)
    seen_e.index_fill_(0, triples[:, 2].index_select(0, train), True)
    seen_r = torch.zeros(num_relations, dtype=torch.bool)
    seen_r.index_fill_(0, triples[:, 1].index_select(0, train), True)
    ok = seen_e.index_select(0, triples[:, 0]) & seen_e.index_select(0, triples[:, 2])
    ok &= seen_r.index_select(0, triples[:, 1])
    part.masked_fill_(~ok, 0)
    return tuple(triples.index_select(0, torch.nonzero(part == i).squeeze(1)) for i in range(3))  # type: ignore[return-value]


# ---------------------------------------------------------------------- synthetic
def _zipf_cdf(n: int, s: float) -> torch.Tensor:
    w = torch.arange(1, n + 1, dtype=torch.float64).pow_(-s)
    cdf = torch.cumsum(w, 0)
    return cdf / cdf[-1]


def _zipf_sample(cdf: torch.Tensor, perm: torch.Tensor, num: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(num, dtype=torch.float64, generator=gen)
    k = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1)
    return perm.index_select(0, k)


def synthetic_kg(
    num_entities: int,
    num_relations: int,
    num_triples: int,
    skew: float = 1.1,
    seed: int = 0,
    valid_fraction: float = 0.01,
    test_fraction: float = 0.01,
    relation_skew: float = 1.0,
) -> KGData:
    """A Freebase-shaped power-law KG of exactly ``num_triples`` distinct triples.

    Heads and tails are drawn independently from Zipf(``skew``) over a random permutation of the
    entities (so hotness is not id order, as in real data), relations from Zipf(``relation_skew``)
    over a permutation of the relations. Duplicates are removed and sampling repeats until there are
    enough distinct triples; then ``num_triples`` of them are kept in a random order, and split by
    :func:`random_split`. Cold entities may never occur. Deterministic per ``seed``; inverse-CDF
    sampling with ``searchsorted``, so 10M triples over 1M entities take a few seconds.
    """
    if num_entities < 1 or num_relations < 1 or num_triples < 1:
        raise ValueError(f"need positive sizes, got {num_entities} entities, {num_relations} relations, {num_triples} triples")
    space = num_entities * num_entities * num_relations
    if space >= 2**62:
        raise ValueError(f"{num_entities} entities x {num_relations} relations: triple keys overflow int64")
    if num_triples > space // 2:
        raise ValueError(f"{num_triples} distinct triples requested from only {space} possible ones")
    gen = torch.Generator().manual_seed(seed)
    e_perm = torch.randperm(num_entities, generator=gen)
    r_perm = torch.randperm(num_relations, generator=gen)
    e_cdf, r_cdf = _zipf_cdf(num_entities, skew), _zipf_cdf(num_relations, relation_skew)
    keys = torch.empty(0, dtype=torch.int64)
    er = num_entities * num_relations
    rate = 1.0  # distinct new triples per draw, measured on the previous round
    for _ in range(50):
        need = num_triples - keys.numel()
        if need <= 0:
            break
        m = int(need / rate * 1.1) + 1024
        h = _zipf_sample(e_cdf, e_perm, m, gen)
        r = _zipf_sample(r_cdf, r_perm, m, gen)
        t = _zipf_sample(e_cdf, e_perm, m, gen)
        before = keys.numel()
        keys = torch.unique(torch.cat([keys, h * er + r * num_entities + t]))
        rate = max((keys.numel() - before) / m, 0.01)
    else:
        raise ValueError(
            f"could not draw {num_triples} distinct triples over {num_entities} entities with skew {skew}: "
            f"only {keys.numel()} after 50 rounds; lower the skew or the triple count"
        )
    keys = keys.index_select(0, torch.randperm(keys.numel(), generator=gen)[:num_triples])
    triples = torch.stack([keys // er, keys % er // num_entities, keys % num_entities], dim=1)
    train, valid, test = random_split(triples, num_entities, num_relations, valid_fraction, test_fraction, seed)
    name = f"synthetic-{num_entities}e-{num_relations}r-{num_triples}t-s{skew:g}"
    return KGData(name, num_entities, num_relations, train, valid, test)


# ---------------------------------------------------------------------- dispatch
def load_dataset(
    name: str,
    data_path: Optional[str] = None,
    cache_dir: Optional[str] = None,
    synthetic: Optional[dict] = None,
) -> KGData:
    """One of :data:`DATASETS`: ``nations | kinships | umls | ml100k-kg`` (wheels, cached in
    ``cache_dir``), ``tsv`` (a triple directory ``data_path``), ``synthetic`` (keyword arguments of
    :func:`synthetic_kg` in ``synthetic``)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if data_path is not None and name != "tsv":
        raise ValueError(f"data_path is only read by 'tsv', not {name!r} (wheel datasets use cache_dir)")
    if synthetic is not None and name != "synthetic":
        raise ValueError(f"synthetic= is only read by 'synthetic', not {name!r}")
    if name in ("nations", "kinships", "umls"):
        return load_pykeen(name, cache_dir)
    if name == "ml100k-kg":
        return load_ml100k_kg(cache_dir)
    if name == "tsv":
        if data_path is None:
            raise ValueError("dataset 'tsv' needs data_path: a directory with train/valid/test triple files")
        return load_triples_dir(data_path)
    kwargs = dict(synthetic or {})
    missing = [k for k in ("num_entities", "num_relations", "num_triples") if k not in kwargs]
    if missing:
        raise ValueError(f"dataset 'synthetic' needs synthetic={{...}} with {', '.join(missing)}")
    return synthetic_kg(**kwargs)


__all__ = [
    "DATASETS",
    "DatasetUnavailableError",
    "KGData",
    "TripleFormatError",
    "WHEEL_DATASETS",
    "default_cache_dir",
    "fetch_wheel",
    "load_dataset",
    "load_ml100k_kg",
    "load_pykeen",
    "load_triples_dir",
    "parse_triples",
    "random_split",
    "synthetic_kg",
]

"""The data layer: Parquet → Batch, checked against a plain NumPy/Python reconstruction."""

from __future__ import annotations

import gc
import math
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.data import Batch, BatchReader, ReaderPosition, hash_strings
from embtrain.data.gen import GenConfig, generate
from embtrain.errors import DataError, UserInputError
from embtrain.recipe.loader import parse_recipe_text
from embtrain.recipe.models import Recipe

# ------------------------------------------------------------------ pure-Python xxHash64 oracle

_M = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                           9650029242287828579, 2870177450012600261)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes) -> int:
    """XXH64 with seed 0, straight from the specification."""
    n, p = len(data), 0
    if n >= 32:
        v = [(_P1 + _P2) & _M, _P2, 0, (-_P1) & _M]
        while p + 32 <= n:
            for i in range(4):
                v[i] = _round(v[i], int.from_bytes(data[p + 8 * i:p + 8 * i + 8], "little"))
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
    else:
        h = _P5
    h = (h + n) & _M
    while p + 8 <= n:
        h ^= _round(0, int.from_bytes(data[p:p + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        p += 8
    if p + 4 <= n:
        h ^= (int.from_bytes(data[p:p + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def as_int64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


# ------------------------------------------------------------------------------------ recipes

RECIPE = """
version: 1
name: datatest
data:
  train: data/train/*.parquet
  eval: data/eval/*.parquet
  label: clicked
  batch_size: {batch}
  shuffle: {{enabled: {shuffle}, window_batches: 3}}
  last_batch: {last}
  prefetch: {prefetch}
features:
  - {{kind: dense, name: counts, columns: [n1, n2], transform: log1p, fill_null: 0}}
  - {{kind: dense, name: signed, columns: [s1], transform: signed_log1p}}
  - {{kind: dense, name: raw, columns: [r1], fill_null: -1.5}}
  - {{kind: categorical, name: user, column: user_id, table: user, weights: user_w}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: 3, weights: tag_w}}
  - {{kind: categorical, name: history, column: history, table: item, hotness: variable}}
  - {{kind: categorical, name: city, column: city, table: city, ids: string}}
  - {{kind: categorical, name: brand, column: brand, table: brand, ids: string, out_of_range: modulo}}
tables:
  - {{name: user, dim: 4, rows: 300}}
  - {{name: item, dim: 4, rows: 500}}
  - {{name: tag, dim: 4, rows: 50}}
  - {{name: city, dim: 4, dynamic: {{capacity: 100}}}}
  - {{name: brand, dim: 4, rows: 97}}
optimizer:
  sparse: {{type: sgd, lr: 0.1}}
  dense: {{type: sgd, lr: 0.1}}
model: {{type: mlp, hidden: [8]}}
train: {{epochs: 1, seed: {seed}}}
"""


def make_recipe(batch: int = 64, shuffle: bool = False, last: str = "drop", prefetch: int = 2,
                seed: int = 7) -> Recipe:
    text = RECIPE.format(batch=batch, shuffle=str(shuffle).lower(), last=last,
                         prefetch=prefetch, seed=seed)
    return parse_recipe_text(text, "datatest.yaml")


def with_data(recipe: Recipe, **update: object) -> Recipe:
    return recipe.model_copy(update={"data": recipe.data.model_copy(update=update)})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gen-data output for RECIPE: 3 train files (1000 rows), 2 eval files (170 rows)."""
    root = tmp_path_factory.mktemp("data")
    generate(make_recipe(), root / "data", GenConfig(rows=1000, eval_rows=170, files=3, seed=3))
    return root


@pytest.fixture
def in_dataset(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(dataset)
    return dataset


# ------------------------------------------------------------------------- NumPy oracle

def _transform(x: np.ndarray, how: str) -> np.ndarray:
    if how == "log1p":
        return np.log1p(np.maximum(x, 0))
    if how == "signed_log1p":
        return np.sign(x) * np.log1p(np.abs(x))
    return x


def expected_rows(recipe: Recipe, files: list[str]) -> dict[str, object]:
    """Per-row expected values of ``files`` (in the given order), computed without the reader."""
    dense_cols, keys, weights, labels = [], {}, {}, []
    tables = [pq.read_table(f) for f in files]
    for feature in recipe.dense_features:
        for col in feature.columns:
            vals = [v for t in tables for v in t.column(col).to_pylist()]
            x = np.array([feature.fill_null if (v is None or (isinstance(v, float) and math.isnan(v)))
                          else v for v in vals], dtype=np.float64)
            dense_cols.append(_transform(x, feature.transform))
    labels = np.array([v for t in tables for v in t.column(recipe.data.label).to_pylist()],
                      dtype=np.float32)
    for f in recipe.categorical_features:
        table = recipe.table(f.table)
        rows = [v for t in tables for v in t.column(f.column).to_pylist()]
        rows = [r if isinstance(r, list) else [r] for r in rows]
        out = []
        for r in rows:
            ids = [as_int64(xxh64(v.encode())) if f.ids == "string" else v for v in r]
            if table.dynamic is None and f.out_of_range == "modulo":
                ids = [i % table.rows for i in ids]
            out.append(ids)
        keys[f.name] = out
        if f.weights:
            w = [v for t in tables for v in t.column(f.weights).to_pylist()]
            weights[f.name] = [x if isinstance(x, list) else [x] for x in w]
    dense = np.stack(dense_cols, axis=1).astype(np.float32)
    return {"dense": dense, "label": labels, "keys": keys, "weights": weights}


def oracle_batches(recipe: Recipe, split: str = "train", epoch: int = 0) -> list[dict]:
    """The documented global stream, rebuilt in plain Python/NumPy."""
    data = recipe.data
    files = sorted(str(p) for p in Path().glob(data.train if split == "train" else data.eval))
    shuffle = split == "train" and data.shuffle.enabled
    seed = recipe.train.seed
    if shuffle:
        files = [files[i] for i in np.random.default_rng((seed, epoch)).permutation(len(files))]
    exp = expected_rows(recipe, files)
    n = exp["label"].shape[0]
    B = data.batch_size if split == "train" else (data.eval_batch_size or data.batch_size)
    order = np.arange(n)
    if shuffle:
        W = data.shuffle.window_batches * B
        order = np.concatenate([
            w0 + np.random.default_rng((seed, epoch, k)).permutation(min(W, n - w0))
            for k, w0 in enumerate(range(0, n, W))])
    drop = split == "train" and data.last_batch == "drop"
    batches = []
    for start in range(0, n, B):
        rows = order[start:start + B]
        if len(rows) < B and drop:
            break
        batches.append({
            "dense": exp["dense"][rows], "label": exp["label"][rows],
            "keys": {k: [v[r] for r in rows] for k, v in exp["keys"].items()},
            "weights": {k: [v[r] for r in rows] for k, v in exp["weights"].items()},
        })
    return batches


def assert_batch_equal(batch: Batch, want: dict) -> None:
    assert batch.size == len(want["label"])
    assert batch.dense.dtype == np.float32 and batch.dense.shape == want["dense"].shape
    np.testing.assert_allclose(batch.dense, want["dense"], rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(batch.label, want["label"])
    assert set(batch.sparse) == set(want["keys"])
    for name, rows in want["keys"].items():
        sp = batch.sparse[name]
        assert sp.keys.dtype == np.int64 and sp.offsets.dtype == np.int64
        lengths = [len(r) for r in rows]
        np.testing.assert_array_equal(sp.offsets, np.concatenate([[0], np.cumsum(lengths)]))
        np.testing.assert_array_equal(sp.keys, [k for r in rows for k in r])
        if name in want["weights"]:
            assert sp.weights is not None and sp.weights.dtype == np.float32
            np.testing.assert_array_equal(sp.weights, np.array(
                [w for r in want["weights"][name] for w in r], dtype=np.float32))
        else:
            assert sp.weights is None


def same_batches(a: list[Batch], b: list[Batch]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if not (np.array_equal(x.dense, y.dense) and np.array_equal(x.label, y.label)):
            return False
        for k in x.sparse:
            if not (np.array_equal(x.sparse[k].keys, y.sparse[k].keys)
                    and np.array_equal(x.sparse[k].offsets, y.sparse[k].offsets)):
                return False
    return True


# ---------------------------------------------------------------------------------- hashing


KNOWN = {
    "": 0xEF46DB3751D8E999,
    "a": 0xD24EC4F1A98C6E5B,
    "abc": 0x44BC2CF5AD770999,
    "v0": 0x1FB34B2037BC5D9F,
    "v12345": 0x77D0EF29F116F8E9,
    "Nobody inspects the spammish repetition": 0xFBCEA83C8A378BF1,
    "héllo wörld, this string is longer than thirty-two bytes!": 0xFD4CFE46779B25AD,
}


def test_string_hash_known_values() -> None:
    got = hash_strings(list(KNOWN))
    assert got.dtype == np.int64
    assert [int(v) for v in got] == [as_int64(v) for v in KNOWN.values()]
    assert [xxh64(s.encode()) for s in KNOWN] == list(KNOWN.values())


def test_string_hash_matches_oracle_on_random_strings() -> None:
    rng = np.random.default_rng(0)
    strings = ["".join(chr(c) for c in rng.integers(32, 0x2FFF, size=int(rng.integers(0, 70))))
               for _ in range(300)]
    got = hash_strings(strings)
    assert [int(v) for v in got] == [as_int64(xxh64(s.encode())) for s in strings]
    # sliced Arrow arrays and large_string hash the same
    from embtrain.data import hash_string_array
    arr = pa.array(strings, type=pa.large_string()).slice(10, 50)
    np.testing.assert_array_equal(hash_string_array(arr), got[10:60])


# ------------------------------------------------------------------------------- round trip


def test_round_trip_unshuffled(in_dataset: Path) -> None:
    recipe = make_recipe(batch=64, last="keep")
    reader = BatchReader(recipe, "train")
    assert reader.total_rows == 1000 and reader.batches_per_epoch() == 16
    got = list(reader)
    want = oracle_batches(recipe)
    assert len(got) == len(want) == 16 and got[-1].size == 1000 - 15 * 64
    for b, w in zip(got, want, strict=True):
        assert_batch_equal(b, w)
    assert reader.position == ReaderPosition(1, 0)


def test_round_trip_shuffled_follows_documented_order(in_dataset: Path) -> None:
    recipe = make_recipe(batch=64, shuffle=True)
    for epoch in (0, 1):
        reader = BatchReader(recipe, "train", epoch=epoch)
        got = list(reader)
        want = oracle_batches(recipe, epoch=epoch)
        assert len(got) == len(want) == 1000 // 64
        for b, w in zip(got, want, strict=True):
            assert_batch_equal(b, w)


def test_eval_split_keeps_last_batch_and_never_shuffles(in_dataset: Path) -> None:
    recipe = with_data(make_recipe(batch=64, shuffle=True), eval_batch_size=50)
    got = list(BatchReader(recipe, "eval", epoch=5))
    want = oracle_batches(recipe, "eval")
    assert [b.size for b in got] == [50, 50, 50, 20]
    for b, w in zip(got, want, strict=True):
        assert_batch_equal(b, w)


def test_written_values_and_fills(in_dataset: Path) -> None:
    """gen-data wrote nulls only where a fill exists; the reader filled them before the transform."""
    t = pa.concat_tables([pq.read_table(f) for f in sorted(Path().glob("data/train/*.parquet"))])
    assert t.column("n1").null_count > 0 and t.column("r1").null_count > 0
    assert t.column("s1").null_count == 0
    batches = list(BatchReader(make_recipe(batch=1000, last="keep"), "train"))
    dense = batches[0].dense
    nulls = np.asarray(t.column("r1").is_null())
    np.testing.assert_array_equal(dense[nulls, 3], -1.5)
    assert (dense[np.asarray(t.column("n1").is_null()), 0] == 0).all()


# ------------------------------------------------------------------------------- rank split


@pytest.mark.parametrize("shuffle,last", [(True, "drop"), (False, "keep"), (True, "keep")])
def test_rank_slices_concatenate_to_single_process_batches(in_dataset: Path, shuffle: bool,
                                                           last: str) -> None:
    recipe = make_recipe(batch=64, shuffle=shuffle, last=last)
    single = list(BatchReader(recipe, "train", epoch=1))
    for world in (2, 4):
        ranks = [list(BatchReader(recipe, "train", rank=r, world_size=world, epoch=1))
                 for r in range(world)]
        assert all(len(r) == len(single) for r in ranks)
        for i, whole in enumerate(single):
            parts = [ranks[r][i] for r in range(world)]
            assert [p.size for p in parts] == [
                (r + 1) * whole.size // world - r * whole.size // world for r in range(world)]
            np.testing.assert_array_equal(np.concatenate([p.dense for p in parts]), whole.dense)
            np.testing.assert_array_equal(np.concatenate([p.label for p in parts]), whole.label)
            for name, sp in whole.sparse.items():
                keys = np.concatenate([p.sparse[name].keys for p in parts])
                np.testing.assert_array_equal(keys, sp.keys)
                lengths = np.concatenate([np.diff(p.sparse[name].offsets) for p in parts])
                np.testing.assert_array_equal(lengths, np.diff(sp.offsets))


def test_uneven_world_size_splits_every_batch(in_dataset: Path) -> None:
    recipe = make_recipe(batch=64)
    single = list(BatchReader(recipe, "train"))
    ranks = [list(BatchReader(recipe, "train", rank=r, world_size=3)) for r in range(3)]
    for i, whole in enumerate(single):
        parts = [ranks[r][i] for r in range(3)]
        assert [p.size for p in parts] == [21, 21, 22]
        assert {p.global_rows for p in parts} == {whole.size}
        np.testing.assert_array_equal(np.concatenate([p.label for p in parts]), whole.label)
    with pytest.raises(UserInputError, match="rank 2"):
        BatchReader(make_recipe(batch=64), "train", rank=2, world_size=2)


# ----------------------------------------------------------------------- shuffle and resume


def test_shuffle_is_deterministic_and_differs_across_epochs(in_dataset: Path) -> None:
    recipe = make_recipe(batch=64, shuffle=True)
    a = list(BatchReader(recipe, "train", epoch=0))
    b = list(BatchReader(recipe, "train", epoch=0))
    c = list(BatchReader(recipe, "train", epoch=1))
    other_seed = list(BatchReader(make_recipe(batch=64, shuffle=True, seed=8), "train"))
    assert same_batches(a, b)
    assert not same_batches(a, c)
    assert not same_batches(a, other_seed)
    assert same_batches(other_seed, list(BatchReader(recipe, "train", seed=8)))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("start", [1, 3, 7, 14, 15, 40])
def test_start_batch_equals_reading_and_discarding(in_dataset: Path, shuffle: bool,
                                                   start: int) -> None:
    recipe = make_recipe(batch=64, shuffle=shuffle, prefetch=0)
    full = list(BatchReader(recipe, "train", epoch=2))
    resumed = list(BatchReader(recipe, "train", epoch=2, start_batch=start))
    assert same_batches(resumed, full[start:])


def test_start_batch_skips_files_without_opening_them(in_dataset: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = pq.ParquetFile

    def spy(path: str, *args: object, **kwargs: object) -> pq.ParquetFile:
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", spy)
    recipe = make_recipe(batch=64, prefetch=0)
    reader = BatchReader(recipe, "train", start_batch=12)  # rows 768.. lie in the last file
    batches = list(reader)
    assert len(batches) == 3
    assert [Path(p).name for p in opened] == ["part-00002.parquet"]


def test_position_tracks_consumed_batches_and_resumes(in_dataset: Path) -> None:
    recipe = make_recipe(batch=64, shuffle=True)
    reader = BatchReader(recipe, "train")
    first = []
    for batch in reader:
        first.append(batch)
        if len(first) == 5:
            break
    assert reader.position == ReaderPosition(0, 5)
    rest = list(reader)  # continues where it stopped
    assert reader.position == ReaderPosition(1, 0)
    assert same_batches(first + rest, list(BatchReader(recipe, "train")))
    resumed = BatchReader(recipe, "train", epoch=0, start_batch=5)
    assert same_batches(list(resumed), rest)


# ---------------------------------------------------------------------------- prefetch thread


#: the reader's own threads (storage tiers' and aligned I/O's pools, which another test in the
#: same worker may have started, live as long as their process)
READER_THREADS = ("embtrain-prefetch", "embtrain-decode", "embtrain-convert", "embtrain-gather")


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(READER_THREADS)]


def test_prefetch_thread_stops_when_consumer_stops_early(in_dataset: Path) -> None:
    reader = BatchReader(make_recipe(batch=64, shuffle=True, prefetch=3), "train")
    for i, _ in enumerate(reader):
        if i == 2:
            break
    gc.collect()
    for _ in range(100):
        if not _reader_threads():
            break
        threading.Event().wait(0.02)
    assert not _reader_threads()


def test_worker_error_is_raised_in_consumer(dataset: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "train").mkdir(parents=True)
    good = pq.read_table(dataset / "data/train/part-00000.parquet")
    pq.write_table(good, "data/train/part-00000.parquet")
    ids = good.column("item_id").to_numpy().copy()
    ids[10] = 10_000
    bad = good.set_column(good.schema.get_field_index("item_id"), "item_id", pa.array(ids))
    pq.write_table(bad, "data/train/part-00001.parquet")
    reader = BatchReader(make_recipe(batch=64, prefetch=2), "train")
    seen = 0
    with pytest.raises(DataError, match=r"part-00001\.parquet: column 'item_id'"):
        for _ in reader:
            seen += 1
    assert seen == good.num_rows // 64  # every batch before the bad file arrived first
    gc.collect()
    assert not _reader_threads()


# ------------------------------------------------------------------------------ data errors


SMALL = """
version: 1
data: {{train: d/*.parquet, label: y, batch_size: 4, prefetch: 0, shuffle: {{enabled: false}}}}
features:
  - {{kind: dense, name: x, columns: [x]{fill}}}
  - {{kind: categorical, name: f, column: c, table: t, hotness: {hot}{extra}}}
tables:
  - {{name: t, dim: 4, rows: 10}}
optimizer: {{sparse: {{type: sgd, lr: 0.1}}, dense: {{type: sgd, lr: 0.1}}}}
model: {{type: mlp, hidden: [4]}}
train: {{epochs: 1}}
"""


def small(fill: str = "", hot: object = 1, extra: str = "") -> Recipe:
    return parse_recipe_text(SMALL.format(fill=fill, hot=hot, extra=extra), "small.yaml")


def write(tmp_path: Path, columns: dict[str, pa.Array], name: str = "p.parquet") -> str:
    (tmp_path / "d").mkdir(exist_ok=True)
    path = f"d/{name}"
    pq.write_table(pa.table(columns), tmp_path / path)
    return path


def read_all(recipe: Recipe) -> list[Batch]:
    return list(BatchReader(recipe, "train"))


BASE = {"x": pa.array([1.0, 2.0, 3.0, 4.0]), "c": pa.array([1, 2, 3, 4]),
        "y": pa.array([0, 1, 0, 1], pa.int8())}


@pytest.mark.parametrize("columns,recipe_kw,pattern", [
    ({"c": None}, {}, r"d/p.parquet: column 'c' \(feature 'f'\) is missing"),
    ({"c": pa.array([1.0, 2.0, 3.0, 4.0])}, {},
     r"d/p.parquet: column 'c' \(feature 'f'\): type double, expected an integer column"),
    ({"x": pa.array(["a", "b", "c", "d"])}, {},
     r"d/p.parquet: column 'x' \(feature 'x'\): type string, expected a float or integer"),
    ({"c": pa.array([1, None, 3, 4])}, {}, r"d/p.parquet: column 'c' \(feature 'f'\): null id at row 1"),
    ({"c": pa.array([1, 2, 10, 4])}, {},
     r"d/p.parquet: column 'c' \(feature 'f'\): id 10 outside table 't' rows \[0, 10\)"),
    ({"c": pa.array([1, -2, 3, 4])}, {},
     r"d/p.parquet: column 'c' \(feature 'f'\): id -2 outside table 't' rows \[0, 10\)"),
    ({"x": pa.array([1.0, float("nan"), 3.0, 4.0])}, {},
     r"d/p.parquet: column 'x' \(feature 'x'\): NaN at row 1 and the feature has no fill_null"),
    ({"x": pa.array([1.0, 2.0, None, 4.0])}, {},
     r"d/p.parquet: column 'x' \(feature 'x'\): null at row 2 and the feature has no fill_null"),
    ({"x": pa.array([1.0, 2.0, 3.0, float("inf")])}, {},
     r"d/p.parquet: column 'x' \(feature 'x'\): inf at row 3 \(infinite, or beyond float32's "
     r"range\) and the feature has no fill_null"),
    ({"x": pa.array([1.0, -1e39, 3.0, 4.0])}, {},
     r"d/p.parquet: column 'x' \(feature 'x'\): -inf at row 1 \(infinite, or beyond"),
    ({"c": pa.array([[1], [2, 3, 4], [5], [6]])}, {"hot": 2},
     r"d/p.parquet: column 'c' \(feature 'f'\): row 1 has 3 ids, more than hotness 2"),
    ({"c": pa.array([[1], [2, 3], [5], [6]])}, {"hot": 1},
     r"d/p.parquet: column 'c' \(feature 'f'\): row 1 has 2 ids, hotness 1 needs exactly one"),
    ({"c": pa.array([[1], [2, None], [5], [6]])}, {"hot": "variable"},
     r"d/p.parquet: column 'c' \(feature 'f'\): null list element at row 1"),
    ({"c": pa.array([[1], None, [5], [6]])}, {"hot": "variable"},
     r"d/p.parquet: column 'c' \(feature 'f'\): null list at row 1"),
    ({"c": pa.array([1, 2, 3, 4])}, {"hot": 3},
     r"d/p.parquet: column 'c' \(feature 'f'\): type int64, expected a list of integers"),
    ({"y": pa.array([0, None, 1, 1])}, {}, r"d/p.parquet: column 'y' \(label\): null at row 1"),
    ({"c": pa.array([[1], [2, 3], [5], [6]]), "w": pa.array([[1.0], [2.0], [1.0], [1.0]])},
     {"hot": 2, "extra": ", weights: w"},
     r"d/p.parquet: column 'w' \(weights of feature 'f'\): row 1 has 1 weights but 2 ids"),
    ({"w": None}, {"extra": ", weights: w"},
     r"d/p.parquet: column 'w' \(weights of feature 'f'\) is missing"),
])
def test_data_errors_name_file_and_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          columns: dict, recipe_kw: dict, pattern: str) -> None:
    monkeypatch.chdir(tmp_path)
    cols = {**BASE, "w": pa.array([1.0, 1.0, 1.0, 1.0]), **columns}
    write(tmp_path, {k: v for k, v in cols.items() if v is not None})
    with pytest.raises(DataError, match=pattern):
        read_all(small(**recipe_kw))


def test_an_infinite_dense_value_is_treated_like_nan(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """fill_null replaces it; without one, validate --data, training, evaluation and predict
    stop with the same located line, and predict leaves no output file."""
    from embtrain import api
    from embtrain.data.check import check_data

    monkeypatch.chdir(tmp_path)
    write(tmp_path, {**BASE, "x": pa.array([1.0, float("inf"), float("nan"), -1e39])})
    filled = read_all(small(fill=", fill_null: 7"))
    assert filled[0].dense[:, 0].tolist() == [1.0, 7.0, 7.0, 7.0]
    line = ("d/p.parquet: column 'x' (feature 'x'): inf at row 1 (infinite, or beyond float32's "
            "range) and the feature has no fill_null")
    with pytest.raises(DataError) as info:
        read_all(small())
    assert str(info.value) == line.replace("inf at row 1 (infinite, or beyond float32's range)",
                                           "NaN at row 2")  # the kernel sees NaN first
    write(tmp_path, {**BASE, "x": pa.array([1.0, float("inf"), 3.0, -1e39])})
    assert check_data(small()) == [line]
    with pytest.raises(DataError) as info:
        read_all(small())  # what training and evaluation read
    assert str(info.value) == line
    write(tmp_path, BASE, "ok.parquet")
    (tmp_path / "d" / "p.parquet").rename(tmp_path / "bad.parquet")
    api.run(small(), tmp_path / "run")  # one step on the good rows
    with pytest.raises(DataError) as info:
        api.predict(tmp_path / "run", "bad.parquet", tmp_path / "out.parquet")
    assert str(info.value) == line.replace("d/p.parquet", "bad.parquet")
    assert not (tmp_path / "out.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet", "d", "run"]


def test_no_file_matching_glob_names_the_glob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"data.train: no file matches 'd/\*.parquet'"):
        BatchReader(small(), "train")
    with pytest.raises(UserInputError, match=r"no data\.eval"):
        write(tmp_path, BASE)
        BatchReader(small(), "eval")


@pytest.mark.parametrize("name", ["a.parquet", "z.parquet"])
def test_unreadable_file_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         name: str) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, BASE, "m.parquet")
    (tmp_path / "d" / name).write_bytes(b"not parquet")
    with pytest.raises(DataError, match=rf"d/{name}: not a readable Parquet file"):
        BatchReader(small(), "train")


def test_schema_errors_come_before_any_row_is_read(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, BASE, "a.parquet")
    write(tmp_path, {**BASE, "c": pa.array(["1", "2", "3", "4"])}, "b.parquet")
    with pytest.raises(DataError, match=r"d/b.parquet: column 'c'"):
        BatchReader(small(), "train")


# ------------------------------------------------------------------------- column variants


def test_list_variants_and_modulo_and_dynamic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    values = pa.array([3, 4, 5, 6, 7, 8, 9, 1], pa.int32())
    fixed = pa.FixedSizeListArray.from_arrays(values, 2)
    large = pa.LargeListArray.from_arrays(pa.array([0, 1, 3, 3, 4], pa.int64()),
                                          pa.array([12, -1, 25, 7], pa.int16()))
    strings = pa.array([["v1"], ["v2", "v3"], ["v4"], []], pa.list_(pa.large_string()))
    write(tmp_path, {**BASE, "c": pa.array([[1], [2], [3], [4]], pa.list_(pa.uint8())),
                     "fx": fixed, "lg": large, "st": strings,
                     "dy": pa.array([-5, 2**62, 0, -(2**63)], pa.int64()),
                     "dc": pa.array(["x", "y", "x", "z"]).dictionary_encode()})
    text = SMALL.format(fill="", hot=1, extra="").replace("tables:", """\
  - {kind: categorical, name: fx, column: fx, table: t, hotness: 2}
  - {kind: categorical, name: lg, column: lg, table: t, hotness: variable, out_of_range: modulo}
  - {kind: categorical, name: st, column: st, table: d, hotness: 2, ids: string}
  - {kind: categorical, name: dy, column: dy, table: d}
  - {kind: categorical, name: dc, column: dc, table: d, ids: string}
tables:
  - {name: d, dim: 4, dynamic: {capacity: 100}}""")
    batch = read_all(parse_recipe_text(text, "variants.yaml"))[0]
    np.testing.assert_array_equal(batch.sparse["f"].keys, [1, 2, 3, 4])
    np.testing.assert_array_equal(batch.sparse["fx"].keys, [3, 4, 5, 6, 7, 8, 9, 1])
    np.testing.assert_array_equal(batch.sparse["fx"].offsets, [0, 2, 4, 6, 8])
    np.testing.assert_array_equal(batch.sparse["lg"].keys, [2, 9, 5, 7])
    np.testing.assert_array_equal(batch.sparse["lg"].offsets, [0, 1, 3, 3, 4])
    np.testing.assert_array_equal(batch.sparse["st"].keys,
                                  [as_int64(xxh64(s.encode())) for s in ["v1", "v2", "v3", "v4"]])
    np.testing.assert_array_equal(batch.sparse["st"].offsets, [0, 1, 3, 4, 4])
    np.testing.assert_array_equal(batch.sparse["dy"].keys, [-5, 2**62, 0, -(2**63)])
    np.testing.assert_array_equal(batch.sparse["dc"].keys, hash_strings(["x", "y", "x", "z"]))


def test_declared_column_types_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, BASE)
    text = SMALL.format(fill="", hot=1, extra="").replace(
        "prefetch: 0,", "prefetch: 0, columns: {x: float, c: string},")
    with pytest.raises(DataError, match=r"d/p.parquet: column 'c': type int64, but data.columns "
                                        r"declares string"):
        BatchReader(parse_recipe_text(text, "declared.yaml"), "train")


def test_interpreter_exits_while_a_reader_is_mid_epoch(in_dataset: Path) -> None:
    import subprocess
    import sys

    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from embtrain.recipe.loader import parse_recipe_text\n"
        "from embtrain.data import BatchReader\n"
        "text = open(sys.argv[2]).read()\n"
        "it = iter(BatchReader(parse_recipe_text(text, 'r.yaml'), 'train'))\n"
        "next(it)\n"
        "print('ok')\n"
    )
    recipe_file = in_dataset / "mid.yaml"
    recipe_file.write_text(RECIPE.format(batch=8, shuffle="true", last="drop", prefetch=4, seed=1))
    res = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parents[1]),
                          str(recipe_file)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_batches_per_epoch_from_metadata(in_dataset: Path) -> None:
    assert BatchReader(make_recipe(batch=64, last="drop"), "train").batches_per_epoch() == 15
    assert BatchReader(make_recipe(batch=64, last="keep"), "train").batches_per_epoch() == 16
    assert BatchReader(make_recipe(batch=100, last="drop"), "eval").batches_per_epoch() == 2


def test_prefetcher_reraises_in_order_and_closes_its_source() -> None:
    from embtrain.data.prefetch import Prefetcher

    closed = threading.Event()

    def source():
        try:
            yield from range(3)
            raise ValueError("boom")
        finally:
            closed.set()

    got = []
    with pytest.raises(ValueError, match="boom"):
        for item in Prefetcher(source(), 2):
            got.append(item)
    assert got == [0, 1, 2] and closed.wait(1)

    closed.clear()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    p = Prefetcher(endless(), 4)
    assert [next(p) for _ in range(5)] == [0, 1, 2, 3, 4]
    p.close()
    assert not p.alive and closed.is_set()

"""Virtual shards (``data.shards``): the global stream does not depend on the process count,
each rank decodes only the rows of its shards, and a resume continues at any process count."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.data import Batch, BatchReader
from embtrain.data.shards import ShardLayout
from embtrain.errors import RecipeError, UserInputError
from embtrain.recipe.loader import parse_recipe_text
from embtrain.recipe.models import Recipe

FILE_ROWS = (230, 170, 201)  # 601 rows in three files
GROUP_ROWS = 10

RECIPE = """
version: 1
name: shards
data:
  train: data/*.parquet
  label: y
  batch_size: {batch}
  shards: {shards}
  shuffle: {{enabled: {shuffle}, window_batches: 2}}
  last_batch: {last}
  prefetch: {prefetch}
features:
  - {{kind: dense, name: rid, columns: [rid]}}
  - {{kind: categorical, name: one, column: one, table: t}}
  - {{kind: categorical, name: many, column: many, table: t, hotness: variable}}
tables:
  - {{name: t, dim: 4, rows: 100000}}
optimizer:
  sparse: {{type: sgd, lr: 0.1}}
  dense: {{type: sgd, lr: 0.1}}
model: {{type: mlp, hidden: [4]}}
train: {{epochs: 1, seed: 11}}
"""


def make_recipe(batch: int = 24, shards: int = 6, shuffle: bool = True, last: str = "keep",
                prefetch: int = 0) -> Recipe:
    return parse_recipe_text(RECIPE.format(batch=batch, shards=shards,
                                           shuffle=str(shuffle).lower(), last=last,
                                           prefetch=prefetch), "shards.yaml")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three files, row groups of 10 rows; row ``i`` (in file-name order) has ``rid == i``,
    ``one == i`` and ``i % 3`` list keys ``i, i+1, ...``."""
    root = tmp_path_factory.mktemp("shards")
    (root / "data").mkdir()
    at = 0
    for f, n in enumerate(FILE_ROWS):
        rid = np.arange(at, at + n)
        table = pa.table({
            "rid": pa.array(rid.astype(np.float64)),
            "y": pa.array((rid % 2).astype(np.float64)),
            "one": pa.array(rid.astype(np.int64)),
            "many": pa.array([list(range(i, i + i % 3)) for i in rid.tolist()],
                             pa.list_(pa.int64())),
        })
        pq.write_table(table, root / "data" / f"part-{f}.parquet", row_group_size=GROUP_ROWS)
        at += n
    return root


@pytest.fixture
def in_dataset(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(dataset)
    return dataset


def oracle(recipe: Recipe, epoch: int) -> list[np.ndarray]:
    """The global batches' row ids by the documented rule, in plain NumPy."""
    data, seed = recipe.data, recipe.train.seed
    starts = np.cumsum((0, *FILE_ROWS))
    files = list(range(len(FILE_ROWS)))
    if data.shuffle.enabled:
        files = [files[i] for i in np.random.default_rng((seed, epoch)).permutation(len(files))]
    rows = np.concatenate([np.arange(starts[f], starts[f + 1]) for f in files])
    R, V, B = len(rows), data.shards, data.batch_size
    b, W = B // V, data.shuffle.window_batches * (B // V)
    streams = []
    for v in range(V):
        own = rows[v * R // V:(v + 1) * R // V]
        if data.shuffle.enabled:
            own = np.concatenate([own[w0:w0 + W][np.random.default_rng((seed, epoch, k, v))
                                                 .permutation(len(own[w0:w0 + W]))]
                                  for k, w0 in enumerate(range(0, len(own), W))])
        streams.append(own)
    full = R // B
    out = [np.concatenate([s[t * b:(t + 1) * b] for s in streams]) for t in range(full)]
    if R % B and data.last_batch == "keep":
        out.append(np.concatenate([s[full * b:] for s in streams]))
    return out


def rids(batch: Batch) -> np.ndarray:
    return batch.dense[:, 0].astype(np.int64)


def check_batch(batch: Batch) -> None:
    """The batch's sparse inputs belong to its rows (the assembly is per row)."""
    rid = rids(batch)
    np.testing.assert_array_equal(batch.sparse["one"].keys, rid)
    np.testing.assert_array_equal(batch.label, (rid % 2).astype(np.float32))
    many = batch.sparse["many"]
    np.testing.assert_array_equal(np.diff(many.offsets), rid % 3)
    np.testing.assert_array_equal(many.keys, [k for i in rid.tolist() for k in range(i, i + i % 3)])


def read(recipe: Recipe, world: int, **kw: int) -> list[list[Batch]]:
    return [list(BatchReader(recipe, "train", rank=r, world_size=world, **kw))
            for r in range(world)]


@pytest.mark.parametrize("shuffle,last", [(True, "keep"), (True, "drop"), (False, "keep")])
def test_global_batches_follow_the_rule_at_every_world_size(in_dataset: Path, shuffle: bool,
                                                            last: str) -> None:
    recipe = make_recipe(shuffle=shuffle, last=last)
    want = oracle(recipe, epoch=1)
    assert len(want) == BatchReader(recipe, "train").batches_per_epoch() == 25 + (last == "keep")
    for world in (1, 2, 3, 4):
        ranks = read(recipe, world, epoch=1)
        assert all(len(r) == len(want) for r in ranks)
        for t, rows in enumerate(want):
            parts = [ranks[r][t] for r in range(world)]
            assert [p.size for p in parts] == [(r + 1) * len(rows) // world
                                               - r * len(rows) // world for r in range(world)]
            assert all(p.global_rows == len(rows) for p in parts)
            for p in parts:
                check_batch(p)
            np.testing.assert_array_equal(np.concatenate([rids(p) for p in parts]), rows)


def test_each_rank_decodes_only_its_shards(in_dataset: Path) -> None:
    recipe = make_recipe(last="drop")  # 601 rows, 6 shards of ~100 rows
    total = sum(FILE_ROWS)
    for prefetch in (0, 2):  # decoding ahead in a thread decodes nothing more
        one = BatchReader(make_recipe(last="drop", prefetch=prefetch), "train")
        list(one)
        assert one.decoded_rows == total  # each row group once, though 6 shards share some
    for world in (2, 3, 6):
        decoded = []
        for r in range(world):
            reader = BatchReader(recipe, "train", rank=r, world_size=world)
            list(reader)
            decoded.append(reader.decoded_rows)
        # its own rows, rounded out to whole row groups at both ends of its range
        share = total / world
        assert all(share - GROUP_ROWS <= d <= share + 2 * GROUP_ROWS for d in decoded), decoded
        assert sum(decoded) <= total + 2 * (world - 1) * GROUP_ROWS


@pytest.mark.parametrize("start", [1, 2, 25])
@pytest.mark.parametrize("then,now", [(1, 2), (2, 3), (3, 1)])
def test_resume_at_another_world_size_continues_the_stream(in_dataset: Path, start: int,
                                                           then: int, now: int) -> None:
    recipe = make_recipe()
    want = oracle(recipe, epoch=0)
    before = [BatchReader(recipe, "train", rank=r, world_size=then) for r in range(then)]
    trained = []
    for reader in before:  # each rank stops after `start` batches, as at a checkpoint
        got = []
        for batch in reader:
            got.append(batch)
            if len(got) == start:
                break
        trained.append(got)
    positions = {reader.position for reader in before}
    assert len(positions) == 1
    position = positions.pop()
    assert (position.epoch, position.batch) == (0, start)
    for t in range(start):
        np.testing.assert_array_equal(
            np.concatenate([rids(trained[r][t]) for r in range(then)]), want[t])
    rest = read(recipe, now, epoch=position.epoch, start_batch=position.batch)
    assert all(len(r) == len(want) - start for r in rest)
    for i, rows in enumerate(want[start:]):
        np.testing.assert_array_equal(np.concatenate([rids(rest[r][i]) for r in range(now)]),
                                      rows)


def test_position_and_prefetch_walk_epochs(in_dataset: Path) -> None:
    recipe = make_recipe(prefetch=2)
    reader = BatchReader(recipe, "train", rank=1, world_size=2)
    epochs = [list(reader) for _ in range(2)]
    for epoch, got in enumerate(epochs):
        want = oracle(recipe, epoch)
        assert [rids(b).tolist() for b in got] == [
            rows[len(rows) // 2:].tolist() for rows in want]
    assert epochs[0][0].dense.tolist() != epochs[1][0].dense.tolist()


def test_layout_pieces_cover_each_batch_once() -> None:
    for rows, shards, batch in [(601, 6, 24), (100, 4, 8), (23, 3, 6), (7, 1, 4)]:
        layout = ShardLayout(rows, shards, batch, drop_last=False)
        pieces = [layout.pieces(t) for t in range(layout.batches())]
        assert sum(map(sum, pieces)) == rows
        assert layout.batches() == -(-rows // batch)
        for t, sizes in enumerate(pieces):
            for world in (1, 2, 3, 5):
                got = [(v, a, c) for r in range(world)
                       for v, a, c in layout.rank_pieces(t, r, world)]
                covered = sorted((v, i) for v, a, c in got for i in range(a, c))
                assert covered == [(v, i) for v, n in enumerate(sizes) for i in range(n)]


def test_shards_must_divide_the_batch(in_dataset: Path) -> None:
    with pytest.raises(RecipeError, match="shards: 5 does not divide batch_size: 24"):
        make_recipe(shards=5)
    with pytest.raises(UserInputError, match="does not divide the batch size 25"):
        BatchReader(make_recipe(), "train", batch_size=25)


CSV_RECIPE = """
version: 1
name: shards_csv
data: {{train: csv/*.csv, label: y, batch_size: 24, shards: 6, prefetch: {prefetch},
        shuffle: {{window_batches: 2}}}}
features:
  - {{kind: dense, name: rid, columns: [rid]}}
  - {{kind: categorical, name: one, column: one, table: t}}
tables:
  - {{name: t, dim: 4, rows: 100000}}
optimizer: {{sparse: {{type: sgd, lr: 0.1}}, dense: {{type: sgd, lr: 0.1}}}}
model: {{type: mlp, hidden: [4]}}
train: {{epochs: 1, seed: 11}}
"""


@pytest.mark.parametrize("prefetch", [0, 2])
def test_text_files_give_the_same_sharded_stream(in_dataset: Path, prefetch: int) -> None:
    (in_dataset / "csv").mkdir(exist_ok=True)
    at = 0
    for f, n in enumerate(FILE_ROWS):
        rid = range(at, at + n)
        lines = ["rid,y,one", *(f"{i},{i % 2},{i}" for i in rid)]
        (in_dataset / "csv" / f"part-{f}.csv").write_text("\n".join(lines) + "\n")
        at += n
    recipe = parse_recipe_text(CSV_RECIPE.format(prefetch=prefetch), "shards_csv.yaml")
    want = oracle(make_recipe(last="drop"), epoch=0)
    for world in (1, 2, 3):
        ranks = read(recipe, world)
        assert all(len(r) == len(want) for r in ranks)
        for t, rows in enumerate(want):
            parts = [ranks[r][t] for r in range(world)]
            got = np.concatenate([rids(p) for p in parts])
            np.testing.assert_array_equal(got, rows)
            np.testing.assert_array_equal(np.concatenate([p.sparse["one"].keys for p in parts]),
                                          rows)


JOB_RECIPE = """
version: 1
name: shards_job
data: {{train: {data}/data/*.parquet, label: y, batch_size: 24, shards: 6,
        shuffle: {{window_batches: 2}}}}
features:
  - {{kind: dense, name: rid, columns: [rid], transform: log1p}}
  - {{kind: categorical, name: one, column: one, table: t, out_of_range: modulo}}
  - {{kind: categorical, name: many, column: many, table: u, hotness: variable,
      out_of_range: modulo}}
tables:
  - {{name: t, dim: 4, rows: 97, sharding: row}}
  - {{name: u, dim: 4, rows: 61, sharding: table}}
optimizer: {{sparse: {{type: adagrad, lr: 0.05}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 8, log_every: 1, seed: 3, checkpoint: {{every: 3, keep: 3}}}}
"""


@pytest.mark.distributed
def test_two_rank_run_resumes_on_one_rank_as_it_ran(dataset: Path, tmp_path: Path) -> None:
    """`embtrain run` with shards: the 2-rank run's steps 4-8 again after a resume of its
    step-3 checkpoint (mid shuffle window) on one process (each rank reading only its
    shards)."""
    from embtrain.train.metrics_log import read_metrics
    from tests.support.cli import run_cli

    recipe = tmp_path / "shards.yaml"
    recipe.write_text(JOB_RECIPE.format(data=dataset))
    two = tmp_path / "two"
    res = run_cli("run", str(recipe), "--np", "2", "--run-dir", str(two))
    assert res.returncode == 0, res.stderr
    copy = tmp_path / "resumed"
    shutil.copytree(two, copy)
    res = run_cli("run", "--resume", str(copy), "--from-step", "3", "--np", "1")
    assert res.returncode == 0, res.stderr

    def losses(run_dir: Path) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}

    want, got = losses(two), losses(copy)
    assert sorted(want) == list(range(1, 9))
    np.testing.assert_allclose([got[s] for s in range(4, 9)], [want[s] for s in range(4, 9)],
                               rtol=1e-5, atol=1e-6)

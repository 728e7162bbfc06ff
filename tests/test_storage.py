"""The disk tier's file, I/O and prefetcher against plain in-memory references (real files)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from embtrain.embedding.config import (
    InitializerConfig,
    ShardPlacement,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.initializers import initial_rows as table_initial_rows
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.storage import disk
from embtrain.storage.aligned import BLOCK, IOPool, aligned_blocks, open_direct
from embtrain.storage.disk import RowFile, RowLayout, Rows, TierFileError
from embtrain.storage.diskbench import measure_disk
from embtrain.storage.tier_io import TierIO
from tests.support.storage import row_layout

OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer


@pytest.fixture
def tier_dir(tmp_path: Path) -> Path:
    """A directory on the disk the tests run on (not tmpfs where /tmp is one)."""
    return tmp_path


class Reference:
    """The plain model of a tier file: every row's state in NumPy arrays."""

    def __init__(self, f: RowFile):
        self.rows = f.read(np.arange(f.layout.rows))

    def random_write(self, f: RowFile, rng: np.random.Generator, n: int) -> None:
        lay = f.layout
        keys = rng.choice(lay.rows, n, replace=False)
        r = Rows(keys, rng.standard_normal((n, lay.dim)).astype(np.float32),
                 [rng.standard_normal((n, w)).astype(np.float32) for _, w, _ in lay.slots],
                 rng.integers(0, 1 << 30, (n, 2)).astype(np.int32))
        f.write(r)
        self.rows.values[keys] = r.values
        for a, b in zip(self.rows.slots, r.slots, strict=True):
            a[keys] = b
        assert self.rows.meta is not None
        self.rows.meta[keys] = r.meta

    def check(self, got: Rows, keys: np.ndarray) -> None:
        assert np.array_equal(got.keys, keys)
        assert got.values.tobytes() == self.rows.values[keys].tobytes()
        for a, b in zip(got.slots, self.rows.slots, strict=True):
            assert a.tobytes() == b[keys].tobytes()
        assert self.rows.meta is not None and got.meta is not None
        assert np.array_equal(got.meta, self.rows.meta[keys])


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_random_writes_read_back_bit_for_bit(tier_dir: Path, kind: str) -> None:
    rng = np.random.default_rng(abs(hash(kind)) % 1000)
    f = RowFile.create(tier_dir / "t.tier", row_layout(kind), "run")
    ref = Reference(f)
    for _ in range(30):  # enough rewrites to free units and compact
        ref.random_write(f, rng, int(rng.integers(1, 900)))
        keys = rng.integers(0, 5000, 700)  # duplicates, any order
        ref.check(f.read(keys), keys)
        assert f.occupied_units <= disk.COMPACT_FACTOR * \
            -(-f.written_rows // f.layout.rows_per_unit) + disk.COMPACT_SLACK_UNITS + 1
    assert f.counters.compactions > 0
    all_keys = np.arange(5000)
    ref.check(f.read(all_keys), all_keys)
    f.close()
    assert os.path.getsize(tier_dir / "t.tier") <= disk.max_file_bytes(f.layout)
    g = RowFile.open(tier_dir / "t.tier", f.layout, "run")
    ref.check(g.read(all_keys), all_keys)
    ref.random_write(g, rng, 500)
    ref.check(g.read(all_keys), all_keys)
    g.close()


def test_records_larger_than_a_block(tier_dir: Path) -> None:
    lay = row_layout("adam", rows=300, dim=400)  # 8 + 8 + 3 * 1600 bytes: two blocks per unit
    assert lay.unit_blocks == 2 and lay.rows_per_unit == 1
    rng = np.random.default_rng(3)
    with RowFile.create(tier_dir / "big.tier", lay, "run") as f:
        ref = Reference(f)
        for _ in range(10):
            ref.random_write(f, rng, 40)
        keys = rng.permutation(300)
        ref.check(f.read(keys), keys)


def test_never_written_rows_equal_the_initializer(tier_dir: Path) -> None:
    table = TableConfig("emb", 4000, 12, InitializerConfig("truncated_normal", std=0.2))
    lay = RowLayout.of(table, SparseOptimizerConfig(kind="ftrl", lr=0.1,
                                                    initial_accumulator_value=0.3), 11)
    with RowFile.create(tier_dir / "a.tier", lay, "run") as f:
        keys = np.random.default_rng(0).integers(0, 4000, 900)
        got = f.read(keys)
        assert got.values.tobytes() == table_initial_rows(table, 11, keys).tobytes()
        assert np.all(got.slots[0] == np.float32(0.3)) and np.all(got.slots[1] == 0)
        assert got.meta is not None and not got.meta.any()
        assert f.counters.rows_read == 0 and f.counters.bytes_read == 0
    # a row shard of a column shard starts with its full table's rows and columns
    full = TableConfig("emb", 8000, 20)
    shard = TableConfig("emb", 4000, 10, placement=ShardPlacement(1, 2, 5, 20))
    lay = RowLayout.of(shard, SparseOptimizerConfig(kind="sgd", lr=0.1), 11)
    with RowFile.create(tier_dir / "s.tier", lay, "run") as f:
        keys = np.arange(4000)
        want = table_initial_rows(full, 11, 1 + 2 * keys)[:, 5:15]
        assert f.read(keys).values.tobytes() == np.ascontiguousarray(want).tobytes()


def test_reopen_checks_every_field_and_refuses_with_one_line(tier_dir: Path) -> None:
    path = tier_dir / "t.tier"
    lay = row_layout()
    RowFile.create(path, lay, "run-1").close()
    wrong = [
        (row_layout(dim=8), "run-1", "dim"),
        (row_layout(seed=8), "run-1", "seed"),
        (row_layout(kind="adam"), "run-1", "slots"),
        (row_layout(rows=4999), "run-1", "rows"),
        (row_layout(name="u"), "run-1", "table"),
        (lay, "run-2", "run_id"),
    ]
    for layout, run, field in wrong:
        with pytest.raises(TierFileError) as err:
            RowFile.open(path, layout, run)
        line = str(err.value)
        assert "\n" not in line and str(path) in line and f"{field} is" in line
    f = RowFile.open(path, lay, "run-1")  # the right one opens
    with pytest.raises(TierFileError, match="in use by another process"):
        RowFile.create(path, lay, "run-1")
    f.abandon()  # as if killed: the index was never written
    with pytest.raises(TierFileError, match="not closed cleanly"):
        RowFile.open(path, lay, "run-1")
    RowFile.create(path, lay, "run-3").close()  # a run rebuilds its tier file
    other = tier_dir / "notes.txt"
    other.write_text("mine")
    with pytest.raises(TierFileError, match="not an embtrain tier file"):
        RowFile.create(other, lay, "run")
    assert other.read_text() == "mine"
    with pytest.raises(TierFileError, match="no tier file"):
        RowFile.open(tier_dir / "missing.tier", lay, "run")


def test_damaged_index_is_refused(tier_dir: Path) -> None:
    path = tier_dir / "t.tier"
    lay = row_layout()
    with RowFile.create(path, lay, "run") as f:
        Reference(f).random_write(f, np.random.default_rng(0), 100)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size - BLOCK)  # the index is the file's last blocks
        fh.write(b"\xff" * 8)
    with pytest.raises(TierFileError, match="checksum"):
        RowFile.open(path, lay, "run")


def _refuses_direct_io(directory: Path) -> bool:
    probe = directory / f".probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
        return False
    except OSError:
        return True
    finally:
        probe.unlink(missing_ok=True)


def test_buffered_mode_reads_back_bit_for_bit(tier_dir: Path) -> None:
    rng = np.random.default_rng(5)
    with RowFile.create(tier_dir / "t.tier", row_layout(), "run", direct=False) as f:
        assert not f.direct
        ref = Reference(f)
        for _ in range(5):
            ref.random_write(f, rng, 800)
        keys = rng.integers(0, 5000, 2000)
        ref.check(f.read(keys), keys)


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or not _refuses_direct_io(Path("/dev/shm")),
                    reason="no file system here refuses O_DIRECT (tmpfs accepts it since "
                           "Linux 6.6)")
def test_a_file_system_refusing_direct_io_gets_buffered_io_and_one_note(
        capsys: pytest.CaptureFixture) -> None:
    d = Path("/dev/shm") / f"embtrain-test-{os.getpid()}"
    d.mkdir()
    try:
        rng = np.random.default_rng(5)
        for i in range(2):
            with RowFile.create(d / f"t{i}.tier", row_layout(), "run") as f:
                assert not f.direct
                ref = Reference(f)
                ref.random_write(f, rng, 800)
                keys = rng.integers(0, 5000, 2000)
                ref.check(f.read(keys), keys)
        assert capsys.readouterr().err.count("refuses direct I/O") == 1
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


@pytest.mark.parametrize("engine", ["numba", "python"])
def test_io_pool_reads_and_writes_scattered_blocks(tier_dir: Path, engine: str) -> None:
    fd, _ = open_direct(str(tier_dir / "raw"), os.O_RDWR | os.O_CREAT)
    try:
        rng = np.random.default_rng(1)
        ref = rng.integers(0, 256, (300, BLOCK), dtype=np.uint8)
        pool = IOPool(fd, BLOCK, depth=4, engine=engine, max_run=3)
        data = aligned_blocks(300)
        data[:] = ref
        pool.write(np.arange(300), data)
        ids = np.unique(rng.integers(0, 300, 120))
        out = aligned_blocks(ids.shape[0])
        pool.read(ids, out)
        assert np.array_equal(out, ref[ids])
        with pytest.raises(OSError):
            pool.read(np.array([10_000]), aligned_blocks(1))  # past the end: a short read
        pool.close()
    finally:
        os.close(fd)


def test_prefetch_orders_write_backs_before_later_reads(tier_dir: Path) -> None:
    rng = np.random.default_rng(2)
    io = TierIO(RowFile.create(tier_dir / "t.tier", row_layout("adam"), "run"))
    ref = Reference(io.file)
    for _ in range(20):
        keys = rng.choice(5000, 600, replace=False)
        lay = io.file.layout
        r = Rows(keys, rng.standard_normal((600, lay.dim)).astype(np.float32),
                 [rng.standard_normal((600, w)).astype(np.float32) for _, w, _ in lay.slots],
                 rng.integers(0, 99, (600, 2)).astype(np.int32))
        io.write_back(r)  # async; owned by the tier now
        ref.rows.values[keys] = r.values
        for a, b in zip(ref.rows.slots, r.slots, strict=True):
            a[keys] = b
        assert ref.rows.meta is not None
        ref.rows.meta[keys] = r.meta
        want = rng.integers(0, 5000, 400)
        ticket = io.prefetch(want)  # submitted after the write: must see it
        ref.check(io.wait(ticket), want)
    io.count(hits=90, misses=10)
    s = io.take_stats()
    assert s.rows_written == 20 * 600 and s.hit_rate == 0.9 and s.bytes_written > 0
    assert s.rows_read + s.rows_initialized == 20 * 400
    assert io.take_stats().rows_written == 0
    io.close()


def test_prefetch_overlaps_a_step_that_releases_the_gil(tier_dir: Path) -> None:
    import time

    io = TierIO(RowFile.create(tier_dir / "t.tier", row_layout(rows=200_000), "run"))
    rng = np.random.default_rng(4)
    io.file.write(io.file.read(np.arange(200_000)))  # every row on disk
    keys = rng.choice(200_000, 20_000, replace=False)
    t0 = time.perf_counter()
    io.read(keys)
    alone = time.perf_counter() - t0
    keys = rng.choice(200_000, 20_000, replace=False)
    ticket = io.prefetch(keys)
    time.sleep(alone * 1.5)  # the step: no GIL held
    t0 = time.perf_counter()
    io.wait(ticket)
    assert time.perf_counter() - t0 < 0.5 * alone
    io.close()


def test_background_errors_surface_at_the_next_wait(tier_dir: Path) -> None:
    io = TierIO(RowFile.create(tier_dir / "t.tier", row_layout(), "run"))
    io.write_back(Rows(np.array([1, 1]), np.zeros((2, 16), np.float32),
                       [np.zeros((2, 16), np.float32)], np.zeros((2, 2), np.int32)))
    with pytest.raises(ValueError, match="unique"):
        io.flush()
    io.file.abandon()


def test_measure_disk_reports_rates(tier_dir: Path) -> None:
    rates = measure_disk(tier_dir, size=16 << 20, depths=(1, 4), seconds=0.2)
    assert rates.sequential_write_bytes_per_s > 0
    assert set(rates.random_reads_per_s) == {1, 4} and min(rates.random_reads_per_s.values()) > 0
    assert not list(tier_dir.iterdir())  # the scratch file is gone


def test_concurrent_readers_of_two_files_do_not_interfere(tier_dir: Path) -> None:
    rng = np.random.default_rng(9)
    files = [RowFile.create(tier_dir / f"{i}.tier", row_layout(name=f"t{i}"), "run")
             for i in range(2)]
    refs = [Reference(f) for f in files]
    for f, ref in zip(files, refs, strict=True):
        ref.random_write(f, rng, 2000)
    errors: list[BaseException] = []

    def work(f: RowFile, ref: Reference) -> None:
        try:
            for _ in range(5):
                keys = np.arange(5000)
                ref.check(f.read(keys), keys)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=p) for p in zip(files, refs, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for f in files:
        f.close()


@pytest.mark.parametrize("seed", range(3))
def test_oracle_equals_a_plain_count_over_sets(seed: int) -> None:
    from collections import Counter

    from embtrain.storage.oracle import oracle_hits

    rng = np.random.default_rng(seed)
    steps = [rng.integers(0, 300, int(rng.integers(0, 200))) ** 1 for _ in range(12)]
    steps = [np.minimum(s, rng.integers(0, 300, s.shape[0])) for s in steps]  # skewed
    seen = Counter(r for s in steps for r in set(s.tolist()))
    for cached in (0, 1, 17, 100, 400):
        best = sorted(seen, key=lambda r: (-seen[r], r))[:cached]
        got = oracle_hits(steps, cached)
        assert got.lookups == sum(seen.values())
        assert got.hits == sum(seen[r] for r in best)


def test_sorted_stream_equals_reading_every_row(tier_dir: Path) -> None:
    rng = np.random.default_rng(8)
    with RowFile.create(tier_dir / "t.tier", row_layout("ftrl", rows=7000), "run") as f:
        ref = Reference(f)
        for _ in range(25):
            ref.random_write(f, rng, int(rng.integers(1, 1500)))
        scanned = np.concatenate(list(f.scan()))
        assert np.array_equal(np.sort(scanned["key"]), np.flatnonzero(f.written(np.arange(7000))))
        read_before = f.counters.bytes_read
        chunks = list(f.iter_sorted(chunk_rows=1024))
        assert [len(c) for c in chunks] == [1024] * 6 + [7000 - 6144]
        ref.check(Rows(np.concatenate([c.keys for c in chunks]),
                       np.concatenate([c.values for c in chunks]),
                       [np.concatenate([c.slots[i] for c in chunks]) for i in range(2)],
                       np.concatenate([c.meta for c in chunks])), np.arange(7000))
        # one sequential pass over the file per stream
        assert f.counters.bytes_read - read_before == f.file_units * BLOCK
    assert [p.name for p in tier_dir.iterdir()] == ["t.tier"]  # scratch files are gone

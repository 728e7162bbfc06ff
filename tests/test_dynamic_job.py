"""Dynamic tables through `embtrain run`: N ranks == 1 rank, bit-exact resume with evictions,
dumps and increments of live keys, the full-table error, load between static and dynamic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embtrain.train.metrics_log import read_metrics

RECIPE = """
version: 1
name: dyn
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
tables:
  - name: user
    dim: 8
    sharding: {sharding}
    dynamic: {{capacity: {user_capacity}, eviction: {eviction}, admission: {{type: count, min_count: 2}}, ttl_steps: {ttl}, missing: initial}}
  - {{name: item, dim: 8, dynamic: {{capacity: {capacity}, eviction: lfu}}, sharding: {item}}}
  - {{name: tag, dim: 8, rows: 200}}
optimizer: {{sparse: {{type: adagrad, lr: 0.05}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train: {{steps: {steps}, eval_every: 10, log_every: 1, seed: 1, checkpoint: {{every: 10, keep: 5}}}}
"""


def write_recipe(root: Path, name: str, *, capacity: str = "200K", eviction: str = "lru",
                 ttl: int = 1000, steps: int = 20, sharding: str = "row",
                 item: str = "table", user_capacity: str | None = None) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(RECIPE.format(data=root / "data", capacity=capacity, eviction=eviction,
                                  user_capacity=user_capacity or capacity,
                                  ttl=ttl, steps=steps, sharding=sharding, item=item))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("dyn")
    res = run_cli("gen-data", "--recipe", str(write_recipe(root, "gen")), "--out",
                  str(root / "data"), "--rows", "12000", "--eval-rows", "3000", "--files", "2")
    assert res.returncode == 0, res.stderr
    return root


def run(*args: str):
    from tests.support.cli import run_cli

    return run_cli("run", *args, timeout=600)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}


def dump(run_dir: Path, out: Path, *extra: str) -> dict[str, np.ndarray]:
    from tests.support.cli import run_cli

    res = run_cli("dump", str(run_dir), str(out), *extra)
    assert res.returncode == 0, res.stderr
    return {str(p.relative_to(out)): np.load(p) for p in sorted(out.rglob("*.npy"))}


@pytest.mark.distributed
def test_two_ranks_equal_one_rank(data: Path, tmp_path: Path) -> None:
    """Row sharding by key hash (user, with count admission and TTL) and a whole dynamic
    table on one rank (item): losses, evaluations and dumped tables equal one process."""
    recipe = write_recipe(data, "ranks", ttl=6)
    dirs = {}
    for n in (1, 2):
        dirs[n] = tmp_path / f"run-{n}"
        res = run(str(recipe), "--np", str(n), "--run-dir", str(dirs[n]))
        assert res.returncode == 0, res.stderr
    a, b = losses(dirs[1]), losses(dirs[2])
    assert sorted(a) == list(range(1, 21)) == sorted(b)
    np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=1e-5, atol=1e-6)
    ea = [(r["auc"], r["logloss"]) for r in read_metrics(dirs[1]) if r["kind"] == "eval"]
    eb = [(r["auc"], r["logloss"]) for r in read_metrics(dirs[2]) if r["kind"] == "eval"]
    np.testing.assert_allclose(eb, ea, rtol=1e-5)
    da, db = dump(dirs[1], tmp_path / "d1"), dump(dirs[2], tmp_path / "d2")
    assert sorted(da) == sorted(db)
    assert "tables/user/admission_keys.npy" in da and da["tables/user/keys.npy"].size > 100
    for key in da:
        np.testing.assert_allclose(db[key], da[key], rtol=1e-5, atol=1e-6, err_msg=key)
    plan = json.loads((dirs[2] / "plan.json").read_text())
    assert {t["name"]: t["sharding"] for t in plan["tables"]}["user"] == "row"
    last = [r for r in read_metrics(dirs[2]) if r["kind"] == "train"][-1]["dynamic_tables"]
    first = [r for r in read_metrics(dirs[1]) if r["kind"] == "train"][-1]["dynamic_tables"]
    assert last == first and last["user"]["expired"] > 0 and last["user"]["inserts"] > 0


def test_resume_is_bit_exact_with_evictions(data: Path, tmp_path: Path) -> None:
    """20 steps == 10 steps + resume + 10, with LRU/LFU evictions and TTL in both halves."""
    recipe = write_recipe(data, "evict", capacity="600", ttl=4, user_capacity="100")
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(str(recipe), "--run-dir", str(full)).returncode == 0
    res = run(str(recipe), "--run-dir", str(part), "--max-steps", "10")
    assert res.returncode == 0, res.stderr
    res = run("--resume", str(part))
    assert res.returncode == 0, res.stderr
    a, b = losses(full), losses(part)
    assert [a[s] for s in range(1, 21)] == [b[s] for s in range(1, 21)]
    ev = [r["dynamic_tables"] for r in read_metrics(full) if r["kind"] == "train"]
    assert ev[9]["user"]["evictions"] > 0 and ev[19]["user"]["evictions"] > ev[9]["user"]["evictions"]
    assert ev[19]["item"]["evictions"] > ev[9]["item"]["evictions"] > 0
    da, db = dump(full, tmp_path / "da"), dump(part, tmp_path / "db")
    assert sorted(da) == sorted(db)
    for key in da:
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)
    assert da["tables/user/keys.npy"].size <= 100


def test_increments_list_evicted_keys(data: Path, tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    recipe = write_recipe(data, "inc", capacity="600", ttl=4)
    run_dir = tmp_path / "run"
    assert run(str(recipe), "--run-dir", str(run_dir)).returncode == 0
    inc = tmp_path / "inc"
    res = run_cli("incremental-export", str(run_dir), str(inc), "--since", "10")
    assert res.returncode == 0, res.stderr
    removed = np.load(inc / "tables/user/removed_keys.npy")
    assert removed.size > 0
    base = tmp_path / "base"
    dump(run_dir, base, "--step", "10")
    merged = tmp_path / "merged"
    res = run_cli("apply-increments", str(base), str(inc), "--out", str(merged))
    assert res.returncode == 0, res.stderr
    later = dump(run_dir, tmp_path / "later")
    got = {str(p.relative_to(merged)): np.load(p) for p in sorted(merged.rglob("*.npy"))}
    for key in later:
        if key.startswith("tables/"):
            np.testing.assert_array_equal(got[key], later[key], err_msg=key)
    assert not np.isin(removed, later["tables/user/keys.npy"]).any()


def test_full_table_without_eviction_stops_with_one_line(data: Path, tmp_path: Path) -> None:
    recipe = write_recipe(data, "full", capacity="700", eviction="none", ttl=1000,
                          user_capacity="190")
    run_dir = tmp_path / "run"
    res = run(str(recipe), "--run-dir", str(run_dir))
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if "is full" in x]
    assert len(lines) == 1 and "'user'" in lines[0] and "capacity" in lines[0], res.stderr
    assert "raise tables[].dynamic.capacity" in lines[0]
    step = int(lines[0].split("is full at step ")[1].split(":")[0])
    assert 10 < step < 20
    # the checkpoint before the failure is complete and loads
    assert dump(run_dir, tmp_path / "d", "--step", "10")["tables/user/keys.npy"].size <= 190


def test_load_between_static_and_dynamic(data: Path, tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    dyn = write_recipe(data, "src")
    run_dir = tmp_path / "run"
    assert run(str(dyn), "--run-dir", str(run_dir), "--max-steps", "5").returncode == 0
    export = tmp_path / "export"
    dump(run_dir, export)
    # the generated user ids are 64-bit hashes: they cannot be rows of a static table
    static = Path(str(dyn).replace("src", "static"))
    text = dyn.read_text().replace(
        "dynamic: {capacity: 200K, eviction: lru, admission: {type: count, min_count: 2}, "
        "ttl_steps: 1000, missing: initial}", "rows: 300000").replace("sharding: row", "sharding: auto")
    assert "rows: 300000" in text
    static.write_text(text)
    res = run_cli("load", str(export), "--recipe", str(static), "--run-dir",
                  str(tmp_path / "s"), "--max-steps", "2")
    assert res.returncode == 2
    assert "does not fit a static table of 300000 rows" in res.stderr
    assert len([x for x in res.stderr.splitlines() if "does not fit" in x]) == 1
    # a static table's rows load into a dynamic table and back
    tag_dyn = Path(str(dyn).replace("src", "tagdyn"))
    tag_dyn.write_text(dyn.read_text().replace(
        "{name: tag, dim: 8, rows: 200}", "{name: tag, dim: 8, dynamic: {capacity: 500}}"))
    res = run_cli("load", str(export), "--recipe", str(tag_dyn), "--run-dir",
                  str(tmp_path / "t"), "--max-steps", "2")
    assert res.returncode == 0, res.stderr
    back = dump(tmp_path / "t", tmp_path / "tdump")
    assert back["tables/tag/keys.npy"].max() < 200
    shutil.rmtree(tmp_path / "t")


def test_dynamic_recipe_runs_as_documented(tmp_path: Path) -> None:
    """docs/DYNAMIC_TABLES.md: gen-data for recipes/dynamic_table.yaml, then run it (a few steps here)."""
    from tests.support.cli import REPO, run_cli

    shutil.copy(REPO / "recipes/dynamic_table.yaml", tmp_path / "dynamic_table.yaml")
    res = run_cli("gen-data", "--recipe", "dynamic_table.yaml", "--out", "data/dynamic",
                  "--rows", "80000", "--eval-rows", "4000", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run_cli("run", "dynamic_table.yaml", "--max-steps", "30", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["steps"] == 30 and summary["evals"][-1]["auc"] > 0.55
    run_dir = Path(summary["run_dir"])
    run_dir = run_dir if run_dir.is_absolute() else tmp_path / run_dir
    last = [r for r in read_metrics(run_dir) if r["kind"] == "train"][-1]
    user = last["dynamic_tables"]["user"]
    assert 0 < user["rows"] <= user["capacity"] == 200_000 and user["admissions_pending"] > 0


def test_dynamic_data_parallel_is_refused(data: Path, tmp_path: Path) -> None:
    recipe = write_recipe(data, "dp", sharding="data_parallel")
    res = run(str(recipe), "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "tables[0].sharding: a dynamic table cannot be data_parallel" in res.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_sparse_ids_reach_the_auc_of_remapped_static_ids(tmp_path: Path) -> None:
    """gen-data's sparse-ids preset (63-bit and negative ids, new ones over time) in dynamic
    tables reaches the eval AUC of the same data remapped to 0..n-1 in static tables.

    Tables start at zero so that the two runs are the same computation (a key's initial value
    is a function of its id, and the ids differ); with the default uniform initializer the two
    AUCs differ by the initial noise, as runs with different seeds do (0.710-0.729 over three
    seeds here, docs/PERFORMANCE.md)."""
    from embtrain.data.presets import preset_recipe_yaml
    from tests.support.cli import run_cli

    aucs = {}
    for preset in ("sparse-ids", "sparse-ids-dense"):
        data = tmp_path / preset
        res = run_cli("gen-data", "--preset", preset, "--out", str(data), "--rows", "300000",
                      "--eval-rows", "50000")
        assert res.returncode == 0, res.stderr
        text = preset_recipe_yaml(preset, str(data), dim=8, batch_size=2048)
        text = text.replace("dim: 8, ", "dim: 8, initializer: {type: zeros}, ")
        recipe = tmp_path / f"{preset}.yaml"
        recipe.write_text(text)
        res = run_cli("run", str(recipe), "--run-dir", str(tmp_path / f"run-{preset}"),
                      "--json", timeout=1200)
        assert res.returncode == 0, res.stderr
        aucs[preset] = json.loads(res.stdout)["evals"][-1]["auc"]
    assert aucs["sparse-ids"] > 0.6
    assert abs(aucs["sparse-ids"] - aucs["sparse-ids-dense"]) <= 0.002, aucs


@pytest.mark.parametrize(("args", "message"), [
    (["--baseline", "static"], "--baseline static compares dynamic tables with static ones"),
    (["--dynamic", "--np", "2"], "--dynamic compares one process with one process"),
])
def test_bench_dynamic_flags_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    from embtrain.cli.main import main

    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]

"""The Python API: the example of docs/USAGE.md runs, errors are exceptions."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import embtrain.api as et
from embtrain.errors import DataError, RecipeError

REPO = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (REPO / "docs" / "USAGE.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_usage_guide_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "recipes").mkdir()
    shutil.copy(REPO / "recipes" / "quickstart.yaml", tmp_path / "recipes")
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(readme_example(), "docs/USAGE.md", "exec"), names)
    steps, auc, world = capsys.readouterr().out.strip().splitlines()[-1].split()
    # predict scores the eval split as the run's last evaluation did
    assert names["scores"].rows == names["summary"].last_eval.rows == 5000
    assert names["scores"].auc == pytest.approx(names["summary"].last_eval.auc, abs=1e-6)
    assert (tmp_path / "scores.parquet").is_file()
    assert (int(steps), int(world)) == (20, 1) and 0.5 < float(auc) <= 1
    assert (tmp_path / "exports" / "notebook" / "manifest.json").is_file()
    assert sorted(p.name for p in (tmp_path / "runs" / "notebook" / "checkpoints").iterdir())[-1] \
        == "step-00000020"


def test_errors_are_exceptions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = et.load_recipe(REPO / "recipes" / "quickstart.yaml").model_dump(mode="json")
    bad = {**raw, "tables": [{**raw["tables"][0], "dim": 0}, *raw["tables"][1:]], "bogus": 1}
    with pytest.raises(RecipeError) as info:
        et.load_recipe(bad)
    assert len(info.value.lines) == 2 and all(line.startswith("<dict>:") for line in info.value.lines)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"data\.train: no file matches 'data/quickstart/train"):
        et.run(raw, run_dir=tmp_path / "r")
    with pytest.raises(RecipeError, match=r"data\.train: no file matches"):
        et.validate(raw, data=True)

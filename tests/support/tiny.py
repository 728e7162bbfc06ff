"""The tiny recipes of the reliability and error tests, and how a test checks that a command
refused something: one line on stderr, the right exit code, no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path


def one_line_error(result, *needles: str, code: int = 2) -> str:
    """The single stderr line of a failed CLI run, checked for exit code and contents."""
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


#: 6 steps, evaluation every 3, a checkpoint every 2 (keeping 2); ``{data}``: its data
TINY = """
version: 1
name: tiny
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - {{name: user, dim: 4, rows: 100}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 6, eval_every: 3, log_every: 2, seed: 1, checkpoint: {{every: 2, keep: 2}}}}
"""


#: a recipe that trains (almost) forever on 2 ranks, a checkpoint every 2 steps
TWO = """
version: 1
name: two
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 64}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - {{name: user, dim: 4, rows: 100, sharding: row}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 100000, eval_every: 1000000, log_every: 1000, seed: 1,
        checkpoint: {{every: 2, keep: 2}}}}
"""



def variant(root: Path, name: str, **changes: str) -> Path:
    """A recipe like TINY over its own copy of the data; ``changes``: text replacements."""
    data = root / f"data-{name}"
    if not data.exists():
        shutil.copytree(root / "data", data)
    text = TINY.format(data=data)
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path = root / f"{name}.yaml"
    path.write_text(text)
    return path


def rewrite_column(path: Path, column: str, change) -> None:
    """Rewrite one column of a Parquet file with ``change(numpy values) -> values``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    values = change(table.column(column).to_numpy().copy())
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, pa.array(values)), path)


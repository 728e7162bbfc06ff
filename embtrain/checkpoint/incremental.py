"""Incremental exports: the rows changed since an earlier checkpoint, and applying them.

``incremental_export(RUN_DIR, OUT, since)`` compares the latest (or chosen) checkpoint, the
*target*, with an earlier checkpoint of the same run, the *base*:

* ``since`` as a step ``N`` names the checkpoint ``step-N`` (it must be in the target's
  history, i.e. a checkpoint completed earlier in the same run, even if pruned since);
* ``since`` as an ISO-8601 time names the newest checkpoint whose manifest ``time_utc`` (the
  moment it was complete) is at or before that time (a time without zone is UTC).

The increment holds, per table, the rows with ``last_step >= N`` (``last_step`` is the
0-based index of the step that last updated a row and checkpoint ``step-N`` holds steps
``0..N-1``, so these are exactly the rows updated after the base), with their values,
optimizer slots and metadata, plus ``removed_keys`` (keys present in the base and gone
since: always empty for static tables); the whole dense model and ``state.json`` of the
target; and a manifest naming the base (step and content fingerprint) and the target.

``apply_increments(BASE, [INC1, INC2, ...], OUT)`` applies increments in order onto a full
``.npy`` export (or checkpoint) and writes a full export whose arrays are byte-identical to
a dump of the last increment's target; the result's content fingerprint is checked against
the target's before the output directory appears. An increment whose base fingerprint is
not the current state's is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.checkpoint.bundle import Bundle, NpyRows, open_bundle, verify_bundle
from embtrain.checkpoint.bundle_format import (
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    FileEntry,
    content_fingerprint,
    utc_now,
)
from embtrain.checkpoint.bundle_write import FileSource, Source, write_bundle
from embtrain.checkpoint.export import RECIPE, resolve_checkpoint, run_dir_of
from embtrain.checkpoint.layout import (
    TableData,
    iter_table_chunks,
    read_table,
    table_files,
    table_meta,
    table_names,
    table_stream,
)
from embtrain.checkpoint.manager import checkpoint_name, history_entry

_STEP = re.compile(r"^\d+$")


def parse_since(text: str) -> int | datetime:
    """A step (digits) or an aware UTC datetime (ISO 8601; no zone means UTC)."""
    text = str(text).strip()
    if _STEP.match(text):
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise CheckpointError(
            f"--since: expected a step or an ISO-8601 time, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def resolve_base(target: Bundle, since: int | datetime) -> dict[str, Any]:
    """The history entry (step, time, fingerprint, rows) of the base checkpoint ``since`` names."""
    entries = [*target.manifest.get("history", []), history_entry(target.manifest)]
    if isinstance(since, int):
        for entry in reversed(entries):
            if int(entry["step"]) == since:
                return entry
        have = ", ".join(str(e["step"]) for e in entries)
        raise CheckpointError(
            f"{target.path}: --since {since}: no checkpoint at step {since} in this "
            f"run's history (checkpoints at steps: {have})"
        )
    before = [e for e in entries if _utc(e["time_utc"]) <= since]
    if not before:
        raise CheckpointError(
            f"{target.path}: --since {since.isoformat()}: no checkpoint was complete "
            f"by then (the first one at {entries[0]['time_utc']})"
        )
    return max(before, key=lambda e: (_utc(e["time_utc"]), int(e["step"])))


def _table_keys(bundle: Bundle, name: str) -> np.ndarray:
    """A table's keys (8 bytes a row), read a chunk at a time and verified."""
    parts = [p.keys for p in iter_table_chunks(bundle, name, members=["keys"])]
    verify_bundle(bundle, [f"tables/{name}/keys.npy"])
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _removed_keys(target: Bundle, name: str, base: dict[str, Any]) -> np.ndarray:
    """Keys in the base but not in the target (a dynamic table's evicted and expired keys):
    empty for static tables (keys = 0..rows-1: the first and last key tell)."""
    rows = int(target.manifest["tables"][name]["rows"])
    base_rows = base.get("rows", {}).get(name)
    with NpyRows(target, f"tables/{name}/keys.npy") as keys:
        ends = [int(k) for k in (*keys.read(0, 1), *keys.read(rows - 1, rows))]
    static = base_rows == rows and (rows == 0 or ends == [0, rows - 1])
    if static:
        return np.zeros(0, dtype=np.int64)
    run_dir = run_dir_of(target.path)
    base_dir = (
        None if run_dir is None else run_dir / "checkpoints" / checkpoint_name(int(base["step"]))
    )
    if base_dir is None or not base_dir.is_dir():
        raise CheckpointError(
            f"{target.path}: table {name} changed its keys since step {base['step']} "
            "and that checkpoint is gone; cannot list removed keys"
        )
    base_bundle = open_bundle(base_dir, kinds=("checkpoint",))
    if base_bundle.fingerprint != base["content_fingerprint"]:
        raise CheckpointError(f"{base_dir}: is not the checkpoint named in {target.path}'s history")
    base_keys = _table_keys(base_bundle, name)
    return np.setdiff1d(base_keys, _table_keys(target, name), assume_unique=True
                        ).astype(np.int64)


def incremental_export(
    run_dir: Path,
    out: Path,
    since: str | int | datetime,
    step: int | None = None,
    fsync: bool = True,
) -> dict[str, Any]:
    """Write the increment from the checkpoint ``since`` names to the latest (or ``step``) one."""
    target = open_bundle(resolve_checkpoint(run_dir, step), kinds=("checkpoint",))
    when = parse_since(since) if isinstance(since, str) else since
    base = resolve_base(target, when)
    base_step = int(base["step"])
    tables: dict[str, Any] = {}

    def files() -> Iterator[tuple[str, Source]]:
        for name in table_names(target):
            # first pass: how many rows changed (last_step only); then those rows, a chunk at
            # a time, every file hashed on the way (a mismatch fails the increment)
            changed = 0
            for part in iter_table_chunks(target, name, members=["last_step"]):
                assert part.last_step is not None
                changed += int(np.count_nonzero(part.last_step >= base_step))
            removed = _removed_keys(target, name, base)
            chunks = (p.take(np.flatnonzero(p.last_step >= base_step))
                      for p in iter_table_chunks(target, name, verify=True))
            source, _ = table_stream(name, changed, chunks, removed_keys=removed)
            full = dict(target.manifest["tables"][name])
            full.pop("dynamic", None)
            tables[name] = {**full, "changed": changed, "removed": int(removed.size)}
            yield f"tables/{name}", source
        for rel, entry in target.files.items():
            if not rel.startswith("tables/"):
                yield rel, FileSource(target.path / rel, entry)

    def finish(entries: list[FileEntry]) -> dict[str, Any]:
        m = target.manifest
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": "increment",
            "array_format": "npy",
            "recipe_fingerprint": m["recipe_fingerprint"],
            "step": int(m["step"]),
            "time_utc": utc_now(),
            "checkpoint_time_utc": m["time_utc"],
            "tables": tables,
            "slots": m.get("slots", []),
            "dense": m.get("dense", {}),
            "history": m.get("history", []),
            "since": {"given": str(since), "step": base_step},
            "base": base,
            "target": history_entry(m),
        }

    return write_bundle(Path(out), files(), finish, fsync=fsync)


def apply_increment(data: TableData, inc: TableData) -> TableData:
    """``data`` (sorted by key, arrays writable) with ``inc``'s removals and rows applied."""
    if set(data.slots) != set(inc.slots):
        raise ValueError(f"slots differ: {sorted(data.slots)} vs {sorted(inc.slots)}")
    if inc.removed_keys is not None and inc.removed_keys.size:
        data = data.take(np.flatnonzero(~np.isin(data.keys, inc.removed_keys)))
    data.extra = dict(inc.extra)  # a dynamic table's admission state: whole in every increment
    n = data.rows
    pos = np.searchsorted(data.keys, inc.keys)
    present = np.zeros(inc.rows, dtype=bool)
    inside = pos < n
    present[inside] = data.keys[pos[inside]] == inc.keys[inside]
    idx = pos[present]
    data.values[idx] = inc.values[present]
    for slot, arr in data.slots.items():
        arr[idx] = inc.slots[slot][present]
    assert data.update_count is not None and data.last_step is not None
    assert inc.update_count is not None and inc.last_step is not None
    data.update_count[idx] = inc.update_count[present]
    data.last_step[idx] = inc.last_step[present]
    if present.all():
        return data
    new = np.flatnonzero(~present)
    merged = TableData(
        np.concatenate([data.keys, inc.keys[new]]),
        np.concatenate([data.values, inc.values[new]]),
        {s: np.concatenate([a, inc.slots[s][new]]) for s, a in data.slots.items()},
        np.concatenate([data.update_count, inc.update_count[new]]),
        np.concatenate([data.last_step, inc.last_step[new]]),
        extra=data.extra, dtype=data.dtype, state_dtype=data.state_dtype,
    )
    return merged.take(np.argsort(merged.keys, kind="stable"))


def check_chain(base: Bundle, increments: Sequence[Bundle]) -> None:
    """Each increment must apply to the state the previous one (or the base) produced."""
    fp, step, name = base.fingerprint, base.step, base.path
    for inc in increments:
        want = inc.manifest["base"]
        if want["content_fingerprint"] != fp:
            raise CheckpointError(
                f"{inc.path}: applies to the state at step {want['step']} (fingerprint "
                f"{want['content_fingerprint'][:16]}), but {name} holds step {step} (fingerprint "
                f"{fp[:16]}); apply increments in order onto the base they name"
            )
        if inc.manifest["recipe_fingerprint"] != base.manifest["recipe_fingerprint"]:
            raise CheckpointError(
                f"{inc.path}: recipe fingerprint {inc.manifest['recipe_fingerprint']} "
                f"differs from the base's {base.manifest['recipe_fingerprint']}"
            )
        target = inc.manifest["target"]
        fp, step, name = target["content_fingerprint"], int(target["step"]), inc.path


def apply_increments(
    base_dir: Path, increments: Sequence[Path], out: Path, fsync: bool = True
) -> dict[str, Any]:
    """Apply increments in order to a full ``.npy`` export; write the newer full export to ``out``.

    Refuses an increment whose base is not the current state. The result's arrays are
    byte-identical to a dump of the last increment's target (checked via the content
    fingerprint before ``out`` appears).
    """
    if not increments:
        raise CheckpointError("apply-increments: give at least one increment")
    base = open_bundle(Path(base_dir), kinds=("export", "checkpoint"))
    if base.manifest.get("array_format", "npy") != "npy":
        raise CheckpointError(f"{base.path}: a Parquet export cannot be a base; dump it as .npy")
    if content_fingerprint(base.files.values()) != base.fingerprint:
        raise CheckpointError(
            f"{base.path}: manifest's content fingerprint does not match its files"
        )
    incs = [open_bundle(Path(p), kinds=("increment",)) for p in increments]
    check_chain(base, incs)
    last = incs[-1]
    target = last.manifest["target"]
    tables: dict[str, Any] = {}

    def files() -> Iterator[tuple[str, Source]]:
        for name in table_names(last):
            if name not in base.manifest.get("tables", {}):
                raise CheckpointError(f"{base.path}: has no table {name!r} (the increments do)")
            data = read_table(base, name)
            for inc in incs:
                try:
                    data = apply_increment(data, read_table(inc, name))
                except ValueError as exc:
                    raise CheckpointError(f"{inc.path}: table {name}: {exc}") from None
            want = int(last.manifest["tables"][name]["rows"])
            if data.rows != want:
                raise CheckpointError(
                    f"{last.path}: table {name}: {data.rows} rows after applying, "
                    f"the target has {want}"
                )
            tables[name] = table_meta(data)
            yield from table_files(name, data)
        for rel, entry in last.files.items():
            if not rel.startswith("tables/"):
                yield rel, FileSource(last.path / rel, entry)
        if RECIPE in base.files:
            yield RECIPE, FileSource(base.path / RECIPE, base.files[RECIPE])

    def finish(entries: list[FileEntry]) -> dict[str, Any]:
        got = content_fingerprint(entries)
        if got != target["content_fingerprint"]:
            raise CheckpointError(
                f"{out}: applying the increments did not reproduce step "
                f"{target['step']} exactly (fingerprint {got[:16]}, expected "
                f"{target['content_fingerprint'][:16]})"
            )
        m = last.manifest
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": "export",
            "array_format": "npy",
            "recipe_fingerprint": m["recipe_fingerprint"],
            "step": int(target["step"]),
            "time_utc": utc_now(),
            "checkpoint_time_utc": target["time_utc"],
            "tables": tables,
            "slots": m.get("slots", []),
            "dense": m.get("dense", {}),
            "history": m.get("history", []),
            "source": {
                "kind": "apply-increments",
                "step": int(target["step"]),
                "content_fingerprint": target["content_fingerprint"],
                "base": {
                    "path": str(base.path),
                    "step": base.step,
                    "content_fingerprint": base.fingerprint,
                },
                "increments": [str(i.path) for i in incs],
            },
        }

    return write_bundle(Path(out), files(), finish, fsync=fsync)

"""Checks that span several parts of a recipe.

They read the raw (parsed YAML) mapping rather than the validated models, so
they still run when some other part of the file is invalid, and every problem
of a file is reported at once. Each finding is a ``(path, message)`` pair; the
loader turns the path into a ``file:line:col`` position.
"""

from __future__ import annotations

from typing import Any

from embtrain.recipe.kinds import HALF_TABLE_DTYPES, TIERS, in_files, tier_rank
from embtrain.recipe.units import parse_count

Path = tuple[Any, ...]
Finding = tuple[Path, str]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def cross_checks(raw: dict[str, Any]) -> list[Finding]:
    """All cross-field findings of a raw recipe mapping."""
    findings: list[Finding] = []
    tables = _list(raw.get("tables"))
    features = _list(raw.get("features"))
    findings += _check_unique(tables, "tables")
    findings += _check_unique(features, "features")
    table_by_name = {t.get("name"): (i, t) for i, t in enumerate(tables) if isinstance(t, dict)}
    for i, table in enumerate(tables):
        if isinstance(table, dict):
            findings += _check_table(i, table)
    for i, feature in enumerate(features):
        if isinstance(feature, dict) and feature.get("kind") == "categorical":
            findings += _check_feature(i, feature, table_by_name)
    findings += _check_model(raw, features, table_by_name)
    findings += _check_distributed(_dict(raw.get("distributed")))
    findings += _check_half_fields(tables)
    findings += _check_dense_backend(_dict(raw.get("train")))
    return findings


def _check_dense_backend(train: dict[str, Any]) -> list[Finding]:
    """Mixed precision is the TensorFlow dense backend's (``auto`` resolving to JAX is the
    job's check: :func:`embtrain.models.backend.recipe_problems`)."""
    precision = train.get("mixed_precision")
    if train.get("dense_backend") == "jax" and precision in ("bf16", "fp16"):
        return [(("train", "mixed_precision"), f"{precision} runs on the TensorFlow dense "
                 "backend only; set train.dense_backend: tensorflow or train.mixed_precision: "
                 "none")]
    return []


def _check_half_fields(tables: list[Any]) -> list[Finding]:
    """``rounding`` and ``optimizer_state`` belong to float16/bfloat16 tables only."""
    out: list[Finding] = []
    for i, table in enumerate(tables):
        table = _dict(table)
        half = table.get("dtype") in HALF_TABLE_DTYPES
        for key in ("rounding", "optimizer_state"):
            if table.get(key) is not None and not half:
                out.append((("tables", i, key), f"{key} applies to float16/bfloat16 tables "
                            f"only (this table is {table.get('dtype', 'float32')})"))
    return out


def _check_unique(items: list[Any], where: str) -> list[Finding]:
    seen: dict[Any, int] = {}
    out: list[Finding] = []
    for i, item in enumerate(items):
        name = _dict(item).get("name")
        if name is None:
            continue
        if name in seen:
            out.append(((where, i, "name"), f"duplicate name {name!r} (also {where}[{seen[name]}])"))
        else:
            seen[name] = i
    return out


def _check_table(i: int, table: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    has_rows, has_dynamic = table.get("rows") is not None, table.get("dynamic") is not None
    if has_rows and has_dynamic:
        out.append((("tables", i, "rows"), "a dynamic table has no 'rows' (its size is dynamic.capacity)"))
    elif not has_rows and not has_dynamic:
        out.append((("tables", i), "a table needs 'rows' (static) or a 'dynamic' block"))
    storage = table.get("storage")
    if isinstance(storage, list):
        last_rank = -1
        seen: set[str] = set()
        for j, tier in enumerate(storage):
            tier = _dict(tier)
            kind = tier.get("tier")
            if kind not in TIERS:
                continue
            if kind in seen:
                out.append((("tables", i, "storage", j, "tier"), f"tier {kind!r} appears twice"))
            elif tier_rank(kind) < last_rank:
                out.append((("tables", i, "storage", j, "tier"),
                            f"tier {kind!r} after a slower tier: order is {', '.join(TIERS)}"))
            seen.add(kind)
            last_rank = max(last_rank, tier_rank(kind))
            if tier.get("path") is not None and not in_files(kind):
                out.append((("tables", i, "storage", j, "path"),
                            f"only a {' or '.join(k for k in TIERS if in_files(k))} tier has a path"))
            if tier.get("eviction") is not None and j == len(storage) - 1:
                out.append((("tables", i, "storage", j, "eviction"),
                            "the last tier holds every row and evicts none: eviction belongs "
                            "to a tier above it (the cache)"))
            if j < len(storage) - 1 and tier.get("budget") is None:
                out.append((("tables", i, "storage", j),
                            f"tier {kind!r} needs a budget: a slower tier follows it"))
    return out


def _check_feature(i: int, feature: dict[str, Any], tables: dict[Any, tuple[int, dict]]) -> list[Finding]:
    out: list[Finding] = []
    name = feature.get("table")
    if name is not None and name not in tables:
        known = ", ".join(sorted(str(n) for n in tables)) or "none"
        out.append((("features", i, "table"), f"no table named {name!r} (tables: {known})"))
    elif name is not None:
        table = tables[name][1]
        dim, want = _positive_int(table.get("dim")), _positive_int(feature.get("dim"))
        if dim and want and dim != want:
            out.append((("features", i, "dim"),
                        f"dim {want} differs from table {name!r}'s dim {dim} (shared tables have one dim)"))
    if feature.get("combiner") == "concat" and not _positive_int(feature.get("hotness", 1)):
        out.append((("features", i, "combiner"), "combiner 'concat' needs a fixed hotness"))
    out.extend(_check_null_id(i, feature, tables))
    return out


def _check_null_id(i: int, feature: dict[str, Any], tables: dict[Any, tuple[int, dict]]) -> list[Finding]:
    """``null: {id: VALUE}``: VALUE has the ids' kind and lies inside a static table's rows."""
    rule = feature.get("null")
    if not isinstance(rule, dict) or "id" not in rule:
        return []
    value, string = rule["id"], feature.get("ids", "int") == "string"
    where = ("features", i, "null", "id")
    if string != isinstance(value, str) or isinstance(value, bool):
        kind = "a string" if string else "an integer"
        return [(where, f"id {value!r} must be {kind} (ids: {'string' if string else 'int'})")]
    table = tables.get(feature.get("table"))
    try:
        rows = parse_count(table[1].get("rows")) if table and table[1].get("rows") is not None else None
    except (TypeError, ValueError):
        rows = None
    if (not string and rows is not None
            and feature.get("out_of_range", "error") == "error" and not 0 <= value < rows):
        return [(where, f"id {value} is outside table {feature.get('table')!r} rows [0, {rows}) "
                        "(or set out_of_range: modulo)")]
    return []


def feature_width(feature: dict[str, Any], tables: dict[Any, tuple[int, dict]]) -> int | None:
    """Width of a categorical feature's pooled output, or None when it cannot be told."""
    table = tables.get(feature.get("table"))
    dim = _positive_int(table[1].get("dim")) if table else None
    if dim is None:
        return None
    if feature.get("combiner") == "concat":
        hot = _positive_int(feature.get("hotness", 1))
        return dim * hot if hot else None
    return dim


def _check_model(raw: dict[str, Any], features: list[Any], tables: dict[Any, tuple[int, dict]]) -> list[Finding]:
    model = _dict(raw.get("model"))
    kind = model.get("type")
    out: list[Finding] = []
    categorical = [(i, f) for i, f in enumerate(features)
                   if isinstance(f, dict) and f.get("kind") == "categorical"]
    widths = {i: feature_width(f, tables) for i, f in categorical}
    needs_equal = (kind == "dlrm" and model.get("interaction", "dot") == "dot") or kind == "deepfm"
    if needs_equal:
        known = {i: w for i, w in widths.items() if w is not None}
        if known:
            first_i = min(known)
            ref = known[first_i]
            for i, w in known.items():
                if w != ref:
                    why = "DLRM's dot interaction" if kind == "dlrm" else "DeepFM's FM interaction"
                    out.append((("features", i),
                                f"embedding width {w} differs from {features[first_i].get('name')!r}'s {ref}: "
                                f"{why} needs equal widths"))
            bottom = model.get("bottom")
            last = bottom[-1] if kind == "dlrm" and isinstance(bottom, list) and bottom else None
            if _positive_int(last) and last != ref:
                out.append((("model", "bottom", len(bottom) - 1),
                            f"last bottom layer is {last} but embeddings are {ref} wide: "
                            "the dot interaction needs them equal"))
    if kind == "wide_deep" and isinstance(model.get("wide_features"), list):
        names = {f.get("name") for _, f in categorical}
        for j, name in enumerate(model["wide_features"]):
            if name not in names:
                out.append((("model", "wide_features", j), f"no categorical feature named {name!r}"))
    return out


def _check_distributed(dist: dict[str, Any]) -> list[Finding]:
    hosts = dist.get("hosts")
    processes = _positive_int(dist.get("processes", 1))
    if not isinstance(hosts, list) or not processes:
        return []
    slots = 0
    for host in hosts:
        if not isinstance(host, str):
            return []
        _, _, n = host.partition(":")
        slots += int(n) if n.isdigit() else 1
    if slots < processes:
        return [(("distributed", "hosts"), f"hosts offer {slots} slots but processes is {processes}")]
    return []

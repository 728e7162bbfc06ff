"""Print a :class:`~embtrain.plan.objects.Plan` for people: Rich tables, no TensorFlow."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from embtrain.plan.objects import Plan, RankSummary, TablePlan
from embtrain.plan.topology import POOLS
from embtrain.recipe.kinds import in_files
from embtrain.recipe.units import format_bytes

MAX_TABLE_ROWS = 60
MAX_RANK_ROWS = 32


def _count(n: float) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{int(n)}"


def _per_rank(table: TablePlan, tier: str) -> str:
    values = sorted({g.tiers.get(tier) for g in table.groups})
    if not values or values[-1] == 0:
        return "-"
    if len(values) == 1:
        return format_bytes(values[0])
    return f"{format_bytes(values[0])}–{format_bytes(values[-1])}"


def _tier_rows(table: TablePlan) -> str:
    """Rows per rank in each tier (in storage order) of the table's largest shard:
    ``7.5K/30.0K/462.5K``."""
    if len(table.storage) < 2 or not table.groups:
        return "-"
    g = max(table.groups, key=lambda g: g.rows)
    return "/".join(_count(g.tier_rows.get(s.tier)) for s in table.storage)


def _hit(table: TablePlan) -> str:
    return "-" if table.hit_rate is None else f"{100 * table.hit_rate:.1f}%"


def _tables(plan: Plan, max_rows: int) -> RenderableType:
    tiers = [t for t in POOLS
             if t == "device" or any(s.tier == t for tb in plan.tables for s in tb.storage)]
    shown = list(plan.tables)
    caption = None
    if len(shown) > max_rows:
        shown = sorted(shown, key=lambda t: (-t.bytes, t.name))[:max_rows]
        caption = f"the {max_rows} largest of {len(plan.tables)} tables; --json lists all"
    out = Table(title="Tables", caption=caption, title_justify="left")
    out.add_column("table")
    out.add_column("rows", justify="right")
    out.add_column("dim", justify="right")
    out.add_column("sharding")
    out.add_column("ranks", justify="right")
    for tier in tiers:
        out.add_column(f"{tier}/rank", justify="right")
    out.add_column("total", justify="right")
    half = any(t.dtype != "float32" for t in shown)  # values and optimizer state apart
    if half:
        out.add_column("dtype")
        out.add_column("values", justify="right")
        out.add_column("optimizer", justify="right")
    tiered = any(len(t.storage) > 1 for t in shown)
    if tiered:
        out.add_column("rows/tier", justify="right")
        out.add_column("hit", justify="right")
    for t in shown:
        sharding = t.sharding if t.requested == "auto" else f"{t.sharding} (asked)"
        extra = (_tier_rows(t), _hit(t)) if tiered else ()
        if half:
            short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[t.dtype]
            extra = (short, format_bytes(t.value_bytes), format_bytes(t.optimizer_bytes),
                     *extra)
        out.add_row(t.name, _count(t.rows) + (" dyn" if t.dynamic else ""), str(t.dim), sharding,
                    t.ranks_label, *(_per_rank(t, tier) for tier in tiers),
                    format_bytes(t.bytes), *extra)
    return out


def _used(used: int, capacity: int) -> str:
    share = f" ({100 * used / capacity:.0f}%)" if capacity else ""
    return f"{format_bytes(used)}{share}"


def _rank_values(r: RankSummary, pools: list[str]) -> list[int]:
    return [r.shards, *(r.memory.get(p) for p in pools), r.lookups,
            r.ids_bytes + r.forward_bytes + r.backward_bytes]


def _ranks(plan: Plan, max_rows: int) -> RenderableType:
    top = plan.topology
    used = {s.tier for t in plan.tables for s in t.storage}
    # a file pool only when a table uses it; the device pool only on a machine with a GPU
    pools = [p for p in POOLS
             if (p != "device" or top.has_device) and (not in_files(p) or p in used)]
    out = Table(title="Ranks (per step: lookups, all-to-all bytes as table owner)",
                title_justify="left")
    out.add_column("rank", justify="right")
    out.add_column("shards", justify="right")
    for pool in pools:
        label = "host+device" if pool == "host" and not top.has_device else pool
        out.add_column(f"{label} of {format_bytes(top.capacity(pool))}", justify="right")
    out.add_column("lookups", justify="right")
    out.add_column("all-to-all", justify="right")

    def cells(label: str, values: list[int]) -> list[str]:
        shards, *memory, lookups, exchanged = values
        used = [_used(m, top.capacity(p)) for m, p in zip(memory, pools, strict=True)]
        return [label, str(shards), *used, _count(lookups), format_bytes(exchanged)]

    rows = [_rank_values(r, pools) for r in plan.ranks]
    if len(rows) <= max_rows:
        for r, values in zip(plan.ranks, rows, strict=True):
            out.add_row(*cells(str(r.rank), values))
    else:
        columns = list(zip(*rows, strict=True))
        out.add_row(*cells("min", [min(c) for c in columns]))
        out.add_row(*cells("mean", [round(sum(c) / len(c)) for c in columns]))
        out.add_row(*cells("max", [max(c) for c in columns]))
        out.caption = f"{len(rows)} ranks summarised; --json lists each"
    return out


def _traffic(plan: Plan) -> RenderableType:
    t = plan.traffic
    out = Table(title=f"Traffic per step (global batch {t.batch_size})", title_justify="left",
                show_header=False)
    out.add_column("what")
    out.add_column("amount", justify="right")
    out.add_row("lookups", _count(t.lookups))
    out.add_row("ids all-to-all (int64)", format_bytes(t.ids_bytes))
    wire = {4: "float32", 2: "fp16", 1: "int8"}.get(t.element_bytes, f"{t.element_bytes} B")
    out.add_row(f"embeddings forward ({wire})", format_bytes(t.forward_bytes))
    out.add_row(f"gradients backward ({wire})", format_bytes(t.backward_bytes))
    out.add_row("data-parallel all-reduce", format_bytes(t.allreduce_bytes))
    return out


def plan_renderable(plan: Plan, *, max_tables: int = MAX_TABLE_ROWS,
                    max_ranks: int = MAX_RANK_ROWS) -> RenderableType:
    """The whole plan as one Rich renderable: tables, ranks, traffic, notes, fingerprint."""
    top = plan.topology
    device = format_bytes(top.device_memory) if top.device_memory is not None else "none"
    totals = plan.totals
    head = Text.assemble(
        ("Plan", "bold"), f" for {plan.recipe or 'recipe'} on {top.world_size} rank(s): device ",
        device, f", host {format_bytes(top.host_memory)}, disk {format_bytes(top.disk)} per rank\n",
        f"{len(plan.tables)} tables, {format_bytes(totals.bytes)} in all (values ",
        format_bytes(totals.value_bytes), ", optimizer ", format_bytes(totals.optimizer_bytes),
        ", metadata ", format_bytes(totals.metadata_bytes), ")")
    notes = Text("Notes\n", style="bold")
    for note in plan.notes:
        notes.append(f"  • {note}\n", style="")
    return Group(head, _tables(plan, max_tables), _ranks(plan, max_ranks), _traffic(plan), notes,
                 Text.assemble(("fingerprint ", "bold"), plan.fingerprint))


def render_plan(plan: Plan, console: Console | None = None, *, max_tables: int = MAX_TABLE_ROWS,
                max_ranks: int = MAX_RANK_ROWS) -> None:
    """Print ``plan`` on ``console`` (a new stdout console by default)."""
    (console or Console()).print(plan_renderable(plan, max_tables=max_tables, max_ranks=max_ranks))

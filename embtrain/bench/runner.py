"""`embtrain bench`: plan, check memory, generate batches, run each side in a child process.

Order of work, so that nothing large is allocated for a model the machine cannot hold:

1. Build the synthetic model's recipe and plan it on this machine's topology
   (``Topology.detect``). A plan that does not fit stops here (``ran: false``) with the
   planner's reason and the smallest topology that would hold the tables.
2. Estimate each side's process memory (tables and optimizer state, per-step workspace,
   the batches, the runtime) and compare it with the memory available now. The two sides
   run one after the other, each in its own child process (so each peak RSS is its own),
   so each must fit on its own; a baseline that does not fit stops the run and says that
   ``--baseline none`` runs embtrain alone.
3. Generate the batches once (power-law ids, normal dense features, random labels), write
   them to a temporary directory, run embtrain then the baseline on them
   (:mod:`embtrain.bench.sides`), and judge the results against the targets
   (:mod:`embtrain.bench.targets`). The memory estimates are :mod:`embtrain.bench.footprint`'s.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.bench.footprint import (
    RUNTIME_BYTES,
    GiB,
    MemoryCheck,
    available_memory,
    baseline_table_bytes,
    batch_bytes,
    batches_on_disk,
    workspace_bytes,
)
from embtrain.bench.inputs import generate
from embtrain.bench.measure import digest
from embtrain.bench.peer_fbgemm import (
    PEER_SIDES,
    check_optimizer,
    fbgemm_python,
    verify_peers,
)
from embtrain.bench.precision import (
    FLOAT32_SIDE,
    precision_recipe,
    round_figures,
    side_precision,
)
from embtrain.bench.results import (
    environment,
    side_report,
)
from embtrain.bench.sides import run_side, tfra_python
from embtrain.bench.synthetic import SyntheticModel, build_recipe, load_model
from embtrain.bench.targets import judge
from embtrain.bench.tiers import (
    EVICTIONS,
    TierSetup,
    cache_vs_oracle,
    check_disk,
    parse_host_memory,
    tier_setup,
)
from embtrain.bench.worker import SideSpec
from embtrain.errors import UserInputError
from embtrain.plan import FitSuggestion, Plan, PlanError, Topology, make_plan
from embtrain.plan.cost import RowCost
from embtrain.recipe.models import Recipe

BASELINES = ("native-tf", "tfra", "fbgemm", "one-process", "static", "none")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    """Everything `embtrain bench` was asked for."""

    model: str = "tiny"
    batch: int = 65536
    steps: int = 20
    warmup: int = 3
    alpha: float = 1.05
    optimizer: str = "adagrad"
    baseline: str = "native-tf"
    scale: float = 1.0
    batches: int | None = None
    seed: int = 0
    repeat: int = 1
    processes: int = 1
    quantize: str = "none"
    device: str = "cpu"  # train.device of embtrain's side
    dynamic: bool = False
    host_memory: str | None = None  # a size or a fraction of the tables' bytes (with disk)
    disk: str | None = None  # directory of the disk tier
    eviction: str | None = None  # the tier caches' replacement: lru (default) or lfu
    precision: str = "none"  # bf16 / fp16: half tables + mixed precision against float32
    optimizer_state: str = "float32"  # the half tables' optimizer state: float32 or table

    @property
    def distinct_batches(self) -> int:
        """Distinct batches generated (reused in a ring): ``--batches``, else min(steps+warmup, 8)."""
        return self.batches if self.batches is not None else min(self.steps + self.warmup, 8)


# --------------------------------------------------------------------------------- plan


@dataclass
class Outcome:
    """A bench result being assembled: the JSON document and what the renderer needs."""

    doc: dict[str, Any]
    plan: Plan | None = None
    missing: str | None = None


def _topology_dict(t: Topology | None) -> dict[str, Any] | None:
    return None if t is None else t.to_dict()


def _suggestion_dict(s: FitSuggestion | None, fallback: str | None = None) -> dict[str, Any]:
    if s is None:
        return {"description": fallback, "by_ranks": None, "by_memory": None}
    return {
        "description": s.describe(),
        "by_ranks": _topology_dict(s.by_ranks),
        "by_memory": _topology_dict(s.by_memory),
    }


def _base_doc(options: BenchOptions, model: SyntheticModel) -> dict[str, Any]:
    return {
        "model": model.name,
        "batch": options.batch,
        "steps": options.steps,
        "warmup": options.warmup,
        "alpha": options.alpha,
        "optimizer": options.optimizer,
        "baseline": options.baseline,
        "scale": options.scale,
        "seed": options.seed,
        "repeat": options.repeat,
        "processes": options.processes,
        "quantize": options.quantize,
        "device": options.device,
        "precision": options.precision,
        "optimizer_state": options.optimizer_state,
        "model_info": {
            "tables": model.num_tables,
            "inputs": model.num_inputs,
            "table_bytes": model.table_bytes(options.scale),
            "ids_per_sample": model.ids_per_sample,
            "mlp": list(model.mlp),
            "numerical": model.numerical,
            "interact_stride": model.interact_stride,
        },
    }


def _not_run(
    doc: dict[str, Any], reason: str, needed: int, smallest: dict[str, Any], plan: Plan | None
) -> Outcome:
    doc.update(
        {"ran": False, "reason": reason, "needed_bytes": needed, "smallest_topology": smallest}
    )
    if plan is not None:
        doc["plan"] = {
            "fingerprint": plan.fingerprint,
            "totals": plan.totals.to_dict(),
            "topology": plan.topology.to_dict(),
        }
    return Outcome(doc=doc, plan=plan, missing=reason)


def _whole_host(needed: int, like: Topology) -> Topology:
    """One rank like ``like`` with host memory raised to the whole GiB above ``needed``."""
    return Topology(
        world_size=1,
        device_memory=like.device_memory,
        host_memory=-(-needed // GiB) * GiB,
        disk=like.disk,
    )


def plan_and_check(
    options: BenchOptions, topology: Topology | None = None, available: int | None = None
) -> tuple[Outcome, Recipe, SyntheticModel]:
    """Steps 1 and 2: the plan and the memory check; ``outcome.doc['ran']`` is unset when it fits."""
    model = load_model(options.model)
    setup = _tiers(options, model)
    recipe = build_recipe(
        model,
        optimizer=options.optimizer,
        batch=options.batch,
        scale=options.scale,
        steps=options.steps,
        seed=options.seed,
        storage_by_table=None if setup is None else setup.storage(),
    )
    topology = topology or Topology.detect(1)
    doc = _base_doc(options, model)
    doc["topology"] = topology.to_dict()
    if setup is not None:
        doc["tiers"] = setup.to_dict()
    # --precision: the tables the half side holds (in their dtype) decide whether it fits
    planned = (recipe if options.precision == "none"
               else precision_recipe(recipe, *side_precision(options.precision),
                                     options.optimizer_state))
    try:
        plan = make_plan(planned, topology, batch_size=options.batch)
    except PlanError as exc:
        shown = None
        if exc.suggestion is not None and exc.suggestion.by_memory is not None:
            shown = make_plan(recipe, exc.suggestion.by_memory, batch_size=options.batch)
        needed = shown.totals.bytes if shown is not None else int(exc.needed)
        return (
            _not_run(doc, str(exc), needed, _suggestion_dict(exc.suggestion), shown),
            recipe,
            model,
        )

    count = options.distinct_batches
    work = workspace_bytes(model, options.scale, options.batch)
    data = batch_bytes(model, options.batch, count)
    if setup is not None and batches_on_disk(data):  # read when a step needs it (and the next)
        data = batch_bytes(model, options.batch, min(count, 2))
    tables = plan.totals.bytes if setup is None else setup.memory_bytes
    emb_need = tables + work + data + RUNTIME_BYTES
    base_need = None
    if options.baseline != "none":
        base_need = (
            baseline_table_bytes(model, options.scale, options.optimizer, options.baseline)
            + work
            + data
            + RUNTIME_BYTES
        )
    free = available_memory() if available is None else available
    check = MemoryCheck(available=free, embtrain=emb_need, baseline=base_need)
    doc["memory_check"] = check.to_dict()
    if emb_need > free:
        top = _whole_host(emb_need, topology)
        reason = (
            f"embtrain's process needs about {_gib(emb_need)} (tables {_gib(tables)}, "
            f"step workspace {_gib(work)}, batches {_gib(data)}, runtime {_gib(RUNTIME_BYTES)}) "
            f"but {_gib(free)} is available"
        )
        smallest = {
            "description": f"1 rank with {_gib(top.host_memory)} of host memory",
            "by_ranks": None,
            "by_memory": top.to_dict(),
        }
        return _not_run(doc, reason, emb_need, smallest, plan), recipe, model
    if base_need is not None and base_need > free:
        top = _whole_host(base_need, topology)
        tables = {"tfra": "hash tables", "static": "tables all in memory",
                  "fbgemm": "each peer's tables"}.get(
            options.baseline, "tf.Variables")
        table_bytes = baseline_table_bytes(model, options.scale, options.optimizer,
                                           options.baseline)
        reason = (
            f"the {options.baseline} baseline needs about {_gib(base_need)} ({tables} "
            f"and optimizer slots {_gib(table_bytes)}, "
            f"step workspace {_gib(work)}, batches {_gib(data)}, runtime "
            f"{_gib(RUNTIME_BYTES)}) but {_gib(free)} is available; "
            f"--baseline none runs embtrain alone"
        )
        smallest = {
            "description": f"1 rank with {_gib(top.host_memory)} of host memory",
            "by_ranks": None,
            "by_memory": top.to_dict(),
        }
        return _not_run(doc, reason, base_need, smallest, plan), recipe, model
    if options.precision != "none":
        reason = _float32_side_misfit(recipe, topology, options.batch,
                                      work + data + RUNTIME_BYTES, free)
        if reason is not None:
            doc["float32_side_not_run"] = reason
    if model.interact_stride is not None:
        reason = (
            f"model {model.name} pools its embeddings (interact_stride "
            f"{model.interact_stride}) before the MLP, which embtrain's dense models do not "
            f"offer yet; the bench only plans it"
        )
        return (
            _not_run(doc, reason, emb_need, _suggestion_dict(None, "fits as given"), plan),
            recipe,
            model,
        )
    doc["plan"] = {
        "fingerprint": plan.fingerprint,
        "totals": plan.totals.to_dict(),
        "topology": plan.topology.to_dict(),
    }
    return Outcome(doc=doc, plan=plan), recipe, model


def _float32_side_misfit(recipe: Recipe, topology: Topology, batch: int, extra: int,
                         free: int) -> str | None:
    """Why the float32 side of ``--precision`` cannot run here (None: it fits): a model whose
    half tables fit where its float32 ones do not (DE small in bfloat16 on 24 GiB) then runs
    the half side alone."""
    try:
        tables = make_plan(recipe, topology, batch_size=batch).totals.bytes
    except PlanError as exc:
        return f"the float32 side does not fit: {exc}"
    if tables + extra > free:
        return (f"the float32 side needs about {_gib(tables + extra)} (tables {_gib(tables)}) "
                f"but {_gib(free)} is available")
    return None


def _tiers(options: BenchOptions, model: SyntheticModel) -> TierSetup | None:
    """The tier setup of ``--host-memory``/``--disk`` (None without them); a bad flag or disk
    path is a one-line :class:`UserInputError`."""
    if options.eviction is not None and options.eviction not in EVICTIONS:
        raise UserInputError(f"--eviction: {options.eviction}: one of {', '.join(EVICTIONS)}")
    if options.disk is None and options.host_memory is None:
        if options.eviction is not None:
            raise UserInputError("--eviction chooses the tier caches' replacement: it needs "
                                 "--host-memory and --disk")
        return None
    if options.disk is None or options.host_memory is None:
        raise UserInputError("--host-memory and --disk go together: the budget of the tables "
                             "in memory and the directory of the rest")
    cost = RowCost.of("float32", options.optimizer, False)
    total = sum(sum(cost.shard(t.rows, t.dim)) for t in model.tables(options.scale))
    budget = parse_host_memory(options.host_memory, total)
    setup = tier_setup(model, scale=options.scale, optimizer=options.optimizer,
                       batch=options.batch, budget=budget, disk=options.disk,
                       alpha=options.alpha, eviction=options.eviction or "lru")
    check_disk(setup, options.optimizer)
    return setup


def _mapped_ids(directory: Path) -> list[np.ndarray]:
    """The saved batches' ids per input, memory-mapped (read once, not held)."""
    meta = json.loads((directory / "meta.json").read_text())
    return [np.load(directory / f"ids_{i}.npy", mmap_mode="r") for i in range(int(meta["inputs"]))]


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


EMBTRAIN = "embtrain"
#: the sides in ``--precision``'s half dtype: embtrain's, and the static side it is compared
#: with under ``--dynamic`` or tiers (dynamic ÷ static at one dtype)
HALF_SIDES = (EMBTRAIN, "static")


def run_bench(
    options: BenchOptions,
    progress: Progress | None = None,
    topology: Topology | None = None,
    available: int | None = None,
) -> Outcome:
    """The whole benchmark; ``outcome.doc`` is the JSON document (``ran`` true or false)."""
    say = progress or (lambda _msg: None)
    if options.baseline == "tfra":
        tfra_python()  # before anything is generated
    if options.baseline == "fbgemm":
        fbgemm_python()
        check_optimizer(options.optimizer)
    outcome, _recipe, model = plan_and_check(options, topology, available)
    if "ran" in outcome.doc:
        return outcome
    doc = outcome.doc
    doc["environment"] = environment()
    count = options.distinct_batches
    with tempfile.TemporaryDirectory(prefix="embtrain-bench-") as tmp:
        workdir = Path(tmp)
        say(
            f"generating {count} distinct batch(es) of {options.batch} samples "
            f"(power-law ids, alpha {options.alpha})"
        )
        started = time.perf_counter()
        batches = generate(
            model.inputs(options.scale),
            model.numerical,
            options.batch,
            count,
            options.alpha,
            seed=options.seed,
        )
        batches.save(workdir / "batches")
        doc["batches"] = {
            "count": count,
            "bytes": batches.nbytes,
            "seconds": time.perf_counter() - started,
            "digest": digest(
                x
                for k in range(count)
                for x in (*(ids[k] for ids in batches.ids), batches.dense[k], batches.labels[k])
            ),
        }
        del batches
        doc["batches"]["on_disk"] = "tiers" in doc and batches_on_disk(doc["batches"]["bytes"])
        tier_storage = None
        setup = None
        if "tiers" in doc:
            setup = _tiers(options, model)
            assert setup is not None
            tier_storage = {name: [t.model_dump() for t in tiers]
                            for name, tiers in setup.storage().items()}
            say(f"measuring the disk under {options.disk}: random 4 KiB direct reads at 1, 4 "
                "and 16 in flight, sequential writes")
            from embtrain.storage.diskbench import measure_disk

            doc["tiers"]["disk_rates"] = measure_disk(options.disk, size=2 * GiB,
                                                      seconds=2.0).to_dict()
        sides = ["embtrain"] + ([options.baseline] if options.baseline != "none" else [])
        if options.baseline == "fbgemm":  # and torch.nn.EmbeddingBag on the same ids
            sides = ["embtrain", *PEER_SIDES]
            say("checking the fbgemm and torch peers against embtrain's step on a small case")
            doc["peer_check"] = verify_peers(options.seed)
        if options.dynamic and "static" not in sides:  # --dynamic: always against static
            sides.insert(1, "static")
        half = (side_precision(options.precision) if options.precision != "none"
                else ("float32", "none"))
        if options.precision != "none" and "float32_side_not_run" not in doc:
            sides.insert(1, FLOAT32_SIDE)  # the half side against float32 embtrain
        ranks = {"embtrain": options.processes, FLOAT32_SIDE: options.processes}
        reports: dict[str, dict[str, Any]] = {}
        medians: dict[str, list[float]] = {side: [] for side in sides}
        rounds: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for side, round_ in ((side, r) for r in range(options.repeat) for side in sides):
            say(
                f"{side}: building and running {options.warmup} warm-up + {options.steps} "
                f"timed steps in a child process"
                + (f" (round {round_ + 1} of {options.repeat})" if options.repeat > 1 else "")
            )
            spec = SideSpec(
                side=side,
                model=model.name,
                scale=options.scale,
                batch=options.batch,
                optimizer=options.optimizer,
                steps=options.steps,
                warmup=options.warmup,
                seed=options.seed,
                batches_dir=str(workdir / "batches"),
                out=str(workdir / f"{side}.json"),
                processes=ranks.get(side, 1),
                quantize=options.quantize if ranks.get(side, 1) > 1 else "none",
                device=options.device if side == "embtrain" else "cpu",
                # --precision's float32 side: embtrain's tables (dynamic, tiered) in float32;
                # --dynamic's and the tiers' static side: in embtrain's dtype, in memory
                dynamic=options.dynamic and side in (EMBTRAIN, FLOAT32_SIDE),
                storage=tier_storage if side in (EMBTRAIN, FLOAT32_SIDE) else None,
                batches_on_disk=doc["batches"]["on_disk"],  # both sides alike
                table_dtype=half[0] if side in HALF_SIDES else "float32",
                mixed_precision=half[1] if side in HALF_SIDES else "none",
                optimizer_state=options.optimizer_state if side in HALF_SIDES else None,
            )
            report = side_report(run_side(spec, workdir), options.batch)
            by_table = report.get("tiers", {}).pop("by_table", None)
            if setup is not None and by_table is not None and options.processes == 1:
                say("comparing the caches' hit rate with the offline oracle on the same batches")
                ids = _mapped_ids(workdir / "batches")
                report["tiers"]["oracle"] = cache_vs_oracle(
                    setup, [i.table for i in model.inputs(options.scale)], ids,
                    options.warmup, options.steps, by_table)
                del ids
            medians[side].append(report["step_ms"]["median"])
            rounds[side].append(round_figures(report))
            # Best of the rounds: other jobs on the machine only ever add time.
            if (
                side not in reports
                or report["step_ms"]["median"] < reports[side]["step_ms"]["median"]
            ):
                reports[side] = report
        for side in sides:
            reports[side]["round_step_medians_ms"] = medians[side]
    judge(doc, reports, rounds, options, model)
    return outcome

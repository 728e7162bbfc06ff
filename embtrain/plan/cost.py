"""The planner's cost model: bytes per row of a table and traffic per step.

Every constant the planner uses lives here so that the plan, its notes and the
docs say the same thing.

Memory of a shard holding ``rows`` rows and ``columns`` columns of a table:

* values: ``rows × columns × dtype bytes`` (float32 4, float16/bfloat16 2);
* optimizer state: ``rows × slots × state bytes`` (4: float32, the default; 2 for a
  half table with ``optimizer_state: table``) where slots per row are
  those the optimizer's spec declares (:mod:`embtrain.kernels.optimizer_spec`, the
  one the engine allocates from): sgd 0, adagrad ``columns``, rowwise_adagrad 1,
  adam and lazy_adam ``2 × columns``, ftrl ``2 × columns`` (a column shard keeps its
  own copy of per-row slots such as rowwise_adagrad's accumulator);
* metadata: 12 bytes per row (update count and last step, int32 each, and the
  int32 direct-address map the engine deduplicates with) and, for dynamic
  tables, at most 85 bytes per row of capacity for the hash index and the row
  bookkeeping (:data:`HASH_INDEX_BYTES_PER_ROW`).

Traffic per step (``B`` the global batch, ``h`` a feature's ids per sample,
``d`` the table's dim, ``e`` bytes per element on the wire: 4, or 2 / 1 with
``distributed.comm.quantize`` fp16 / int8), summed over all ranks, counting
only bytes that cross between ranks (a fraction ``(W-1)/W`` of each exchange):

* ids all-to-all: ``B × h × 8``, times ``W`` for column sharding (every column
  shard needs every id), none for data-parallel tables; plus bag lengths, 4 bytes
  per sample for a variable-length feature and per sample and owner (and concat
  position) for row sharding;
* embeddings forward and gradients backward: ``B × width × e`` each, where
  width is ``d`` (``d × h`` for the concat combiner); row sharding sends one
  partial sum per sample from each rank owning one of its ids, on average
  ``W × (1 - (1 - 1/W)^h)`` of them;
* all-reduce: a data-parallel table's per-row gradient sums and touched counts,
  ``rows × (d + 1) × 4`` per rank (a ring moves about twice that); the dense
  network is left out.

Each sharding mode computes these in its model in :mod:`embtrain.plan.shardings`, which the
planner and the mode's run-time strategy (``embtrain.embedding.sharding.<mode>``) share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES, slot_counts
from embtrain.recipe.kinds import DTYPE_BYTES

KiB = 2**10
MiB = 2**20
GiB = 2**30

SLOT_BYTES = 4
METADATA_BYTES_PER_ROW = 12
# a dynamic table's index: 2-4 16-byte entries per row (at most half full, a power of two),
# plus the row's key (8), free-list slot (8), pin (4) and live flag (1): at most 85 bytes
HASH_INDEX_BYTES_PER_ROW = 85
# A tiered dynamic table's key directory, per key of capacity besides its index: key,
# liveness, free-stack entry, pin, metadata and the store flag (embtrain.embedding.tiers).
DIRECTORY_BYTES_PER_ROW = 8 + 1 + 8 + 4 + 8 + 1


def index_slots(entries: int) -> int:
    """Slots of a hash index of ``entries`` keys: at least ``2 × entries``, a power of two,
    at least 16 (each slot 16 bytes)."""
    return 1 << max(4, math.ceil(math.log2(max(2 * entries, 2))))


def cache_rows(budget: int, row_bytes: int, capacity: int, dynamic: bool) -> int:
    """Cache rows ``budget`` bytes of memory tiers buy for a tiered table (shard) of
    ``capacity`` rows whose cached rows cost ``row_bytes``: a dynamic table's key directory
    comes first (at least one row)."""
    if dynamic:  # the key directory of every key stays in memory
        budget -= directory_bytes(capacity)
    return max(1, budget // row_bytes)


def directory_bytes(capacity: int) -> int:
    """Memory the key directory of a tiered dynamic table of ``capacity`` keys takes: its
    index and per-key bookkeeping (it stays in memory whatever the tiers)."""
    return 16 * index_slots(capacity) + capacity * DIRECTORY_BYTES_PER_ROW
ID_BYTES = 8
LENGTH_BYTES = 4  # a bag length on the wire (int32)
WIRE_BYTES = {"none": 4, "fp16": 2, "int8": 1}
GRADIENT_BYTES = 4
VARIABLE_HOTNESS = 10
TINY_TABLE_BYTES = 1 * MiB

# float32 optimizer slots per row: (per column, per row), from the optimizers' spec.
OPTIMIZER_SLOTS = {name: slot_counts(name) for name in OPTIMIZER_NAMES}


@dataclass(frozen=True)
class RowCost:
    """Bytes of one table row, split so that any column range can be priced."""

    value_per_column: int
    slots_per_column: int
    slots_per_row: int
    metadata_per_row: int
    slot_bytes: int = SLOT_BYTES

    @classmethod
    def of(cls, dtype: str, optimizer: str, dynamic: bool,
           state_dtype: str = "float32") -> RowCost:
        """The row cost of a table with this dtype, sparse optimizer and kind, its optimizer
        state in ``state_dtype``."""
        per_column, per_row = slot_counts(optimizer)  # the registry as it is now
        metadata = METADATA_BYTES_PER_ROW + (HASH_INDEX_BYTES_PER_ROW if dynamic else 0)
        return cls(DTYPE_BYTES[dtype], per_column, per_row, metadata, DTYPE_BYTES[state_dtype])

    def shard(self, rows: int, columns: int) -> tuple[int, int, int]:
        """(values, optimizer state, metadata) bytes of ``rows`` rows × ``columns`` columns."""
        values = rows * columns * self.value_per_column
        optimizer = rows * (self.slots_per_column * columns + self.slots_per_row) * self.slot_bytes
        return values, optimizer, rows * self.metadata_per_row


def expected_owners(hotness: int, world_size: int) -> float:
    """Expected number of distinct ranks owning ``hotness`` ids spread by key modulo ``world_size``."""
    if world_size <= 1:
        return 1.0 if hotness > 0 else 0.0
    return world_size * (1.0 - (1.0 - 1.0 / world_size) ** hotness)

# Power-law exponent of the ids for expected cache hit rates when the data says nothing
# (embtrain gen-data's and bench's default, ``GenConfig.alpha``).
DEFAULT_ID_ALPHA = 1.05

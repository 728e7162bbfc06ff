"""A shard's table state on the wire: what each owner sends rank 0 when a table is exported
(keys, values, slots, metadata and a dynamic table's admission state, in one packed buffer).
Values and slots travel in their stored form (float32, or a half table's uint16 patterns; the
buffer names the dtypes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embtrain.comm.wire import Cursor, pack
from embtrain.embedding.engine import TableState
from embtrain.embedding.halves import DTYPE_CODES
from embtrain.embedding.optimizers import SlotSpec


def pack_state(s: TableState, slot_names: Sequence[str]) -> bytes:
    """One shard's state (or key range) as bytes for a gather to rank 0."""
    assert s.update_count is not None and s.last_step is not None
    adm_keys = s.extra.get("admission_keys", np.empty(0, np.int64))
    adm_counts = s.extra.get("admission_counts", np.empty(0, np.int64))
    bloom = s.extra.get("bloom", np.empty(0, np.uint8))
    dtypes = np.array([DTYPE_CODES[s.dtype], DTYPE_CODES[s.state_dtype]], np.int64)
    arrays = [np.array([s.keys.shape[0]], np.int64), dtypes, s.keys, s.values,
              *(s.slots[n] for n in slot_names), s.update_count, s.last_step,
              np.array([adm_keys.size, int("admission_keys" in s.extra), bloom.size,
                        int("bloom" in s.extra)], np.int64),
              adm_keys.astype(np.int64), adm_counts.astype(np.int64), bloom]
    return pack([np.ascontiguousarray(a) for a in arrays]).tobytes()


def unpack_state(data: bytes, cols: int, slots_of: Sequence[SlotSpec]) -> TableState:
    """A shard's state from :func:`pack_state`'s bytes (``cols`` columns wide)."""
    cur = Cursor(np.frombuffer(data, np.uint8))
    n = int(cur.take(np.int64, 1)[0])
    vcode, scode = cur.take(np.int64, 2).tolist()
    names = {code: name for name, code in DTYPE_CODES.items()}
    vtype = np.float32 if vcode == 0 else np.uint16
    stype = np.float32 if scode == 0 else np.uint16
    keys = cur.take(np.int64, n)
    values = cur.take(vtype, n * cols).reshape(n, cols)
    slots = {}
    for spec in slots_of:
        slots[spec.name] = (cur.take(stype, n) if spec.per_row
                            else cur.take(stype, n * cols).reshape(n, cols))
    counts, last = cur.take(np.int64, n), cur.take(np.int64, n)
    n_adm, has_adm, n_bloom, has_bloom = cur.take(np.int64, 4).tolist()
    extra = {}
    adm_keys, adm_counts = cur.take(np.int64, n_adm), cur.take(np.int64, n_adm)
    if has_adm:
        extra = {"admission_keys": adm_keys, "admission_counts": adm_counts}
    bloom = cur.take(np.uint8, n_bloom)
    if has_bloom:
        extra["bloom"] = bloom
    return TableState(keys, values, slots, counts, last, extra, names[vcode], names[scode])


__all__ = ["pack_state", "unpack_state"]

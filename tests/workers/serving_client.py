"""Score Parquet files with an `embtrain export` SavedModel using TensorFlow and pyarrow only.

    python -I tests/workers/serving_client.py EXPORT_DIR 'eval/*.parquet' OUT.npy [EXPORT_DIR GLOB OUT ...]

``OUT.npy`` gets the ``probability`` output; ``OUT.npz`` every output by name (several labels).

``import embtrain`` is blocked in this process (a meta path finder refuses it), so the
SavedModel must hold everything from the raw columns to the probability.
"""

from __future__ import annotations

import glob
import sys


class _Blocked:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "embtrain" or name.startswith("embtrain."):
            raise ImportError(f"{name} is blocked in this process")


sys.meta_path.insert(0, _Blocked())


def feed(signature, table):
    """The signature's inputs from an Arrow table of raw columns: ``C`` (a column),
    ``C_values`` / ``C_lengths`` (a list column), ``C_null`` (which rows' id or list is null)
    and ``C_values_null`` (which list elements are null); a null is sent as 0 or "" beside
    its mask."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import tensorflow as tf

    inputs = {}
    for name, spec in signature.structured_input_signature[1].items():
        kind, base = "", name
        if name not in table.column_names:
            for suffix in ("_values_null", "_null", "_values", "_lengths"):
                if name.endswith(suffix) and name[:-len(suffix)] in table.column_names:
                    kind, base = suffix, name[:-len(suffix)]
                    break
        column = table.column(base).combine_chunks()
        if kind in ("_values", "_values_null"):
            column = column.flatten()
        if kind in ("_null", "_values_null"):
            inputs[name] = tf.constant(column.is_null().to_numpy(zero_copy_only=False))
            continue
        if kind == "_lengths":
            column = pc.fill_null(pc.list_value_length(column), 0)
        if spec.dtype == tf.string:
            inputs[name] = tf.constant([v if v is not None else "" for v in column.to_pylist()],
                                       tf.string)
        else:
            if column.null_count and not pa.types.is_floating(column.type):
                column = pc.fill_null(column, 0)
            values = column.to_numpy(zero_copy_only=False).astype(spec.dtype.as_numpy_dtype)
            inputs[name] = tf.constant(np.asarray(values))
    return inputs


def main(argv: list[str]) -> None:
    try:
        import embtrain  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("embtrain is importable: the check would prove nothing")
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    for export, pattern, out in zip(argv[0::3], argv[1::3], argv[2::3], strict=True):
        model = tf.saved_model.load(export)
        serve = model.signatures["serving_default"]
        table = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(pattern))])
        result = serve(**feed(serve, table))
        if out.endswith(".npz"):
            np.savez(out, **{name: value.numpy() for name, value in result.items()})
        else:
            np.save(out, result["probability"].numpy())


if __name__ == "__main__":
    main(sys.argv[1:])

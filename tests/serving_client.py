"""Score Parquet files with an `embtrain export` SavedModel using TensorFlow and pyarrow only.

    python -I tests/serving_client.py EXPORT_DIR 'eval/*.parquet' OUT.npy [EXPORT_DIR GLOB OUT ...]

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
    """The signature's inputs from an Arrow table of raw columns."""
    import pyarrow.compute as pc
    import tensorflow as tf

    inputs = {}
    for name, spec in signature.structured_input_signature[1].items():
        kind = name.rsplit("_", 1)[-1] if name not in table.column_names else ""
        column = table.column(name.rsplit("_", 1)[0] if kind else name).combine_chunks()
        if kind == "values":
            column = column.flatten()
        elif kind == "lengths":
            column = pc.list_value_length(column)
        if spec.dtype == tf.string:
            inputs[name] = tf.constant(column.to_pylist(), tf.string)
        else:
            values = column.to_numpy(zero_copy_only=False).astype(spec.dtype.as_numpy_dtype)
            inputs[name] = tf.constant(values)
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

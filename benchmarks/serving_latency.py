"""Latency of an `embtrain export` SavedModel, loaded with TensorFlow alone.

    python benchmarks/serving_latency.py EXPORT_DIR 'data/eval/*.parquet' [--batches 1,1024]
        [--calls 300]

For each batch size: the inputs of ``calls`` different batches (consecutive rows of the files)
are built beforehand, then ``serving_default`` is called on them one after the other after a
warm-up; prints p50 and p99 of the call's wall time (what a server spends in the model).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "workers"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("data")
    parser.add_argument("--batches", default="1,1024")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf
    from serving_client import feed

    model = tf.saved_model.load(args.export)
    serve = model.signatures["serving_default"]
    files = sorted(glob.glob(args.data))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    report = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        calls = min(args.calls, table.num_rows // batch)
        inputs = [feed(serve, table.slice(i * batch, batch)) for i in range(calls)]
        for x in inputs[:10]:  # warm-up
            serve(**x)
        times = []
        for x in inputs:
            t0 = time.perf_counter()
            serve(**x)["probability"].numpy()
            times.append(time.perf_counter() - t0)
        ms = np.array(times) * 1e3
        report[batch] = {"calls": calls, "p50_ms": float(np.percentile(ms, 50)),
                         "p99_ms": float(np.percentile(ms, 99)),
                         "rows_per_s": float(batch * calls / sum(times))}
        print(f"batch {batch}: {calls} calls, p50 {report[batch]['p50_ms']:.2f} ms, "
              f"p99 {report[batch]['p99_ms']:.2f} ms, {report[batch]['rows_per_s']:,.0f} rows/s")
    print(json.dumps(report))


if __name__ == "__main__":
    main()

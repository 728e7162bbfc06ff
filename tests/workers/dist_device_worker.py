"""One rank of the device-array exchange test (started by tests/test_device.py).

Rank r sends ``r + 1 + k`` rows to rank k, rows ``[r, k, i, 0.5]``; it writes OUT/rank-R.json
with what it received, whether this Horovod has NCCL, and the bytes it counted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from embtrain.comm import make_comm


def main() -> None:
    out = Path(sys.argv[1])
    comm = make_comm()
    r = comm.rank
    counts = [r + 1 + k for k in range(comm.size)]
    send = np.concatenate([np.array([[r, k, i, 0.5] for i in range(c)], np.float32)
                           for k, c in enumerate(counts)])
    got = comm.alltoallv_rows(send, counts, "forward")
    (out / f"rank-{r}.json").write_text(json.dumps({
        "received": got.tolist(), "module": type(got).__module__,
        "nccl": comm.nccl_built(), "sent": comm.traffic.sent.get("forward", 0)}))
    comm.shutdown()


if __name__ == "__main__":
    main()

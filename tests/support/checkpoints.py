"""Checkpoint surgery for tests: a checkpoint that lies consistently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def rewrite_member(checkpoint: Path, rel: str, array: np.ndarray, fingerprint: bool) -> None:
    """Replace one array of a checkpoint and make its manifest entry agree (the checksum and
    shape; and the content fingerprint when ``fingerprint``): a consistent lie."""
    from embtrain.checkpoint.bundle_format import FileEntry, content_fingerprint, hash_file

    np.save(checkpoint / rel, array)
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["files"]:
        if entry["path"] == rel:
            entry.update(sha256=hash_file(checkpoint / rel), bytes=(checkpoint / rel).stat().st_size,
                         dtype=array.dtype.name, shape=list(array.shape))
            entry.pop("crc32", None)
    if fingerprint:
        entries = [FileEntry(e["path"], e["sha256"], e["bytes"], e.get("dtype"),
                             None if e.get("shape") is None else tuple(e["shape"]), e.get("crc32"))
                   for e in manifest["files"]]
        manifest["content_fingerprint"] = content_fingerprint(entries)
    manifest_path.write_text(json.dumps(manifest))

"""Storage tiers below the first: the disk tier's file, its prefetcher and disk checks."""

from embtrain.storage.disk import RowFile, RowLayout, Rows, TierFileError, max_file_bytes
from embtrain.storage.store import DiskStore, open_row_store

__all__ = ["DiskStore", "RowFile", "RowLayout", "Rows", "TierFileError", "max_file_bytes",
           "open_row_store"]

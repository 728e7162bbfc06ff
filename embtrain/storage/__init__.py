"""Storage tiers below the first: the registry of tier kinds, the disk tier's file, its
prefetcher and disk checks."""

from embtrain.storage.disk import RowFile, RowLayout, Rows, TierFileError, max_file_bytes
from embtrain.storage.kinds import ROW_STORES, open_store
from embtrain.storage.store import DiskStore, open_row_store

__all__ = ["ROW_STORES", "DiskStore", "RowFile", "RowLayout", "Rows", "TierFileError",
           "max_file_bytes", "open_row_store", "open_store"]

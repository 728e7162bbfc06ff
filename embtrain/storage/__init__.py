"""Storage tiers below the first: the disk tier's file, its prefetcher and disk checks."""

from embtrain.storage.disk import RowFile, RowLayout, Rows, TierFileError, max_file_bytes

__all__ = ["RowFile", "RowLayout", "Rows", "TierFileError", "max_file_bytes"]

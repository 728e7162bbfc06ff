"""Virtual shards of a training epoch: which rows make each global batch, and which a rank reads.

The epoch's rows (the split's files concatenated in the epoch's file order) are cut into
``V = data.shards`` contiguous *shards*, shard ``v`` holding rows ``[v*R//V, (v+1)*R//V)`` of
the ``R`` rows. Every full global batch of ``B`` rows takes the next ``b = B/V`` rows of each
shard's own (shuffled) stream, shard 0's first, then shard 1's, and so on; the last, partial
batch (``last_batch: keep``) takes what each shard has left. ``V`` divides ``B``, so an epoch
has ``R // B`` full batches whatever ``V`` is, as with one shard.

A rank keeps rows ``[r*S//w, (r+1)*S//w)`` of each global batch of ``S`` rows (the rule the
dense and the sparse side share), so it reads only the shards whose pieces fall in that range:
with ``w`` dividing ``V``, exactly ``V/w`` of them. Nothing here depends on ``w`` except that
choice: the batches are the same for every process count.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardLayout"]


@dataclass(frozen=True)
class ShardLayout:
    """The shard arithmetic of one epoch of ``rows`` rows."""

    rows: int
    shards: int
    batch_size: int
    drop_last: bool

    def __post_init__(self) -> None:
        if self.shards < 1 or self.batch_size % self.shards:
            raise ValueError(f"shards {self.shards} must divide batch_size {self.batch_size}")

    @property
    def shard_batch(self) -> int:
        """Rows each shard gives to a full batch."""
        return self.batch_size // self.shards

    @property
    def full_batches(self) -> int:
        return self.rows // self.batch_size

    def batches(self) -> int:
        """Global batches of the epoch (the same as without shards)."""
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def shard_rows(self, shard: int) -> tuple[int, int]:
        """Epoch rows ``[lo, hi)`` of ``shard``."""
        return shard * self.rows // self.shards, (shard + 1) * self.rows // self.shards

    def pieces(self, batch: int) -> list[int]:
        """Rows each shard gives to global batch ``batch``, in shard order."""
        if batch < self.full_batches:
            return [self.shard_batch] * self.shards
        used = self.full_batches * self.shard_batch
        return [hi - lo - used for lo, hi in map(self.shard_rows, range(self.shards))]

    def rank_pieces(self, batch: int, rank: int, world_size: int) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)``: rank ``rank``'s rows of global batch ``batch`` as ranges
        of the shards' pieces of it, in batch order."""
        sizes = self.pieces(batch)
        total = sum(sizes)
        lo, hi = rank * total // world_size, (rank + 1) * total // world_size
        out, at = [], 0
        for shard, n in enumerate(sizes):
            a, c = max(lo, at), min(hi, at + n)
            if a < c:
                out.append((shard, a - at, c - at))
            at += n
        return out

"""A paged KV cache: PagedAttention's memory layout in plain PyTorch.

Chapter "Inference: the KV cache and the cost of attention", section "PagedAttention's idea".
Instead of a contiguous ``max_len`` slab per request, one pool of fixed-size *blocks* of
``block_size`` positions is shared; each sequence owns a *block table* (its blocks, in order),
gets a block only when it crosses into a new one and returns them when it finishes (Kwon et
al., 2023, vLLM), so it wastes at most one partly filled block.

Shapes: ``h_kv`` key/value heads, ``d`` head dimension, ``n`` new positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import positive_int, tensor

__all__ = ["OutOfBlocksError", "PagedKVCache"]


class OutOfBlocksError(RuntimeError):
    """The block pool has too few free blocks for the requested append."""


class PagedKVCache:
    """A pool of ``num_blocks`` KV blocks shared by many sequences, each with its own block table.

    ``keys`` and ``values`` are ``(num_blocks, h_kv, block_size, d)`` tensors of ``dtype`` (a
    floating-point type) on ``device``; sequences are named by any hashable id::

        cache = PagedKVCache(num_blocks=8, block_size=4,
                             num_kv_heads=2, head_dim=16)
        cache.append("a", k, v)           # k, v: (h_kv, n, d)
        keys, values = cache.gather("a")  # (h_kv, length, d), contiguous
        cache.free("a")                   # its blocks go back to the pool
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = positive_int("head_dim", head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        shape = (self.num_blocks, self.num_kv_heads, self.block_size, self.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (blocks, h_kv, block, d)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        # Hand out low block ids first (pop from the end of a reversed list).
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self.block_tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}

    # ------------------------------------------------------------------ bookkeeping
    @property
    def num_free_blocks(self) -> int:
        """Blocks currently in the pool, not owned by any sequence."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks owned by some sequence."""
        return self.num_blocks - len(self._free)

    def blocks_needed(self, length: int) -> int:
        """Blocks a sequence of ``length`` positions occupies: ``ceil(length / block_size)``."""
        return -(-positive_int("length", length, allow_zero=True) // self.block_size)

    def used_positions(self) -> int:
        """Positions actually filled, summed over all sequences."""
        return sum(self.lengths.values())

    def allocated_positions(self) -> int:
        """Positions reserved in owned blocks (filled or not)."""
        return self.num_used_blocks * self.block_size

    # ------------------------------------------------------------------ operations
    def append(self, seq_id: object, key: Tensor, value: Tensor) -> None:
        """Append ``key``/``value`` ``(h_kv, n, d)`` (``n >= 0``) to sequence ``seq_id``,
        allocating blocks on demand; :class:`OutOfBlocksError` (nothing written) if the pool has
        too few free blocks."""
        try:
            hash(seq_id)
        except TypeError:
            raise TypeError(f"seq_id must be hashable, got {type(seq_id).__name__}") from None
        tensor("key", key, kind="float")
        tensor("value", value, kind="float")
        expected = (self.num_kv_heads, self.head_dim)
        if key.dim() != 3 or value.shape != key.shape or (key.shape[0], key.shape[2]) != expected:
            raise ValueError(
                f"key and value must both have shape (h_kv={self.num_kv_heads}, n, "
                f"d={self.head_dim}), got key {tuple(key.shape)} and value {tuple(value.shape)}"
            )
        n = key.shape[1]
        table = self.block_tables.get(seq_id, [])
        length = self.lengths.get(seq_id, 0)
        missing = self.blocks_needed(length + n) - len(table)
        if missing > len(self._free):  # raised before any change
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {missing} more block(s) of {self.block_size} "
                f"positions to grow from {length} to {length + n}, but only "
                f"{len(self._free)} of {self.num_blocks} blocks are free; free a finished "
                "sequence or make the pool larger"
            )
        # The blocks are taken only after the copy succeeded (a copy that fails midway changes
        # only positions no sequence has filled, which gather() never reads).
        taken = self._free[len(self._free) - missing :][::-1]  # what pop() would give
        owned, table = table, table + taken
        # Copy block by block: position p lives in block table[p // block_size] at slot
        # p % block_size.
        written = 0
        while written < n:
            pos = length + written
            block, slot = table[pos // self.block_size], pos % self.block_size
            take = min(self.block_size - slot, n - written)
            self.keys[block, :, slot : slot + take] = key[:, written : written + take]
            self.values[block, :, slot : slot + take] = value[:, written : written + take]
            written += take
        if missing:
            del self._free[len(self._free) - missing :]
        owned += taken  # the same list object: a table read earlier keeps growing
        self.block_tables[seq_id] = owned
        self.lengths[seq_id] = length + n

    def gather(self, seq_id: object) -> tuple[Tensor, Tensor]:
        """The keys and values of ``seq_id``, contiguous: two ``(h_kv, length, d)`` tensors."""
        if seq_id not in self.block_tables:
            raise KeyError(
                f"seq_id {seq_id!r} is not a sequence of this cache; known: "
                f"{list(self.block_tables)}"
            )
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long, device=self.keys.device)
        length = self.lengths[seq_id]
        h, d = self.num_kv_heads, self.head_dim

        def contiguous(pool: Tensor) -> Tensor:
            blocks = pool[table]  # (n_blocks, h_kv, block, d)
            flat = blocks.transpose(0, 1).reshape(h, -1, d)  # (h_kv, n_blocks * block, d)
            return flat[:, :length]  # (h_kv, length, d)

        return contiguous(self.keys), contiguous(self.values)

    def free(self, seq_id: object) -> None:
        """Return the blocks of ``seq_id`` to the pool and forget the sequence."""
        if seq_id not in self.block_tables:
            raise KeyError(
                f"seq_id {seq_id!r} is not a sequence of this cache; known: "
                f"{list(self.block_tables)}"
            )
        # Push back in reverse so that a new sequence reuses them in the same order.
        self._free.extend(reversed(self.block_tables.pop(seq_id)))
        del self.lengths[seq_id]

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"sequences={len(self.block_tables)}, free_blocks={self.num_free_blocks})"
        )

"""Shard rules for a tensor-parallel rank's open of a state dict:
``reg.get_state_dict(prefix, "torch", shard=memcuda.Shard(rank, world, rules))``."""
from __future__ import annotations

import ctypes
from typing import Any, Mapping, Optional

from .errors import InvalidArgument

WHOLE = -2**31  # MEMCUDA_SHARD_WHOLE


class ShardRuleC(ctypes.Structure):
    """memcuda_shard_rule."""
    _fields_ = [("pattern", ctypes.c_char_p), ("dim", ctypes.c_int)]


class Shard:
    """Rank `rank` of `world`: each tensor whose name (relative to the prefix)
    matches a glob of `rules` (fnmatch, in dict order, the first match wins)
    is opened as its shard along that dimension, a zero-copy view; a negative
    dimension counts from the end (-1: the last, as in numpy), None opens it
    whole, as are names no rule matches. A rule that matches nothing, or only
    names an earlier rule took, raises InvalidArgument unless allow_unused."""

    def __init__(self, rank: int, world: int, rules: Mapping[str, Optional[int]], allow_unused: bool = False) -> None:
        self.rank, self.world, self.allow_unused = rank, world, allow_unused
        self.rules = dict(rules)
        for pattern, dim in self.rules.items():
            if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or not WHOLE < dim < 2**31):
                raise InvalidArgument(f"Shard rule {pattern!r}: dimension {dim!r} is not an int or None")

    def c_rules(self) -> Any:
        arr = (ShardRuleC * max(len(self.rules), 1))()
        for i, (pattern, dim) in enumerate(self.rules.items()):
            arr[i] = ShardRuleC(pattern.encode(), WHOLE if dim is None else dim)
        return arr

    def open(self, lib: Any, reg: Any, prefix: str, arr: Any, n: Any) -> int:
        """memcuda_open_state_dict_sharded into (arr, n), as memcuda_open_state_dict."""
        return lib.memcuda_open_state_dict_sharded(reg, prefix.encode(), self.rank, self.world, self.c_rules(),
                                                   len(self.rules), int(self.allow_unused), arr, n)

    def __repr__(self) -> str:
        return f"memcuda.Shard({self.rank}, {self.world}, {self.rules!r})"

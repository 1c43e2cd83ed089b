"""`with obj:` for the package's handles: leaving the block calls the method
the class names in _end (close, release, abort, detach)."""
from typing import Any, TypeVar

S = TypeVar("S", bound="Scoped")


class Scoped:
    __slots__ = ()
    _end = "close"

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        getattr(self, self._end)()

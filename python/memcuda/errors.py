"""The exception tree of memcuda, mirroring the C++ ``memcuda::Error`` tree.

Every class has ``code`` (the C ABI's ``MEMCUDA_ERR_*`` value) and ``name``
(the stable wire name that ``memcuda::Error::code()`` returns). Some classes
also derive from the matching built-in exception, so that generic handlers
work: ``InvalidArgument`` is a ``ValueError``, ``NotFound`` a ``LookupError``,
``ConnectionError`` and ``TimeoutError`` their built-in namesakes.
"""
from __future__ import annotations

import builtins
from typing import Callable, Dict, NoReturn, Type, TypeVar

from ._lib import lib

E = TypeVar("E", bound=type)


BY_CODE: Dict[int, Type["MemcudaError"]] = {}


def _code(code: int) -> Callable[[Type[E]], Type[E]]:
    """Gives a class its C ABI code and the wire name libmemcuda_c has for it
    (memcuda_error_name: the one table of names), and files it in BY_CODE."""
    def register(cls: Type[E]) -> Type[E]:
        cls.code, cls.name = code, lib.memcuda_error_name(code).decode()
        BY_CODE[code] = cls
        return cls
    return register


@_code(1)
class MemcudaError(Exception):
    """Root of every error raised by memcuda (C++: ``memcuda::Error``)."""

    code: int
    name: str


@_code(2)
class InvalidArgument(MemcudaError, ValueError):
    """A caller-supplied value is malformed (bad name, shape, dtype, range...)."""


@_code(3)
class NotFound(MemcudaError, LookupError):
    """No tensor of that name (or it was removed)."""


@_code(4)
class AlreadyExists(MemcudaError):
    """create() of a name that is already registered."""


@_code(5)
class TypeMismatch(MemcudaError, TypeError):
    """A tensor opened or written with a dtype (or shape) that is not the stored one."""


@_code(6)
class StaleHandle(MemcudaError):
    """The name was removed (and maybe re-created) since the handle was opened."""


@_code(7)
class BudgetExceeded(MemcudaError):
    """An allocation would take a device over its byte budget."""


@_code(8)
class Lost(MemcudaError):
    """The tensor's memory died with its allocator and nobody held it."""


@_code(9)
class NotLeader(MemcudaError):
    """No allocator of record answered in time. The message says whether nobody
    holds the lease (start one: ``memcuda serve``) or its holder did not serve."""


@_code(10)
class Unavailable(MemcudaError):
    """Another node, or a backend/device this process cannot use."""


@_code(11)
class InternalError(MemcudaError):
    """A bug or an impossible state inside mem-cuda; please report it."""


@_code(12)
class ProtocolError(InvalidArgument):
    """A name, shape or record that does not follow docs/protocol.md."""


@_code(13)
class CudaError(MemcudaError):
    """A CUDA call failed; ``cuda_status`` is the cudaError_t (-1 when unknown)."""
    cuda_status: int = -1


@_code(14)
class RedisError(MemcudaError):
    """Anything that went wrong talking to Redis."""


@_code(15)
class ConnectionError(RedisError, builtins.ConnectionError):  # noqa: A001 - mirrors memcuda::ConnectionError
    """Could not connect to Redis, or the connection broke for good."""


@_code(16)
class AuthError(ConnectionError):
    """Redis refused the credentials (WRONGPASS, NOAUTH, NOPERM)."""


@_code(17)
class TimeoutError(RedisError, builtins.TimeoutError):  # noqa: A001 - mirrors memcuda::TimeoutError
    """A Redis command or a request to the allocator of record timed out."""


@_code(18)
class ReplyError(RedisError):
    """Redis answered with an error reply."""


@_code(19)
class OutOfMemory(MemcudaError, MemoryError):
    """Host memory ran out inside the library."""


@_code(20)
class UnknownError(MemcudaError):
    """A failure the library could not classify (a bug: please report it)."""


@_code(21)
class NotZeroCopy(Unavailable):
    """Zero copy cannot be had for what was asked (a device that cannot reach
    the tensor's memory, host code asking for device memory, a dtype the
    framework cannot view). The message says why and what to do; nothing is
    copied unless the call is given ``allow_copy=True`` (docs/python.md,
    "Zero copy or an error")."""


def raise_last(status: int) -> NoReturn:
    """Raises the exception of this thread's last failed C call (status: its return value)."""
    code = lib.memcuda_last_error_code() or status
    msg = (lib.memcuda_last_error_message() or b"").decode("utf-8", "replace")
    cls = BY_CODE.get(code, MemcudaError)
    err = cls(msg)
    if cls is CudaError:
        err.cuda_status = lib.memcuda_last_error_cuda_status()
    raise err


def check(status: int) -> None:
    """Raises for a non-zero status of a C call."""
    if status != 0:
        raise_last(status)


# Python-side errors without a C code of their own: they carry their
# parent's code and wire name.
class LayoutMismatch(InvalidArgument):
    """A module's parameters and buffers do not match the tensors under a
    prefix (``memcuda.torch.attach``/``publish``). ``missing`` (in the module,
    not under the prefix), ``unexpected`` (under the prefix, not in the
    module) and ``mismatched`` (shape or dtype, one line each) list every
    difference; the message lists them all."""

    def __init__(self, message: str, missing=(), unexpected=(), mismatched=()) -> None:
        super().__init__(message)
        self.missing, self.unexpected, self.mismatched = list(missing), list(unexpected), list(mismatched)


class ZeroCopyWarning(RuntimeWarning):
    """A copy was made in place of zero copy because the call asked for one
    (``allow_copy=True``); it is counted in ``Registry.stats()`` (``copies``,
    ``copied_bytes``)."""

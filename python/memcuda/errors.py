"""The exception tree of memcuda, mirroring the C++ ``memcuda::Error`` tree.

Every class has ``code`` (the C ABI's ``MEMCUDA_ERR_*`` value) and ``name``
(the stable wire name that ``memcuda::Error::code()`` returns). Some classes
also derive from the matching built-in exception, so that generic handlers
work: ``InvalidArgument`` is a ``ValueError``, ``NotFound`` a ``LookupError``,
``ConnectionError`` and ``TimeoutError`` their built-in namesakes.
"""
from __future__ import annotations

import builtins
from typing import Dict, NoReturn, Type

from ._lib import lib


class MemcudaError(Exception):
    """Root of every error raised by memcuda (C++: ``memcuda::Error``)."""

    code: int = 1
    name: str = "error"


class InvalidArgument(MemcudaError, ValueError):
    """A caller-supplied value is malformed (bad name, shape, dtype, range...)."""
    code, name = 2, "invalid_argument"


class NotFound(MemcudaError, LookupError):
    """No tensor of that name (or it was removed)."""
    code, name = 3, "not_found"


class AlreadyExists(MemcudaError):
    """create() of a name that is already registered."""
    code, name = 4, "already_exists"


class TypeMismatch(MemcudaError, TypeError):
    """A tensor opened or written with a dtype (or shape) that is not the stored one."""
    code, name = 5, "type_mismatch"


class StaleHandle(MemcudaError):
    """The name was removed (and maybe re-created) since the handle was opened."""
    code, name = 6, "stale_handle"


class BudgetExceeded(MemcudaError):
    """An allocation would take a device over its byte budget."""
    code, name = 7, "budget_exceeded"


class Lost(MemcudaError):
    """The tensor's memory died with its allocator and nobody held it."""
    code, name = 8, "lost"


class NotLeader(MemcudaError):
    """No allocator of record answered in time (start one: ``memcuda serve``)."""
    code, name = 9, "not_leader"


class Unavailable(MemcudaError):
    """Another node, or a backend/device this process cannot use."""
    code, name = 10, "unavailable"


class InternalError(MemcudaError):
    """A bug or an impossible state inside mem-cuda; please report it."""
    code, name = 11, "internal"


class ProtocolError(InvalidArgument):
    """A name, shape or record that does not follow docs/protocol.md."""
    code, name = 12, "protocol_error"


class CudaError(MemcudaError):
    """A CUDA call failed; ``cuda_status`` is the cudaError_t (-1 when unknown)."""
    code, name = 13, "cuda_error"
    cuda_status: int = -1


class RedisError(MemcudaError):
    """Anything that went wrong talking to Redis."""
    code, name = 14, "redis_error"


class ConnectionError(RedisError, builtins.ConnectionError):  # noqa: A001 - mirrors memcuda::ConnectionError
    """Could not connect to Redis, or the connection broke for good."""
    code, name = 15, "redis_connection"


class AuthError(ConnectionError):
    """Redis refused the credentials (WRONGPASS, NOAUTH, NOPERM)."""
    code, name = 16, "redis_auth"


class TimeoutError(RedisError, builtins.TimeoutError):  # noqa: A001 - mirrors memcuda::TimeoutError
    """A Redis command or a request to the allocator of record timed out."""
    code, name = 17, "timeout"


class ReplyError(RedisError):
    """Redis answered with an error reply."""
    code, name = 18, "redis_reply"


class OutOfMemory(MemcudaError, MemoryError):
    """Host memory ran out inside the library."""
    code, name = 19, "out_of_memory"


class UnknownError(MemcudaError):
    """A failure the library could not classify (a bug: please report it)."""
    code, name = 20, "unknown"


BY_CODE: Dict[int, Type[MemcudaError]] = {
    c.code: c for c in (MemcudaError, InvalidArgument, NotFound, AlreadyExists, TypeMismatch, StaleHandle,
                        BudgetExceeded, Lost, NotLeader, Unavailable, InternalError, ProtocolError, CudaError,
                        RedisError, ConnectionError, AuthError, TimeoutError, ReplyError, OutOfMemory, UnknownError)
}


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

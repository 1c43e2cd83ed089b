"""PyTorch modules in the registry: a trainer ``publish``es a module's weights
under a prefix, inference workers ``attach`` their modules to them, zero copy.

    # trainer
    v = memcuda.torch.publish(model, reg, "llama/")          # first call creates, later ones copy in place
    # each worker (another process), holding a module of the same architecture
    att = memcuda.torch.attach(model, reg, "llama/")         # parameters become views of the shared tensors
    v = att.wait(timeout=10)                                 # the next in-place publish, stream-ordered

A module's entries are its state-dict names: every parameter and every
persistent buffer (non-persistent buffers stay the process's own). Tied
weights (one tensor under two names) are published under both names, as
``state_dict()`` has them; attach binds the tied tensor once (to the first
name's registry tensor, in state-dict order), so the tie survives and the
other name's registry tensor, equal by construction, is checked but unused.

Import it as ``memcuda.torch`` (``import memcuda.torch``); the package does
not import torch unless asked to.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn

from memcuda import dtypes
from memcuda.errors import AlreadyExists, InvalidArgument, LayoutMismatch, NotFound
from memcuda.registry import Registry
from memcuda._scoped import Scoped
from memcuda.tensor import Stream, Tensor, stream_ptr, torch_views

__all__ = ["publish", "attach", "Attachment"]

MODES = ("inplace", "ab")
Layout = Dict[str, Tuple[Tuple[int, ...], str]]  # name -> (shape, torch dtype name)


class _Member(NamedTuple):
    """One state-dict entry of a module: its name and where it lives."""
    name: str
    owner: torch.nn.Module
    attr: str
    is_param: bool

    def get(self) -> torch.Tensor:
        return (self.owner._parameters if self.is_param else self.owner._buffers)[self.attr]

    def set(self, value: torch.Tensor) -> None:
        (self.owner._parameters if self.is_param else self.owner._buffers)[self.attr] = value


def _members(module: torch.nn.Module) -> List[_Member]:
    """The module's state-dict entries in ``state_dict()``'s order (parameters,
    persistent buffers, then children; a shared submodule under each name)."""
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgument(f"expected a torch.nn.Module, got {type(module).__name__}")
    out: List[_Member] = []

    def walk(m: torch.nn.Module, prefix: str) -> None:
        for k, p in m._parameters.items():
            if p is not None:
                out.append(_Member(prefix + k, m, k, True))
        skip = getattr(m, "_non_persistent_buffers_set", ())
        for k, b in m._buffers.items():
            if b is not None and k not in skip:
                out.append(_Member(prefix + k, m, k, False))
        for k, c in m._modules.items():
            if c is not None:
                walk(c, prefix + k + ".")

    walk(module, "")
    return out


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).split(".", 1)[-1]


def _module_layout(members: Sequence[_Member]) -> Layout:
    return {m.name: (tuple(m.get().shape), _dtype_name(m.get().dtype)) for m in members}


def _registry_layout(held: Mapping[str, Tensor]) -> Layout:
    return {k: (t.shape, dtypes.TORCH[t._dtype]) for k, t in held.items()}


def _fmt(entry: Tuple[Tuple[int, ...], str]) -> str:
    return f"{entry[1]}{list(entry[0])}"


def _check_layout(registry: Layout, module: Layout, prefix: str, strict: bool, what: str,
                  bool_as_uint8: bool = False) -> None:
    """Raises ONE LayoutMismatch listing every difference. strict=False
    ignores missing and unexpected names (shapes and dtypes still count), as
    ``load_state_dict(strict=False)`` does. bool_as_uint8: the registry side
    comes from torch views, where bool travels as uint8 (DLPack 0.6)."""
    missing = [n for n in module if n not in registry] if strict else []
    unexpected = [n for n in registry if n not in module] if strict else []
    mismatched = []
    for n, (mshape, mdt) in module.items():
        if n not in registry:
            continue
        rshape, rdt = registry[n]
        if rshape != mshape:
            mismatched.append(f"{n}: shape {list(rshape)} under the prefix, {list(mshape)} in the module")
        if rdt != mdt and not (bool_as_uint8 and (rdt, mdt) == ("uint8", "bool")):
            mismatched.append(f"{n}: dtype {rdt} under the prefix, {mdt} in the module")
    if not (missing or unexpected or mismatched):
        return
    lines = [f"missing under the prefix (in the module): {n} {_fmt(module[n])}" for n in missing]
    lines += [f"unexpected under the prefix (not in the module): {n} {_fmt(registry[n])}" for n in unexpected]
    lines += mismatched
    raise LayoutMismatch(f"{what}: the module does not match the tensors under {prefix!r} "
                         f"({len(lines)} difference{'s' if len(lines) != 1 else ''}):\n  " + "\n  ".join(lines),
                         missing=missing, unexpected=unexpected, mismatched=mismatched)


def _bind(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
          members: Optional[Sequence[_Member]] = None) -> Dict[str, torch.Tensor]:
    """Rebinds every parameter and buffer of `module` named in `tensors` to
    that tensor's memory (zero copy; moving to another version of a model is
    one call of this). One tensor object under several names (tied weights)
    is bound once, to the first of its names found in `tensors`, so the tie
    survives. Parameters stay the same ``nn.Parameter`` objects (``.data``
    is swapped: optimizers, hooks and ties that hold them stay valid) and
    keep their ``requires_grad``; where torch refuses the swap (another
    device type), each name gets a new Parameter over the tensor. Shapes and
    dtypes must already match (``_check_layout``); a bool entry accepts a
    uint8 tensor (bool's DLPack form) and views it as bool. Returns what
    each bound name now holds."""
    members = _members(module) if members is None else members
    groups: Dict[int, List[_Member]] = {}
    for m in members:
        groups.setdefault(id(m.get()), []).append(m)
    bound: Dict[str, torch.Tensor] = {}
    for group in groups.values():
        name = next((m.name for m in group if m.name in tensors), None)
        if name is None:
            continue  # strict=False: left as it is
        obj = group[0].get()
        t = tensors[name]
        if obj.dtype == torch.bool and t.dtype == torch.uint8:
            t = t.view(torch.bool)
        try:
            obj.data = t
            new = obj
        except RuntimeError:
            new = torch.nn.Parameter(t, requires_grad=obj.requires_grad) if isinstance(obj, torch.nn.Parameter) \
                else t
            for m in group:
                m.set(new)
        for m in group:
            bound[m.name] = new
    return bound


def _cuda_stream(stream: Stream, device: int) -> "torch.cuda.Stream":
    """A torch stream of `stream` (None: torch's current stream of `device`)."""
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        return stream
    return torch.cuda.ExternalStream(stream_ptr(stream), device=device)


def _placement(tensors: Sequence[Tensor], prefix: str) -> Tuple[str, int]:
    """(backend, device) shared by a model's registry tensors: a model version
    records one event, on one device."""
    places = {(t.backend, t.device) for t in tensors}
    if len(places) != 1:
        raise InvalidArgument(f"the tensors under {prefix!r} live on {sorted(places)}: memcuda.torch publishes "
                              "a model on one device (one prefix per device)")
    return next(iter(places))


def _check_mode(value: str, what: str) -> None:
    if value not in MODES:
        raise InvalidArgument(f"{what} must be one of {MODES}, got {value!r}")


# ---- producer -----------------------------------------------------------------
def publish(module: torch.nn.Module, registry: Registry, prefix: str, *, stream: Stream = None,
            device: Any = None, backend: Optional[str] = None, replace: bool = False, mode: str = "inplace") -> int:
    """Puts `module`'s parameters and persistent buffers under `prefix` and
    publishes a model version; returns it (1, 2, ...).

    First call for a prefix: ``put_state_dict(..., persistent=True)`` (a
    state-dict record is linked: a consumer's open is one reference), in the
    module's own place unless `device`/`backend` say otherwise. Later calls,
    same names, shapes and dtypes: IN PLACE, copied into the tensors that are
    there (consumers holding them, attached modules included, see the new
    weights in the same memory), then ``publish_version``. CUDA copies are
    enqueued on `stream` (None: torch's current stream) and the version's
    event is recorded there: no host synchronisation; order the module's
    own writes before that stream. A different layout raises LayoutMismatch
    listing every difference, unless replace=True: then the old tensors are
    removed and the module is put afresh (attached consumers keep the old
    memory: they must attach again).

    The module's tensors must be on one device (a version records one
    event). Publish a prefix from one thread at a time (one event per model
    is re-recorded by each publish). mode="ab": a new A/B version through
    ``Registry.publish_model``."""
    _check_mode(mode, "mode")
    members = _members(module)
    sd = {m.name: m.get().detach() for m in members}
    if not sd:
        raise InvalidArgument("the module has no parameters or persistent buffers to publish")
    if mode == "ab":
        extra = {k: v for k, v in (("device", device), ("backend", backend)) if v is not None}
        return registry.publish_model(prefix, sd, stream=stream, **extra)
    if device is None and backend is None and len({(v.device.type, v.device.index) for v in sd.values()}) > 1:
        raise InvalidArgument("the module's tensors are on several devices: memcuda.torch publishes a model on "
                              "one device (pass device=, or publish each part under its own prefix)")
    held = registry.get_state_dict(prefix)
    try:
        if not held:
            try:
                return _publish_new(registry, prefix, sd, stream, device, backend)
            except AlreadyExists:
                held = registry.get_state_dict(prefix)  # another publisher made it first: go in place
        try:
            _check_layout(_registry_layout(held), _module_layout(members), prefix, True, "publish")
        except LayoutMismatch:
            if not replace:
                raise
            for t in held.values():
                t.release()
            for key in held:
                try:
                    registry.remove(prefix + key)
                except NotFound:
                    pass
            held = {}
            return _publish_new(registry, prefix, sd, stream, device, backend)
        return _publish_in_place(registry, prefix, held, sd, stream)
    finally:
        for t in held.values():
            t.release()


def _publish_new(registry: Registry, prefix: str, sd: Dict[str, torch.Tensor], stream: Stream, device: Any,
                 backend: Optional[str]) -> int:
    # put_state_dict copies on `stream` (None: torch's current one) and the
    # version's event goes on the same stream.
    made = registry.put_state_dict(prefix, sd, device=device, backend=backend, persistent=True, stream=stream)
    try:
        b, d = _placement(list(made.values()), prefix)
        if b == "cuda":
            return registry.publish_version(prefix, stream=_cuda_stream(stream, d), backend=b, device=d)
        return registry.publish_version(prefix, backend=b)
    finally:
        for t in made.values():
            t.release()


def _publish_in_place(registry: Registry, prefix: str, held: Dict[str, Tensor], sd: Dict[str, torch.Tensor],
                      stream: Stream) -> int:
    names = list(sd)
    b, d = _placement([held[n] for n in names], prefix)
    views = torch_views([held[n] for n in names])
    pairs = []
    for n, v in zip(names, views):
        src = sd[n]
        pairs.append((v.view(torch.bool) if src.dtype == torch.bool else v, src))
    if b == "cuda":
        s = _cuda_stream(stream, d)
        with torch.cuda.stream(s):
            for v, src in pairs:
                v.copy_(src, non_blocking=True)
        return registry.publish_version(prefix, stream=s, backend="cuda", device=d)
    with torch.no_grad():
        for v, src in pairs:
            v.copy_(src)
    return registry.publish_version(prefix, backend="host")


# ---- consumer -----------------------------------------------------------------
class Attachment(Scoped):
    """What ``attach`` returns: keeps the registry tensors that the module's
    parameters and buffers view alive (their references go when this object,
    the module's tensors and every other view of them are gone, or at
    ``detach``), and waits for the producer's next version.

    Safe from any thread; ``wait`` blocks only its caller."""

    _end = "detach"

    def __init__(self, module: torch.nn.Module, registry: Registry, prefix: str, tensors: Dict[str, torch.Tensor],
                 version: int, device: int, model: Any = None) -> None:
        self.module = module
        self.registry = registry
        self.prefix = prefix
        self._tensors = tensors
        self._version = version
        self._device = device  # CUDA ordinal, -1 for host
        self._model = model    # the PinnedModel of versions="ab"
        self._lock = threading.Lock()  # version and tensors; never held across a wait

    @property
    def version(self) -> int:
        """The newest version this attachment has seen (0: none published yet)."""
        return self._version

    @property
    def tensors(self) -> Dict[str, torch.Tensor]:
        """{state-dict name: the registry tensor it views} (a copy of the dict)."""
        with self._lock:
            return dict(self._tensors)

    @property
    def attached(self) -> bool:
        return self._tensors is not None

    def _stream(self, stream: Stream) -> Stream:
        if self._device < 0:
            return None
        return _cuda_stream(stream, self._device)

    def wait(self, after: Optional[int] = None, timeout: float = 10.0, stream: Stream = None) -> Optional[int]:
        """Blocks (no polling) until an in-place publish newer than `after`
        (None: the newest this attachment has seen) and returns its version,
        or None after `timeout` seconds. CUDA: `stream` (None: torch's current
        stream of the module's device) is made to wait for the producer's
        writes, without host synchronisation: work enqueued there after this
        call reads the new weights."""
        if self._model is not None:
            raise InvalidArgument("an attachment with versions='ab' moves with advance(), not wait()")
        if self._tensors is None:
            raise InvalidArgument(f"the attachment to {self.prefix!r} was detached")
        v = self.registry.wait_version(self.prefix, self._version if after is None else int(after), timeout,
                                       stream=self._stream(stream))
        if v is not None:
            with self._lock:
                self._version = max(self._version, v)
        return v

    def advance(self, stream: Stream = None) -> bool:
        """versions='ab': moves the module to the model's newest version (one
        rebind of every parameter and buffer); False when it is current."""
        if self._model is None:
            raise InvalidArgument("advance() is for attachments with versions='ab'; an in-place attachment "
                                  "sees each publish in its memory and waits with wait()")
        if self._tensors is None:
            raise InvalidArgument(f"the attachment to {self.prefix!r} was detached")
        if not self._model.advance(stream=stream):
            return False
        tensors = dict(self._model.tensors)
        members = _members(self.module)
        _check_layout(_torch_layout(tensors), _module_layout(members), self.prefix, True, "advance",
                      bool_as_uint8=True)
        _bind(self.module, tensors, members)
        with self._lock:
            self._tensors, self._version = tensors, self._model.version
        return True

    def detach(self) -> None:
        """Gives the module private copies of its current values (made on
        torch's current stream) and lets the registry tensors go. To drop
        the module instead, delete it and this object: no copy is made."""
        with self._lock:
            tensors, self._tensors, model, self._model = self._tensors, None, self._model, None
        if tensors is None:
            return
        members = _members(self.module)
        private = {m.name: m.get().detach().clone() for m in members if m.name in tensors}
        _bind(self.module, private, members)
        del tensors, model

    def __repr__(self) -> str:
        state = f"{len(self._tensors)} tensors" if self._tensors is not None else "detached"
        return f"memcuda.torch.Attachment(prefix={self.prefix!r}, version={self._version}, {state})"


def _torch_layout(tensors: Mapping[str, torch.Tensor]) -> Layout:
    return {k: (tuple(v.shape), _dtype_name(v.dtype)) for k, v in tensors.items()}


def attach(module: torch.nn.Module, registry: Registry, prefix: str, *, strict: bool = True,
           stream: Stream = None, timeout: float = 10.0, versions: str = "inplace") -> Attachment:
    """Makes `module`'s parameters and persistent buffers views of the tensors
    under `prefix` (zero copy: ``p.data_ptr()`` is the registry tensor's; N
    workers hold one copy of the weights). The whole prefix is opened with
    one ``get_state_dict`` (one reference where the producer linked a record).

    Checks first, binds nothing on failure: names missing or unexpected
    (strict=False ignores those, as ``load_state_dict`` does), shapes and
    dtypes: ONE LayoutMismatch (an InvalidArgument) listing every difference.
    NotFound when nothing is under the prefix. Parameters stay the same
    ``nn.Parameter`` objects with their ``requires_grad``; the module takes the
    registry tensors' device. An optimizer step on an attached module writes
    the shared weights: every attached process sees it.

    CUDA: `stream` (None: torch's current stream) is ordered after the newest
    published version (at most `timeout` seconds to read it). Returns the
    Attachment: ``wait()`` for the next in-place publish, ``detach()``.

    versions="ab": through ``Registry.open_model`` (A/B model versions),
    moved with ``Attachment.advance``."""
    _check_mode(versions, "versions")
    members = _members(module)
    mlayout = _module_layout(members)
    if versions == "ab":
        model = registry.open_model(prefix, framework="torch")
        tensors = dict(model.tensors)
        _check_layout(_torch_layout(tensors), mlayout, prefix, strict, "attach", bool_as_uint8=True)
        _bind(module, tensors, members)
        dev = next((v.device.index for v in tensors.values() if v.is_cuda), -1)
        return Attachment(module, registry, prefix, tensors, model.version, dev, model=model)
    held = registry.get_state_dict(prefix)
    try:
        if not held:
            raise NotFound(f"attach: no tensor under {prefix!r}")
        _check_layout(_registry_layout(held), mlayout, prefix, strict, "attach")
        b, d = _placement(list(held.values()), prefix)
        # One DLPack import per allocation, ordered after the records' events.
        tensors = dict(zip(held, torch_views(list(held.values()))))
    finally:
        for t in held.values():
            t.release()
    _bind(module, tensors, members)
    version = registry.current_version(prefix)
    if version and b == "cuda":
        # Order the stream after the newest version's event (a version older
        # than the tensors' own events is never current: put orders those).
        version = registry.wait_version(prefix, version - 1, timeout, stream=_cuda_stream(stream, d)) or version
    return Attachment(module, registry, prefix, tensors, version, d if b == "cuda" else -1)

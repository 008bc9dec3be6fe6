"""``nccl`` onto the target's collective backend wherever a process group is made.

* ``init_process_group``, ``new_group``, ``new_subgroups``, ``new_subgroups_by_enumeration``:
  ``backend="nccl"`` becomes ``hccl`` on npu and ``gloo`` on cpu (also inside the
  per-device form ``"cpu:gloo,cuda:nccl"``); ``pg_options`` that are NCCL options become
  HCCL options (npu) or are dropped (cpu), see :mod:`.nccl_options`; ``device_id=``
  names a CUDA device: on npu it becomes the NPU with the same index, on cpu it is
  dropped (gloo binds no device).
* ``DeviceMesh("cuda", ...)`` / ``init_device_mesh("cuda", ...)`` / ``DeviceMesh.from_group(g, "cuda")``
  build a mesh of the target's device type, with ``backend_override`` translated.
* ``barrier(device_ids=[...])``: kept on npu (same indices), dropped on cpu.
* ``DistributedDataParallel(device_ids=..., output_device=...)``: the same rule as ``device_id``.

Backend-name checks. Program code that asserts ``dist.get_backend() == "nccl"`` or
branches on ``dist.is_nccl_available()`` keeps working: while patched, for calls made
*outside torch*, ``get_backend(group)`` reports the backend the program asked for
(``"nccl"``) for every group created with ``nccl`` (or inheriting it from a default
group created with ``nccl``), and ``is_nccl_available()`` / ``is_backend_available("nccl")``
answer True. torch's own code always sees the real backend (``gloo`` / ``hccl``),
because it decides what the backend can do. :func:`real_backend` gives the real name
to program code that needs it.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any

from ..backend import Backend
from ..devices import DeviceMap
from ..patch import Action, Add, Patch, Replace, replacing
from ..usage import note
from .nccl_options import ProcessGroupNCCL, translate_pg_options

__all__ = ["backend_name_patches", "real_backend", "requested_backend", "translate_backend"]

_C10D = "torch.distributed.distributed_c10d"

# process group -> the backend string the program asked for, when it named nccl
_REQUESTED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def translate_backend(backend: Any, target: Backend) -> Any:
    """A ``backend=`` value with every ``nccl`` replaced by the target's collective backend."""
    if not isinstance(backend, str):
        return backend
    dist = target.dist_backend
    if backend.lower() == "nccl":
        return dist
    if ":" in backend:  # "cpu:gloo,cuda:nccl"
        parts: dict[str, str] = {}
        for item in backend.split(","):
            device, _, name = item.partition(":")
            device, name = device.strip(), name.strip()
            if name.lower() == "nccl":
                name = dist
            device = target.device_type if device == "cuda" else device
            parts.setdefault(device, name)  # cuda mapped onto cpu: the explicit cpu entry wins
        return ",".join(f"{d}:{n}" for d, n in parts.items())
    return backend


def _names_nccl(backend: Any) -> bool:
    return isinstance(backend, str) and "nccl" in backend.lower()


def requested_backend(group: Any = None) -> str | None:
    """The nccl-naming backend string the program created ``group`` with, or None."""
    from torch.distributed import distributed_c10d as c10d

    if group is None:
        if not c10d.is_initialized():
            return None
        group = c10d._get_default_group()
    try:
        return _REQUESTED.get(group)
    except TypeError:
        return None


def real_backend(group: Any = None) -> str:
    """The backend ``group`` really runs on (``gloo``/``hccl``), whatever get_backend reports."""
    from torch.distributed import distributed_c10d as c10d

    pg = group if group is not None else c10d._get_default_group()
    return str(c10d._world.pg_map[pg][0])


def _called_from_torch() -> bool:
    """Whether the code calling the patched function (ours and wrapt's frames skipped) is torch's."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "ascend_patch" or name.startswith(("ascend_patch.", "wrapt")):
            frame = frame.f_back
            continue
        return name == "torch" or name.startswith("torch.")
    return False


def _record(group: Any, backend: Any) -> None:
    from torch.distributed import distributed_c10d as c10d

    if group is None or group is c10d.GroupMember.NON_GROUP_MEMBER:
        return
    try:
        _REQUESTED[group] = str(backend)
    except TypeError:  # not weak-referenceable: not a ProcessGroup
        pass


def _device_id(device_id: Any, target: Backend, dmap: DeviceMap) -> Any:
    if device_id is None or target.name == "cpu":
        return None
    return dmap(device_id)


def _group_wrapper(original: Any, target: Backend, dmap: DeviceMap, api: str) -> Any:
    signature = inspect.signature(original)
    is_init = api.endswith("init_process_group")

    @replacing(original)
    def make_group(*args: Any, **kwargs: Any) -> Any:
        from torch.distributed import distributed_c10d as c10d

        bound = signature.bind_partial(*args, **kwargs)
        arguments = bound.arguments
        asked = arguments.get("backend")
        translated = translate_backend(asked, target)
        if translated != asked:
            note(f"{api}(backend='nccl')")
            arguments["backend"] = translated
        if arguments.get("pg_options") is not None:
            arguments["pg_options"] = translate_pg_options(arguments["pg_options"], target)
        if arguments.get("device_id") is not None:
            arguments["device_id"] = _device_id(arguments["device_id"], target, dmap)
        # a group made with backend=None inherits the default group's backend, and its name
        inherited = None if asked is not None or is_init else requested_backend()
        result = original(*bound.args, **bound.kwargs)
        named = asked if _names_nccl(asked) else inherited
        if named:
            if is_init:
                _record(c10d._get_default_group(), named)
            elif isinstance(result, tuple):  # new_subgroups -> (this rank's group, all groups)
                for group in [result[0], *list(result[1] or ())]:
                    _record(group, named)
            else:
                _record(result, named)
        return result

    make_group.__signature__ = signature  # type: ignore[attr-defined]
    make_group.__name__ = original.__name__
    return make_group


def _get_backend(original: Any) -> Any:
    @replacing(original)
    def get_backend(group: Any = None) -> Any:
        real = original(group)
        if _called_from_torch():
            return real
        asked = requested_backend(group)
        if asked is None:
            return real
        note("torch.distributed.get_backend (reports the backend the program asked for)", "emulated")
        from torch.distributed import Backend as C10dBackend

        return C10dBackend(asked) if ":" not in asked else asked

    return get_backend


def _is_nccl_available(original: Any) -> Any:
    @replacing(original)
    def is_nccl_available() -> bool:
        if _called_from_torch():
            return bool(original())
        note("torch.distributed.is_nccl_available (nccl is served by the target's backend)", "emulated")
        return True

    return is_nccl_available


def _is_backend_available(original: Any) -> Any:
    @replacing(original)
    def is_backend_available(backend: str) -> bool:
        if not _called_from_torch() and isinstance(backend, str) and backend.lower() == "nccl":
            return True
        return bool(original(backend))

    return is_backend_available


def _barrier(original: Any, target: Backend) -> Any:
    signature = inspect.signature(original)

    @replacing(original)
    def barrier(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device_ids") is not None or len(args) > 2:
            bound = signature.bind_partial(*args, **kwargs)
            if bound.arguments.get("device_ids") is not None and target.name == "cpu":
                note("torch.distributed.barrier(device_ids=...)", "no-op")
                bound.arguments["device_ids"] = None
            return original(*bound.args, **bound.kwargs)
        return original(*args, **kwargs)

    barrier.__signature__ = signature  # type: ignore[attr-defined]
    return barrier


def _translate_override(override: Any, target: Backend) -> Any:
    """DeviceMesh's normalised backend_override: a tuple of (backend, options) per mesh dimension."""
    if not override:
        return override
    out = []
    for item in override:
        if isinstance(item, tuple) and len(item) == 2:
            out.append((translate_backend(item[0], target), translate_pg_options(item[1], target)))
        else:
            out.append(item)
    return tuple(out)


def _mesh_init(original: Any, target: Backend, dmap: DeviceMap) -> Any:
    @replacing(original)
    def __init__(self: Any, device_type: Any, *args: Any, **kwargs: Any) -> None:
        mapped = dmap.device_type_name(device_type)
        if mapped != device_type:
            note("torch.distributed.device_mesh.DeviceMesh('cuda', ...)")
        if kwargs.get("backend_override"):
            kwargs["backend_override"] = _translate_override(kwargs["backend_override"], target)
        original(self, mapped, *args, **kwargs)

    return __init__


def _ddp_init(original: Any, target: Backend, dmap: DeviceMap) -> Any:
    signature = inspect.signature(original)

    @replacing(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        ids = arguments.get("device_ids")
        if ids is not None:
            note("DistributedDataParallel(device_ids=...)")
            arguments["device_ids"] = None if target.name == "cpu" else [dmap(i) for i in ids]
        out = arguments.get("output_device")
        if out is not None:
            arguments["output_device"] = None if target.name == "cpu" else dmap(out)
        original(*bound.args, **bound.kwargs)

    return __init__


def backend_name_patches(target: Backend, dmap: DeviceMap) -> list[Patch]:
    """Every patch that maps NCCL process-group creation and naming onto the target."""
    dist = target.dist_backend

    def group(name: str, reason: str) -> Patch:
        return Replace(f"{_C10D}:{name}", reason,
                       make=lambda orig: _group_wrapper(orig, target, dmap, f"torch.distributed.{name}"),
                       count_calls=False)

    return [
        group("init_process_group", f"nccl -> {dist}; NCCL pg_options and device_id onto the target"),
        group("new_group", f"nccl -> {dist}; NCCL pg_options and device_id onto the target"),
        group("new_subgroups", f"nccl -> {dist}; NCCL pg_options onto the target"),
        group("new_subgroups_by_enumeration", f"nccl -> {dist}; NCCL pg_options onto the target"),
        Replace(f"{_C10D}:get_backend",
                "reports 'nccl' to program code for groups it created with nccl (torch sees the real name)",
                make=_get_backend, action=Action.EMULATED, count_calls=False),
        Replace(f"{_C10D}:is_nccl_available",
                f"True for program code: nccl is served by {dist}", make=_is_nccl_available,
                action=Action.EMULATED, count_calls=False),
        Replace(f"{_C10D}:is_backend_available",
                f"'nccl' is available to program code (served by {dist})", make=_is_backend_available,
                action=Action.EMULATED, count_calls=False),
        Replace(f"{_C10D}:barrier", "device_ids onto the target (dropped on the host)",
                make=lambda orig: _barrier(orig, target), count_calls=False),
        Add("torch.distributed:ProcessGroupNCCL",
            "ProcessGroupNCCL.Options for code that configures NCCL communicators (no NCCL in this torch)",
            replacement=ProcessGroupNCCL, action=Action.EMULATED),
        Replace("torch.distributed.device_mesh:DeviceMesh.__init__",
                f"DeviceMesh('cuda') -> DeviceMesh('{target.device_type}'); backend_override translated",
                make=lambda orig: _mesh_init(orig, target, dmap), count_calls=False),
        Replace("torch.nn.parallel.distributed:DistributedDataParallel.__init__",
                "device_ids/output_device onto the target (none on the host)",
                make=lambda orig: _ddp_init(orig, target, dmap), count_calls=False),
    ]

"""The little of nvidia-ml-py (``pynvml``) the CUDA backend needs, loaded only when asked for.

Nothing here imports ``pynvml`` at module level: importing nbmonitor must not touch the driver,
and the package is an optional extra (``nbmonitor[cuda]``). The module object is passed around
as ``Any`` because nvidia-ml-py ships no type information.
"""

from __future__ import annotations

import os
from typing import Any, Literal

ErrorKind = Literal["unsupported", "lost", "other"]

INSTALL_HINT = "pip install 'nbmonitor[cuda]' (nvidia-ml-py)"

# A field that answers one of these will answer it again: stop asking (nvitop does the same).
# FunctionNotFound means the driver predates the call; the caller first tries an older variant.
_UNSUPPORTED = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
# The device fell off the bus or the driver gave up on it; nothing more will come from it.
_LOST = ("NVMLError_GpuIsLost", "NVMLError_Unknown")


def load() -> tuple[Any | None, str]:
    """``(pynvml, "")``, or ``(None, reason)`` when nvidia-ml-py cannot be imported."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py is not importable ({exc}); {INSTALL_HINT}"
    return pynvml, ""


def classify(nvml: Any, exc: BaseException) -> ErrorKind:
    """Sort an NVMLError into: stop asking, device gone, or a one-off failure."""
    for name in _UNSUPPORTED:
        cls = getattr(nvml, name, None)
        if cls is not None and isinstance(exc, cls):
            return "unsupported"
    for name in _LOST:
        cls = getattr(nvml, name, None)
        if cls is not None and isinstance(exc, cls):
            return "lost"
    return "other"


def function_missing(nvml: Any, exc: BaseException) -> bool:
    """True when the driver lacks a call or struct version, so an older variant may work."""
    for name in ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch"):
        cls = getattr(nvml, name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def nvml_uuid(torch_uuid: str) -> list[str]:
    """NVML spellings to try for a UUID from ``torch.cuda.get_device_properties(i).uuid``.

    torch prints the bare 8-4-4-4-12 hex form; NVML wants it prefixed with ``GPU-`` (or
    ``MIG-`` for a MIG instance, which we try second).
    """
    uuid = torch_uuid.strip()
    if uuid.startswith(("GPU-", "MIG-")):
        return [uuid]
    return [f"GPU-{uuid}", f"MIG-{uuid}"]


def parse_visible_devices(value: str | None) -> list[int | str] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: ``None`` when unset (every device visible).

    Entries are indices or (possibly abbreviated) UUIDs; like CUDA, parsing stops at the first
    entry that is neither, and an empty value hides every device.
    """
    if value is None:
        return None
    out: list[int | str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if index < 0:
                break
            out.append(index)
        elif entry.startswith(("GPU-", "MIG-")):
            out.append(entry)
        else:
            break
    return out


def handle_for(nvml: Any, torch_index: int, torch_uuid: str | None) -> tuple[Any, str]:
    """The NVML handle of torch device ``torch_index``, and how it was found.

    By UUID when torch gives one: torch and NVML may number devices differently
    (``CUDA_VISIBLE_DEVICES`` remaps, and CUDA's default order is fastest-first while NVML's is
    PCI bus order), but a UUID names one device. Without a UUID, ``CUDA_VISIBLE_DEVICES`` is
    parsed here, which is right only when CUDA also orders by PCI bus.
    Raises NVMLError when no device matches.
    """
    if torch_uuid:
        error: BaseException | None = None
        for candidate in nvml_uuid(torch_uuid):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(candidate), f"uuid {candidate}"
            except nvml.NVMLError as exc:
                error = exc
        assert error is not None
        raise error
    not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None and torch_index >= len(visible):
        raise nvml.NVMLError(not_found)
    entry: int | str = torch_index if visible is None else visible[torch_index]
    if isinstance(entry, int):
        return nvml.nvmlDeviceGetHandleByIndex(entry), f"index {entry} (CUDA_VISIBLE_DEVICES)"
    if entry.startswith("MIG-"):
        return nvml.nvmlDeviceGetHandleByUUID(entry), f"uuid {entry}"
    # CUDA accepts any unambiguous UUID prefix, so match it against every device's UUID.
    matches = []
    for physical in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(physical)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        if uuid.startswith(entry):
            matches.append((handle, uuid))
    if len(matches) != 1:
        raise nvml.NVMLError(not_found)
    return matches[0][0], f"uuid {matches[0][1]} (CUDA_VISIBLE_DEVICES)"

"""Where the engine finds NCCL: the nvidia-nccl-cu13 wheel's library, which the dynamic loader does not search.

The C++ side opens NCCL at run time, from DEEPINFER_NCCL_LIBRARY when set, else by the name libnccl.so.2. The wheel
installs the library inside the Python package nvidia/nccl/lib, so the package points DEEPINFER_NCCL_LIBRARY there
when it is imported (before any engine starts); a value already set is kept.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

LIBRARY_VARIABLE = "DEEPINFER_NCCL_LIBRARY"


def wheel_nccl_library() -> Path | None:
    """The libnccl.so.2 of the installed nvidia-nccl-cu13 wheel, or None when the wheel is not installed."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        library = Path(location) / "lib" / "libnccl.so.2"
        if library.is_file():
            return library
    return None


def configure_nccl_library() -> str | None:
    """Sets DEEPINFER_NCCL_LIBRARY to the wheel's library unless it is set already; returns the value in effect."""
    current = os.environ.get(LIBRARY_VARIABLE)
    if current:
        return current
    library = wheel_nccl_library()
    if library is None:
        return None
    os.environ[LIBRARY_VARIABLE] = str(library)
    return str(library)

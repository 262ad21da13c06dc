"""What this installation is: the package version, the backends the compiled extension can run, the GPUs it sees.

``deepinfer --version`` prints it; the server's ``GET /version`` returns the same facts as JSON.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_info", "format_build_info"]


def build_info() -> dict[str, Any]:
    """{"version", "backends", "cuda_device_count", "rank_processes"}.

    The extension reports CUDA only through ``cuda_device_count()``, which is 0 both in a build without the CUDA
    backend and in a CUDA build on a machine without a visible GPU; so "cuda" is listed exactly when the engine can
    use it now (device='auto' picks it then), and CPU is always there.
    """
    from deepinfer import __version__, _deepinfer

    gpus = int(_deepinfer.cuda_device_count())
    return {"version": __version__, "backends": ["cpu", "cuda"] if gpus > 0 else ["cpu"], "cuda_device_count": gpus,
            # How ranks can be processes: under mpirun ("mpi"), meeting at an address ("gloo": --nnodes, torchrun).
            "rank_processes": list(_deepinfer.process_communicators())}


def format_build_info(info: dict[str, Any] | None = None) -> str:
    """The human-readable lines of ``deepinfer --version``."""
    info = build_info() if info is None else info
    gpus = info["cuda_device_count"]
    why_none = "" if gpus > 0 else " (this build has no CUDA backend, or no GPU is visible to it)"
    return "\n".join([f"deepinfer {info['version']}",
                      "backends: " + ", ".join(b.upper() for b in info["backends"]),
                      f"CUDA GPUs visible: {gpus}{why_none}",
                      "ranks as processes: " + (", ".join(
                          {"mpi": "mpirun (MPI)", "gloo": "--nnodes / torchrun / LeaderWorkerSet (gloo)"}[c]
                          for c in info["rank_processes"]) or "none (built without MPI and gloo)")])

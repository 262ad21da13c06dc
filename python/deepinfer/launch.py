"""Where this process's rank comes from, when the ranks of a parallel model are processes.

Ranks are threads of one process unless something says otherwise (`tensor_parallel_size=N` on one machine). They are
processes, one a rank, when:

- ``mpirun`` started this process (``OMPI_COMM_WORLD_*``, or ``distributed_executor_backend="mpi"``): MPI connects
  them;
- ``nnodes`` / ``node_rank`` / ``dist_init_addr`` are given (SGLang's ``--nnodes --node-rank --dist-init-addr``), or a
  Kubernetes LeaderWorkerSet set its variables (``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``): one
  command a machine, which starts that machine's ``tensor_parallel_size / nnodes`` ranks (itself the first, the
  others as child processes), ranks numbered machine by machine;
- ``torchrun`` started this process (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): one
  process a rank, as torchrun started them.

In the last two the processes meet at one address, ``HOST:PORT`` of rank 0's machine, where rank 0 serves the
bootstrap (gloo's TCP transport then carries the host collectives, NCCL the GPUs'). Rank 0's process runs the
engine (and serves HTTP); every other rank runs rank 0's steps until rank 0 stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepinfer.config import EngineConfig

logger = logging.getLogger("deepinfer")

# The port rank 0 serves the bootstrap at under a LeaderWorkerSet without dist_init_addr (torch's default port).
DEFAULT_INIT_PORT = 29500
# Set in the child processes a machine's first rank starts: the child's rank on its machine.
LOCAL_RANK_VARIABLE = "DEEPINFER_LOCAL_RANK"


@dataclass(frozen=True)
class RankPlacement:
    """This process's rank among ranks that are processes."""

    launcher: str              # "mpirun", "flags", "LeaderWorkerSet" or "torchrun": who said so
    rank: int                  # in [0, world_size); -1 under mpirun (MPI numbers the ranks)
    local_rank: int            # the GPU this rank takes on its machine
    world_size: int            # tensor_parallel_size
    init_addr: str = ""        # HOST:PORT where the ranks meet ("" under mpirun)
    ranks_per_node: int = 1    # the ranks of one machine (flags and LeaderWorkerSet: its command starts them)

    @property
    def is_leader(self) -> bool:
        """Whether this process runs the engine (and serves)."""
        if self.launcher == "mpirun":
            from deepinfer import _deepinfer
            return _deepinfer.mpi_rank() == 0
        return self.rank == 0

    @property
    def starts_local_ranks(self) -> bool:
        """Whether this process starts its machine's other ranks (it is the machine's first)."""
        return self.launcher in ("flags", "LeaderWorkerSet") and self.local_rank == 0 and self.ranks_per_node > 1


def _int_variable(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"{name}={environ[name]!r} is not an integer") from None


def check_init_addr(address: str, what: str = "dist_init_addr") -> str:
    """HOST:PORT or [IPv6]:PORT with a port in [1, 65535]; ValueError naming the text otherwise."""
    host, sep, port = address.rpartition(":")
    ok = bool(sep and host and port.isdigit() and 1 <= int(port) <= 65535)
    if ok and ":" in host:
        ok = host.startswith("[") and host.endswith("]") and len(host) > 2
    if not ok:
        raise ValueError(f"{what} must be HOST:PORT (or [IPv6]:PORT) of rank 0's machine with a port in "
                         f"[1, 65535], got {address!r}")
    return address


def _torchrun_placement(config: EngineConfig, environ: Mapping[str, str]) -> RankPlacement | None:
    if not all(k in environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = _int_variable(environ, "WORLD_SIZE")
    if world == 1:
        return None
    if world != config.tensor_parallel_size:
        raise ValueError(f"torchrun started {world} processes (WORLD_SIZE) for tensor_parallel_size "
                         f"{config.tensor_parallel_size}: start one a rank")
    # torchrun's own store may hold MASTER_PORT (its agent's), so the engine's bootstrap takes the port after it.
    address = config.dist_init_addr or f"{environ['MASTER_ADDR']}:{_int_variable(environ, 'MASTER_PORT') + 1}"
    return RankPlacement("torchrun", rank=_int_variable(environ, "RANK"), local_rank=_int_variable(environ, "LOCAL_RANK"),
                         world_size=world, init_addr=check_init_addr(address))


def _node_placement(config: EngineConfig, environ: Mapping[str, str]) -> RankPlacement | None:
    """One command a machine: from the flags, or where they are left at their defaults, a LeaderWorkerSet's."""
    nnodes, node_rank, address, launcher = config.nnodes, config.node_rank, config.dist_init_addr, "flags"
    if nnodes == 1 and "LWS_GROUP_SIZE" in environ:
        launcher = "LeaderWorkerSet"
        nnodes = _int_variable(environ, "LWS_GROUP_SIZE")
        node_rank = _int_variable(environ, "LWS_WORKER_INDEX") if "LWS_WORKER_INDEX" in environ else 0
        if not 0 <= node_rank < nnodes:
            raise ValueError(f"LWS_WORKER_INDEX={node_rank} is not in [0, LWS_GROUP_SIZE={nnodes})")
        leader = environ.get("LWS_LEADER_ADDRESS")
        if address is None and nnodes > 1:
            if not leader:
                raise ValueError("LWS_GROUP_SIZE is set but LWS_LEADER_ADDRESS is not: give --dist-init-addr "
                                 "HOST:PORT")
            address = f"{leader}:{DEFAULT_INIT_PORT}"
    if nnodes == 1 and address is None:
        return None
    if address is None:
        raise ValueError(f"nnodes={nnodes}: the ranks need dist_init_addr (--dist-init-addr HOST:PORT of node 0)")
    if config.tensor_parallel_size % nnodes != 0:
        raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} is not a multiple of nnodes {nnodes}: "
                         "every machine runs as many ranks")
    per_node = config.tensor_parallel_size // nnodes
    local = _int_variable(environ, LOCAL_RANK_VARIABLE) if LOCAL_RANK_VARIABLE in environ else 0
    if not 0 <= local < per_node:
        raise ValueError(f"{LOCAL_RANK_VARIABLE}={local} is not in [0, {per_node})")
    return RankPlacement(launcher, rank=node_rank * per_node + local, local_rank=local,
                         world_size=config.tensor_parallel_size, init_addr=check_init_addr(address),
                         ranks_per_node=per_node)


def rank_placement(config: EngineConfig, environ: Mapping[str, str] | None = None) -> RankPlacement | None:
    """This process's rank when the ranks are processes; None when they are threads of this process (or there is
    one). Raises ValueError for a launch that cannot be (sizes that disagree, a missing address, a build without
    the communicator it needs)."""
    placement = _placement(config, os.environ if environ is None else environ)
    return None if placement is None else _check_built(placement)


def _placement(config: EngineConfig, environ: Mapping[str, str]) -> RankPlacement | None:
    from deepinfer import _deepinfer

    backend = config.distributed_executor_backend
    multi_node = config.nnodes > 1 or config.dist_init_addr is not None
    if backend == "mp":
        if multi_node:
            raise ValueError("distributed_executor_backend='mp' runs the ranks as threads of this process; "
                             "nnodes / dist_init_addr need processes (leave it unset)")
        return None
    if config.tensor_parallel_size == 1:
        if multi_node:
            raise ValueError(f"nnodes={config.nnodes} / dist_init_addr={config.dist_init_addr!r} with "
                             "tensor_parallel_size 1: there is one rank")
        return None
    if backend == "mpi" or (backend is None and not multi_node and _deepinfer.mpi_launched()):
        if not _deepinfer.mpi_launched():
            raise ValueError("distributed_executor_backend='mpi': this process was not started by mpirun; run "
                             f"`mpirun -np {config.tensor_parallel_size} deepinfer ...`")
        if multi_node:
            raise ValueError("under mpirun the ranks are mpirun's processes: leave nnodes and dist_init_addr unset")
        return RankPlacement("mpirun", rank=-1, local_rank=int(environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")),
                             world_size=config.tensor_parallel_size)
    if backend == "external_launcher" or (backend is None and not multi_node):
        placement = _torchrun_placement(config, environ)
        if placement is not None or backend == "external_launcher":
            if placement is None:
                raise ValueError("distributed_executor_backend='external_launcher': torchrun's RANK, LOCAL_RANK, "
                                 "WORLD_SIZE, MASTER_ADDR and MASTER_PORT are not all set")
            return placement
    return _node_placement(config, environ)


def _check_built(placement: RankPlacement) -> RankPlacement:
    from deepinfer import _deepinfer

    needed = "mpi" if placement.launcher == "mpirun" else "gloo"
    if needed not in _deepinfer.process_communicators():
        how = ("install OpenMPI (apt-get install libopenmpi-dev openmpi-bin)" if needed == "mpi"
               else "install gloo (apt-get install libgloo-dev)")
        raise ValueError(f"ranks started by {placement.launcher} need this build's {needed} communicator, which it "
                         f"lacks: {how} and reinstall deepinfer")
    return placement


def configure_options(options: Any, placement: RankPlacement) -> None:
    """Sets the engine options of this process's rank."""
    from deepinfer import _deepinfer

    if placement.launcher == "mpirun":
        options.rank_launch = _deepinfer.RankLaunch.mpi
        return
    options.rank_launch = _deepinfer.RankLaunch.address
    options.dist_init_addr = placement.init_addr
    options.rank = placement.rank
    options.local_rank = placement.local_rank


def start_local_ranks(config: EngineConfig, placement: RankPlacement) -> list[subprocess.Popen]:
    """Starts this machine's other ranks (local ranks 1 ..), each a `python -m deepinfer.local_rank` child that reads
    its configuration from its stdin and runs rank 0's steps. A child that dies before the ranks have met cancels
    this process's wait for them (which would otherwise last collective_timeout_s), naming it."""
    from deepinfer import _deepinfer

    _deepinfer.clear_bootstrap_cancel()
    children = []
    for local in range(1, placement.ranks_per_node):
        env = dict(os.environ, **{LOCAL_RANK_VARIABLE: str(local)})
        child = subprocess.Popen([sys.executable, "-m", "deepinfer.local_rank"], stdin=subprocess.PIPE, env=env)
        assert child.stdin is not None
        try:
            child.stdin.write(pickle.dumps(config))
            child.stdin.close()
        except BrokenPipeError:
            # The child exited before reading its configuration; its watcher below reports the exit.
            with contextlib.suppress(OSError):
                child.stdin.close()
        children.append(child)
    logger.info("rank %d started this machine's ranks %d..%d (processes %s)", placement.rank, placement.rank + 1,
                placement.rank + len(children), ", ".join(str(c.pid) for c in children))
    for local, child in enumerate(children, start=1):
        threading.Thread(target=_watch_local_rank, args=(child, placement.rank + local), daemon=True,
                         name=f"deepinfer-rank-{placement.rank + local}").start()
    return children


def _watch_local_rank(child: subprocess.Popen, rank: int) -> None:
    """A child that fails ends this process's bootstrap wait (a no-op once the ranks have met: a failure then shows
    in the collectives, naming the rank)."""
    from deepinfer import _deepinfer

    code = child.wait()
    if code != 0:
        _deepinfer.cancel_bootstrap_waits(f"rank {rank}'s process {child.pid} exited with {code}")


def join_local_ranks(children: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
    """Waits for the children to end after rank 0 stopped them; one that lingers is killed."""
    for child in children:
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("local rank process %d did not end %g s after the engine stopped; killing it", child.pid,
                           timeout_s)
            child.kill()
            child.wait()

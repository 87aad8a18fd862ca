"""Process groups for tensor parallelism, from the ranks `mpirun -n N` (or torchrun) started.

Under mpirun, rank and size come from mpi4py; rank 0 picks a free TCP port on 127.0.0.1 (or MASTER_ADDR) and
broadcasts it over MPI, then every rank joins `torch.distributed` ("gloo" on CPU, "nccl" on CUDA). torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) is accepted as well. The CPU torch wheel has no MPI
backend, hence MPI only for the rendezvous.

Every collective counts the bytes it moves (`bytes_communicated`: the bytes this rank sends plus receives,
whatever algorithm the backend picks), so benchmarks can report the traffic per engine step.
"""
from __future__ import annotations

import os
import pickle
import socket

import torch

from .errors import DFlashError

_MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def env_world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment, without initialising anything: (0, 1) alone."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for rv, sv in zip(_MPI_RANK_VARS, _MPI_SIZE_VARS):
        if rv in os.environ and sv in os.environ:
            return int(os.environ[rv]), int(os.environ[sv])
    if "PMIX_RANK" in os.environ:  # Open MPI 5 / PMIx: ask MPI for the size
        from mpi4py import MPI
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return 0, 1


def is_driver_process() -> bool:
    """True on rank 0 (or when not launched by mpirun/torchrun): the rank that owns I/O."""
    return env_world()[0] == 0


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Distributed:
    """A torch.distributed group over all ranks, with the few collectives the engine needs."""

    def __init__(self, rank: int, world_size: int, device: str, group=None):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.group = group
        self.bytes_communicated = 0  # sent + received by this rank, all collectives
        self.num_collectives = 0

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def _count(self, sent: int, received: int) -> None:
        self.bytes_communicated += sent + received
        self.num_collectives += 1

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor (same shape on all ranks), in rank order."""
        import torch.distributed as dist

        t = t.contiguous()
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.group)
        n = t.numel() * t.element_size()
        self._count(n * (self.world_size - 1), n * (self.world_size - 1))
        return out

    def all_gather_cat(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat(self.all_gather(t), dim)

    def all_gather_object(self, obj) -> list:
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        n = len(pickle.dumps(obj))
        self._count(n * (self.world_size - 1), n * (self.world_size - 1))
        return out

    def broadcast_object(self, obj=None, src: int = 0):
        """rank `src` sends `obj` (pickled); every rank returns it."""
        import torch.distributed as dist

        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self.group)
        n = len(pickle.dumps(box[0]))
        self._count(n * (self.world_size - 1) if self.rank == src else 0, 0 if self.rank == src else n)
        return box[0]

    def close(self) -> None:
        """Leave the group (before the process exits: gloo's threads must not outlive it)."""
        global _current
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if _current is self:
            _current = None

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)


_current: Distributed | None = None


def init_distributed(device: str = "cpu") -> Distributed | None:
    """Join (once per process) the group of the ranks mpirun/torchrun started; None when running alone."""
    global _current
    if _current is not None:
        return _current
    rank, size = env_world()
    if size <= 1:
        return None
    import torch.distributed as dist

    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ and "RANK" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=size)  # torchrun: env://
        else:
            try:
                from mpi4py import MPI
            except ImportError:
                raise DFlashError("tensor parallelism under mpirun needs mpi4py: pip install mpi4py mpich") from None
            comm = MPI.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = comm.bcast(int(os.environ.get("MASTER_PORT") or _free_port(addr)) if rank == 0 else None, root=0)
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count()))))
    _current = Distributed(dist.get_rank(), dist.get_world_size(), device)
    return _current


def current() -> Distributed | None:
    return _current

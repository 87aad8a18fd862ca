"""Process groups for tensor parallelism, from the ranks `mpirun -n N` (or torchrun) started.

Under mpirun, rank and size come from mpi4py; rank 0 picks a free TCP port on 127.0.0.1 (or MASTER_ADDR) and
broadcasts it over MPI, then every rank joins `torch.distributed` ("gloo" on CPU, "nccl" on CUDA). torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) is accepted as well. The CPU torch wheel has no MPI
backend, hence MPI only for the rendezvous.

Every collective counts the bytes it moves (`bytes_communicated`: the bytes this rank sends plus receives,
whatever algorithm the backend picks), so benchmarks can report the traffic per engine step.

`Channel` carries rank 0's control messages (runtime/tensor_parallel.py's SPMD) on a gloo group of its own, so a
receiver can wait with a deadline and still notice signals, which a blocking collective cannot.
"""
from __future__ import annotations

import datetime
import os
import pickle
import re
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


def _mpi_comm():
    """MPI.COMM_WORLD under mpirun, None under torchrun or alone."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return None
    if env_world()[1] <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise DFlashError("tensor parallelism under mpirun needs mpi4py: pip install mpi4py mpich") from None
    return MPI.COMM_WORLD


def driver_check(check) -> None:
    """Run `check` (which raises DFlashError) on rank 0 only and raise its error on every rank.

    For checks of rank 0's own resources (the HTTP port) before the ranks' group exists: if rank 0 alone
    failed, the other ranks would sit in the rendezvous until the launcher killed them, and the user would see
    mpirun's crash banner instead of one line. Under torchrun (no MPI) the other ranks skip the check.
    """
    rank, size = env_world()
    if size <= 1:
        check()
        return
    err = None
    if rank == 0:
        try:
            check()
        except DFlashError as e:
            err = str(e)
    comm = _mpi_comm()
    if comm is not None:
        err = comm.bcast(err, root=0)
    if err is not None:
        raise DFlashError(err)


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


class PeerGone(Exception):
    """A Channel receive that ended without a message: the sender failed, or the caller stopped waiting."""


class Channel:
    """Pickled messages from rank 0 to every rank, on a CPU gloo group of their own.

    Why not `broadcast_object_list` on the model's group: a receiver blocked in a collective can neither time
    out early nor run Python signal handlers until a message arrives. Here receivers wait in short slices and ask
    `give_up()` between them (a deadline, a signal), and the group is gloo even when the model's is NCCL.
    Messages up to HEAD - 8 bytes (every engine step's) cost one broadcast; longer ones a second for the rest.
    """

    HEAD = 256
    SLICE_S = 0.5

    def __init__(self, d: Distributed):
        import torch.distributed as dist

        self.d = d
        self.group = dist.new_group(backend="gloo")  # collective: every rank creates it at the same point

    def send(self, obj) -> None:
        import torch.distributed as dist

        data = pickle.dumps(obj)
        k = self.HEAD - 8
        head = bytearray(self.HEAD)
        head[:8] = len(data).to_bytes(8, "little")
        head[8:8 + min(k, len(data))] = data[:k]
        dist.broadcast(torch.frombuffer(head, dtype=torch.uint8), 0, group=self.group)
        sent = self.HEAD
        if len(data) > k:
            dist.broadcast(torch.frombuffer(bytearray(data[k:]), dtype=torch.uint8), 0, group=self.group)
            sent += len(data) - k
        self.d._count(sent * (self.d.world_size - 1), 0)

    def recv(self, give_up=lambda: None):
        """The next message; PeerGone when the sender failed or `give_up()` returned a reason (a string)."""
        head = torch.empty(self.HEAD, dtype=torch.uint8)
        self._wait(head, give_up)
        raw = head.numpy().tobytes()
        n, k = int.from_bytes(raw[:8], "little"), self.HEAD - 8
        data = raw[8:8 + min(n, k)]
        if n > k:
            rest = torch.empty(n - k, dtype=torch.uint8)
            self._wait(rest, give_up)
            data += rest.numpy().tobytes()
        self.d._count(0, self.HEAD + max(0, n - k))
        return pickle.loads(data)

    def _wait(self, t: torch.Tensor, give_up) -> None:
        import torch.distributed as dist

        work = dist.broadcast(t, 0, group=self.group, async_op=True)
        while True:
            try:
                work.wait(timeout=datetime.timedelta(seconds=self.SLICE_S))
                return
            except RuntimeError as e:
                if work.is_completed():  # finished just now, or failed: a second wait returns or says why
                    try:
                        work.wait()
                        return
                    except RuntimeError as e2:  # gloo: "[pair.cc:537] Read error ...: Connection reset by peer. ..."
                        why = re.sub(r"^\[[^\]]*\]\s*", "", (str(e2).splitlines() or [""])[0]).split(". ")[0]
                        raise PeerGone(f"lost the connection to rank 0 ({why[:200]})") from None
                last = e
            why = give_up()
            if why:
                raise PeerGone(why) from last


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

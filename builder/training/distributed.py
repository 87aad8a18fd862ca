"""Data parallelism for dflash-train under torchrun: a process group, and the few collectives the trainer needs.

The drafter is not wrapped in DistributedDataParallel: a rank trains several sequences of different lengths per
step (some with no anchor at all), a shape DDP's per-forward bookkeeping does not fit. Summing the gradients once
per step after the local backward passes is the same all-reduce DDP performs, on one flat buffer.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist


@dataclass
class Group:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    def barrier(self) -> None:
        tdist.barrier()

    def broadcast(self, params: list[torch.Tensor]) -> None:
        """Rank 0's values everywhere: every rank starts from the same weights, whatever it loaded."""
        with torch.no_grad():
            for p in params:
                tdist.broadcast(p.data, 0)

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        tdist.all_reduce(flat)
        off = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[off:off + n].view_as(p).to(p.dtype)
            off += n

    def sum_values(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        tdist.all_reduce(t)
        return t.tolist()

    def max_value(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return t.item()

    def same_everywhere(self, params: list[torch.Tensor]) -> bool:
        """Whether every rank holds bitwise the same values (elementwise max == min over the ranks)."""
        flat = torch.cat([p.detach().reshape(-1).double() for p in params])
        hi, lo = flat.clone(), flat.clone()
        tdist.all_reduce(hi, op=tdist.ReduceOp.MAX)
        tdist.all_reduce(lo, op=tdist.ReduceOp.MIN)
        return torch.equal(hi, lo)

    def close(self, together: bool = False) -> None:
        """together: after a run every rank finished, wait for all of them first (a rank that tore its gloo group
        down while another was still writing the export could abort at exit: "terminate called without an active
        exception"); never after an error, where the others may not come."""
        if tdist.is_initialized():
            if together:
                tdist.barrier()
            tdist.destroy_process_group()


def launched_world() -> int:
    """Ranks torchrun started (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_group(device: str, timeout_min: float = 60.0) -> Group | None:
    """The process group of a torchrun launch (None for a single process): nccl for GPUs, one GPU per local
    rank; gloo on CPUs. torchrun's environment (MASTER_ADDR, RANK, ...) says where the others are. timeout_min:
    how long ranks wait for rank 0 to build the drafter's start (feature cache, data) before giving up."""
    if launched_world() <= 1:
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    if not tdist.is_initialized():
        tdist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_min))
    return Group(tdist.get_rank(), tdist.get_world_size(), local, dev)

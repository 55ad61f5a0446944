"""The trainer ranks as one torch.distributed group: where they meet, which backend, and
the two collectives the update needs (a start from identical weights, summed gradients).

Ranks may sit on different Ray nodes, so the rendezvous address is rank 0's node IP (as
Ray knows it) and a port free there, never a loopback address picked on the driver."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist


class ClusterTooSmall(ValueError):
    """The Ray cluster cannot hold the GPUs the trainer ranks ask for."""


def backend_for(device: torch.device | str) -> str:
    """NCCL between GPUs, gloo between CPUs."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rendezvous_address(node_ip: str) -> str:
    """``ip:port`` for rank 0 to listen on: a port free on this node now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return f"{node_ip}:{s.getsockname()[1]}"


def join(address: str, rank: int, world: int, device: torch.device) -> None:
    """Join the group of ``world`` ranks meeting at ``address``."""
    dist.init_process_group(backend_for(device), init_method=f"tcp://{address}", rank=rank,
                            world_size=world)


def in_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def broadcast_from_rank0(params: Sequence[torch.Tensor]) -> None:
    """Every rank starts from rank 0's copy of ``params`` (same seed gives the same
    LoRA init on one build; this makes it so across builds and devices)."""
    for p in params:
        dist.broadcast(p.data, src=0)


def sum_gradients(params: Sequence[torch.nn.Parameter], bucket_bytes: int) -> None:
    """Sum the gradients of ``params`` over the group, in flat buckets of at most
    ``bucket_bytes`` (one collective per bucket rather than per tensor; all buckets are
    in flight at once). A missing gradient counts as zeros, so every rank sends the same
    layout."""
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    pending = []
    for bucket in buckets(grads, bucket_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        pending.append((bucket, flat, dist.all_reduce(flat, op=dist.ReduceOp.SUM,
                                                      async_op=True)))
    for bucket, flat, work in pending:
        work.wait()
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def buckets(tensors: Sequence[torch.Tensor], max_bytes: int) -> Iterator[list[torch.Tensor]]:
    """``tensors`` in order, cut into runs of one device and dtype of at most
    ``max_bytes`` each (a tensor larger than that is a bucket of its own)."""
    run: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if run and (size + nbytes > max_bytes or (t.device, t.dtype) != (run[0].device,
                                                                         run[0].dtype)):
            yield run
            run, size = [], 0
        run.append(t)
        size += nbytes
    if run:
        yield run


def check_cluster_gpus(world: int, per_rank: float, total: float, largest_node: float
                       ) -> None:
    """ClusterTooSmall if ``world`` ranks of ``per_rank`` GPUs cannot be placed on a
    cluster of ``total`` GPUs whose largest node has ``largest_node``."""
    need = world * per_rank
    if need > total:
        raise ClusterTooSmall(
            f"ray.num_workers={world} x ray.num_gpus_per_worker={per_rank:g} = {need:g} "
            f"GPUs, but the Ray cluster has {total:g}")
    if per_rank > largest_node:
        raise ClusterTooSmall(
            f"ray.num_gpus_per_worker={per_rank:g}, but the largest Ray node has "
            f"{largest_node:g} GPUs (a rank runs on one node)")


def wait_for_gpus(world: int, per_rank: float, timeout_s: float,
                  resources: Callable[[], tuple[float, float]]) -> None:
    """Wait up to ``timeout_s`` until ``resources()`` (total GPUs, largest node's GPUs)
    can hold the ranks; ClusterTooSmall with the numbers then."""
    if per_rank <= 0:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        total, largest = resources()
        try:
            check_cluster_gpus(world, per_rank, total, largest)
            return
        except ClusterTooSmall as exc:
            if time.monotonic() >= deadline:
                raise ClusterTooSmall(f"{exc} (waited {timeout_s:g} s for more; "
                                      "ray.resources_timeout_s)") from None
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))

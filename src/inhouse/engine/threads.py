"""CPU threads for torch and for the kernels' work pool, set around every step.

``torch.set_num_threads`` takes effect for the calling thread's parallel regions: a
step loop on a thread of its own, with the setting made on the thread that loaded the
model, ran its decode steps measurably slower, though ``torch.get_num_threads()`` read
the same there. So each step sets it on the thread that runs it.

A q8/q4 step, or a bf16 one on AMX tiles (``kernel_pool``), runs its heavy work on the
C++ kernels' own pool, and torch's remaining ops (the embedding lookup, picking logits
rows, the sampler's argmax) on the step's thread alone: an OpenMP team woken for a few
microseconds of work keeps polling for more afterwards, on the very cores the pool's next
linear needs, and on a busy 2-core host waiting for a team member that lost its core
took a whole scheduler slice (~8 ms for a 5-row ``argmax`` or a copy of 9 logits rows,
against ~0.01 ms alone).

A step on an accelerator leaves torch only its host-side bookkeeping (the attention
metadata, the sampler's small tensors): one thread. With torch's default of every CPU
(16 on the H200 machine measured), a decode step of a 135M model on CUDA took 44.9 ms
at one request and 37.8 ms at sixteen; on one thread, 20.9 ms and 23.1 ms.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def step_threads(device: torch.device, kernel_pool: bool) -> Iterator[None]:
    """Within: on a CPU, every CPU the process may use for torch's ops, or (``kernel_pool``)
    for the kernels' pool, torch's ops then on this thread alone; on an accelerator, torch's
    host-side ops on this thread alone. Torch's count restored after."""
    before = torch.get_num_threads()
    cpus = len(os.sched_getaffinity(0))
    if kernel_pool:
        torch.ops.inhouse_cpu.set_pool_threads(cpus)
    torch.set_num_threads(cpus if device.type == "cpu" and not kernel_pool else 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

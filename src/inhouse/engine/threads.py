"""CPU threads for torch, set in every thread that runs a model.

``torch.set_num_threads`` takes effect for the calling thread's parallel regions: a
step loop on a thread of its own, with the setting made on the thread that loaded the
model, ran its decode steps measurably slower, though ``torch.get_num_threads()`` read
the same there. So each thread that runs a forward pass sets it once, itself.
"""

from __future__ import annotations

import os
import threading

import torch

_this_thread = threading.local()


def use_cpu_threads() -> None:
    """Give this thread's torch ops every CPU the process may use (once per thread)."""
    if getattr(_this_thread, "done", False):
        return
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    _this_thread.done = True

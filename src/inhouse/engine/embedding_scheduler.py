"""The embedding model's scheduler: one thread runs every embeddings request in steps.

Each step is one forward pass of at most ``step_tokens`` padded tokens (rows x longest
row; by default one input of the model's longest, ~0.07 s of MiniLM on one core, at 92%
of the throughput of 16 such rows), filled by taking one input at a time from each
waiting request in turn, starting with the newest and then rotating. So a one-input
request that arrives while a 2,048-input one runs is in the next step, short inputs of
several requests share a step, a request whose client left is dropped before its next
input runs (:meth:`EmbeddingJob.cancel`), and the embedding model never takes a thread
that grammar compiling or tokenizing needs. The thread runs at a lower CPU priority
than the chat engine's step loop (``nice`` + ``NICE_INCREMENT``), with ``threads``
torch threads of its own (half the CPUs, at least one).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch

from inhouse.engine.embedder import Embedder
from inhouse.engine.stats import EmbeddingStats

log = logging.getLogger(__name__)

NICE_INCREMENT = 5  # below the chat engine: its decode steps win a shared core
TOKENIZE_AHEAD = 8  # inputs tokenized at a time, as a request's turn needs them


@dataclass(slots=True)
class EmbeddingResult:
    """A finished request: unit vectors in input order and the tokens the model read."""

    vectors: torch.Tensor
    prompt_tokens: int


@dataclass(eq=False, slots=True)
class EmbeddingJob:
    """One request's inputs, how far it got, and the future its caller awaits."""

    inputs: list[str] | list[list[int]]
    future: Future[EmbeddingResult] = field(default_factory=Future)
    tokenized: deque[list[int]] = field(default_factory=deque)
    next_input: int = 0  # the first input not tokenized yet
    rows: list[torch.Tensor] = field(default_factory=list)
    tokens: int = 0

    def cancel(self) -> None:
        """Stop: inputs not yet in a step never run (the caller has left)."""
        self.future.cancel()

    @property
    def exhausted(self) -> bool:
        """Every input is in a step that ran or is being built."""
        return not self.tokenized and self.next_input >= len(self.inputs)

    def peek(self, embedder: Embedder) -> list[int]:
        """The next input's token ids (tokenizing a few more when none are ready)."""
        if not self.tokenized:
            end = min(self.next_input + TOKENIZE_AHEAD, len(self.inputs))
            self.tokenized.extend(embedder.token_ids(self.inputs[self.next_input : end]))
            self.next_input = end
        return self.tokenized[0]

    def settle(self, result: EmbeddingResult | None = None, error: Exception | None = None) -> None:
        """Complete the future, unless the caller cancelled it meanwhile."""
        try:
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)  # type: ignore[arg-type]
        except InvalidStateError:
            pass


class EmbeddingScheduler:
    """Runs :class:`EmbeddingJob` s on one thread, a token budget per step, in turns."""

    def __init__(
        self,
        embedder: Embedder,
        step_tokens: int | None = None,
        threads: int | None = None,
    ) -> None:
        step_tokens = step_tokens or embedder.max_seq_length
        if step_tokens < embedder.max_seq_length:
            raise ValueError(f"step_tokens must hold one input of {embedder.max_seq_length}")
        self.embedder = embedder
        self.step_tokens = step_tokens
        self.threads = threads or max(1, len(os.sched_getaffinity(0)) // 2)
        self._new: queue.SimpleQueue[EmbeddingJob | None] = queue.SimpleQueue()
        self._jobs: deque[EmbeddingJob] = deque()
        self._inputs = self._tokens = 0  # written by the scheduler's thread only
        self._thread = threading.Thread(target=self._run, name="inhouse-embed", daemon=True)
        self._thread.start()

    def submit(self, inputs: list[str] | list[list[int]]) -> EmbeddingJob:
        """Queue a request; its future gives an :class:`EmbeddingResult`."""
        if not inputs:
            raise ValueError("an embedding request needs at least one input")
        job = EmbeddingJob(inputs)
        self._new.put(job)
        return job

    def stats(self) -> EmbeddingStats:
        """Requests not finished (as of the last step) and what has been embedded."""
        return EmbeddingStats(len(self._jobs) + self._new.qsize(), self._inputs, self._tokens)

    def close(self) -> None:
        """Stop the thread after its current step; unfinished jobs are cancelled."""
        self._new.put(None)
        self._thread.join()

    def _run(self) -> None:
        _lower_priority()
        torch.set_num_threads(self.threads)
        while self._take_new(block=not self._jobs):
            self._jobs = deque(job for job in self._jobs if not job.future.done())
            if self._jobs:
                self._step()
        for job in self._jobs:
            job.cancel()

    def _take_new(self, block: bool) -> bool:
        while True:
            try:
                job = self._new.get(block=block)
            except queue.Empty:
                return True
            if job is None:
                return False
            self._jobs.appendleft(job)  # a newcomer's first input is in the next step
            block = False

    def _step(self) -> None:
        batch = self._next_batch()
        if not batch:
            return
        try:
            vectors = self.embedder.embed([ids for _, ids in batch])
        except Exception as error:  # fails the requests in this step, not the thread
            log.exception("embedding step failed")
            for job in {job for job, _ in batch}:
                job.settle(error=error)
            return
        for (job, ids), row in zip(batch, vectors, strict=True):
            job.rows.append(row)
            job.tokens += len(ids)
        self._inputs += len(batch)
        self._tokens += sum(len(ids) for _, ids in batch)
        for job in {job for job, _ in batch}:
            if job.exhausted:
                job.settle(EmbeddingResult(torch.stack(job.rows), job.tokens))
        self._jobs.rotate(-1)  # the next step starts with the next request

    def _next_batch(self) -> list[tuple[EmbeddingJob, list[int]]]:
        """Inputs from each request in turn, while rows x longest row fits the budget."""
        batch: list[tuple[EmbeddingJob, list[int]]] = []
        longest = 0
        active = [job for job in self._jobs if not job.exhausted]
        while active:
            for job in list(active):
                try:
                    ids = job.peek(self.embedder)
                except Exception as error:  # input the tokenizer refuses: that request fails
                    job.settle(error=error)
                    active.remove(job)
                    continue
                width = max(longest, len(ids))
                if batch and (len(batch) + 1) * width > self.step_tokens:
                    return batch
                batch.append((job, job.tokenized.popleft()))
                longest = width
                if job.exhausted:
                    active.remove(job)
        return batch


def _lower_priority() -> None:
    """Raise this thread's nice value by ``NICE_INCREMENT`` (Linux nice is per thread;
    torch's worker threads for it inherit it when they are created)."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICE_INCREMENT)
    except OSError:  # not permitted or not Linux: run at the process's priority
        log.info("could not lower the embedding thread's priority")

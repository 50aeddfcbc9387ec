"""The request merger of `vsr-run serve`: concurrent calls queue on the event loop and one worker
thread runs the engine (an Engine is not thread-safe), a batch of calls at a time.

A call is a list of token-id rows (its inputs, already checked by the tokenizer) and a top_k. The
queue holds at most `max_queue` calls; `submit` on a full queue raises QueueFull (the service's
503). The collector takes the calls that are waiting, whole calls only, up to `max_batch` rows,
and hands them to the worker thread. How their rows meet the engine is the merging rule:

- "exact": each call is its own engine call, in CLI_CHUNK rows at a time, exactly as `vsr-run`
  answers that call's inputs alone; calls are merged in the queue and the worker's trip, not in
  the engine's batches, and the collector never waits for more. On the CPU reference path (and,
  through the shape ladder's tiles, on a GPU) a row's bytes depend on the rows it shares an engine
  batch with: measured with MKL's fp32 GEMM, any second row changes a row's probabilities by up
  to 1e-6, even at the same token count. Only this rule gives every caller the CLI's bytes.
- "shared": the rows of every call in the batch form one engine call (the engine sorts them by
  length into batches of BATCH_SIZE on the shape ladder, so CUDA graphs replay). A batch whose
  first call found the engine idle and nothing queued waits up to `max_wait_ms` for more calls
  while it is short of `max_batch` rows; calls that queued while the engine ran go at once (they
  have waited already), so under load the engine runs batch after batch without idling. Each answer is the
  CLI's answer for the merged list (`vsr-run` given those inputs together, in that order), within
  the engine's rounding (about 1e-6 in a probability) of the caller's answer alone.

An exception in the engine fails the calls of that engine call only (their futures carry it);
the worker goes on with the next batch. `close` lets every call accepted so far be answered, then
stops the worker.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

CLI_CHUNK = 64   # the inputs `vsr-run` answers per engine call (cli/run.py reads it from here)
MERGE_RULES = ("exact", "shared")


class QueueFull(Exception):
    """The queue holds max_queue calls; the caller should retry later."""


class Closed(Exception):
    """The batcher is draining or stopped and accepts no new calls."""


@dataclass
class Answered:
    """One call's outputs: its rows of the engine's output (probabilities or embeddings, fp32; a
    tensor, or the rows as lists of floats where they came from an engine process) and the
    engine's per-row results ({"choice", "top"} or {"embedding"}; None where the batcher was asked
    for outputs only), in input order; `replica` the engine process that answered, if any."""
    outputs: torch.Tensor | list[list[float]]
    results: list[dict] | None
    replica: int | None = None

    def rows(self) -> list[list[float]]:
        return self.outputs if isinstance(self.outputs, list) else self.outputs.tolist()


@dataclass
class _Call:
    ids: list[list[int]]
    top_k: int
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


def answer_ids(engine, ids: list[list[int]], top_k: int, *, results: bool = True) -> Answered:
    """The engine's answer to these rows as `vsr-run` computes it: CLI_CHUNK rows per engine
    call, each through Engine.answer's own path (forward of the token ids, then its results,
    unless `results` is False)."""
    outs = [engine._forward_ids(ids[i:i + CLI_CHUNK]) for i in range(0, len(ids), CLI_CHUNK)]
    y = torch.cat(outs) if len(outs) > 1 else outs[0]
    return Answered(y, engine._results(y, top_k) if results else None)


class Batcher:
    def __init__(self, engine, *, max_batch: int = 64, max_wait_ms: float = 2.0, max_queue: int = 1024,
                 merge: str = "exact", metrics=None, results: bool = True):
        if merge not in MERGE_RULES:
            raise ValueError(f"merge rule {merge!r} is not one of {', '.join(MERGE_RULES)}")
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and max_queue must be at least 1 and max_wait_ms not negative")
        self.engine, self.merge, self.metrics, self.results = engine, merge, metrics, results
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self._queue: asyncio.Queue | None = None
        self._carry: _Call | None = None   # a call that did not fit the last batch: first in the next
        self._task: asyncio.Task | None = None
        self._closing = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vsr-engine")

    # ---- the caller's side (the event loop) -------------------------------------------------

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="vsr-batcher")

    @property
    def depth(self) -> int:
        """Calls waiting (not yet handed to the worker)."""
        return (self._queue.qsize() if self._queue else 0) + (self._carry is not None)

    async def submit(self, ids: list[list[int]], top_k: int) -> Answered:
        """This call's answer; QueueFull when max_queue calls wait, Closed while draining."""
        return await self.enqueue(ids, top_k)

    def enqueue(self, ids: list[list[int]], top_k: int) -> asyncio.Future:
        """submit without the await: the future of this call's answer (QueueFull and Closed are
        raised here)."""
        if self._closing or self._queue is None:
            raise Closed("the service is shutting down")
        if not 1 <= len(ids) <= self.max_batch:
            raise ValueError(f"a call has 1 to {self.max_batch} inputs, got {len(ids)}")
        call = _Call(ids, top_k, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(call)
        except asyncio.QueueFull:
            raise QueueFull(f"{self.max_queue} calls are waiting") from None
        self._observe_depth()
        return call.future

    async def close(self) -> None:
        """Accept nothing more, answer every call already accepted, stop the worker thread."""
        if self._closing:
            return
        self._closing = True
        if self._queue is not None:
            await self._queue.put(None)   # after every accepted call: the collector stops there
        if self._task is not None:
            await self._task
        self._pool.shutdown(wait=True)

    # ---- the collector and the worker -------------------------------------------------------

    async def _next(self, timeout: float | None):
        if self._carry is not None:
            call, self._carry = self._carry, None
            return call
        if timeout is None:
            return await self._queue.get()
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            if timeout <= 0:
                raise TimeoutError from None
        return await asyncio.wait_for(self._queue.get(), timeout)

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        stop = False
        while not stop:
            # Calls that queued while the engine ran have waited already: they go at once. Only a
            # call that found the engine idle and nothing queued waits (up to max_wait) for company.
            idle = self._carry is None and self._queue.empty()
            first = await self._next(None)
            if first is None:
                break
            batch, rows = [first], len(first.ids)
            deadline = loop.time() + (self.max_wait if self.merge == "shared" and idle else 0.0)
            while rows < self.max_batch:
                try:
                    call = await self._next(deadline - loop.time())
                except TimeoutError:
                    break
                if call is None:
                    stop = True
                    break
                if rows + len(call.ids) > self.max_batch:
                    self._carry = call
                    break
                batch.append(call)
                rows += len(call.ids)
            self._observe_depth()
            await loop.run_in_executor(self._pool, self._run, batch, loop)

    def _run(self, batch: list[_Call], loop) -> None:
        """On the worker thread: the engine call(s) of one batch; each call's future is resolved
        on the event loop."""
        started = time.perf_counter()
        if self.metrics is not None:
            self.metrics.batch(len(batch), sum(len(c.ids) for c in batch),
                               [started - c.queued_at for c in batch])
        groups = [[c] for c in batch] if self.merge == "exact" else [batch]
        for group in groups:
            t0 = time.perf_counter()
            try:
                if len(group) == 1:
                    parts = [answer_ids(self.engine, group[0].ids, group[0].top_k, results=self.results)]
                else:   # one forward for the group; each call's results at its own top_k
                    merged = answer_ids(self.engine, [r for c in group for r in c.ids], 1, results=False)
                    parts, at = [], 0
                    for c in group:
                        y = merged.outputs[at:at + len(c.ids)]
                        parts.append(Answered(y, self.engine._results(y, c.top_k) if self.results else None))
                        at += len(c.ids)
            except Exception as e:   # the engine's failure is this group's answer, not the worker's end
                if self.metrics is not None:
                    self.metrics.engine_failed()
                for c in group:
                    loop.call_soon_threadsafe(_settle, c.future, None, e)
                continue
            if self.metrics is not None:
                self.metrics.engine_call(sum(len(c.ids) for c in group), time.perf_counter() - t0)
            for c, part in zip(group, parts, strict=True):
                loop.call_soon_threadsafe(_settle, c.future, part, None)

    def _observe_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth(self.depth)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():   # the caller went away (its task was cancelled): nothing to deliver
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)

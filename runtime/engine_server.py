"""Engine processes behind `vsr-run serve --replicas N --http-workers W`, docs/serve.md.

The split service: N engine processes (replica i on GPU i modulo the GPUs, or on the CPU), each
holding its engine and its Batcher behind a Unix socket, and W uvicorn worker processes on the
one port that parse HTTP, tokenize and write JSON. A worker hands each call's token ids to the
engine process with the fewest rows in flight and gets the call's output rows back; the engine
process merges the calls of every worker into its batches, so one engine's batches fill from all
of the port's traffic and a GPU holds one CUDA context, while the per-call Python work (HTTP,
JSON, tokenizing, the top-k labels) spreads over the workers' cores.

Frames: a 4-byte little-endian length, then a pickle. The sockets live in a folder only this
user can open (tempfile.mkdtemp), and only this service's own processes connect to them.
  worker -> engine: (call id, token-id rows, top_k)
  engine -> worker: ("card", {...}) once on connecting; then per call (call id, "ok", the rows'
  fp32 bytes, row count) or (call id, kind, message), kind "queue_full", "closed" or
  "engine_error" (the worker answers 503, 503 and 500).
The parent process starts the engines (spawn), waits for each to load and answer its warm-up,
restarts one that dies (workers reconnect to its socket) and, once uvicorn has drained the
workers, tells each engine to stop: it answers what it accepted and exits.
"""
from __future__ import annotations

import array
import asyncio
import itertools
import json
import multiprocessing
import pickle
import signal
import struct
import threading
import time
from pathlib import Path

from vsr.runtime.batcher import Answered, Closed, QueueFull

_LENGTH = struct.Struct("<I")
RECONNECT_S = 0.5      # how often a worker retries the socket of an engine process that went away
START_TIMEOUT_S = 900  # loading a 27B-class package and compiling its kernels can take minutes


class EngineError(Exception):
    """The engine process raised on the batch that held this call."""


def _frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader):
    (n,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(n))


# ---- the engine process ----------------------------------------------------------------------

def engine_main(cfg_json: str, slot: int, path: str, conn) -> None:
    """An engine process (a multiprocessing spawn target): load the engine, answer the warm-up,
    listen on `path` and say ("ready", card) over `conn`, or ("failed", exception). It ignores
    SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group, and the workers may
    still be draining): it stops when the parent sends "stop" or goes away."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    from vsr.runtime.service import ServeConfig, build_service, replica_device
    cfg = ServeConfig(**json.loads(cfg_json))
    try:
        service = build_service(cfg, replica=slot, device=replica_device(cfg, slot), results=False)
    except Exception as e:   # the parent reports it (and exits with the CLI's code for it)
        try:
            conn.send(("failed", e))
        except Exception:   # an exception that does not pickle
            conn.send(("failed", RuntimeError(f"{type(e).__name__}: {e}")))
        return
    asyncio.run(_engine_loop(service, slot, path, conn))


async def _engine_loop(service, slot: int, path: str, conn) -> None:
    await service.start()   # the batcher, the warm-up answer, the frozen heap
    engine = service.engine
    card = {"replica": slot, "labels": engine.labels, "mode": engine.mode, "device": service.device,
            "act_dtype": str(engine.act_dtype).removeprefix("torch.")}
    server = await asyncio.start_unix_server(lambda r, w: _serve_worker(service, card, r, w), path=path)
    conn.send(("ready", card))
    await asyncio.get_running_loop().run_in_executor(None, _until_stop, conn)
    server.close()
    await service.stop()   # every call accepted is answered first


def _until_stop(conn) -> None:
    try:
        conn.recv()   # "stop"
    except (EOFError, OSError):   # the parent is gone
        pass


async def _serve_worker(service, card: dict, reader, writer) -> None:
    """One worker's connection: each call frame goes into the batcher; its answer goes back as
    soon as the batch that held it is done."""
    writer.write(_frame(("card", card)))
    waiting: set[asyncio.Future] = set()

    def reply(cid: int, fut: asyncio.Future) -> None:
        waiting.discard(fut)
        if writer.is_closing() or fut.cancelled():
            return
        err = fut.exception()
        if err is None:
            out = fut.result().outputs
            writer.write(_frame((cid, "ok", out.numpy().tobytes(), out.shape[0])))
        else:
            kind = "queue_full" if isinstance(err, QueueFull) else "closed" if isinstance(err, Closed) else "engine_error"
            writer.write(_frame((cid, kind, f"{type(err).__name__}: {err}" if kind == "engine_error" else str(err))))

    try:
        while True:
            try:
                cid, ids, top_k = await _read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            try:
                fut = service.batcher.enqueue(ids, top_k)
            except (QueueFull, Closed, ValueError) as e:
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(e)
            waiting.add(fut)
            fut.add_done_callback(lambda f, cid=cid: reply(cid, f))
    finally:
        if waiting:   # the worker went away: its calls are still answered (and dropped)
            await asyncio.gather(*waiting, return_exceptions=True)
        writer.close()


# ---- the worker's side -----------------------------------------------------------------------

class _Link:
    """A worker's connection to one engine process."""

    def __init__(self, path: str):
        self.path = path
        self.card: dict | None = None
        self.writer = None
        self.pending: dict[int, tuple[asyncio.Future, int]] = {}
        self.rows = 0   # rows sent and not yet answered
        self.alive = False


class RemoteEngine:
    """What the service reads off its engine, for a worker whose engines run elsewhere: the
    package's tokenizer here, the rest from the engine processes' cards once connected."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.labels: list[str] | None = None
        self.mode = "unknown"
        self.act_dtype = "unknown"
        self.device = "unknown"

    def take_cards(self, cards: list[dict]) -> None:
        first = cards[0]
        self.labels, self.mode, self.act_dtype = first["labels"], first["mode"], first["act_dtype"]
        self.device = ",".join(sorted({c["device"] for c in cards}))


class RemoteBatcher:
    """The Batcher's interface (start, submit, depth, close) over the engine processes' sockets:
    each call goes to the live engine with the fewest rows in flight; a call whose engine goes
    away gets Closed (503), and the link reconnects once the parent has restarted the engine."""

    def __init__(self, paths: list[str], engine: RemoteEngine, *, max_batch: int):
        from vsr.runtime.engine import row_results
        self._row_results = row_results
        self.engine, self.max_batch = engine, max_batch
        self.links = [_Link(p) for p in paths]
        self._ids = itertools.count()
        self._closing = False
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        cards = []
        for link in self.links:
            await self._connect(link)
            cards.append(link.card)
        self.engine.take_cards(cards)

    @property
    def available(self) -> bool:
        return any(link.alive for link in self.links)

    @property
    def depth(self) -> int:
        """Calls sent and not yet answered."""
        return sum(len(link.pending) for link in self.links)

    async def _connect(self, link: _Link) -> None:
        reader, writer = await asyncio.open_unix_connection(link.path)
        kind, card = await _read_frame(reader)
        assert kind == "card", kind
        link.card, link.writer, link.alive = card, writer, True
        self._spawn(self._read_answers(link, reader))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def submit(self, ids: list[list[int]], top_k: int) -> Answered:
        if self._closing:
            raise Closed("the service is shutting down")
        if not 1 <= len(ids) <= self.max_batch:
            raise ValueError(f"a call has 1 to {self.max_batch} inputs, got {len(ids)}")
        live = [link for link in self.links if link.alive]
        if not live:
            raise Closed("no engine process is running; retry later")
        link = min(live, key=lambda lk: lk.rows)
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        link.pending[cid] = (fut, len(ids))
        link.rows += len(ids)
        link.writer.write(_frame((cid, ids, top_k)))
        rows = await fut
        return Answered(rows, self._row_results(self.engine.labels, rows, top_k), link.card["replica"])

    async def _read_answers(self, link: _Link, reader) -> None:
        try:
            while True:
                msg = await _read_frame(reader)
                fut, n = link.pending.pop(msg[0])
                link.rows -= n
                if fut.done():   # the caller went away
                    continue
                kind = msg[1]
                if kind == "ok":
                    flat = array.array("f", msg[2]).tolist()   # the exact fp32 values, as Python floats
                    width = len(flat) // n
                    fut.set_result([flat[i * width:(i + 1) * width] for i in range(n)])
                elif kind == "queue_full":
                    fut.set_exception(QueueFull(msg[2]))
                elif kind == "closed":
                    fut.set_exception(Closed(msg[2]))
                else:
                    fut.set_exception(EngineError(msg[2]))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        link.alive = False
        link.writer.close()
        replica = link.card["replica"] if link.card else "?"
        for fut, _ in link.pending.values():
            if not fut.done():
                fut.set_exception(Closed(f"engine process {replica} stopped before answering; retry"))
        link.pending.clear()
        link.rows = 0
        if not self._closing:
            self._spawn(self._reconnect(link))

    async def _reconnect(self, link: _Link) -> None:
        while not self._closing:
            await asyncio.sleep(RECONNECT_S)
            try:
                await self._connect(link)
                return
            except (OSError, asyncio.IncompleteReadError):
                continue

    async def close(self) -> None:
        """Wait for every call sent to be answered, then close the connections."""
        self._closing = True
        waiting = [fut for link in self.links for fut, _ in link.pending.values()]
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)
        for link in self.links:
            if link.writer is not None:
                link.writer.close()
        for task in list(self._tasks):
            task.cancel()


# ---- the parent ------------------------------------------------------------------------------

class EngineProcesses:
    """The parent's engine processes: start them (each loaded and warm before `start` returns),
    restart one that dies while the service runs, stop them once the workers have drained."""

    def __init__(self, cfg_json: str, replicas: int, folder: Path, log=print):
        self.cfg_json, self.log = cfg_json, log
        self.paths = [str(folder / f"engine-{slot}.sock") for slot in range(replicas)]
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: list = [None] * replicas
        self._conns: list = [None] * replicas
        self._stopping = threading.Event()
        self._watch: threading.Thread | None = None

    def _launch(self, slot: int):
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=engine_main, args=(self.cfg_json, slot, self.paths[slot], child),
                                 name=f"vsr-engine-{slot}", daemon=False)
        proc.start()
        child.close()
        return proc, parent

    def _await_ready(self, slot: int, proc, conn) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not conn.poll(0.2):
            if not proc.is_alive():
                raise RuntimeError(f"engine process {slot} exited with code {proc.exitcode} while loading")
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"engine process {slot} did not load within {START_TIMEOUT_S} s")
        try:
            kind, payload = conn.recv()
        except EOFError:   # it died before a word (a script that starts the service needs a main guard)
            proc.join()
            raise RuntimeError(f"engine process {slot} exited with code {proc.exitcode} while loading") from None
        if kind == "failed":
            proc.join()
            raise payload
        return payload

    def start(self) -> list[dict]:
        """Start every engine in parallel; their cards once each has answered its warm-up call.
        If one fails, the others are stopped and its exception is raised here."""
        launched = [self._launch(slot) for slot in range(len(self.paths))]
        self._procs = [p for p, _ in launched]
        self._conns = [c for _, c in launched]
        try:
            cards = [self._await_ready(slot, p, c) for slot, (p, c) in enumerate(launched)]
        except BaseException:
            self.stop()
            raise
        self._watch = threading.Thread(target=self._watch_loop, name="vsr-engine-watch", daemon=True)
        self._watch.start()
        return cards

    def _watch_loop(self) -> None:
        not_before = [0.0] * len(self._procs)   # a slot whose restart failed waits longer each time
        backoff = [1.0] * len(self._procs)
        while not self._stopping.wait(1.0):
            for slot, proc in enumerate(self._procs):
                if proc.is_alive() or self._stopping.is_set() or time.monotonic() < not_before[slot]:
                    continue
                self.log(f"vsr-run serve: engine process {slot} exited with code {proc.exitcode}; restarting it")
                try:
                    proc, conn = self._launch(slot)
                    self._procs[slot], self._conns[slot] = proc, conn
                    self._await_ready(slot, proc, conn)
                    backoff[slot] = 1.0
                except Exception as e:
                    backoff[slot] = min(2 * backoff[slot], 60.0)
                    not_before[slot] = time.monotonic() + backoff[slot]
                    self.log(f"vsr-run serve: engine process {slot} did not restart ({type(e).__name__}: {e}); "
                             f"next try in {backoff[slot]:.0f} s")

    def stop(self, timeout: float = 60.0) -> None:
        """Tell every engine to stop (each answers what it accepted first) and wait for them."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.join()
        for conn in self._conns:
            try:
                conn.send("stop")
            except (OSError, AttributeError):
                pass
        for proc in self._procs:
            if proc is None:
                continue
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()

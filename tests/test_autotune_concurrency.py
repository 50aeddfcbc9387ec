"""Proof (c) of issue 5: 16 processes tune and read overlapping keys of one cache file (a fake
timer, on CPU) while some are SIGKILLed at random; afterwards the file passes PRAGMA
integrity_check, every finished key is in it, no key was tuned twice, and every surviving
process got the tiles the file holds."""
import json
import multiprocessing
import os
import random
import signal
import time

import pytest

from vsr.autotune.store import SqliteStore

CPU_ID = ("cpu", "x86_64", None, None, 2)


def _timer(fn):
    time.sleep(0.01)  # slow enough that kills land mid-tune
    t = fn.__defaults__[0]
    return 1.0 / t["BLOCK_K"] + 0.001 * t["BLOCK_N"]


def _worker(db, log, out, seed):
    import torch

    from vsr.autotune.device_id import DeviceIdentity
    from vsr.autotune.fake import FAKE_DENSE
    from vsr.autotune.resolver import TileResolver
    from vsr.kernels.dense import DenseWeight

    def on_tuned(entry):
        # Logged only after the entry is committed: a logged key is a finished key.
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{entry.digest} {os.getpid()}\n".encode())
        os.close(fd)

    probs = []
    for N in (24, 40, 56, 72):
        w = DenseWeight(torch.ones(N, 32))
        probs += [FAKE_DENSE.problem(w, b, torch.float32) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    random.Random(seed).shuffle(probs)
    r = TileResolver(db, "tune", "cpu", identity=DeviceIdentity(*CPU_ID), timer=_timer, on_tuned=on_tuned)
    tiles = {r.key(FAKE_DENSE, p).digest(): r.tile(FAKE_DENSE, p) for p in probs}
    with open(out, "w") as f:
        json.dump(tiles, f)


N_PROCS = 16
N_KEYS = 32


def test_sixteen_processes_with_random_kills(tmp_path):
    db, log = tmp_path / "shared.db", tmp_path / "tuned.log"
    rng = random.Random(1234)
    # forkserver with the modules preloaded: 16 children start at once without 16 torch imports
    # (2 CPU cores), and without forking a pytest process whose thread pools may be in use.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "vsr.autotune.resolver", "vsr.autotune.fake"])
    t0 = time.monotonic()
    procs = [ctx.Process(target=_worker, args=(str(db), str(log), str(tmp_path / f"out{i}.json"), i))
             for i in range(N_PROCS)]
    for p in procs:
        p.start()
    victims = rng.sample(range(N_PROCS), 5)
    time.sleep(0.3)
    for v in victims:
        time.sleep(rng.uniform(0.02, 0.3))
        procs[v].kill()
    for p in procs:
        p.join(timeout=90)
    assert time.monotonic() - t0 < 90
    killed = [v for v in victims if procs[v].exitcode == -signal.SIGKILL]
    assert killed, "no kill landed while the workers ran"
    print(f"killed {len(killed)} workers mid-run")
    outs = {}
    for i, p in enumerate(procs):
        if i in killed:
            continue
        assert p.exitcode == 0, f"worker {i} exited with {p.exitcode}"
        outs[i] = json.loads((tmp_path / f"out{i}.json").read_text())

    store = SqliteStore(db, create=False)
    assert store.integrity_check() == "ok"
    recorded = {e.digest: e.tile for e in store.entries()}
    assert len(recorded) == N_KEYS, "the survivors must have finished every key"
    lines = log.read_text().split()
    finished = lines[0::2]
    assert len(finished) == len(set(finished)), "a key was tuned twice"
    assert set(finished) <= set(recorded), "a finished key was lost"
    for i, tiles in outs.items():
        assert tiles == recorded, f"worker {i} used tiles that differ from the file's"
    assert all(t["BLOCK_K"] == 64 for t in recorded.values())

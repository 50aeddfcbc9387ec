"""The engine: a package's model, tokenizer and head behind one `predict` call (contract 9).

Modes:
- "reference": CPU. Every Linear runs its format's pure-torch reference (exact numerics).
- "emulated":  the same reference numerics, chosen explicitly with emulate=True (e.g. FP8 or
               NVFP4 on a device that refuses them); labelled so in every output.
- "triton":    a CUDA device: Linear layers run the Triton templates, tiles from a
               vsr.autotune TileResolver over `autotune_cache` with `miss_policy`.

dtype (the activation dtype):
- "auto" on a GPU: the package's own dtype (bf16 for the Qwen3 packages, fp32 for MiniLM).
- "auto" on the CPU: always fp32. CPU bf16 matmuls are slow and round every
  activation, and the reference path's job is to be exact; a bf16 package's weights
  are kept in bf16 and upcast per call, so the answers are those of its exact weights.
- "float32" | "bfloat16" | "float16": the same weights in that precision: dense
  weights (and norms) converted to it, quantized weights kept as stored, activations in it.

Batch shapes (CUDA devices, eager and graphed engines alike, unless load_engine's shape_ladder
says otherwise): a batch runs at a shape from a short ladder (batch_shape), its requests rounded
up to a power of two (the extra rows repeat its last request, and their answers are dropped) and
its tokens to a power of two up to 8, a multiple of 8 up to 64, of 16 past it, never past the
model's token limit (masked padding). Shapes then repeat across batches, so CUDA graphs replay;
and since the eager engine runs the same shapes, a graph gives the eager engine's bytes. The
padding costs compute where the products, not the host, take the time (the requests at most
doubled and the tokens rounded up as well: 17 requests of 9 tokens, 153 rows, run as 32 x 16, 512). A request's answer depends on the batch it shares (a batch pads to its
longest request), and the batches are a pure function of the request list.

Kernel sets (Engine.kernel_set): "exact" computes every operation with transformers' roundings
(the CPU reference path always; on the GPU a dense package at every dtype, and any package at an
explicit dtype); "approximate" (a quantized package at dtype "auto" on the GPU) lets the norms and
activations round once instead of twice and, for FP8 products, quantize their output for the
next product inside the same kernel. load_engine's kernel_set="exact" forces the exact set.

Products: q|k|v and gate|up run as one product each, their weights concatenated at load
(runtime/fuse.py); a layer runs four products.

cuda_graphs (CUDA only, on by default on a CUDA device; cuda_graphs=False or vsr-run
--no-cuda-graphs turns them off): a batch shape seen for the second time is captured as a
CUDA graph (after an eager run, which is that call's answer) and replayed from then on: one replay
instead of a host-side launch per kernel (an eager int4 or fp8 layer spends 66-177 us of host time
a call on an H200, several times its kernels' time). The same kernels and tiles run,
so a replay gives the eager forward's bytes. A shape's first call runs eagerly and captures
nothing, so traffic whose shapes never repeat costs what the eager engine costs; the
CUDA_GRAPHS_KEPT most recently used graphs are kept (their memory comes from one shared pool),
and a shape whose graph was evicted is captured again on its next call.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import torch

from vsr.autotune.buckets import bucket_for
from vsr.runtime.errors import DeviceRefusal, PackageError, RequestError
from vsr.runtime.tokenize import PackageTokenizer

KERNEL_SETS = ("exact", "approximate")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BATCH_SIZE = 32   # a power of two: batch_shape rounds a batch's requests up to one
CUDA_GRAPHS_KEPT = 32
# The call on which a shape is captured: its second (the first is answered eagerly, with no
# capture), so that a shape seen once costs no capture.
CAPTURE_AT = 2
# Shapes seen but not yet captured that a GraphedForward remembers, per graph kept.
SEEN_PER_GRAPH = 4


def batch_shape(requests: int, tokens: int, limit: int) -> tuple[int, int]:
    """The (requests, tokens) a batch of `requests` requests, the longest `tokens` tokens, runs
    at on a CUDA device (module docstring): requests to the next power of two; tokens to the next
    power of two up to 8, multiple of 8 up to 64 and of 16 past it, but never past `limit`, the
    model's token limit (PackageTokenizer.limit, within its position table). One request's rows
    (its tokens) so stay in their row bucket (autotune.buckets), and its products keep their
    tiles: padded to 8 tokens, a one-token request takes 1.1-1.5 ms more on the H200 than at its
    own shape, its products at bucket 8 launching more kernels than at bucket 1."""
    if not 1 <= tokens <= limit or not 1 <= requests <= BATCH_SIZE:
        raise ValueError(f"a batch has at least one request (at most {BATCH_SIZE}) of 1 to {limit} tokens, "
                         f"got {requests} x {tokens}")
    if tokens <= 8:
        padded = bucket_for(tokens)
    else:
        step = 8 if tokens <= 64 else 16
        padded = -(-tokens // step) * step
    return 1 << (requests - 1).bit_length(), min(limit, padded)


class _Graph(NamedTuple):
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]   # the static buffers each replay reads
    output: torch.Tensor               # the static buffer each replay writes


class GraphedForward:
    """model(*inputs) through one CUDA graph per shape of the inputs, captured on the shape's
    `capture_at`-th call (see the module docstring); before that, an eager run.

    The tensor returned is memory of the graphs' shared pool (before a shape is captured, and on
    the capturing call, an eager run's own output): valid until this object's next call, of any
    shape (another graph's replay may write there), so copy it out at once (the engine moves it
    to the CPU). One thread per object: captures and replays share its buffers and streams.
    Every capture takes counters from kernels/common.py's capture pools (the fixup kernels' arrival
    counts), which an evicted graph does not give back: a process that captures many thousand
    shapes ends with captured launches that zero their own counters (0.9-2 us each)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, kept: int = CUDA_GRAPHS_KEPT,
                 capture_at: int = CAPTURE_AT):
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        if kept < 1 or capture_at < 1:
            raise ValueError(f"kept and capture_at must be at least 1, got {kept} and {capture_at}")
        self.device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        self.model, self.kept, self.capture_at = model, kept, capture_at
        self.pool = None   # every graph allocates from one memory pool...
        with torch.cuda.device(self.device):
            self.capture_stream = torch.cuda.Stream()   # ...and is captured on one stream, as torch asks
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()   # input shapes -> graph, most recent last
        # Shapes not captured yet -> their calls so far, most recent last (SEEN_PER_GRAPH x kept).
        self.seen: OrderedDict[tuple, int] = OrderedDict()
        self.captures = 0

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple(tuple(t.shape) for t in inputs)
        with torch.cuda.device(self.device):   # Triton launches on the current device
            entry = self.graphs.get(key)
            if entry is None:
                calls = self.seen.pop(key, 0) + 1
                if calls < self.capture_at:
                    self._remember(key, calls)
                    return self.model(*(t.to(self.device) for t in inputs))   # the eager engine's run
                entry, warm = self._capture(inputs)
                self.graphs[key] = entry
                while len(self.graphs) > self.kept:   # an evicted shape is captured again on its next call
                    evicted = self.graphs.popitem(last=False)[0]
                    if self.capture_at > 1:   # (at 1, any next call captures: nothing to remember)
                        self._remember(evicted, self.capture_at - 1)
                return warm   # the same kernels and tiles as a replay: its bytes, one forward fewer
            self.graphs.move_to_end(key)
            for buf, t in zip(entry.inputs, inputs):
                buf.copy_(t)
            entry.graph.replay()
            return entry.output

    def _remember(self, key: tuple, calls: int) -> None:
        """A shape not captured (or no longer: evicted) and its calls so far, as the most recent
        in `seen`, whose oldest are forgotten past SEEN_PER_GRAPH x kept shapes."""
        self.seen[key] = calls
        while len(self.seen) > SEEN_PER_GRAPH * self.kept:
            self.seen.popitem(last=False)

    def _capture(self, inputs) -> tuple[_Graph, torch.Tensor]:
        """The graph of this shape, and the output of the eager run made before capturing it."""
        static = tuple(t.to(self.device, copy=True) for t in inputs)
        # An eager run first, on the capture stream (torch.cuda.graph's own warm-up advice): it
        # compiles every kernel and resolves every layer's tile (a cache miss may even tune), none
        # of which may happen while capturing. Its output is this call's answer.
        here = torch.cuda.current_stream()
        self.capture_stream.wait_stream(here)
        with torch.cuda.stream(self.capture_stream):
            warm = self.model(*static)
        here.wait_stream(self.capture_stream)
        warm.record_stream(here)   # made on the capture stream, read on the caller's
        from vsr.kernels import common
        graph = torch.cuda.CUDAGraph()
        mark = common.capture_counters_mark()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.capture_stream):
                out = self.model(*static)
        except BaseException:
            common.rewind_capture_counters(mark)   # nothing captured will run: its counters go back
            raise
        if self.pool is None:
            self.pool = graph.pool()
        self.captures += 1
        return _Graph(graph, static, out), warm


class Engine:
    def __init__(self, model, tokenizer: PackageTokenizer, *, mode: str, device: torch.device,
                 act_dtype: torch.dtype, weight_bytes: int, resolver=None, linears=None, cuda_graphs: bool = False,
                 shape_ladder: bool | None = None, kernel_set: str = "exact", fused=None):
        if kernel_set not in KERNEL_SETS:
            raise ValueError(f"kernel_set must be one of {KERNEL_SETS}, got {kernel_set!r}")
        self.model = model
        self.kernel_set = kernel_set
        # A fused product's label -> the package's Linear layers it runs (runtime/fuse.py).
        self.fused: dict = fused or {}
        # batch_shape's ladder: on every CUDA engine unless asked otherwise (load_engine's shape_ladder).
        self.shape_ladder = device.type == "cuda" if shape_ladder is None else shape_ladder
        self.graphed = GraphedForward(model, device) if cuda_graphs else None
        self.tokenizer = tokenizer
        self.mode = mode
        self.device = device
        self.act_dtype = act_dtype
        self.weight_bytes = weight_bytes
        self.resolver = resolver
        self.linears: dict = linears or {}  # module name -> QLinear, for tests and tools
        self.labels: list[str] | None = model.labels

    def forward(self, texts: list[str]) -> torch.Tensor:
        """Probabilities [n, L] (or embeddings [n, H]), fp32 on the CPU, in the order given.

        Requests are batched in order of token count (less padding), BATCH_SIZE at a time, each
        batch at its batch_shape on a CUDA device; the order is a pure function of the texts, so
        the same list gives the same batches.
        """
        if not texts:
            raise RequestError("no requests")
        return self._forward_ids(self.tokenizer.encode_checked(texts))

    @torch.inference_mode()  # here, not on forward: answer runs the model through this too
    def _forward_ids(self, ids: list[list[int]]) -> torch.Tensor:
        order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
        out: list[torch.Tensor | None] = [None] * len(ids)
        for s in range(0, len(order), BATCH_SIZE):
            idx = order[s:s + BATCH_SIZE]
            rows = [ids[i] for i in idx]
            if self.shape_ladder:
                n, length = batch_shape(len(rows), len(rows[-1]), self.tokenizer.limit)  # (rows[-1]: the longest)
                b = self.tokenizer.pad(rows + [rows[-1]] * (n - len(rows)), length)
            else:
                b = self.tokenizer.pad(rows)
            if self.graphed is not None:
                y = self.graphed(b.input_ids, b.attention_mask, b.lengths)
            else:
                y = self.model(b.input_ids.to(self.device), b.attention_mask.to(self.device), b.lengths.to(self.device))
            y = y[:len(idx)].float().cpu()
            for j, i in enumerate(idx):
                out[i] = y[j]
        return torch.stack(out)  # type: ignore[arg-type]

    def predict(self, texts: list[str], top_k: int = 3) -> list[dict]:
        """One dict per text: {"choice", "top": [[label, prob], ...]} or {"embedding": [...]}."""
        return self._results(self.forward(texts), top_k)

    def answer(self, texts: list[str], top_k: int = 3) -> list[dict]:
        """As predict, but a request this engine will not answer (empty, over-long) gets
        {"error": message} in its place and the others are still answered. Each text is
        tokenized once; the answered ones give the same bits as predict on them alone."""
        ids, problems = self.tokenizer.encode_each(texts)
        ok = [i for i, p in enumerate(problems) if p is None]
        out: list[dict] = [{"error": p} for p in problems]
        if ok:
            for i, r in zip(ok, self._results(self._forward_ids([ids[i] for i in ok]), top_k), strict=True):
                out[i] = r
        return out

    def _results(self, y: torch.Tensor, top_k: int) -> list[dict]:
        # Python floats once (the exact fp32 values), not a tensor index per label
        return row_results(self.labels, y.tolist(), top_k)


def row_results(labels: list[str] | None, rows: list[list[float]], top_k: int) -> list[dict]:
    """Engine.predict's dicts of output rows given as lists of floats: {"choice", "top"} for a
    classifier (the top_k labels by probability), {"embedding"} without labels."""
    if labels is None:
        return [{"embedding": row} for row in rows]
    k = max(1, min(int(top_k), len(labels)))
    res = []
    for row in rows:
        # Ties broken by label index (stable sort), so the answer never depends on the sort kernel.
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        top = [[labels[j], row[j]] for j in order]
        res.append({"choice": top[0][0], "top": top})
    return res


def _use_kernel_bundle(resolver) -> str | None:
    """Before the first kernel compiles: Triton reads the compiled-kernel bundle of this device
    and Triton version, found beside the autotune cache in use or installed by `vsr-tune import`
    (autotune.bundle; $VSR_KERNEL_BUNDLE names one, "off" none), and memoises the hashes every
    compile lookup needs (autotune.startup_memo). Once per process."""
    from vsr.autotune import bundle, startup_memo
    from vsr.runtime.paths import cache_root

    startup_memo.enable(cache_root())   # Triton's installation hash and the kernels' source hashes
    if bundle.active_path() is None:
        bundle.find_and_activate(resolver.identity, resolver.cache_path, cache_root() / "bundles")
    return bundle.active_path()


def load_engine(pkg, *, device="cpu", dtype="auto", emulate: bool = False, autotune_cache=None,
                miss_policy: str = "default", cuda_graphs: bool | None = None, shape_ladder: bool | None = None,
                kernel_set: str | None = None) -> Engine:
    """Build the engine for an opened package (vsr.runtime.package.OpenedPackage or anything with
    .path, .config and .model_dtype). The device check has already run in open_package; this loads
    the weights. shape_ladder: batches at batch_shape's shapes (None: on a CUDA device); False
    pads each batch to its own longest request, and CUDA graphs then capture each such shape.
    cuda_graphs: None (the default) is on for a CUDA device on the Triton path, off elsewhere.
    kernel_set: None picks by the rule of the module docstring; "exact" forces the exact set;
    "approximate" is refused where the rule picks the exact one."""
    from vsr.runtime.loaders import PackageLoader
    from vsr.runtime.linear import QLinear
    from vsr.runtime.models import build_model, linear_names
    from vsr.runtime.models.common import Builder

    path = Path(pkg.path)
    config = pkg.config
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceRefusal(f"device {device!r}: this machine has no CUDA device")
    if cuda_graphs and dev.type != "cuda":
        raise ValueError(f"cuda_graphs: CUDA graphs need a CUDA device, not {device!r}")
    if cuda_graphs is None:
        cuda_graphs = dev.type == "cuda" and not emulate
    if kernel_set not in (None, *KERNEL_SETS):
        raise ValueError(f"kernel_set must be one of {KERNEL_SETS} (or None), got {kernel_set!r}")
    stored = pkg.model_dtype
    if dtype == "auto" or dtype is None:
        act = stored if dev.type == "cuda" else torch.float32
        convert = False
    else:
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
        act = DTYPES[name]
        convert = True

    resolver = None
    if emulate:
        mode, lin_mode = "emulated", "reference"
    elif dev.type == "cuda":
        mode, lin_mode = "triton", "triton"
        from vsr.autotune.resolver import TileResolver  # lazily: the CPU path never needs the tuner

        resolver = TileResolver(autotune_cache, policy=miss_policy, device=dev)
        _use_kernel_bundle(resolver)
    elif dev.type == "cpu":
        mode, lin_mode = "reference", "reference"
    else:
        raise PackageError(f"device {device!r}: vsr runs on cpu or cuda devices")

    def make_linear(w):
        return QLinear(w, lin_mode, tiles=resolver)

    tok = PackageTokenizer(path, config)  # cheap, and a broken tokenizer fails before any weight is read
    loader = PackageLoader(path, config)
    try:  # the safetensors handles are released whether validation or loading fails or not
        # Validate every Linear's tensors (presence, shape, dtype) before any moves to the device.
        formats = loader.check_linears(linear_names(config, loader))
        allowed = approximate_allowed(lin_mode, formats.values(), convert)
        if kernel_set == "approximate" and not allowed:
            raise ValueError("kernel_set 'approximate' runs only for a quantized package at dtype auto on the "
                             "Triton path; this engine runs the exact set")
        chosen = "approximate" if allowed and kernel_set != "exact" else "exact"
        builder = Builder(loader, make_linear, act, dev, convert, kernels=lin_mode, exact=chosen == "exact")
        model = build_model(config, builder).eval()
    finally:
        loader.close()
    return Engine(model, tok, mode=mode, device=dev, act_dtype=act,
                  weight_bytes=builder.linear_bytes + builder.other_bytes, resolver=resolver,
                  linears=builder.linears, cuda_graphs=cuda_graphs, shape_ladder=shape_ladder,
                  kernel_set=chosen, fused=builder.fused)


def approximate_allowed(lin_mode: str, formats, explicit_dtype: bool) -> bool:
    """Whether an engine may run the approximate set: Triton kernels, a quantized package (any
    Linear not dense) and dtype auto (an explicit dtype asks for exact numerics in that dtype)."""
    return lin_mode == "triton" and not explicit_dtype and any(f != "dense" for f in formats)

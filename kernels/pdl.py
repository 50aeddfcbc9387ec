"""Programmatic dependent launch (PDL, NVIDIA sm_90+) of a forward's kernels.

Within `programmatic_forward()`, each Triton kernel of a forward (the norms, RoPE, attention, the
activations, the score head, and the dense products) launches as a programmatic dependent of the
kernel before it on the stream: its programs may become resident while that kernel still runs,
and each waits (griddepcontrol.wait) before reading any memory, until the kernel before it has
finished and its writes are visible. A kernel that waits may let its own dependent launch at once
(griddepcontrol.launch_dependents): the next kernel's launch, and a product's first weight lines
(gemm.launch_tma's prefetch), then overlap this one. The arithmetic is unchanged, so the bytes are
the same with and without it; only the gaps between kernels shrink. A kernel launched without it
waits for the whole stream before it as usual, so any mix of kernels is correct. CUDA graphs
capture the dependencies (runtime.engine.GraphedForward captures within the same context).
https://docs.nvidia.com/cuda/cuda-c-programming-guide/#programmatic-dependent-launch-and-synchronization
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from vsr.kernels import common

_ON = contextvars.ContextVar("vsr_programmatic_forward", default=False)


@contextlib.contextmanager
def programmatic_forward(on: bool = True):
    """Within: the forward's kernels launch as programmatic dependents where the device has PDL."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)


def enabled(device: torch.device) -> bool:
    """Whether a forward kernel launched now on `device` launches as a programmatic dependent."""
    return _ON.get() and common.device_features(torch.device(device)).pdl


def options(device: torch.device) -> dict:
    """A forward kernel's PDL arguments: WAIT and RELEASE (constexprs) and the launch option."""
    on = enabled(device)
    return {"WAIT": on, "RELEASE": on, **common.pdl_option(on)}


@triton.jit
def begin(WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """The first statement of a forward kernel: WAIT for the kernel before it (its writes visible),
    then RELEASE the kernel after it to launch. No instruction without them."""
    common.wait_for_producer(WAIT)
    if RELEASE:
        gdc_launch_dependents()

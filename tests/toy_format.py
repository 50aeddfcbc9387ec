"""A weight format of the tests' own, registered the way a new format is: its module holds the
weight class, the pure-torch reference, a template and the WeightFormat spec; one call registers it.
Int8 weights with one scale per tensor; the template's launcher is the reference in torch (the
registry, QLinear and vsr-tune's job building never look inside it)."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from vsr.kernels.template import Problem, Template
from vsr.kernels.weight_format import Record, WeightFormat


@dataclass
class ToyWeight:
    q: torch.Tensor          # int8 [N, K]
    scale: torch.Tensor      # fp32 scalar

    format = "toy"

    @property
    def N(self) -> int:
        return self.q.shape[0]

    @property
    def K(self) -> int:
        return self.q.shape[1]

    def params(self):
        return (("bits", 8),)

    def to(self, device):
        return ToyWeight(self.q.to(device), self.scale.to(device))

    def nbytes(self) -> int:
        return self.q.numel() + 4


def reference_linear(x: torch.Tensor, w: ToyWeight) -> torch.Tensor:
    """y = x · (q · scale)ᵀ in fp32, in x's dtype."""
    return (x.float() @ (w.q.float() * w.scale.float()).t()).to(x.dtype)


def problem(w: ToyWeight, M: int, act_dtype: torch.dtype) -> Problem:
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


def default_tile(p: Problem) -> dict:
    return {"path": "tiled", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}


TEMPLATE = Template(name="toy_w8a16", module=sys.modules[__name__], search_space=lambda p: [default_tile(p)],
                    default_tile=default_tile, launch=lambda x, w, tile, out=None: reference_linear(x, w),
                    reference=reference_linear, problem=problem)


def random_weight(N, K, params, model_dtype, g, device):
    q = torch.randint(-127, 128, (N, K), generator=g, device=device, dtype=torch.int32).to(torch.int8)
    return ToyWeight(q, torch.tensor(0.01, device=device))


FORMAT = WeightFormat(name="toy", weight_class=ToyWeight, reference=reference_linear, templates=(TEMPLATE,),
                      choose_template=lambda w, act_dtype, emulate: "toy_w8a16", random_weight=random_weight,
                      records=(Record("toy-int8", (("bits", 8),)),), tuned_records=("toy-int8",))

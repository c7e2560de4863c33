"""A host emulator of the native ``kv_copy`` kernel: executes copy plans with memmove.

It follows the kernel's address arithmetic line by line, so running plans built from host
tensors through it checks the plan geometry of every layout without a GPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from lmcache_cuda._plan import CopyPlan, PlanKernels


def run_plans(plans: Sequence[Any]) -> None:
    for plan in plans:
        work = plan.work.tolist()
        for base, kv, layer, col in plan.planes:
            for eng_off, obj_base, kv_stride, layer_stride in work:
                eng = base + eng_off
                obj = obj_base + kv * kv_stride + layer * layer_stride + col
                for r in range(plan.rows):
                    for h in range(plan.num_heads):
                        e = eng + r * plan.eng_row_stride + h * plan.eng_head_stride
                        o = obj + r * plan.obj_row_stride + h * plan.obj_head_stride
                        src, dst = (o, e) if plan.to_engine else (e, o)
                        ctypes.memmove(dst, src, plan.width_bytes)


class EmulatedKernels(PlanKernels):
    """The CUDA plugin's plan kernels over host memory, executed by :func:`run_plans`."""

    def execute(self, plans: Sequence[CopyPlan], device: torch.device) -> None:
        run_plans(plans)

"""torch.cuda.amp.GradScaler, run on CPU tensors, for the loss-scaling parity run.

GradScaler's Python (its scale / unscale_ / step / update state machine, the
skip of optimizer.step on an overflow, the per-optimizer bookkeeping) is used
as PyTorch ships it. What this PyTorch build lacks on the CPU are the two
kernels GradScaler calls, and three asserts that its tensors are on a GPU:
  - torch._amp_foreach_non_finite_check_and_unscale_ (found_inf = 1 where an
    element is not finite; every gradient times inv_scale), and
  - torch._amp_update_scale_ (AmpKernels.cu's amp_update_scale_cuda_kernel:
    on an overflow scale *= backoff_factor and the tracker resets; otherwise the
    tracker counts, and at growth_interval the scale grows by growth_factor if
    that stays finite in f32, and the tracker resets; products in double, the
    scale stored in f32),
written here after those kernels' documented semantics.
"""
import math

import torch
from torch.cuda.amp import grad_scaler as _gs


def _non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            found_inf.fill_(1.0)
        if inv_scale.item() != 1.0:
            g.mul_(inv_scale)


def _update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    if found_inf.item():
        scale.fill_(scale.item() * backoff_factor)  # a Python float (double) product, stored in f32
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker.item()) + 1
        if successful == growth_interval:
            grown = torch.tensor(scale.item() * growth_factor, dtype=torch.float32)
            if math.isfinite(grown.item()):
                scale.copy_(grown.reshape(1))
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


class CPUGradScaler(_gs.GradScaler):
    def __init__(self, **kwargs):
        available = _gs.amp_definitely_not_available
        _gs.amp_definitely_not_available = lambda: False  # (no GPU here: GradScaler would disable itself)
        try:
            super().__init__(**kwargs)
        finally:
            _gs.amp_definitely_not_available = available

    def scale(self, outputs):  # GradScaler.scale for one tensor, without its assert on the device
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(outputs.device)
        return outputs * self._scale

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        with torch.no_grad():
            _non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return {found_inf.device: found_inf}

    def update(self, new_scale=None):
        kernel = torch._amp_update_scale_
        torch._amp_update_scale_ = _update_scale_
        try:
            super().update(new_scale)
        finally:
            torch._amp_update_scale_ = kernel

    def skipped(self, optimizer):
        """Whether this iteration's step(optimizer) skipped the optimizer (call before update())."""
        return sum(v.item() for v in self._found_inf_per_device(optimizer).values()) > 0

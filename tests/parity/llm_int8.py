"""LLM.int8() (Dettmers et al. 2022, arXiv:2208.07339) written out plainly in torch, to
check headroom's LLMInt8<> projections against (tests/parity/reference.py, configuration
llm_int8). Independent of headroom's code: only the stored weight (codes, row absmaxes)
comes from the driver, and those are checked against the weight quantization below.

The algorithm, for y = x W^T with x (N, in) and W (out, in):
  - W is stored as int8 codes, one absmax a_o per row: code = round(W * 127 / a_o),
    halves away from zero (bitsandbytes' weight quantizer rounds half to even; the
    two differ only on exact ties);
  - the outlier columns O of x: every column holding some |x| >= threshold (the
    paper's mixed-precision decomposition; 0 disables it);
  - every other column is quantized row-wise: s_i = max |x[i, j]| over j not in O,
    xq = round_half_even(x * (127 / s_i)) (bitsandbytes' __float2int_rn);
  - y = (xq @ codes^T, exact integer sums) * s_i * a_o / 127^2
        + x[:, O] @ (codes[:, O] * a_o / 127)^T   (the outlier columns in f32, their
          weights dequantized from the int8 ones, as bitsandbytes does when the
          weights are stored in int8 only);
  - backward: dx = dy @ dequant(W); the frozen weight takes no gradient.
"""
import torch


def quantize_weight(w):
    """Row-wise absmax int8 of a float32 (out, in) matrix: (codes int8, absmax float32 (out))."""
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    v = w * scale[:, None]
    codes = torch.where(v < 0, v - 0.5, v + 0.5).trunc().clamp(-127, 127)
    return codes.to(torch.int8), absmax


def dequantize_weight(codes, absmax):
    return codes.float() * (absmax / 127.0)[:, None]


def outlier_columns(x, threshold):
    if threshold <= 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.nonzero((x.abs() >= threshold).any(dim=0)).flatten()


def forward(x, codes, absmax, threshold):
    """y (N, out) for x (N, in) float32; returns (y, number of outlier columns)."""
    cols = outlier_columns(x, threshold)
    rest = x.clone()
    rest[:, cols] = 0.0
    s = rest.abs().amax(dim=1)
    inv = torch.where(s > 0, 127.0 / s, torch.zeros_like(s))
    xq = torch.round(rest * inv[:, None])  # half to even
    acc = xq.double() @ codes.double().T  # integer sums, exact in double
    y = acc.float() * (s[:, None] * absmax[None, :]) * (1.0 / (127.0 * 127.0))
    if cols.numel():
        y = y + x[:, cols] @ dequantize_weight(codes[:, cols], absmax).T
    return y, int(cols.numel())


class Int8Linear(torch.autograd.Function):
    """y = LLM.int8(x W^T); dx = dy dequant(W)."""

    @staticmethod
    def forward(ctx, x, codes, absmax, threshold, counts):
        ctx.save_for_backward(codes, absmax)
        shape = x.shape
        y, found = forward(x.reshape(-1, shape[-1]), codes, absmax, threshold)
        counts.append(found)
        return y.reshape(*shape[:-1], codes.shape[0])

    @staticmethod
    def backward(ctx, dy):
        codes, absmax = ctx.saved_tensors
        return dy @ dequantize_weight(codes, absmax), None, None, None, None

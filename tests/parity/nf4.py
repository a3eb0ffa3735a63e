"""bitsandbytes' NF4 storage format written out plainly (torch tensors, float32), to
check headroom's quantization against (tests/parity/reference.py, configuration nf4).

What bitsandbytes does (quantize_4bit(x, blocksize=64, quant_type="nf4"), its CUDA kernels):
  - the 16 NF4 code values of QLoRA (Dettmers et al. 2023, arXiv:2305.14314), as
    bitsandbytes' kernels hold them (float32);
  - blocks of 64 consecutive elements of the flattened row-major tensor, one float32
    absmax per block;
  - v = x * (1 / absmax) (the reciprocal is taken once per block), and the code is
    chosen by comparisons "v > midpoint" of adjacent code values (a decision tree):
    the code is the number of midpoints strictly below v, so an exact midpoint goes
    to the LOWER code, and an all-zero block (1 / 0 = inf, 0 * inf = NaN, every
    comparison false) gets code 0;
  - two codes per byte, the first element of a pair in the HIGH nibble;
  - dequantized value = code value * absmax (float32).
Double quantization (compress_statistics=True): offset = absmax.mean() (float32),
(absmax - offset) quantized block-wise (blocks of 256) with the signed 8-bit dynamic
map of create_dynamic_map(signed=True) (built with float32 torch ops), each block's
value v = c * (1 / absmax2) mapped to the nearest map entry; dequantized
absmax = map[q] * absmax2 + offset (two float32 roundings).
"""
import torch

# The published NF4 values (QLoRA appendix E; bitsandbytes' dDequantizeNF4).
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=torch.float32)
# float32 midpoints of adjacent codes: these are the thresholds of bitsandbytes'
# decision tree (e.g. 0.03979014977812767, -0.8480964004993439), bit for bit.
NF4_MID = (NF4_CODE[:-1] + NF4_CODE[1:]) * 0.5
BLOCK = 64
DQ_BLOCK = 256


def nf4_quantize(x):
    """x: float32, numel a multiple of 64. Returns (codes (n) uint8 unpacked, absmax (n/64), v (n) the scaled values)."""
    blocks = x.reshape(-1, BLOCK).float()
    absmax = blocks.abs().amax(dim=1)
    with torch.no_grad():
        v = blocks * (1.0 / absmax)[:, None]  # NaN for an all-zero block, as in bitsandbytes
        codes = (v[..., None] > NF4_MID).sum(-1).to(torch.uint8)
    return codes.reshape(-1), absmax, v.reshape(-1)


def pack(codes):
    """Two codes per byte, the first of a pair in the high nibble."""
    c = codes.reshape(-1, 2).to(torch.int32)
    return ((c[:, 0] << 4) | c[:, 1]).to(torch.uint8)


def unpack(packed):
    p = packed.to(torch.int32)
    return torch.stack(((p >> 4) & 15, p & 15), dim=1).reshape(-1).to(torch.uint8)


def nf4_dequantize(codes, absmax):
    """codes: (n) unpacked; absmax: (n/64) -> (n) float32."""
    return (NF4_CODE[codes.long()].reshape(-1, BLOCK) * absmax[:, None]).reshape(-1)


def dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes' create_dynamic_map, in float32 torch ops as it builds it: for each
    exponent i the interval [0.1, 1] cut by linspace into 2^i (signed) bins, the bin
    midpoints scaled by 10^(i - 6) (and negated, signed), plus 0 and 1, sorted."""
    non_sign_bits = total_bits - 1
    data = []
    for i in range(max_exponent_bits):
        items = 2 ** (i + non_sign_bits - max_exponent_bits + (0 if signed else 1))
        edges = torch.linspace(0.1, 1, items + 1)
        means = (edges[:-1] + edges[1:]) / 2.0
        scale = 10 ** (-(max_exponent_bits - 1) + i)
        data += (scale * means).tolist()
        if signed:
            data += (-scale * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (2 ** total_bits - len(data))
    return torch.tensor(sorted(data), dtype=torch.float32)


def nearest_code(v, table):
    """Index of the entry of the sorted `table` nearest to v (v > midpoint goes up)."""
    hi = torch.searchsorted(table, v).clamp(1, len(table) - 1)
    lo = hi - 1
    mid = (table[lo] + table[hi]) * 0.5
    return torch.where(v > mid, hi, lo).to(torch.uint8)


def double_quantize(absmax, table):
    """Returns (codes (nblocks) uint8, absmax2 (ceil(nblocks/256)), offset (float32 0-d))."""
    offset = absmax.mean()
    c = absmax - offset
    codes, amax2 = [], []
    for s in range(0, len(c), DQ_BLOCK):
        blk = c[s : s + DQ_BLOCK]
        a = blk.abs().amax()
        amax2.append(a)
        codes.append(nearest_code(blk * (1.0 / a), table))
    return torch.cat(codes), torch.stack(amax2), offset


def double_dequantize(codes, absmax2, offset, table):
    a = table[codes.long()]
    scale = absmax2.repeat_interleave(DQ_BLOCK)[: len(codes)]
    return a * scale + offset


def ulps(a, b):
    """|a - b| in units of float32 spacing at max(|a|, |b|) (0 where equal)."""
    a, b = a.float(), b.float()
    m = torch.maximum(a.abs(), b.abs())
    spacing = torch.where(m > 0, torch.nextafter(m, torch.tensor(float("inf"))) - m, torch.tensor(1.0))
    return ((a - b).abs() / spacing).nan_to_num(0.0)

"""The PyTorch side of the GPU benchmark (bench/gpu runs it next to cuda_step):
the same models, batch, sequence length and optimizer as cuda_step's configs,
in PyTorch eager or torch.compile, on one CUDA device; prints one JSON line.

  python3 cuda_torch.py CONFIG --mode eager|compile [--steps N] [--warmup N]
  CONFIG: gpt2_124m    GPT-2 124M (tied LM head, GELU-tanh, LayerNorm, learned positions),
                       B16 T1024, AdamW (fused), bf16 autocast over f32 weights
          llama_qlora  Llama-3.2-1B shape, frozen NF4 base weights (codes + f32 absmax per
                       64, dequantized to bf16 inside each forward: what bitsandbytes'
                       Linear4bit computes), LoRA r16 alpha 16 on all seven projections,
                       torch.utils.checkpoint per block, AdamW on the adapters, B8 T1024

Precision: headroom stores bf16 weights with f32 master copies; PyTorch's
usual mixed precision keeps f32 weights and casts them under autocast. Both
compute the GEMMs in bf16 with f32 accumulation. Attention is
F.scaled_dot_product_attention (flash attention on the GPU). The device peak
is torch.cuda.max_memory_allocated (tensors only; no context).
Differences that remain: PyTorch's AdamW keeps f32 moments for the adapters
where headroom's llama_qlora uses AdamW8bit (the adapters are 0.5% of that
model, so this changes memory by ~0.1 GB).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

PEAK_BF16 = 989.4e12  # H100 / H200 SXM dense bf16, as cuda_step uses


class GPT2(nn.Module):
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, positions=1024):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(positions, d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict(dict(ln_1=nn.LayerNorm(d), c_attn=nn.Linear(d, 3 * d), c_proj=nn.Linear(d, d),
                                                  ln_2=nn.LayerNorm(d), c_fc=nn.Linear(d, 4 * d), mlp_proj=nn.Linear(4 * d, d))))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            h = blk["ln_1"](x)
            q, k, v = blk["c_attn"](h).split(x.shape[-1], dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            x = x + blk["c_proj"](o)
            x = x + blk["mlp_proj"](F.gelu(blk["c_fc"](blk["ln_2"](x)), approximate="tanh"))
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334,
       -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]


class NF4LoRALinear(nn.Module):
    """A frozen NF4 weight (out, in): codes two per byte, one f32 absmax per 64, dequantized to bf16 per forward; plus LoRA."""

    def __init__(self, d_in, d_out, rank=16, alpha=16):
        super().__init__()
        w = torch.randn(d_out, d_in, device="cuda") * 0.02
        blocks = w.view(-1, 64)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        table = torch.tensor(NF4, device="cuda")
        codes = (blocks / absmax).unsqueeze(-1).sub(table).abs().argmin(dim=-1).to(torch.uint8).view(-1)
        self.register_buffer("packed", (codes[0::2] << 4) | codes[1::2])
        self.register_buffer("absmax", absmax.view(-1))
        self.register_buffer("table", table.to(torch.bfloat16))
        self.shape = (d_out, d_in)
        self.lora_A = nn.Parameter(torch.empty(rank, d_in, device="cuda").uniform_(-1 / math.sqrt(d_in), 1 / math.sqrt(d_in)))
        self.lora_B = nn.Parameter(torch.zeros(d_out, rank, device="cuda"))
        self.scale = alpha / rank

    def forward(self, x):
        codes = torch.stack((self.packed >> 4, self.packed & 15), dim=-1).view(-1).long()
        w = (self.table[codes].view(-1, 64) * self.absmax.to(torch.bfloat16).unsqueeze(1)).view(self.shape)
        return F.linear(x, w) + self.scale * F.linear(F.linear(x, self.lora_A.to(x.dtype)), self.lora_B.to(x.dtype))


class LlamaQLoRA(nn.Module):
    def __init__(self, vocab=128256, d=2048, ffn=8192, layers=16, heads=32, kv_heads=8, theta=500000.0, rank=16):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.embed = nn.Embedding(vocab, d).requires_grad_(False)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(nn.ModuleDict(dict(
                n1=nn.RMSNorm(d, eps=1e-5).requires_grad_(False), n2=nn.RMSNorm(d, eps=1e-5).requires_grad_(False),
                q=NF4LoRALinear(d, d, rank), k=NF4LoRALinear(d, kv_heads * self.hd, rank), v=NF4LoRALinear(d, kv_heads * self.hd, rank),
                o=NF4LoRALinear(d, d, rank), gate=NF4LoRALinear(d, ffn, rank), up=NF4LoRALinear(d, ffn, rank),
                down=NF4LoRALinear(ffn, d, rank))))
        self.norm = nn.RMSNorm(d, eps=1e-5).requires_grad_(False)
        self.lm_head = nn.Linear(d, vocab, bias=False).requires_grad_(False)
        inv = 1.0 / theta ** (torch.arange(0, self.hd, 2).float() / self.hd)
        self.register_buffer("inv_freq", inv)

    def rope(self, x, t):
        a = torch.arange(t, device=x.device).float()[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat((a, a), -1).cos().to(x.dtype), torch.cat((a, a), -1).sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    def block(self, L, x):
        b, t, _ = x.shape
        h = L["n1"](x)
        q = self.rope(L["q"](h).view(b, t, self.heads, self.hd).transpose(1, 2), t)
        k = self.rope(L["k"](h).view(b, t, self.kv_heads, self.hd).transpose(1, 2), t)
        v = L["v"](h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, t, -1)
        x = x + L["o"](o)
        h = L["n2"](x)
        return x + L["down"](F.silu(L["gate"](h)) * L["up"](h))

    def forward(self, idx, targets):
        x = self.embed(idx)
        x.requires_grad_(True)
        for L in self.layers:
            x = torch.utils.checkpoint.checkpoint(self.block, L, x, use_reentrant=False)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config", choices=["gpt2_124m", "llama_qlora"])
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.config == "gpt2_124m":
        model, (B, T), vocab = GPT2().cuda(), (16, 1024), 50257
    else:
        model, (B, T), vocab = LlamaQLoRA().cuda(), (8, 1024), 128256
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    step_fn = torch.compile(model) if a.mode == "compile" else model
    g = torch.Generator().manual_seed(12345)
    tokens = torch.randint(0, vocab, (B, T), generator=g).cuda()
    targets = torch.roll(tokens.view(-1), -1).view(B, T)
    losses = []

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        losses.append(step().item())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        losses.append(step().item())
    torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / a.steps
    n = B * T
    print(json.dumps(dict(engine=f"torch_{a.mode}", config=a.config, torch=torch.__version__, tokens_per_step=n,
                          steps=a.steps, step_ms=1e3 * secs, tokens_per_s=n / secs,
                          max_memory_allocated=torch.cuda.max_memory_allocated(), losses=losses)))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The PyTorch side of bench/compare: the same configurations as
bench/compare_headroom.cpp, written the way a PyTorch user writes them
(nn.Linear / nn.LayerNorm / nn.Embedding, LoRA adapters by hand since PEFT is
not installable here, torch.utils.checkpoint per block, torch.optim.AdamW,
clip_grad_norm_), trained on fixed pseudo-random tokens. Prints one JSON line
with the timed steps' tokens/s; bench/compare measures peak resident memory
from outside. With --bf16 the forward runs under torch.autocast("cpu",
dtype=torch.bfloat16), PyTorch's CPU mixed precision as its users switch it
on (f32 weights, gradients and optimizer; bf16 products and activations where
autocast casts them), against headroom's Precision<BF16>.

    /usr/bin/python3 bench/compare_torch.py CONFIG [--steps N] [--warmup N] [--threads N] [--bf16]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# (family, dims, batch, seq, lora targets, checkpointed) -- as in compare_headroom.cpp
TINY = dict(vocab=256, dim=256, ffn=768, layers=4, heads=4, kv_heads=2, theta=10000.0)
GPT2 = dict(vocab=50257, dim=768, layers=4, heads=12, max_pos=1024)
LLAMA_LORA = ("q_proj", "k_proj", "v_proj", "o_proj")
GPT2_LORA = ("c_attn", "c_proj", "c_fc")
CONFIGS = {
    "tiny_full": ("llama", TINY, 16, 128, (), False),
    "tiny_lora": ("llama", TINY, 16, 128, LLAMA_LORA, False),
    "tiny_lora_ckpt": ("llama", TINY, 16, 128, LLAMA_LORA, True),
    "gpt2_full": ("gpt2", GPT2, 4, 256, (), False),
    "gpt2_lora": ("gpt2", GPT2, 4, 256, GPT2_LORA, False),
    "gpt2_lora_ckpt": ("gpt2", GPT2, 4, 256, GPT2_LORA, True),
}
RANK = 16


class LoRALinear(nn.Module):
    """y = base(x) + (x A^T) B^T * alpha / r, base frozen (alpha = r)."""

    def __init__(self, base, rank):
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        if self.base.bias is not None:
            self.base.bias.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features).uniform_(-1, 1) / math.sqrt(base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B)


def linear(name, fan_in, fan_out, bias, lora):
    lin = nn.Linear(fan_in, fan_out, bias=bias)
    return LoRALinear(lin, RANK) if name in lora else lin


def causal_attention(q, k, v):
    # q, k, v: (B, H, T, hd); torch 1.13 has no fused scaled_dot_product_attention on CPU
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class GPT2Block(nn.Module):
    def __init__(self, c, lora):
        super().__init__()
        D = c["dim"]
        self.heads = c["heads"]
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.c_attn = linear("c_attn", D, 3 * D, True, lora)
        self.attn_c_proj = linear("c_proj", D, D, True, lora)
        self.c_fc = linear("c_fc", D, 4 * D, True, lora)
        self.mlp_c_proj = linear("c_proj", 4 * D, D, True, lora)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        x = x + self.attn_c_proj(causal_attention(q, k, v).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2Model(nn.Module):
    def __init__(self, c, lora):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["dim"])
        nn.init.normal_(self.wte.weight, std=0.02)  # GPT-2's initialisation (N(0, 1) makes the tied head's logits huge)
        self.wpe = nn.Embedding(c["max_pos"], c["dim"])
        self.h = nn.ModuleList(GPT2Block(c, lora) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["dim"])

    def hidden(self, tok):
        return self.wte(tok) + self.wpe(torch.arange(tok.shape[1]))

    def logits(self, x):
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, c, lora, cos, sin):
        super().__init__()
        D, hd = c["dim"], c["dim"] // c["heads"]
        self.heads, self.kv_heads, self.cos, self.sin = c["heads"], c["kv_heads"], cos, sin
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(D), RMSNorm(D)
        self.q_proj = linear("q_proj", D, D, False, lora)
        self.k_proj = linear("k_proj", D, self.kv_heads * hd, False, lora)
        self.v_proj = linear("v_proj", D, self.kv_heads * hd, False, lora)
        self.o_proj = linear("o_proj", D, D, False, lora)
        self.gate_proj = linear("gate_proj", D, c["ffn"], False, lora)
        self.up_proj = linear("up_proj", D, c["ffn"], False, lora)
        self.down_proj = linear("down_proj", c["ffn"], D, False, lora)

    def forward(self, x):
        B, T, D = x.shape
        H, KV = self.heads, self.kv_heads
        hd = D // H
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, H, hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, KV, hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, KV, hd).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        x = x + self.o_proj(causal_attention(q, k, v).transpose(1, 2).reshape(B, T, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaModel(nn.Module):
    def __init__(self, c, lora, seq):
        super().__init__()
        hd = c["dim"] // c["heads"]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().float(), emb.sin().float()
        self.embed_tokens = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(LlamaBlock(c, lora, cos, sin) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["dim"])
        self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)

    def hidden(self, tok):
        return self.embed_tokens(tok)

    def logits(self, x):
        return self.lm_head(self.norm(x))


class LM(nn.Module):
    def __init__(self, family, c, seq, lora, ckpt):
        super().__init__()
        self.m = GPT2Model(c, lora) if family == "gpt2" else LlamaModel(c, lora, seq)
        self.ckpt = ckpt
        if lora:  # freeze everything but the adapters
            for name, p in self.named_parameters():
                p.requires_grad_("lora_" in name)

    def forward(self, tok, tgt):
        x = self.m.hidden(tok)
        for block in self.m.h if isinstance(self.m, GPT2Model) else self.m.layers:
            x = checkpoint(block, x, use_reentrant=False) if self.ckpt else block(x)
        logits = self.m.logits(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))


def tokens(vocab, n):
    """The same pseudo-random tokens as compare_headroom.cpp; targets: the next token, wrapping around."""
    x, tok = 12345, []
    for _ in range(n):
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
        tok.append((x >> 9) % vocab)
    return tok, tok[1:] + tok[:1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", action="store_true", help="the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    family, c, B, T, lora, ckpt = CONFIGS[a.config]
    model = LM(family, c, T, lora, ckpt)
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach=True: the multi-tensor AdamW, faster here than torch 1.13's default per-tensor loop on CPU
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True)
    tok, tgt = tokens(c["vocab"], B * T)
    tok = torch.tensor(tok, dtype=torch.long).view(B, T)
    tgt = torch.tensor(tgt, dtype=torch.long).view(B, T)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    losses = [step() for _ in range(a.warmup)]
    t0 = time.perf_counter()
    losses += [step() for _ in range(a.steps)]
    secs = time.perf_counter() - t0
    print(json.dumps({"side": "pytorch", "config": a.config, "tokens_per_s": a.steps * B * T / secs,
                      "step_s": secs / a.steps, "losses": [round(v, 6) for v in losses], "threads": torch.get_num_threads(),
                      "dtype": "bf16 autocast" if a.bf16 else "f32", "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

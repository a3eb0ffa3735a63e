#!/usr/bin/python3
"""The PyTorch side of a parity run (tests/parity/driver.cpp writes DIR).

Reads the initial weights, the batches and the configuration headroom used,
trains the same model written plainly in torch for the same steps, and
compares: per-step losses within 1e-4 relative, final weights within lr / 6
(a sixth of one AdamW step's largest move). Exit status 0: agree; 1: disagree (the differences are
printed); 77: torch is not importable (the test is skipped, visibly).

    /usr/bin/python3 tests/parity/reference.py DIR
"""
import json
import math
import struct
import sys

try:
    import torch
except ImportError:
    print("parity: SKIPPED: torch is not importable with this interpreter (Debian: apt-get install python3-torch)")
    sys.exit(77)

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    """A minimal safetensors reader: 8-byte little-endian header length, JSON header, data."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + lo : base + hi]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


# ---- Llama, written out -----------------------------------------------------------------------
def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, theta):
    # x: (B, H, T, hd); Hugging Face's Llama convention
    T, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Llama(torch.nn.Module):
    def __init__(self, c, w):
        super().__init__()
        self.c = c
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v.clone()) for k, v in w.items()})

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def forward(self, tok, tgt):
        c = self.c
        B, T = tok.shape
        H, KV, D = c["heads"], c["kv_heads"], c["dim"]
        hd = D // H
        x = self.w("model.embed_tokens.weight")[tok.long()]
        for l in range(c["layers"]):
            p = f"model.layers.{l}."
            h = rms_norm(x, self.w(p + "input_layernorm.weight"), c["norm_eps"])
            q = (h @ self.w(p + "self_attn.q_proj.weight").T).view(B, T, H, hd).transpose(1, 2)
            k = (h @ self.w(p + "self_attn.k_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            v = (h @ self.w(p + "self_attn.v_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            q, k = rope(q, c["rope_theta"]), rope(k, c["rope_theta"])
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
            x = x + o @ self.w(p + "self_attn.o_proj.weight").T
            h = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), c["norm_eps"])
            g = h @ self.w(p + "mlp.gate_proj.weight").T
            u = h @ self.w(p + "mlp.up_proj.weight").T
            x = x + (torch.nn.functional.silu(g) * u) @ self.w(p + "mlp.down_proj.weight").T
        h = rms_norm(x, self.w("model.norm.weight"), c["norm_eps"])
        logits = h @ self.w("lm_head.weight").T
        return torch.nn.functional.cross_entropy(logits.view(B * T, -1), tgt.long().view(-1))


def main(d):
    c = json.load(open(f"{d}/config.json"))
    init = read_safetensors(f"{d}/init.safetensors")
    batches = read_safetensors(f"{d}/batches.safetensors")
    ours = json.load(open(f"{d}/losses.json"))
    final = read_safetensors(f"{d}/final.safetensors")
    torch.manual_seed(0)
    model = Llama(c, init)
    opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                            weight_decay=c["weight_decay"])
    bad = 0
    for s in range(c["steps"]):
        opt.zero_grad()
        loss = model(batches["tokens"][s], batches["targets"][s])
        loss.backward()
        opt.step()
        rel = abs(loss.item() - ours[s]) / abs(loss.item())
        flag = "" if rel <= 1e-4 else "  <-- differs"
        bad += rel > 1e-4
        print(f"step {s + 1:2d}  torch {loss.item():.7f}  headroom {ours[s]:.7f}  rel {rel:.2e}{flag}")
    worst = 0.0
    for name, t in final.items():
        mine = model.w(name).detach()
        worst = max(worst, (mine - t).abs().max().item())
    # AdamW turns last-bit differences of a gradient into differences of a
    # fraction of a step (lr): the tolerance is a sixth of one step's largest move.
    tol = c["lr"] / 6
    print(f"final weights: max |torch - headroom| = {worst:.3e} (tolerance lr / 6 = {tol:.1e})")
    bad += worst > tol
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))

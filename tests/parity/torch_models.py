"""The models of the parity runs written out plainly in PyTorch, and a minimal
safetensors reader (tests/parity/reference.py uses them).

Weights are kept under their Hugging Face names, as io::save_pretrained writes
them: Llama (LlamaForCausalLM: model.embed_tokens, model.layers.{i}..., lm_head)
and GPT-2 (GPT2LMHeadModel as published: wte, wpe, h.{i}..., ln_f; c_attn, c_proj
and c_fc are transformers' Conv1D, weight stored (in, out); the LM head is wte).
LoRA adapters are PEFT's: lora_A (r, in), lora_B (out, r), y = base(x) + scale * (x A^T) B^T.
"""
import inspect
import json
import math
import struct

import torch
import torch.utils.checkpoint

import llm_int8

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "F16": torch.float16, "BF16": torch.bfloat16,
          "U8": torch.uint8, "I8": torch.int8}


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


def read_adapter(d):
    """A PEFT LoRA adapter directory: {module: (A, B)} keyed by the module's path in
    the transformers model ("model.layers.0.self_attn.q_proj", "transformer.h.0.attn.c_attn"),
    and the scale lora_alpha / r (one for all modules: rank_pattern / alpha_pattern empty)."""
    cfg = json.load(open(f"{d}/adapter_config.json"))
    assert not cfg["rank_pattern"] and not cfg["alpha_pattern"], "parity runs use one rank and alpha"
    w = read_safetensors(f"{d}/adapter_model.safetensors")
    prefix = "base_model.model."
    mods = {}
    for name in w:
        assert name.startswith(prefix) and name.endswith((".lora_A.weight", ".lora_B.weight")), name
        mods.setdefault(name[len(prefix) : -len(".lora_A.weight")], None)
    adapters = {m: (w[f"{prefix}{m}.lora_A.weight"], w[f"{prefix}{m}.lora_B.weight"]) for m in mods}
    return adapters, cfg["lora_alpha"] / cfg["r"], cfg


def base_name(module, base):
    """The base checkpoint's weight name of a PEFT module path (GPT-2's blocks live under
    "transformer." in GPT2LMHeadModel, but the published checkpoint names have no prefix)."""
    for cand in (module + ".weight", module.removeprefix("transformer.") + ".weight"):
        if cand in base:
            return cand
    raise KeyError(f"no base weight for adapted module {module}")


# ---- building blocks ------------------------------------------------------------------------
def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama3_inv_freq(inv, s):
    # Llama 3.1's RoPE scaling, as transformers' _compute_llama3_parameters
    # (rope_type "llama3"): the slow frequencies divided by the factor, the
    # fast ones kept, those between blended.
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope(x, theta, scaling=None):
    # x: (B, H, T, hd); Hugging Face's Llama convention
    T, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if scaling is not None:
        inv = llama3_inv_freq(inv, scaling)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def checkpoint(fn, *args):
    """torch.utils.checkpoint, non-reentrant where this torch has the choice (1.11 on)."""
    if "use_reentrant" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters:
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return torch.utils.checkpoint.checkpoint(fn, *args)


def causal_attention(q, k, v, window=None):
    # q, k, v: (B, H, T, hd) -> (B, T, H * hd). window (Mistral's sliding_window):
    # query i sees keys j with i - window < j <= i, as transformers'
    # sliding_window_overlay (kv_idx > q_idx - sliding_window) and the causal mask
    B, H, T, hd = q.shape
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = j > i
    if window:
        hidden = hidden | (j <= i - window)
    s = s.masked_fill(hidden, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)


class Model(torch.nn.Module):
    """Llama or GPT-2 (c["family"]) over Hugging Face named weights `base`, with optional
    LoRA `adapters` ({module: (A, B)}, scale `scale`; the base is then frozen; optional
    dropout on their input) and optional activation checkpointing of every block
    (torch.utils.checkpoint)."""

    def __init__(self, c, base, adapters=None, scale=1.0, checkpointed=False, dropout=0.0, masks=None, int8=None):
        super().__init__()
        # LLM.int8 (llm_int8.py): {weight name: (codes, absmax)} and the threshold;
        # each call's count of outlier columns is appended to int8_counts
        self.int8, self.int8_threshold, self.int8_counts = (int8 or {}), (c.get("llm_int8") or {}).get("threshold", 0.0), []
        # LoRA dropout (PEFT's lora_dropout p): the adapter reads its input with the
        # keep mask of the step (masks["<module>.step<s>"], (tokens, in), from the
        # driver), times 1 / (1 - p), as torch.nn.Dropout computes it; set .step
        # before each step's forward
        self.dropout, self.masks, self.step = dropout, masks, 0
        self.c = c
        self.gpt2 = c["family"] == "gpt2"
        self.checkpointed = checkpointed
        train_base = not adapters
        self.base = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v.clone(), requires_grad=train_base) for k, v in base.items()})
        self.scale = scale
        self.lora = {}  # base weight name -> (A name, B name)
        ab = {}
        for m, (A, B) in (adapters or {}).items():
            key = m.replace(".", "__")
            ab[key + "__A"] = torch.nn.Parameter(A.clone())
            ab[key + "__B"] = torch.nn.Parameter(B.clone())
            self.lora[base_name(m, base)] = (key + "__A", key + "__B", m)
        self.adapters = torch.nn.ParameterDict(ab)

    def w(self, name):
        return self.base[name.replace(".", "__")]

    def adapter(self, module):
        """Module's (A, B) parameters by PEFT module path."""
        key = module.replace(".", "__")
        return self.adapters[key + "__A"], self.adapters[key + "__B"]

    def linear(self, h, module):
        """module: its path in the base checkpoint ("model.layers.0.self_attn.q_proj", "h.0.attn.c_attn")."""
        name = module + ".weight"
        W = self.w(name)
        if self.gpt2:  # Conv1D: (in, out) and a bias
            y = h @ W + self.w(module + ".bias")
        elif name in self.int8:
            codes, absmax = self.int8[name]
            y = llm_int8.Int8Linear.apply(h, codes, absmax, self.int8_threshold, self.int8_counts)
        else:
            y = h @ W.T
            if not self.gpt2 and (module + ".bias").replace(".", "__") in self.base:  # Qwen2's q, k, v
                y = y + self.w(module + ".bias")
        if name in self.lora:
            a, b, _ = self.lora[name]
            x = h
            if self.dropout > 0:
                keep = self.masks[f"{module}.step{self.step}"].reshape(h.shape).to(h.dtype)
                x = h * keep * (1.0 / (1.0 - self.dropout))
            y = y + self.scale * ((x @ self.adapters[a].T) @ self.adapters[b].T)
        return y

    # ---- Llama --------------------------------------------------------------------------------
    def llama_block(self, x, l):
        c = self.c
        B, T, D = x.shape
        H, KV = c["heads"], c["kv_heads"]
        hd = c.get("head_dim") or D // H  # Qwen3: head_dim apart from D / H
        p = f"model.layers.{l}."
        h = rms_norm(x, self.w(p + "input_layernorm.weight"), c["norm_eps"])
        q = self.linear(h, p + "self_attn.q_proj").view(B, T, H, hd)
        k = self.linear(h, p + "self_attn.k_proj").view(B, T, KV, hd)
        v = self.linear(h, p + "self_attn.v_proj").view(B, T, KV, hd).transpose(1, 2)
        if c.get("qk_norm"):  # Qwen3Attention: q_norm, k_norm over each head, before RoPE
            q = rms_norm(q, self.w(p + "self_attn.q_norm.weight"), c["norm_eps"])
            k = rms_norm(k, self.w(p + "self_attn.k_norm.weight"), c["norm_eps"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        scaling = c.get("rope_scaling")
        q, k = rope(q, c["rope_theta"], scaling), rope(k, c["rope_theta"], scaling)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        x = x + self.linear(causal_attention(q, k, v, c.get("sliding_window")), p + "self_attn.o_proj")
        h = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), c["norm_eps"])
        g = self.linear(h, p + "mlp.gate_proj")
        u = self.linear(h, p + "mlp.up_proj")
        return x + self.linear(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")

    # ---- GPT-2 --------------------------------------------------------------------------------
    def gpt2_block(self, x, l):
        c = self.c
        B, T, D = x.shape
        H = c["heads"]
        hd = D // H
        p = f"h.{l}."
        ln = torch.nn.functional.layer_norm
        h = ln(x, (D,), self.w(p + "ln_1.weight"), self.w(p + "ln_1.bias"), c["norm_eps"])
        q, k, v = self.linear(h, p + "attn.c_attn").split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        x = x + self.linear(causal_attention(q, k, v), p + "attn.c_proj")
        h = ln(x, (D,), self.w(p + "ln_2.weight"), self.w(p + "ln_2.bias"), c["norm_eps"])
        # GPT-2's "gelu_new": the tanh approximation (headroom's math::gelu_tanh)
        f = torch.nn.functional.gelu(self.linear(h, p + "mlp.c_fc"), approximate="tanh")
        return x + self.linear(f, p + "mlp.c_proj")

    def forward(self, tok, tgt):
        c = self.c
        tok = tok.long()
        T = tok.shape[1]
        if self.gpt2:
            x = self.w("wte.weight")[tok] + self.w("wpe.weight")[torch.arange(T)][None]
            block = self.gpt2_block
        else:
            x = self.w("model.embed_tokens.weight")[tok]
            block = self.llama_block
        for l in range(c["layers"]):
            if self.checkpointed:  # recomputed in backward, as headroom's Checkpointed<> blocks
                x = checkpoint(block, x, l)
            else:
                x = block(x, l)
        if self.gpt2:
            h = torch.nn.functional.layer_norm(x, (c["dim"],), self.w("ln_f.weight"), self.w("ln_f.bias"), c["norm_eps"])
            logits = h @ self.w("wte.weight").T  # tied
        else:
            h = rms_norm(x, self.w("model.norm.weight"), c["norm_eps"])
            logits = h @ self.w("lm_head.weight").T
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.long().reshape(-1))

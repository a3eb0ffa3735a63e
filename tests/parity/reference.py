#!/usr/bin/python3
"""The PyTorch side of a parity run (tests/parity/driver.cpp writes DIR).

Reads the initial weights, the batches and the configuration headroom used,
trains the same model written plainly in torch (torch_models.py) for the same
steps (a bf16 run: its forward under torch.autocast("cpu", dtype=torch.bfloat16),
PyTorch's CPU mixed precision, against headroom's Precision<BF16>; the
tolerances are then bf16's, see BF16_LOSS_RTOL and bf16_tolerance), and compares:
  - every step's loss within 1e-4 relative;
  - the trained weights (the whole model, or the LoRA adapters) within a tolerance
    set by the optimizer (see final_tolerance);
  - LoRA: the frozen base is unchanged (bit for bit), and io::save_merged's
    W + scale B A matches the adapters it was written with;
  - nf4: headroom's NF4 / NF4DQ storage of each quantized projection against the
    bitsandbytes format written out in nf4.py (codes, absmaxes, dequantized weights);
  - llm_int8: headroom's row-wise int8 weights against llm_int8.py's quantizer, and the
    training through LLM.int8's forward (llm_int8.py, the algorithm of Dettmers et al.
    2022 in torch); the run must have outlier columns, and two wrong models (no
    decomposition; no int8 at all) must miss headroom's losses (the check can fail);
  - loss scaling: every step's scale and whether it was skipped, against
    torch.cuda.amp.GradScaler's own state machine run on the CPU (grad_scaler.py).
Exit status 0: agree; 1: disagree (the differences are printed); 77: torch is not
importable (the test is skipped, visibly).

    /usr/bin/python3 tests/parity/reference.py DIR
"""
import json
import math
import os
import sys

try:
    import torch
except ImportError:
    print("parity: SKIPPED: torch is not importable with this interpreter (Debian: apt-get install python3-torch)")
    sys.exit(77)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4  # noqa: E402
from torch_models import Model, base_name, read_adapter, read_safetensors  # noqa: E402

LOSS_RTOL = 1e-4
# bf16 keeps 8 significant bits (a rounding moves a value by up to 2^-9 of it):
# the two sides round different tensors (autocast: products' outputs, with f32
# weights and gradients; headroom: weights, activations and gradients, with f32
# masters), so their losses drift apart by rounding noise, not by a bug
BF16_LOSS_RTOL = 5e-3


def final_tolerance(c, moved):
    """The largest |torch - headroom| allowed for a trained weight after the run.

    AdamW: the update divides the moment by its own square root, so last-bit
    differences of a gradient become differences of a fraction of a step of size
    lr (more where a gradient is near zero); the tolerance is a sixth of one
    step's largest move, lr / 6.
    Lion: every element moves by lr times the sign of an interpolation of its
    momentum and gradient (plus weight decay), so last-bit differences change
    nothing unless they flip a sign where the interpolation is within rounding
    of zero, which would show as a whole 2 lr; AdamW's lr / 6 holds.
    SGD: the update is lr times the (momentum-summed) gradient, linear in it, so
    float rounding of the gradients (relative 1e-6 or so) moves the weights by a
    correspondingly tiny fraction of how far they moved in all; the tolerance is
    1e-4 of the largest total move of any weight over the run (`moved`, torch's).
    """
    if c["optimizer"] == "SGD":
        return 1e-4 * moved, f"1e-4 x largest move {moved:.2e}"
    return c["lr"] / 6, "lr / 6"


def bf16_tolerance(noise, largest):
    """A bf16 run's trained tensors against autocast's. bf16 training is noisy by
    itself (AdamW turns each step's rounding noise into up to lr of movement where
    a gradient is small), and how far PyTorch's own autocast run ends from its f32
    run (`noise`, the largest difference over the tensors) measures that noise on
    this very model and batches. headroom may differ from autocast by twice that,
    plus one bf16 unit in the last place of the largest value (headroom stores its
    weights rounded; autocast keeps f32 weights and rounds them inside each product)."""
    ulp = largest * 2.0**-7
    return 2 * noise + ulp, f"bf16: 2 x |autocast - f32| {noise:.2e} + ulp {ulp:.1e}"


def max_abs_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_nf4(d, base_init):
    """headroom's quantized projections against nf4.py (bitsandbytes' format)."""
    original = read_safetensors(f"{d}/original.safetensors")
    q = read_safetensors(f"{d}/quant.safetensors")
    bad = 0
    if not torch.equal(q["nf4_code"], nf4.NF4_CODE):
        print("nf4: headroom's 16 code values differ from the published NF4 values  <-- differs")
        bad += 1
    table = nf4.dynamic_map(signed=True)
    map_ulps = nf4.ulps(q["dynamic_map"], table)
    print(f"nf4: dynamic map: {int((map_ulps > 0).sum())} of 256 entries differ from bitsandbytes' float32 construction, "
          f"by at most {map_ulps.max().item():.0f} ulp (headroom computes them in double, rounds once)")
    bad += map_ulps.max().item() > 1
    names = [n[: -len(".codes")] for n in q if n.endswith(".codes")]
    ties = zero_blocks = tie_seen = zero_seen = 0
    for name in names:
        x = original[name].reshape(-1)
        codes, absmax, v = nf4.nf4_quantize(x)
        theirs = nf4.unpack(q[name + ".codes"])
        dq = name + ".dq_codes" in q
        # where bitsandbytes and headroom may legitimately differ: exact midpoints
        # (bitsandbytes rounds down, headroom up) and all-zero blocks (bitsandbytes:
        # code 0 from a NaN, headroom: code 7, the exact zero)
        tie = (v[:, None] == nf4.NF4_MID).any(-1)
        zero = (absmax == 0).repeat_interleave(nf4.BLOCK)
        explained = tie | zero
        differ = codes != theirs
        ties += int((differ & tie).sum())
        zero_blocks += int((differ & zero).sum())
        tie_seen += int(tie.sum())
        zero_seen += int(zero.sum())
        unexplained = int((differ & ~explained).sum())
        line = f"nf4: {name} ({'NF4DQ' if dq else 'NF4'}, {x.numel()} values): codes {x.numel() - int(differ.sum())} equal"
        if int(differ.sum()):
            line += f", {int((differ & tie).sum())} differ at exact midpoints, {int((differ & zero).sum())} in all-zero blocks"
        if unexplained:
            line += f", {unexplained} OTHERS  <-- differ"
            bad += 1
        if not torch.equal(q[name + ".codes"], nf4.pack(theirs)):  # (round trip of unpack)
            bad += 1
        theirs_deq = q[name + ".dequant"].reshape(-1)
        if dq:
            qc, a2, off = nf4.double_quantize(absmax, table)
            dcodes = q[name + ".dq_codes"]
            off_ulps = nf4.ulps(q[name + ".offset"], off.reshape(1)).item()
            a2_ulps = nf4.ulps(q[name + ".absmax2"], a2).max().item()
            nq = int((dcodes != qc).sum())
            line += f"; absmax codes {len(qc) - nq}/{len(qc)} equal, absmax2 within {a2_ulps:.0f} ulp, offset within {off_ulps:.0f} ulp"
            if nq or a2_ulps > 2 or off_ulps > 2:
                line += "  <-- differs"
                bad += 1
            # The dequantized absmax is map[q] * absmax2 + offset. bitsandbytes' map
            # entries and offset may differ from headroom's in the last bit, its two
            # roundings may be one fused rounding in the C++, and the sum cancels; so
            # differences are measured in float32 epsilons of the terms' size
            # (|map[q] absmax2| + |offset|), times |NF4 code value| for a weight.
            eps = torch.finfo(torch.float32).eps
            mine_absmax = nf4.double_dequantize(qc, a2, off, table)
            hr_absmax = nf4.double_dequantize(dcodes, q[name + ".absmax2"], q[name + ".offset"][0], q["dynamic_map"])
            terms = (table[qc.long()] * a2.repeat_interleave(nf4.DQ_BLOCK)[: len(qc)]).abs() + off.abs()
            a_eps = ((mine_absmax - hr_absmax).abs() / (terms * eps)).max().item()
            w = nf4.nf4_dequantize(codes, mine_absmax)
            scale = (nf4.NF4_CODE[codes.long()].abs() * terms.repeat_interleave(nf4.BLOCK)) * eps
            w_eps = ((w - theirs_deq).abs() / scale).nan_to_num(0.0).max().item()
            rel = ((w - theirs_deq).abs().max() / theirs_deq.abs().max()).item()
            line += (f"; dequantized absmax within {a_eps:.1f} eps, weights within {w_eps:.1f} eps of their terms (limit 4; "
                     f"{rel:.1e} of the largest weight)")
            if a_eps > 4 or w_eps > 4:
                line += "  <-- differs"
                bad += 1
        else:
            if not torch.equal(q[name + ".absmax"], absmax):
                line += "; absmax differs  <-- differs"
                bad += 1
            # one float32 product: bit for bit, except at the explained elements
            u = nf4.ulps(nf4.nf4_dequantize(codes, absmax), theirs_deq)
            u = torch.where(explained, torch.zeros_like(u), u)
            line += f"; absmax equal; dequantized weights within {u.max().item():.0f} ulp (limit 0)"
            if u.max().item() > 0:
                line += "  <-- differs"
                bad += 1
        if not torch.equal(base_init[name].reshape(-1), theirs_deq):
            line += "; init.safetensors is not the dequantized weight  <-- differs"
            bad += 1
        print(line)
    if tie_seen == 0 or zero_seen == 0:
        print("nf4: the driver's edge cases (values at exact midpoints, an all-zero block) are missing  <-- differs")
        bad += 1
    # Known, reported differences from bitsandbytes (not failures): at an exact midpoint
    # headroom takes the upper code (math::nf4_quantize_value: v >= midpoint), bitsandbytes
    # the lower (v > midpoint); in an all-zero block headroom stores code 7 (0.0), bitsandbytes
    # code 0 (its 0 * (1 / 0) is NaN), which dequantizes to -0.0 (with double quantization to
    # -1 times the block's dequantized absmax, which need not be exactly zero).
    print(f"nf4: NOTE: of {tie_seen} values at exact midpoints {ties} codes differ (headroom rounds up, bitsandbytes "
          f"down), of {zero_seen} values in all-zero blocks {zero_blocks} codes differ (headroom 7 = 0.0, bitsandbytes "
          f"0 = -1 x 0)")
    return bad


def scaled_step(scaler, opt, loss, params, ours, s):
    """One GradScaler iteration (scale, backward, unscale_, step, update); compares the scale it used and
    whether it skipped with headroom's [scale, skipped] of the same step. Returns 1 where they differ.

    headroom also counts a scaled norm of 2^64 or more as an overflow (its squares leave f32), which
    GradScaler does not: on a step GradScaler takes, the scaled norm must stay below 2^62 (the construction's
    margin), else the comparison would not be of the same rule."""
    used = scaler.get_scale()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    skipped = scaler.skipped(opt)
    margin, beyond = "", False
    if not skipped:
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
        beyond = math.log2(used * norm) > 62
        margin = f", scaled norm 2^{math.log2(used * norm):.1f}" + ("  <-- beyond the construction's margin (2^62)" if beyond else "")
    scaler.step(opt)
    scaler.update()
    theirs = torch.tensor(ours[0], dtype=torch.float32).item()  # (written with 9 digits: an f32 exactly)
    bad = used != theirs or skipped != ours[1] or beyond
    print(f"step {s + 1:2d}  scale 2^{math.log2(used):g} {'skipped' if skipped else 'stepped'}; headroom 2^{math.log2(theirs):g} "
          f"{'skipped' if ours[1] else 'stepped'}{margin}" + ("  <-- differs" if bad else ""))
    return int(bad)


def read_int8(d, init):
    """llm_int8: headroom's stored weights ({weight name: (codes, absmax)}) checked
    against llm_int8.quantize_weight of the dense originals; returns them and the count
    of differences."""
    import llm_int8  # noqa: E402
    q = read_safetensors(f"{d}/quant.safetensors")
    original = read_safetensors(f"{d}/original.safetensors")
    out, bad = {}, 0
    codes_off = absmax_off = 0
    for name in init:
        if name + ".codes" not in q:
            continue
        codes, absmax = q[name + ".codes"], q[name + ".absmax"]
        theirs_codes, theirs_absmax = llm_int8.quantize_weight(original[name])
        codes_off += int((codes != theirs_codes).sum())
        absmax_off += int((absmax != theirs_absmax).sum())
        out[name] = (codes, absmax)
    print(f"llm_int8: {len(out)} int8 weights; codes differing from llm_int8.py's quantizer: {codes_off}, "
          f"row absmaxes differing: {absmax_off}" + ("  <-- differs" if codes_off or absmax_off else ""))
    bad += bool(codes_off or absmax_off) + (len(out) == 0)
    return out, bad


def int8_losses(c, init, adapters, scale, batches, int8):
    """The losses of a training run with the given int8 weights (threshold from c)."""
    torch.manual_seed(0)
    m = Model(c, init, adapters, scale, c["checkpointed"], int8=int8)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=c["lr"], betas=(c["beta1"], c["beta2"]),
                            eps=c["eps"], weight_decay=c["weight_decay"])
    losses = []
    for s in range(c["steps"]):
        opt.zero_grad()
        loss = m(batches["tokens"][s], batches["targets"][s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(d):
    c = json.load(open(f"{d}/config.json"))
    init = read_safetensors(f"{d}/init.safetensors")
    batches = read_safetensors(f"{d}/batches.safetensors")
    ours = json.load(open(f"{d}/losses.json"))
    final = read_safetensors(f"{d}/final.safetensors")
    bad = 0
    print(f"parity: {c['family']}, {c['optimizer']} lr {c['lr']}, {c['steps']} steps"
          + (", LoRA" if c["lora"] else "") + (", checkpointed blocks" if c["checkpointed"] else "")
          + (", NF4 / NF4DQ base" if c["quantized"] else ""))
    if c["quantized"]:
        bad += check_nf4(d, init)
    adapters, scale = None, 1.0
    if c["lora"]:
        adapters, scale, acfg = read_adapter(f"{d}/adapter_init")
        print(f"LoRA: {len(adapters)} modules, r {acfg['r']}, alpha {acfg['lora_alpha']} (scale {scale:g}), "
              f"target_modules {acfg['target_modules']}")
    dropout, masks = 0.0, None
    if c["lora"] and acfg["lora_dropout"] > 0:
        dropout = acfg["lora_dropout"]
        masks = read_safetensors(f"{d}/masks.safetensors")
        kept = sum(int(m.sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
        print(f"LoRA dropout {dropout:g} (adapter_config.json): {len(masks)} masks from the driver, "
              f"{1 - kept:.4f} of the elements dropped")
        if abs((1 - kept) - dropout) > 0.01:
            print("  <-- the masks do not drop about lora_dropout of the elements")
            bad += 1
    int8 = None
    if "llm_int8" in c:
        int8, b = read_int8(d, init)
        bad += b
        print(f"LLM.int8: threshold {c['llm_int8']['threshold']:g}, at most {c['llm_int8']['max_outliers']} outlier columns")
    torch.manual_seed(0)
    model = Model(c, init, adapters, scale, c["checkpointed"], dropout, masks, int8)
    params = [p for p in model.parameters() if p.requires_grad]
    if c["optimizer"] == "SGD":
        opt = torch.optim.SGD(params, lr=c["lr"], momentum=c["momentum"], dampening=0, weight_decay=c["weight_decay"],
                              nesterov=False)
    elif c["optimizer"] == "Lion":
        from lion import Lion  # noqa: E402
        opt = Lion(params, lr=c["lr"], betas=(c["beta1"], c["beta2"]), weight_decay=c["weight_decay"])
    else:
        opt = torch.optim.AdamW(params, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                                weight_decay=c["weight_decay"])
    scaler, scales, scale_bad = None, None, 0
    if "loss_scaling" in c:
        import grad_scaler  # noqa: E402
        ls = c["loss_scaling"]
        scaler = grad_scaler.CPUGradScaler(init_scale=ls["init_scale"], growth_factor=ls["growth_factor"],
                                           backoff_factor=ls["backoff_factor"], growth_interval=ls["growth_interval"])
        scales = json.load(open(f"{d}/scales.json"))
        print(f"loss scaling: GradScaler(init_scale 2^{math.log2(ls['init_scale']):g}, growth_factor "
              f"2^{math.log2(ls['growth_factor']):g}, backoff_factor 2^{math.log2(ls['backoff_factor']):g}, "
              f"growth_interval {ls['growth_interval']}) on the CPU")
    worst_loss = 0.0
    bf16 = c.get("dtype") == "bf16"
    rtol = BF16_LOSS_RTOL if bf16 else LOSS_RTOL
    model32 = opt32 = None
    if bf16:
        print("bf16: headroom Precision<BF16> against torch.autocast('cpu', dtype=torch.bfloat16); "
              "PyTorch's f32 run beside it measures bf16's own noise")
        torch.manual_seed(0)
        model32 = Model(c, init, adapters, scale, c["checkpointed"])
        params32 = [p for p in model32.parameters() if p.requires_grad]
        opt32 = torch.optim.AdamW(params32, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                                  weight_decay=c["weight_decay"])
    for s in range(c["steps"]):
        model.step = s + 1
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(batches["tokens"][s], batches["targets"][s])
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scale_bad += scaled_step(scaler, opt, loss, params, scales[s], s)
        if model32 is not None:
            opt32.zero_grad()
            model32(batches["tokens"][s], batches["targets"][s]).backward()
            opt32.step()
        rel = abs(loss.item() - ours[s]) / abs(loss.item())
        worst_loss = max(worst_loss, rel)
        flag = "" if rel <= rtol else "  <-- differs"
        bad += rel > rtol
        print(f"step {s + 1:2d}  torch {loss.item():.7f}  headroom {ours[s]:.7f}  rel {rel:.2e}{flag}")
    print(f"losses: worst rel {worst_loss:.2e} (tolerance {rtol:g})")
    if int8 is not None:
        counts = model.int8_counts
        per_step = len(counts) // c["steps"]
        print(f"LLM.int8: outlier columns per projection call, step 1: {counts[:per_step]}; "
              f"most in any call {max(counts)}, calls with outliers {sum(1 for k in counts if k)} of {len(counts)}")
        bad += max(counts) == 0 or max(counts) > c["llm_int8"]["max_outliers"]
        # the check can fail: models that are not LLM.int8 miss headroom's losses
        c0 = dict(c, llm_int8={"threshold": 0.0})
        for what, cc, w in (("threshold 0 (no decomposition)", c0, int8),
                            ("no int8 (dequantized weights, f32 product)", c, {})):
            other = int8_losses(cc, init, adapters, scale, batches, w)
            miss = max(abs(a - b) / abs(a) for a, b in zip(other, ours))
            print(f"  a model with {what}: worst rel {miss:.2e} from headroom's losses"
                  + ("" if miss > rtol else "  <-- within tolerance: the check cannot tell"))
            bad += miss <= rtol
    if scaler is not None:
        skips = sum(1 for _, k in scales if k)
        print(f"loss scaling: {len(scales)} steps, {skips} skipped; {scale_bad} differ from GradScaler's")
        bad += scale_bad + (skips == 0)

    f32_of = {}  # a bf16 run: PyTorch's f32 run's tensor of each name
    if c["lora"]:
        # the frozen base: unchanged by headroom, bit for bit
        changed = [n for n in init if not torch.equal(init[n], final[n])]
        print(f"frozen base: {len(init) - len(changed)} of {len(init)} tensors unchanged" + ("  <-- differs" if changed else ""))
        bad += bool(changed)
        # the adapters: (name, torch's, headroom's, initial)
        trained, _, _ = read_adapter(f"{d}/adapter_final")
        pairs = []
        for m, (A, B) in trained.items():
            mA, mB = model.adapter(m)
            pairs += [(m + ".lora_A", mA.detach(), A, adapters[m][0]), (m + ".lora_B", mB.detach(), B, adapters[m][1])]
            if model32 is not None:
                a32, b32 = model32.adapter(m)
                f32_of[m + ".lora_A"], f32_of[m + ".lora_B"] = a32.detach(), b32.detach()
    else:
        # every weight: (name, torch's, headroom's, initial)
        pairs = [(n, model.w(n).detach(), final[n], init[n]) for n in final]
        if model32 is not None:
            f32_of.update({n: model32.w(n).detach() for n in final})
    if c["family"] == "gpt2" and not c["lora"]:
        # GPT-2's key bias (the middle third of c_attn.bias) has a zero gradient in
        # exact arithmetic (it adds q . b_k to every score of a row; softmax ignores
        # that), so both sides' gradients for it are rounding noise (1e-10 or so) and
        # AdamW, which normalizes a gradient, moves it by noise only, differently on
        # each side. It is left out of the comparison; instead both sides must have
        # moved it by less than one lr (a real gradient moves it about lr per step).
        D = c["dim"]
        noise = []
        for i, (n, m, t, s0) in enumerate(pairs):
            if n.endswith("attn.c_attn.bias"):
                keep = torch.ones(3 * D, dtype=torch.bool)
                keep[D : 2 * D] = False
                noise.append((m[~keep] - s0[~keep]).abs().max().item())
                noise.append((t[~keep] - s0[~keep]).abs().max().item())
                pairs[i] = (n, m[keep], t[keep], s0[keep])
        key_move = max(noise)
        print(f"key biases (zero gradient, noise only): moved at most {key_move:.1e} (limit lr = {c['lr']:g})"
              + ("  <-- differs" if key_move > c["lr"] else ""))
        bad += key_move > c["lr"]
    moved = max((m - s).abs().max().item() for _, m, _, s in pairs)
    what = "final adapters" if c["lora"] else "final weights"
    if bf16:  # against bf16's own noise on this run
        worst = max(max_abs_diff(m, t) for _, m, t, _ in pairs)
        noise = max(max_abs_diff(m, f32_of[n]) for n, m, _, _ in pairs)
        tol, why = bf16_tolerance(noise, max(m.abs().max().item() for _, m, _, _ in pairs))
        print(f"{what}: max |autocast - headroom| = {worst:.3e} (tolerance {why} = {tol:.1e}; largest move {moved:.2e})")
        bad += worst > tol
    else:
        worst = max(max_abs_diff(m, t) for _, m, t, _ in pairs)
        tol, why = final_tolerance(c, moved)
        print(f"{what}: max |torch - headroom| = {worst:.3e} (tolerance {why} = {tol:.1e}; largest move {moved:.2e})")
        bad += worst > tol

    if c["lora"]:
        # io::save_merged: W + scale B A from headroom's own final adapters (double, rounded once)
        merged = read_safetensors(f"{d}/merged.safetensors")
        err = 0.0
        for m, (A, B) in trained.items():
            n = base_name(m, init)
            delta = scale * (B.double() @ A.double())
            if c["family"] == "gpt2":  # Conv1D weights are stored (in, out)
                delta = delta.T
            err = max(err, max_abs_diff(merged[n], init[n].double() + delta))
        others = [n for n in init if not any(n == base_name(m, init) for m in trained)]
        err = max([err] + [max_abs_diff(merged[n], init[n]) for n in others])
        print(f"merged: max |save_merged - (W + scale B A)| = {err:.1e} (tolerance 1e-6: float32 rounding)")
        bad += err > 1e-6
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))

// The headroom side of a parity run: for configuration NAME, writes into DIR
//   init.safetensors     the initial base weights (Hugging Face names; a quantized
//                        projection as the trainer holds it: dequantized)
//   batches.safetensors  tokens and targets, I32 (steps, batch, seq)
//   config.json          model dims, optimizer and its hyper-parameters
//   losses.json          the loss of every step, as trained here
//   final.safetensors    the base weights after the last step
// and, for LoRA configurations,
//   adapter_init/        the initial LoRA adapters (PEFT layout, io::export_adapter);
//                        B is given nonzero values first, so that A's gradient is
//                        not zero at the first step and both adapters are compared
//   adapter_final/       the adapters after the last step
//   merged.safetensors   io::save_merged after the last step (W + scale B A)
//   masks.safetensors    with LoRA dropout: each module's keep mask of each step,
//                        U8 (tokens, in), "<module>.step<s>" (dropout_masks below)
// and, for nf4,
//   original.safetensors the dense weights the quantized projections were loaded from
//   quant.safetensors    per quantized projection <name>: <name>.codes (U8, packed),
//                        <name>.absmax (NF4) or <name>.dq_codes / .absmax2 / .offset
//                        (NF4DQ), <name>.dequant (F32, rows x cols, what the kernels
//                        compute with); and the trainer's code tables nf4_code (16)
//                        and dynamic_map (256)
// and, for llama_loss_scale (dynamic loss scaling forced to overflow),
//   scales.json          each step's [loss scale, skipped]; config.json then holds
//                        "loss_scaling" (GradScaler's four parameters)
// tests/parity/reference.py trains the same thing in PyTorch and compares.
//
//   parity_driver NAME DIR
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <headroom/headroom.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/io/safetensors.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <vector>

using namespace headroom;
namespace fs = std::filesystem;

namespace {

// Steps of a run: 20. LLM.int8: 6, because its forward rounds its input to
// int8: once the two sides' weights differ in the last bits (a few steps in),
// an input element may round to the neighbouring code on one side only, which
// moves that step's loss by about 1e-5 relative to the other's and grows from
// there; over the first steps no element does and the two agree to 1e-7.
int steps = 20;
constexpr models::LlamaConfig llama_cfg{96, 64, 160, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_cfg{96, 64, 2, 4, 64};
// Llama 3.1's RoPE scaling, with an original context of 64 so that at head
// dim 16 the frequencies fall in all three bands: pair 0 kept (wavelength
// 6.3 < 64 / 4), pairs 1-2 blended, pairs 3-7 divided by the factor 4.
constexpr models::LlamaConfig llama_scaled_cfg{96, 64, 160, 2, 4, 2, 64, false, 10000,
                                                {real(4), real(1), real(4), 64}};
// Qwen2: biases on q, k, v; RMSNorm's epsilon 1e-6
constexpr models::LlamaConfig qwen2_cfg{96, 64, 160, 2, 4, 2, 64, false, 1000000, {}, real(1e-6), true,
                                         models::LlamaArch::qwen2};
// Qwen3: q_norm and k_norm on each head, head_dim 24 apart from 64 / 4
constexpr models::LlamaConfig qwen3_cfg{.vocab = 96, .dim = 64, .ffn = 160, .layers = 2, .heads = 4, .kv_heads = 2,
                                        .max_positions = 64, .rope_theta = 1000000, .rms_norm_eps = real(1e-6),
                                        .arch = models::LlamaArch::qwen3, .head_dim = 24, .qk_norm = true};
// Mistral: a sliding window of 20 over 160 positions, so that the kernels'
// 64-row tiles are whole inside, partly inside and wholly outside it
constexpr models::LlamaConfig mistral_cfg{.vocab = 96, .dim = 64, .ffn = 160, .layers = 2, .heads = 4, .kv_heads = 2,
                                          .max_positions = 160, .arch = models::LlamaArch::mistral, .sliding_window = 20};
// nf4: wide enough that an NF4DQ matrix has more than 256 blocks (up_proj,
// down_proj: 640 blocks, three second-level blocks, the last one partial).
constexpr models::LlamaConfig nf4_cfg{96, 128, 320, 2, 4, 2, 64, false};

// LoRA r 8, alpha 16 (scale 2): a scale other than 1 checks the alpha / r convention.
using Lora8 = LoRA<8, Linear<>, Ratio<16>>;
using LlamaLora = models::Llama<llama_cfg, Apply<Lora8, On<q_proj, v_proj, o_proj, down_proj>>>;
using LlamaLoraCkpt = models::Llama<llama_cfg, Apply<Lora8, On<q_proj, v_proj, o_proj, down_proj>>, Apply<Checkpointed<>, EveryBlock>>;
// lora_dropout 0.1, PEFT's most common setting, through checkpointed blocks (the recompute regenerates the masks)
using LlamaLoraDropCkpt = models::Llama<llama_cfg, Apply<LoRA<8, Linear<>, Ratio<16>, Ratio<1, 10>>, On<q_proj, v_proj, o_proj, down_proj>>,
                                        Apply<Checkpointed<>, EveryBlock>>;
using GPT2LoraCkpt = models::GPT2<gpt2_cfg, Apply<Lora8, On<c_attn, attn_c_proj, c_fc>>, Apply<Checkpointed<>, EveryBlock>>;
// QLoRA: NF4 on some projections, NF4 with double quantization on the others.
using LlamaNF4 = models::Llama<nf4_cfg, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, k_proj, gate_proj>>,
                               Apply<Quantized<NF4DQ, LoRA<8>>, On<v_proj, o_proj, up_proj, down_proj>>>;
using SGDm = SGD<Ratio<9, 10>, Ratio<1, 100>>;  // momentum 0.9, weight decay 0.01
using LionWD = LionWith<Ratio<9, 10>, Ratio<99, 100>, Ratio<1, 10>>;  // the paper's betas, weight decay 0.1
// LLM.int8 (load_in_8bit, llm_int8_threshold 6) under LoRA adapters, on every projection.
using LlamaInt8 = models::Llama<llama_cfg, Apply<Quantized<LLMInt8<>, Lora8>,
                                                 On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;

template <class Tr>
constexpr bool has_adapters() {
  for (std::size_t k = 0; k < Tr::param_count; ++k)
    if (io::is_adapter_param(Tr::param(k).name)) return true;
  return false;
}

template <class Tr>
constexpr bool recomputes() {
  for (const Step& s : Tr::sched.steps)
    if (s.kind == EventKind::recompute) return true;
  return false;
}

// LoRA's B starts at zero, which makes A's first gradient zero: give B
// small deterministic values (the exported initial adapters carry them).
template <class Tr>
void perturb_lora_b(Tr& t) {
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (p.name != "lora_B") continue;
    std::vector<float> w(static_cast<std::size_t>(p.elements()));
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>(0.02 * std::sin(0.7 * static_cast<double>(i) + 1.3 * static_cast<double>(k)));
    t.set_dense(p, w);  // (a bf16 run: rounded, and its masters set)
  }
}

// A deterministic source of uniform (0, 1) values (a 32-bit LCG, 24 bits
// used) and of normal ones (Box-Muller).
struct Lcg {
  std::uint32_t x;
  double uniform() {
    x = x * 1664525u + 1013904223u;
    return (static_cast<double>(x >> 8) + 0.5) / 16777216.0;
  }
  double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

// Writes the model's original dense tensors (original.safetensors, under
// their Hugging Face names) and loads them with io::load_pretrained, which
// quantizes the quantized projections as it loads. Each tensor starts as the
// trainer holds it (zeros where quantized); fill(hf param, slot, values)
// then sets or edits it.
template <class Tr, class Fill>
void load_originals(Tr& t, const fs::path& dir, Fill&& fill) {
  const std::vector<io::HfParam> params = io::hf_params<Tr>();
  std::vector<std::vector<float>> values;
  values.reserve(params.size());
  std::vector<io::TensorView> views;
  for (const io::HfParam& h : params) {
    const ParamSlot& p = *h.slot;
    std::vector<float>& v = values.emplace_back(static_cast<std::size_t>(p.elements()));
    if (p.quant.kind == QuantKind::none)
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = t.weight(p)[i];
    fill(h, p, v);
    views.push_back(io::TensorView{h.name, DType::F32, h.shape, v.data()});
  }
  io::write_safetensors(dir / "original.safetensors", views, {{"format", "pt"}});
  io::load_pretrained(t, dir / "original.safetensors");
}

// nf4: dense originals for the quantized projections (varied block scales, a
// few heavy tails), loaded with io::load_pretrained, which quantizes them as
// it loads (set_quantized); then the quantized state is written out.
// Block 0 of the first quantized matrix holds exact NF4 midpoints (absmax 1,
// so x / absmax is exact) and block 1 is all zero: the two places where a
// quantizer's tie rule and its absmax == 0 handling show.
template <class Tr>
void load_nf4_originals(Tr& t, const fs::path& dir) {
  const std::vector<io::HfParam> params = io::hf_params<Tr>();
  Lcg g{2024};
  bool edge_done = false;
  load_originals(t, dir, [&](const io::HfParam&, const ParamSlot& p, std::vector<float>& v) {
    if (p.quant.kind == QuantKind::none) return;
    for (std::int64_t b = 0; b < p.elements() / 64; ++b) {
      const double scale = 0.005 + 0.04 * g.uniform();  // each block its own absmax
      for (std::int64_t i = b * 64; i < (b + 1) * 64; ++i) {
        const double n = g.normal();
        v[static_cast<std::size_t>(i)] = static_cast<float>(scale * n * (g.uniform() < 0.02 ? 4.0 : 1.0));
      }
    }
    if (!edge_done) {
      edge_done = true;
      v[0] = 1.0f;
      for (int i = 0; i < 15; ++i) {
        v[static_cast<std::size_t>(1 + i)] = 0.5f * (math::nf4_code(i) + math::nf4_code(i + 1));
        v[static_cast<std::size_t>(16 + i)] = math::nf4_code(i);
      }
      for (int i = 64; i < 128; ++i) v[static_cast<std::size_t>(i)] = 0.0f;
    }
  });

  std::vector<std::vector<float>> deq;
  deq.reserve(params.size());
  std::vector<io::TensorView> q;
  const float* table = nullptr;
  for (const io::HfParam& h : params) {
    const ParamSlot& p = *h.slot;
    if (p.quant.kind == QuantKind::none) continue;
    const host::QuantView w = t.quant(p);
    table = w.table;
    const std::int64_t blocks = w.blocks();
    q.push_back({h.name + ".codes", DType::U8, {p.elements() / 2}, w.codes});
    if (p.quant.double_quant) {
      q.push_back({h.name + ".dq_codes", DType::U8, {blocks}, w.dq_codes()});
      q.push_back({h.name + ".absmax2", DType::F32, {(blocks + p.quant.dq_block - 1) / p.quant.dq_block}, w.absmax2()});
      q.push_back({h.name + ".offset", DType::F32, {1}, w.offset()});
    } else {
      q.push_back({h.name + ".absmax", DType::F32, {blocks}, w.absmax()});
    }
    std::vector<float>& d = deq.emplace_back(static_cast<std::size_t>(p.elements()));
    host::dequantize_rows<float>(w, 0, p.rows, d.data());
    q.push_back({h.name + ".dequant", DType::F32, {p.rows, p.cols}, d.data()});
  }
  q.push_back({"nf4_code", DType::F32, {16}, table});
  q.push_back({"dynamic_map", DType::F32, {256}, table + 16});
  io::write_safetensors(dir / "quant.safetensors", q);
}

template <class Tr>
constexpr bool has_llm_int8() {
  for (std::size_t k = 0; k < Tr::param_count; ++k)
    if (Tr::param(k).quant.vectorwise) return true;
  return false;
}

// llm_int8: dense originals for the int8 projections (each row its own scale),
// loaded with io::load_pretrained (quantized row-wise as it loads), and the
// norms' gains raised to 10 on features 3 and 17 (and 40 in the second
// block), so those input columns of the projections after them exceed
// llm_int8_threshold: the decomposition is exercised. Written out: the int8
// codes and row absmaxes as headroom holds them (quant.safetensors).
template <class Tr>
void load_int8_originals(Tr& t, const fs::path& dir) {
  const std::vector<io::HfParam> params = io::hf_params<Tr>();
  Lcg g{808};
  load_originals(t, dir, [&](const io::HfParam& h, const ParamSlot& p, std::vector<float>& v) {
    if (p.quant.kind == QuantKind::none) {
      if (h.name.find("layernorm") != std::string::npos) {
        v[3] = v[17] = 10.0f;
        if (h.name.find("layers.1.") != std::string::npos) v[40] = 10.0f;
      }
      return;
    }
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const double scale = 0.02 + 0.1 * g.uniform();
      for (std::int64_t c = 0; c < p.cols; ++c) v[static_cast<std::size_t>(r * p.cols + c)] = static_cast<float>(scale * g.normal());
    }
  });
  std::vector<io::TensorView> q;
  for (const io::HfParam& h : params) {
    const ParamSlot& p = *h.slot;
    if (p.quant.kind == QuantKind::none) continue;
    const host::QuantView w = t.quant(p);
    q.push_back({h.name + ".codes", DType::I8, {p.rows, p.cols}, w.codes});
    q.push_back({h.name + ".absmax", DType::F32, {p.rows}, w.absmax()});
  }
  io::write_safetensors(dir / "quant.safetensors", q);
}

// LoRA dropout: the keep masks each module's adapter applies to its input at
// step `step` (1-based), as math/dropout.hpp derives them (the trainer's seed,
// data-parallel rank 0, micro-batch 0, the module's node and instance), one U8
// (tokens, in) tensor per module: "<module>.step<step>". Empty without dropout.
template <class Tr>
void dropout_masks(std::uint64_t seed, int step, std::vector<std::vector<std::uint8_t>>& keep, std::vector<io::TensorView>& views) {
  for (const io::LoraModule& m : io::lora_modules<Tr>()) {
    if (m.dropout_num == 0) continue;
    math::Dropout d;
    d.stream = math::dropout_stream(math::dropout_step_key(seed, step, 0), 0, m.A->node, m.A->instance);
    d.threshold = math::dropout_threshold(m.dropout_num, m.dropout_den);
    d.width = m.in;
    const std::int64_t n = Tr::tokens_per_micro_batch;
    std::vector<std::uint8_t>& k = keep.emplace_back(static_cast<std::size_t>(n * m.in));
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < m.in; ++c) k[static_cast<std::size_t>(r * m.in + c)] = d.keep(r, c) ? 1 : 0;
    views.push_back(io::TensorView{m.hf_module + ".step" + std::to_string(step), DType::U8, {n, m.in}, k.data()});  // (moving
    // `keep`'s vectors keeps their data where it is)
  }
}

// Dynamic loss scaling forced to overflow (llama_loss_scale): the final
// norm's weight at 100 makes the gradients large (tens), so a scale of 2^127
// overflows f32 and 2^50 keeps the scaled norm below 2^64 (both engines'
// overflow rules and GradScaler's then agree; reference.py checks the
// margins); backoff 2^-77 and growth 2^77 every 2 steps: a skip every third step.
const LossScaling forced_overflow = {.mode = LossScaling::dynamic, .init_scale = std::ldexp(1.0, 127),
                                     .growth_factor = std::ldexp(1.0, 77), .backoff_factor = std::ldexp(1.0, -77),
                                     .growth_interval = 2};

template <class R>
int run(const fs::path& dir, double lr, const LossScaling* scaling = nullptr) {
  using Tr = host::Trainer<R>;
  using M = typename R::model;
  using O = typename R::optimizer;
  constexpr bool gpt2 = io::hf_family<Tr>() == io::HfFamily::gpt2;
  constexpr bool lora = has_adapters<Tr>();
  constexpr bool quant = Tr::sched.quant_table >= 0;
  TrainOptions options{.seed = 17, .threads = 1, .lr = lr, .clip_norm = 0};
  if (scaling != nullptr) options.loss_scaling = *scaling;
  Tr t(options);
  if (scaling != nullptr)
    for (std::size_t k = 0; k < Tr::param_count; ++k)
      if (Tr::path_of(Tr::param(k)) == "norm.weight")
        t.set_dense(Tr::param(k), std::vector<float>(static_cast<std::size_t>(Tr::param(k).elements()), 100.0f));
  fs::create_directories(dir);
  if constexpr (quant) load_nf4_originals(t, dir);
  if constexpr (has_llm_int8<Tr>()) load_int8_originals(t, dir);
  io::save_pretrained(t, dir / "init.safetensors");
  // bf16: the masters become the stored (rounded) values PyTorch starts from
  if constexpr (R::dtype == DType::BF16) io::load_pretrained(t, dir / "init.safetensors");
  if constexpr (lora) {
    perturb_lora_b(t);
    io::export_adapter(t, dir / "adapter_init", "parity");
  }
  constexpr std::int64_t n = Tr::tokens_per_step, vocab = M::config.vocab;
  std::vector<std::int32_t> tok(steps * n), tgt(steps * n);
  std::uint32_t x = 12345;
  for (std::size_t i = 0; i < tok.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    tok[i] = static_cast<std::int32_t>((x >> 9) % vocab);
  }
  for (std::size_t i = 0; i < tok.size(); ++i) tgt[i] = (tok[i] * 7 + 3) % vocab;  // learnable
  io::write_safetensors(dir / "batches.safetensors",
                        {{"tokens", DType::I32, {steps, R::batch, R::seq}, tok.data()},
                         {"targets", DType::I32, {steps, R::batch, R::seq}, tgt.data()}});
  {  // LoRA dropout's masks, step by step (none without dropout)
    std::vector<std::vector<std::uint8_t>> keep;
    std::vector<io::TensorView> views;
    for (int s = 1; s <= steps; ++s) dropout_masks<Tr>(t.options().seed, s, keep, views);
    if (!views.empty()) io::write_safetensors(dir / "masks.safetensors", views);
  }
  std::ofstream losses(dir / "losses.json");
  std::string scales = "[";  // loss scaling: each step's [scale, skipped]
  losses << "[";
  for (int s = 0; s < steps; ++s) {
    const auto st = t.step(std::span<const std::int32_t>(tok.data() + s * n, n), std::span<const std::int32_t>(tgt.data() + s * n, n));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.9g", s ? ", " : "", st.loss);
    losses << buf;
    std::snprintf(buf, sizeof buf, "%s[%.9g, %s]", s ? ", " : "", static_cast<double>(st.loss_scale), st.skipped ? "true" : "false");
    scales += buf;
  }
  losses << "]\n";
  if (scaling != nullptr) std::ofstream(dir / "scales.json") << scales << "]\n";
  io::save_pretrained(t, dir / "final.safetensors");
  if constexpr (lora) {
    io::export_adapter(t, dir / "adapter_final", "parity");
    io::save_merged(t, dir / "merged.safetensors");
  }
  std::ofstream cfg(dir / "config.json");
  const auto& c = M::config;
  cfg << "{\"family\": \"" << (gpt2 ? "gpt2" : "llama") << "\", \"vocab\": " << c.vocab << ", \"dim\": " << c.dim
      << ", \"layers\": " << c.layers << ", \"heads\": " << c.heads;
  if constexpr (gpt2) cfg << ", \"max_positions\": " << c.max_positions;
  else cfg << ", \"ffn\": " << c.ffn << ", \"kv_heads\": " << c.kv_heads << ", \"rope_theta\": " << c.rope_theta;
  if constexpr (!gpt2)
    if (c.rope_scaling.on())
      cfg << ", \"rope_scaling\": {\"factor\": " << c.rope_scaling.factor << ", \"low_freq_factor\": "
          << c.rope_scaling.low_freq_factor << ", \"high_freq_factor\": " << c.rope_scaling.high_freq_factor
          << ", \"original_max_position_embeddings\": " << c.rope_scaling.original_positions << "}";
  if constexpr (!gpt2)
    cfg << ", \"head_dim\": " << c.head_width() << ", \"qk_norm\": " << (c.qk_norm ? "true" : "false")
        << ", \"sliding_window\": " << c.sliding_window;
  cfg << ", \"batch\": " << R::batch << ", \"seq\": " << R::seq << ", \"steps\": " << steps << ", \"optimizer\": \"" << O::name
      << "\", \"lr\": " << lr << ", \"weight_decay\": " << O::weight_decay::value;
  if constexpr (requires { typename O::momentum; }) cfg << ", \"momentum\": " << O::momentum::value;
  else cfg << ", \"beta1\": " << O::beta1::value << ", \"beta2\": " << O::beta2::value << ", \"eps\": 1e-8";
  double norm_eps = 1e-5;
  if constexpr (!gpt2) norm_eps = c.rms_norm_eps;
  cfg << ", \"norm_eps\": " << norm_eps << ", \"lora\": " << (lora ? "true" : "false") << ", \"checkpointed\": "
      << (recomputes<Tr>() ? "true" : "false") << ", \"quantized\": " << (quant ? "true" : "false") << ", \"dtype\": \""
      << name_of(R::dtype) << "\"";
  if constexpr (has_llm_int8<Tr>()) {
    QuantDesc d{};
    for (std::size_t k = 0; k < Tr::param_count; ++k)
      if (Tr::param(k).quant.vectorwise) d = Tr::param(k).quant;
    cfg << ", \"llm_int8\": {\"threshold\": " << d.outlier_threshold << ", \"max_outliers\": " << d.max_outliers << "}";
  }
  if (scaling != nullptr)
    cfg << std::setprecision(17) << ", \"loss_scaling\": {\"init_scale\": " << scaling->init_scale << ", \"growth_factor\": "
        << scaling->growth_factor << ", \"backoff_factor\": " << scaling->backoff_factor
        << ", \"growth_interval\": " << scaling->growth_interval << "}";
  cfg << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* names =
      "llama_full gpt2_full gpt2_sgd llama_lion llama_lora llama_lora_ckpt llama_lora_dropout_ckpt gpt2_lora_ckpt nf4 llama_bf16 "
      "gpt2_lora_ckpt_bf16 llama_loss_scale llm_int8 llama_rope_scaled qwen2_full qwen3_full mistral_window";
  if (argc != 3) {
    std::fprintf(stderr, "usage: parity_driver NAME DIR   (NAME: %s)\n", names);
    return 2;
  }
  const std::string name = argv[1];
  const fs::path dir = argv[2];
  if (name == "llama_full") return run<Train<models::Llama<llama_cfg>, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  // the q, k, v biases start at zero and are trained: from step 2 on they take part
  if (name == "qwen2_full") return run<Train<models::Llama<qwen2_cfg>, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "qwen3_full") return run<Train<models::Llama<qwen3_cfg>, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "mistral_window") return run<Train<models::Llama<mistral_cfg>, Batch<1>, Seq<160>, AdamW>>(dir, 3e-3);
  if (name == "llama_rope_scaled") return run<Train<models::Llama<llama_scaled_cfg>, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "gpt2_full") return run<Train<models::GPT2<gpt2_cfg>, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "gpt2_sgd") return run<Train<models::GPT2<gpt2_cfg>, Batch<2>, Seq<16>, SGDm>>(dir, 0.03);
  if (name == "llama_lion") return run<Train<models::Llama<llama_cfg>, Batch<2>, Seq<16>, LionWD>>(dir, 3e-4);
  if (name == "llama_lora") return run<Train<LlamaLora, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "llama_lora_ckpt") return run<Train<LlamaLoraCkpt, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "llama_lora_dropout_ckpt") return run<Train<LlamaLoraDropCkpt, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "gpt2_lora_ckpt") return run<Train<GPT2LoraCkpt, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  if (name == "nf4") return run<Train<LlamaNF4, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  // bf16: against PyTorch's CPU autocast (reference.py)
  if (name == "llama_bf16") return run<Train<models::Llama<llama_cfg>, Batch<2>, Seq<16>, AdamW, Precision<BF16>>>(dir, 3e-3);
  if (name == "gpt2_lora_ckpt_bf16") return run<Train<GPT2LoraCkpt, Batch<2>, Seq<16>, AdamW, Precision<BF16>>>(dir, 3e-3);
  // dynamic loss scaling forced to overflow: the scales and skipped steps against GradScaler's (reference.py)
  if (name == "llama_loss_scale") return run<Train<models::Llama<llama_cfg>, Batch<2>, Seq<16>, AdamW>>(dir, 1e-4, &forced_overflow);
  // LLM.int8 against the algorithm written in torch (llm_int8.py)
  if (name == "llm_int8") {
    steps = 6;
    return run<Train<LlamaInt8, Batch<2>, Seq<16>, AdamW>>(dir, 3e-3);
  }
  std::fprintf(stderr, "parity_driver: unknown configuration '%s' (known: %s)\n", name.c_str(), names);
  return 2;
}

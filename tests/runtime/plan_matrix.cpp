// Every preset under policy mixes (full fine-tuning, LoRA, QLoRA in NF4 /
// NF4+DQ / Int4 / Int8, each with and without checkpointed or offloaded blocks,
// AdamW / AdamW8bit / SGD, F32 / BF16, Accumulate<2>, UpdateInBackward; all 22
// mixes for tiny_llama, GPT-2 124M and Llama-3-8B, a cross-section of 9 for the
// other presets):
//   - the plan is valid (no two live buffers overlap) and packs within 5 % of
//     the liveness lower bound;
//   - parameters, trainable parameters and the bytes of every memory role
//     equal what this file derives from the Hugging Face state-dict layout of
//     the model and from the storage formats (bitsandbytes NF4 / DQ, block-wise
//     absmax Int4 / Int8, 8-bit block-wise Adam state) — never from the planner.
//
// The plans of the 7B / 8B presets are expensive to evaluate at compile time
// (~11 s each), so every plan here is computed at run time by
// headroom::detail::expand<R>() (the same constexpr code, called through a
// volatile function pointer so that the compiler does not fold it).
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace headroom;
using std::int64_t;

// ============================================================================
// The reference: plain arithmetic, written from the formats and HF configs.
// ============================================================================

constexpr int64_t a256(int64_t n) { return (n + 255) / 256 * 256; }  // every buffer is 256-aligned
constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

enum class Quant : int { none, nf4, nf4dq, int4, int8 };
enum class Opt : int { adamw, adamw8bit, sgd };
enum class Wrap : int { none, checkpointed, offloaded_checkpointed, offloaded };
enum class Targets : int { none, attention, all };

// A run as plain values (also usable as a template argument).
struct Mix {
  DType dtype = DType::F32;
  Opt opt = Opt::adamw;
  int rank = 0;                     // LoRA rank; 0 = full fine-tuning
  Targets targets = Targets::none;  // which projections get the (Q)LoRA recipe
  Quant quant = Quant::none;        // format of the targeted base weights
  Wrap wrap = Wrap::none;           // policy applied to every block
  int accumulate = 1;
  bool update_in_backward = false;
  int64_t batch = 2, seq = 64;
};

std::string describe(const Mix& m) {
  static const char* q[] = {"-", "NF4", "NF4DQ", "Int4", "Int8"};
  static const char* o[] = {"AdamW", "AdamW8bit", "SGD"};
  static const char* w[] = {"-", "Checkpointed", "Offloaded<Checkpointed>", "Offloaded"};
  static const char* t[] = {"-", "attention", "all"};
  std::ostringstream s;
  s << (m.dtype == DType::F32 ? "F32" : "BF16") << ' ' << o[static_cast<int>(m.opt)] << " rank " << m.rank
    << " targets " << t[static_cast<int>(m.targets)] << " quant " << q[static_cast<int>(m.quant)] << " blocks "
    << w[static_cast<int>(m.wrap)] << " accumulate " << m.accumulate << (m.update_in_backward ? " update-in-backward" : "")
    << " batch " << m.batch << " seq " << m.seq;
  return s.str();
}

// The architecture numbers the reference needs (from config.json).
struct Arch {
  bool llama = true;
  int64_t vocab, dim, ffn, layers, heads, kv_heads, max_pos;
  bool tied;
};
Arch arch_of(const models::LlamaConfig& c) {
  return {true, c.vocab, c.dim, c.ffn, c.layers, c.heads, c.kv_heads, c.max_positions, c.tied};
}
Arch arch_of(const models::GPT2Config& c) {  // GPT-2: n_inner = 4 n_embd, wte tied to the LM head
  return {false, c.vocab, c.dim, 4 * c.dim, c.layers, c.heads, c.heads, c.max_positions, true};
}

// Projection slots, as PEFT's target_modules name them.
enum class Slot : int { none, q, k, v, o, gate, up, down, c_attn, attn_c_proj, c_fc, mlp_c_proj };

// One entry of the Hugging Face state dict (weights stored [out, in]).
struct HfTensor {
  int64_t rows, cols, count;  // count: instances (layers)
  Slot slot;
  bool matrix;  // the weight matrix of a projection (biases are not quantized)
};

// LlamaForCausalLM / GPT2LMHeadModel state dicts.
std::vector<HfTensor> hf_tensors(const Arch& a) {
  const int64_t V = a.vocab, D = a.dim, F = a.ffn, L = a.layers, hd = a.dim / a.heads;
  const int64_t Hq = a.heads * hd, Hkv = a.kv_heads * hd;
  std::vector<HfTensor> t;
  if (a.llama) {
    t.push_back({V, D, 1, Slot::none, false});     // model.embed_tokens.weight
    t.push_back({Hq, D, L, Slot::q, true});        // layers.{i}.self_attn.q_proj.weight
    t.push_back({Hkv, D, L, Slot::k, true});       // ... k_proj.weight
    t.push_back({Hkv, D, L, Slot::v, true});       // ... v_proj.weight
    t.push_back({D, Hq, L, Slot::o, true});        // ... o_proj.weight
    t.push_back({F, D, L, Slot::gate, true});      // layers.{i}.mlp.gate_proj.weight
    t.push_back({F, D, L, Slot::up, true});        // ... up_proj.weight
    t.push_back({D, F, L, Slot::down, true});      // ... down_proj.weight
    t.push_back({D, 1, L, Slot::none, false});     // layers.{i}.input_layernorm.weight
    t.push_back({D, 1, L, Slot::none, false});     // layers.{i}.post_attention_layernorm.weight
    t.push_back({D, 1, 1, Slot::none, false});     // model.norm.weight
    if (!a.tied) t.push_back({V, D, 1, Slot::none, false});  // lm_head.weight
  } else {
    t.push_back({V, D, 1, Slot::none, false});                 // wte
    t.push_back({a.max_pos, D, 1, Slot::none, false});         // wpe
    t.push_back({D, 1, L, Slot::none, false});                 // h.{i}.ln_1.weight
    t.push_back({D, 1, L, Slot::none, false});                 // h.{i}.ln_1.bias
    t.push_back({3 * D, D, L, Slot::c_attn, true});            // h.{i}.attn.c_attn.weight
    t.push_back({3 * D, 1, L, Slot::c_attn, false});           // h.{i}.attn.c_attn.bias
    t.push_back({D, D, L, Slot::attn_c_proj, true});           // h.{i}.attn.c_proj.weight
    t.push_back({D, 1, L, Slot::attn_c_proj, false});          // h.{i}.attn.c_proj.bias
    t.push_back({D, 1, L, Slot::none, false});                 // h.{i}.ln_2.weight
    t.push_back({D, 1, L, Slot::none, false});                 // h.{i}.ln_2.bias
    t.push_back({F, D, L, Slot::c_fc, true});                  // h.{i}.mlp.c_fc.weight
    t.push_back({F, 1, L, Slot::c_fc, false});                 // h.{i}.mlp.c_fc.bias
    t.push_back({D, F, L, Slot::mlp_c_proj, true});            // h.{i}.mlp.c_proj.weight
    t.push_back({D, 1, L, Slot::mlp_c_proj, false});           // h.{i}.mlp.c_proj.bias
    t.push_back({D, 1, 1, Slot::none, false});                 // ln_f.weight
    t.push_back({D, 1, 1, Slot::none, false});                 // ln_f.bias
  }
  return t;
}

bool targeted(const Arch& a, const Mix& m, Slot s) {
  if (m.rank == 0 || s == Slot::none) return false;
  if (a.llama) {
    if (m.targets == Targets::attention) return s == Slot::q || s == Slot::v;  // PEFT's default for Llama
    return true;                                                              // all 7 projections
  }
  if (m.targets == Targets::attention) return s == Slot::c_attn;  // PEFT's default for GPT-2
  return true;  // c_attn, c_proj (both), c_fc
}

int64_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : t == DType::F64 ? 8 : 2; }

// Bytes of n elements in a quantized format.
//   codes: NF4 / Int4 two per byte, Int8 one per byte;
//   absmax: one f32 per block of 64; NF4+DQ (bitsandbytes double quantization):
//           one byte per block, then one f32 absmax per 256 such bytes, plus one
//           f32 offset.
int64_t code_bytes(Quant q, int64_t n) { return q == Quant::int8 ? n : n / 2; }
int64_t absmax_bytes(Quant q, int64_t n) {
  const int64_t blocks = n / 64;
  if (q == Quant::nf4dq) return blocks + cdiv(blocks, 256) * 4 + 4;
  return blocks * 4;
}
// The shared code tables, once per model: NF4's 16 f32 code values, and for DQ
// also the 256-entry f32 dynamic map of the second level.
int64_t table_bytes(Quant q) { return q == Quant::nf4 ? 16 * 4 : q == Quant::nf4dq ? 16 * 4 + 256 * 4 : 0; }

// Optimizer state per trainable tensor of n elements.
//   AdamW: m and v in f32 = 8 B/elem; SGD momentum f32 = 4 B/elem;
//   AdamW8bit (Dettmers et al. 2022): per moment one byte per element and one
//   f32 absmax per block of 256.
int64_t state_bytes(Opt o, int64_t n) {
  if (o == Opt::adamw) return 8 * n;
  if (o == Opt::sgd) return 4 * n;
  return 2 * (n + cdiv(n, 256) * 4);
}

struct Expect {
  int64_t params = 0, trainable = 0;
  int64_t weights = 0, scales = 0, master = 0, grads = 0, state = 0, batch_io = 0;
  int64_t saved_device = 0, saved_offload = 0;
};

Expect expect(const Arch& a, const Mix& m) {
  Expect e;
  const int64_t dt = dtype_bytes(m.dtype);
  const bool half = dt == 2;  // 16-bit storage: f32 master copies of trainable weights
  const auto add = [&](int64_t rows, int64_t cols, int64_t count, bool trainable, Quant q) {
    const int64_t n = rows * cols;
    e.params += n * count;
    if (q != Quant::none) {
      e.weights += count * a256(code_bytes(q, n));
      e.scales += count * a256(absmax_bytes(q, n));
    } else {
      e.weights += count * a256(n * dt);
    }
    if (!trainable) return;
    e.trainable += n * count;
    if (half) e.master += count * a256(4 * n);
    e.grads += count * a256(n * dt);
    e.state += count * a256(state_bytes(m.opt, n));  // SGD<> has momentum 0.9: one buffer
  };
  const bool full = m.rank == 0;
  bool any_quant = false;
  for (const HfTensor& t : hf_tensors(a)) {
    const bool hit = t.matrix && targeted(a, m, t.slot);
    add(t.rows, t.cols, t.count, full, hit ? m.quant : Quant::none);
    if (hit) {
      any_quant = any_quant || m.quant != Quant::none;
      add(m.rank, t.cols, t.count, true, Quant::none);  // lora_A: (r, in)
      add(t.rows, m.rank, t.count, true, Quant::none);  // lora_B: (out, r)
    }
  }
  if (any_quant && table_bytes(m.quant) > 0) e.scales += a256(table_bytes(m.quant));
  if (m.opt == Opt::adamw8bit && e.trainable > 0) e.state += a256(2 * 256 * 4);  // the two dynamic maps (m signed, v unsigned), once

  // batch io: token ids and targets (i32, one per token) and the f32 loss
  const int64_t N = m.batch * m.seq;
  e.batch_io = 2 * a256(4 * N) + a256(4);

  // Saved activations: what each op of a block keeps for its backward
  // (layers/*.hpp), a tensor shared by several ops counted once.
  const int64_t D = a.dim, F = a.ffn, L = a.layers, H = a.heads, hd = D / H, KV = a.kv_heads;
  const auto act = [&](int64_t features) { return a256(N * features * dt); };  // (N, features)
  const int64_t stat = a256(N * 4);                   // f32 per token (rstd, mean)
  const int64_t lse = a256(m.batch * H * m.seq * 4);  // flash attention: f32 (B, H, T)
  // a projection saves its input when its weight trains, or when LoRA wraps it
  const auto saves_input = [&](Slot s) { return full || targeted(a, m, s); };
  int64_t block = 0;
  const int64_t block_input = act(D);
  block += block_input;  // x: read again by the first norm's backward
  if (a.llama) {
    block += stat;                                                                              // rstd1
    if (saves_input(Slot::q) || saves_input(Slot::k) || saves_input(Slot::v)) block += act(D);  // h1 = norm1(x)
    block += act(H * hd) + act(KV * hd) + act(KV * hd);  // q, k, v (attention's inputs)
    block += act(H * hd) + lse;                          // o, log-sum-exp
    block += act(D) + stat;                              // x2 = x + attn, rstd2
    if (saves_input(Slot::gate) || saves_input(Slot::up)) block += act(D);  // h2 = norm2(x2)
    block += act(F) + act(F);                                               // gate, up (SiLU-mul inputs)
    if (saves_input(Slot::down)) block += act(F);                           // silu(gate) * up
    for (Slot s : {Slot::q, Slot::k, Slot::v, Slot::o, Slot::gate, Slot::up, Slot::down})
      if (targeted(a, m, s)) block += act(m.rank);  // LoRA's A x: (N, r)
  } else {
    block += 2 * stat;                                  // ln_1 mean, rstd
    if (saves_input(Slot::c_attn)) block += act(D);     // h1 = ln_1(x)
    block += act(3 * D);                                // qkv
    block += act(D) + lse;                              // o, log-sum-exp
    block += act(D) + 2 * stat;                         // x2, ln_2 mean, rstd
    if (saves_input(Slot::c_fc)) block += act(D);       // h2 = ln_2(x2)
    block += act(F);                                    // c_fc output (GELU input)
    if (saves_input(Slot::mlp_c_proj)) block += act(F); // gelu output
    for (Slot s : {Slot::c_attn, Slot::attn_c_proj, Slot::c_fc, Slot::mlp_c_proj})
      if (targeted(a, m, s)) block += act(m.rank);
  }
  // after the blocks: the final norm saves the last block's output and its stats
  const int64_t tail = act(D) + (a.llama ? stat : 2 * stat);
  switch (m.wrap) {
    case Wrap::none: e.saved_device = L * block + tail; break;
    case Wrap::checkpointed: e.saved_device = L * block_input + tail; break;
    case Wrap::offloaded_checkpointed:
      // the block input moves to the offload tier; a device copy is fetched back
      e.saved_device = L * block_input + tail;
      e.saved_offload = L * block_input;
      break;
    case Wrap::offloaded:
      e.saved_device = L * block + tail;
      e.saved_offload = L * block;
      break;
  }
  return e;
}

// ============================================================================
// The same run as a type.
// ============================================================================

template <class T>
struct tag {
  using type = T;
};

template <Quant Q, int Rank>
constexpr auto recipe_tag() {
  if constexpr (Q == Quant::none) return tag<LoRA<Rank>>{};
  else if constexpr (Q == Quant::nf4) return tag<Quantized<NF4, LoRA<Rank>>>{};
  else if constexpr (Q == Quant::nf4dq) return tag<Quantized<NF4DQ, LoRA<Rank>>>{};
  else if constexpr (Q == Quant::int4) return tag<Quantized<Int4, LoRA<Rank>>>{};
  else return tag<Quantized<Int8, LoRA<Rank>>>{};
}

template <bool Llama, Targets T>
constexpr auto targets_tag() {
  if constexpr (Llama) {
    if constexpr (T == Targets::attention) return tag<On<q_proj, v_proj>>{};
    else return tag<On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>{};
  } else {
    if constexpr (T == Targets::attention) return tag<On<c_attn>>{};
    else return tag<On<c_attn, c_proj, c_fc>>{};
  }
}

template <Wrap W>
constexpr auto wrap_tag() {
  if constexpr (W == Wrap::checkpointed) return tag<Checkpointed<>>{};
  else if constexpr (W == Wrap::offloaded_checkpointed) return tag<Offloaded<Checkpointed<>>>{};
  else return tag<Offloaded<>>{};
}

template <bool Llama, Mix M>
constexpr auto mods_tag() {
  if constexpr (M.rank == 0 && M.wrap == Wrap::none) {
    return tag<type_list<>>{};
  } else if constexpr (M.rank == 0) {
    return tag<type_list<Apply<typename decltype(wrap_tag<M.wrap>())::type, EveryBlock>>>{};
  } else {
    using lora = Apply<typename decltype(recipe_tag<M.quant, M.rank>())::type,
                       typename decltype(targets_tag<Llama, M.targets>())::type>;
    if constexpr (M.wrap == Wrap::none) return tag<type_list<lora>>{};
    else return tag<type_list<lora, Apply<typename decltype(wrap_tag<M.wrap>())::type, EveryBlock>>>{};
  }
}

template <auto C, class Mods>
struct model_from;
template <models::LlamaConfig C, class... Ms>
struct model_from<C, type_list<Ms...>> {
  using type = models::Llama<C, Ms...>;
};
template <models::GPT2Config C, class... Ms>
struct model_from<C, type_list<Ms...>> {
  using type = models::GPT2<C, Ms...>;
};

template <Opt O>
using optimizer_t = std::conditional_t<O == Opt::adamw, AdamW, std::conditional_t<O == Opt::adamw8bit, AdamW8bit, SGD<>>>;

template <auto C, Mix M>
using run_t = Train<typename model_from<C, typename decltype(mods_tag<std::is_same_v<std::remove_cv_t<decltype(C)>, models::LlamaConfig>, M>())::type>::type,
                    Batch<M.batch>, Seq<M.seq>, Precision<M.dtype>, optimizer_t<M.opt>, Accumulate<M.accumulate>,
                    std::conditional_t<M.update_in_backward, UpdateInBackward, Workers<1>>>;

// The plan computed at run time (not folded by the compiler).
template <class R>
detail::Expanded expand_at_run_time() {
  static detail::Expanded (*volatile fn)() = &detail::expand<R, true>;
  return fn();
}

// The check written from its definition, pair by pair, sharing no code
// with the planner's: every buffer lies in its tier's arena, aligned, with
// room for its bytes, and no two buffers of one tier that are alive at a
// common event share a byte.
bool valid_by_pairs(const detail::Expanded& x) {
  const std::size_t n = x.buffers.size();
  for (const Buffer& b : x.buffers) {
    const int64_t arena = x.peak[static_cast<int>(b.tier)];
    if (b.offset < 0 || b.offset + b.size > arena || b.offset % b.align != 0 || b.size < b.bytes) return false;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Buffer& a = x.buffers[i];
    for (std::size_t j = i + 1; j < n; ++j) {
      const Buffer& b = x.buffers[j];
      const bool together = a.tier == b.tier && a.first <= b.last && b.first <= a.last;
      if (together && a.offset < b.offset + b.size && b.offset < a.offset + a.size && a.size > 0 && b.size > 0) return false;
    }
  }
  return true;
}

// the check run again over the final arrays, independently of the planner's flag
bool plan_valid(const detail::Expanded& x) { return x.recheck() && valid_by_pairs(x); }

int64_t role_bytes(const detail::Expanded& x, Role r, Tier t) {
  int64_t s = 0;
  for (const Buffer& b : x.buffers)
    if (b.role == r && b.tier == t) s += b.size;
  return s;
}

void check_plan(const detail::Expanded& x, const Arch& a, const Mix& m) {
  INFO(describe(m));
  const Expect e = expect(a, m);
  int64_t params = 0, trainable = 0;
  for (const ParamInfo& p : x.params) {
    params += p.rows * p.cols * p.instances;
    if (p.trainable) trainable += p.rows * p.cols * p.instances;
  }
  CHECK(params == e.params);
  CHECK(trainable == e.trainable);
  CHECK(role_bytes(x, Role::weights, Tier::device) == e.weights);
  CHECK(role_bytes(x, Role::quant_scales, Tier::device) == e.scales);
  CHECK(role_bytes(x, Role::master_weights, Tier::device) == e.master);
  CHECK(role_bytes(x, Role::grads, Tier::device) == e.grads);
  CHECK(role_bytes(x, Role::optimizer_state, Tier::device) == e.state);
  CHECK(role_bytes(x, Role::batch_io, Tier::device) == e.batch_io);
  CHECK(role_bytes(x, Role::saved_activation, Tier::device) == e.saved_device);
  CHECK(role_bytes(x, Role::saved_activation, Tier::offload) == e.saved_offload);
  // every offloaded activation is in host memory at the loss: the offload
  // arena is exactly their sum
  CHECK(x.peak[1] == e.saved_offload);
  CHECK(x.lower_bound[1] == e.saved_offload);
  // nothing but saved activations goes to the offload tier
  int64_t off = 0;
  for (const Buffer& b : x.buffers)
    if (b.tier == Tier::offload) off += b.size;
  CHECK(off == e.saved_offload);

  CHECK(x.valid);       // the planner's own check
  CHECK(plan_valid(x));  // and the check run again here
  CHECK(x.lower_bound[0] <= x.peak[0]);
  CHECK(x.peak[0] * 100 <= x.lower_bound[0] * 105);  // within 5 % of the bound

  // gradient lifetimes: the whole step under Accumulate<K>; otherwise born in
  // backward (or in the fused loss), and freed at the update, or under
  // UpdateInBackward inside the backward that writes them last: one event,
  // except a tied embedding's, written by the LM head (loss) and again by the
  // embedding's backward
  const int E = static_cast<int>(x.events.size());
  int grads_whole = 0, grads_longer = 0, grads = 0;
  for (const Buffer& b : x.buffers) {
    if (b.role != Role::grads) continue;
    ++grads;
    if (b.first == 0 && b.last == E - 1) ++grads_whole;
    if (b.first != b.last) ++grads_longer;
    if (m.accumulate > 1) continue;
    const EventKind born = x.events[b.first].kind, dies = x.events[b.last].kind;
    CHECK((born == EventKind::backward || born == EventKind::loss));
    if (m.update_in_backward) CHECK((dies == EventKind::backward || dies == EventKind::loss));
    else CHECK(dies == EventKind::update);
  }
  CHECK(grads > 0);
  if (m.accumulate > 1) CHECK(grads_whole == grads);
  if (m.update_in_backward) CHECK(grads_longer == (a.tied && m.rank == 0 ? 1 : 0));
}

template <auto C, Mix... Ms>
void check_mixes() {
  const Arch a = arch_of(C);
  (check_plan(expand_at_run_time<run_t<C, Ms>>(), a, Ms), ...);
}

// ---- the mixes ----------------------------------------------------------------
constexpr DType f32 = DType::F32, bf16 = DType::BF16;
// full fine-tuning
constexpr Mix full_f32{.dtype = f32};
constexpr Mix full_bf16{.dtype = bf16};
constexpr Mix full_bf16_8bit{.dtype = bf16, .opt = Opt::adamw8bit};
constexpr Mix full_f32_sgd{.dtype = f32, .opt = Opt::sgd};
constexpr Mix full_bf16_ckpt{.dtype = bf16, .wrap = Wrap::checkpointed};
constexpr Mix full_bf16_off_ckpt{.dtype = bf16, .wrap = Wrap::offloaded_checkpointed};
constexpr Mix full_f32_off{.dtype = f32, .wrap = Wrap::offloaded};
constexpr Mix full_f32_acc2{.dtype = f32, .accumulate = 2};
constexpr Mix full_bf16_uib{.dtype = bf16, .update_in_backward = true};
// LoRA
constexpr Mix lora_f32{.dtype = f32, .rank = 8, .targets = Targets::attention};
constexpr Mix lora_bf16_all_ckpt{.dtype = bf16, .opt = Opt::adamw8bit, .rank = 16, .targets = Targets::all, .wrap = Wrap::checkpointed};
// QLoRA
constexpr Mix qlora_nf4{.dtype = bf16, .rank = 16, .targets = Targets::all, .quant = Quant::nf4};
constexpr Mix qlora_nf4_ckpt_8bit{.dtype = bf16, .opt = Opt::adamw8bit, .rank = 16, .targets = Targets::all, .quant = Quant::nf4, .wrap = Wrap::checkpointed};
constexpr Mix qlora_nf4dq_ckpt{.dtype = bf16, .opt = Opt::adamw8bit, .rank = 16, .targets = Targets::all, .quant = Quant::nf4dq, .wrap = Wrap::checkpointed};
constexpr Mix qlora_nf4dq_f32{.dtype = f32, .rank = 8, .targets = Targets::attention, .quant = Quant::nf4dq};
constexpr Mix qlora_int4_sgd_off_ckpt{.dtype = bf16, .opt = Opt::sgd, .rank = 8, .targets = Targets::attention, .quant = Quant::int4, .wrap = Wrap::offloaded_checkpointed};
constexpr Mix qlora_int4_f32{.dtype = f32, .rank = 16, .targets = Targets::all, .quant = Quant::int4, .wrap = Wrap::checkpointed};
constexpr Mix qlora_int8_acc2{.dtype = f32, .rank = 16, .targets = Targets::all, .quant = Quant::int8, .accumulate = 2};
constexpr Mix qlora_int8_off{.dtype = bf16, .rank = 8, .targets = Targets::all, .quant = Quant::int8, .wrap = Wrap::offloaded};
constexpr Mix qlora_nf4_uib{.dtype = bf16, .rank = 16, .targets = Targets::all, .quant = Quant::nf4, .update_in_backward = true};
// odd sizes: 100 tokens make the f32 statistics, the log-sum-exp, LoRA's A x
// and the token ids non-multiples of 256 (rounded up per buffer)
constexpr Mix qlora_nf4dq_odd{.dtype = bf16, .opt = Opt::adamw8bit, .rank = 16, .targets = Targets::all, .quant = Quant::nf4dq, .batch = 1, .seq = 100};
constexpr Mix full_f32_odd{.dtype = f32, .batch = 1, .seq = 100};

#define HEADROOM_ALL_MIXES                                                                                         \
  full_f32, full_bf16, full_bf16_8bit, full_f32_sgd, full_bf16_ckpt, full_bf16_off_ckpt, full_f32_off, full_f32_acc2, \
      full_bf16_uib, lora_f32, lora_bf16_all_ckpt, qlora_nf4, qlora_nf4_ckpt_8bit, qlora_nf4dq_ckpt, qlora_nf4dq_f32,  \
      qlora_int4_sgd_off_ckpt, qlora_int4_f32, qlora_int8_acc2, qlora_int8_off, qlora_nf4_uib, qlora_nf4dq_odd,        \
      full_f32_odd
// Each mix instantiates the whole planner once more (~0.4 s of -O3 build
// each): the presets that repeat a family's shape get a cross-section.
#define HEADROOM_SOME_MIXES                                                                                   \
  full_bf16, full_f32_sgd, full_bf16_off_ckpt, full_f32_acc2, lora_f32, qlora_nf4dq_ckpt, qlora_int4_sgd_off_ckpt, \
      qlora_int8_off, qlora_nf4dq_odd

}  // namespace

// The planner's check (plan/pack.hpp) against valid_by_pairs on plans made
// wrong on purpose: one buffer that is neither alive the whole step nor to
// the end of backward moved (onto another buffer's offset, or a few
// alignment steps up or down) or kept alive longer. The check splits the
// buffers by lifetime and sweeps them in birth order; valid_by_pairs
// compares every pair: on these changes the two must agree, and most of
// the changes must be caught.
template <class R>
void check_the_check(int changes, std::uint32_t seed) {
  const detail::Expanded plan = expand_at_run_time<R>();
  REQUIRE(plan.valid);
  REQUIRE(valid_by_pairs(plan));
  const int E = static_cast<int>(plan.events.size());
  int64_t floor = 0;  // the end of the whole-step buffers, which lie at the bottom of the device arena
  std::vector<int> movable;
  for (int i = 0; i < static_cast<int>(plan.buffers.size()); ++i) {
    const Buffer& b = plan.buffers[i];
    if (b.tier != Tier::device) continue;
    if (b.first == 0 && b.last == E - 1) floor = std::max(floor, b.offset + b.size);
    else if (b.last < E - 2) movable.push_back(i);
  }
  REQUIRE(movable.size() > 10);
  std::uint32_t state = seed;
  const auto draw = [&](std::uint32_t n) {  // xorshift32
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return static_cast<int>(state % n);
  };
  int caught = 0, kept = 0;
  for (int c = 0; c < changes; ++c) {
    detail::Expanded x = plan;
    Buffer& b = x.buffers[movable[draw(static_cast<std::uint32_t>(movable.size()))]];
    switch (draw(3)) {
      case 0:
        b.offset = x.buffers[movable[draw(static_cast<std::uint32_t>(movable.size()))]].offset;
        break;
      case 1:
        b.offset = std::max(floor, b.offset + (draw(9) - 4) * b.align);
        break;
      default:
        b.last = std::min(E - 3, b.last + 1 + draw(40));
        break;
    }
    const bool ok = valid_by_pairs(x);
    INFO("change " << c << ": buffer " << b.name << " at " << b.offset << ", events " << b.first << " to " << b.last);
    CHECK(x.recheck() == ok);
    (ok ? kept : caught) += 1;
  }
  CHECK(caught > changes / 2);
  CHECK(kept > 0);
}

TEST_CASE("plan check: agrees with a pairwise check on plans made wrong on purpose", "[plan][check]") {
  check_the_check<run_t<models::tiny_llama, Mix{.dtype = DType::BF16, .rank = 16, .targets = Targets::all, .quant = Quant::nf4, .wrap = Wrap::checkpointed}>>(400, 1);
  check_the_check<run_t<models::gpt2_124m, Mix{.dtype = DType::F32}>>(400, 2);
  check_the_check<run_t<models::llama3_8b, Mix{.dtype = DType::BF16, .rank = 8, .targets = Targets::attention}>>(60, 3);
}

TEST_CASE("plan matrix: tiny_llama under every policy mix", "[plan][matrix]") {
  check_mixes<models::tiny_llama, HEADROOM_ALL_MIXES>();
}
TEST_CASE("plan matrix: GPT-2 124M under every policy mix", "[plan][matrix]") {
  check_mixes<models::gpt2_124m, HEADROOM_ALL_MIXES>();
}
TEST_CASE("plan matrix: Llama-3-8B under every policy mix", "[plan][matrix]") {
  check_mixes<models::llama3_8b, HEADROOM_ALL_MIXES>();
}
TEST_CASE("plan matrix: GPT-2 medium under a cross-section of mixes", "[plan][matrix]") {
  check_mixes<models::gpt2_355m, HEADROOM_SOME_MIXES>();
}
TEST_CASE("plan matrix: Llama-3.2-1B (tied embeddings) under a cross-section of mixes", "[plan][matrix]") {
  check_mixes<models::llama3_2_1b, HEADROOM_SOME_MIXES>();
}
TEST_CASE("plan matrix: Llama-2-7B (no GQA) under a cross-section of mixes", "[plan][matrix]") {
  check_mixes<models::llama2_7b, HEADROOM_SOME_MIXES>();
}

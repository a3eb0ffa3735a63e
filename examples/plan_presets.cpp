// plan_presets [batch] [seq]: what each model preset needs to fine-tune.
//
// For six presets (GPT-2 124M / 355M, Llama-2-7B, Llama-3-8B, Llama-3.2-1B,
// tiny_llama) and six mixes (full fine-tuning, LoRA, QLoRA, each with and
// without activation checkpointing) it prints parameters, trainable
// parameters, arena peak, liveness lower bound, whether the step fits a
// 24 GiB card, and FLOPs per token; then the full report of one run
// (Llama-3-8B QLoRA + checkpointing) and its SVG picture, plan.svg.
//
// A run is a type, so (batch, seq) from the command line can only pick among
// runs compiled in: a small table maps each supported pair to its
// instantiation, and anything else gets an error that lists the pairs.
//
// Compile time: one 8B plan costs the compiler ~6 s of constant evaluation,
// and this program plans 120 runs. So the summary rows run the very same
// constexpr pipeline at run time (headroom::plan_at_run_time<R>(), ~2 ms per 8B
// plan on the CPU, not seconds in the compiler), and only the one run that
// gets the full report is a compile-time constant with a static_assert.
#include <headroom/headroom.hpp>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>

using namespace headroom;

namespace {

using Ckpt = Apply<Checkpointed<>, EveryBlock>;
constexpr std::int64_t budget = 24_GiB;

// ---- presets: the model family, its LoRA targets, its storage precision ----
template <models::LlamaConfig C, DType P>
struct LlamaPreset {
  template <class... Mods>
  using model = models::Llama<C, Mods...>;
  using lora = Apply<LoRA<16>, On<q_proj, k_proj, v_proj, o_proj>>;
  using qlora = Apply<Quantized<NF4, LoRA<16>>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>;
  static constexpr DType dtype = P;
};
template <models::GPT2Config C, DType P>
struct GPT2Preset {
  template <class... Mods>
  using model = models::GPT2<C, Mods...>;
  using lora = Apply<LoRA<16>, On<c_attn, c_proj>>;  // c_proj: attn.c_proj and mlp.c_proj, as PEFT matches
  using qlora = Apply<Quantized<NF4, LoRA<16>>, On<c_attn, c_proj, c_fc>>;
  static constexpr DType dtype = P;
};

enum class Mix { full, lora, qlora };
constexpr const char* mix_name(Mix m, bool ckpt) {
  switch (m) {
    case Mix::full: return ckpt ? "full + ckpt" : "full";
    case Mix::lora: return ckpt ? "LoRA + ckpt" : "LoRA";
    case Mix::qlora: return ckpt ? "QLoRA + ckpt" : "QLoRA";
  }
  return "?";
}

// The model type of a preset under a mix.
template <class Pre, Mix M, bool C>
struct mixed;
template <class Pre>
struct mixed<Pre, Mix::full, false> { using type = typename Pre::template model<>; };
template <class Pre>
struct mixed<Pre, Mix::full, true> { using type = typename Pre::template model<Ckpt>; };
template <class Pre>
struct mixed<Pre, Mix::lora, false> { using type = typename Pre::template model<typename Pre::lora>; };
template <class Pre>
struct mixed<Pre, Mix::lora, true> { using type = typename Pre::template model<typename Pre::lora, Ckpt>; };
template <class Pre>
struct mixed<Pre, Mix::qlora, false> { using type = typename Pre::template model<typename Pre::qlora>; };
template <class Pre>
struct mixed<Pre, Mix::qlora, true> { using type = typename Pre::template model<typename Pre::qlora, Ckpt>; };

// AdamW for full fine-tuning and LoRA, 8-bit AdamW for QLoRA (as its paper).
template <Mix M>
using optimizer_for = std::conditional_t<M == Mix::qlora, AdamW8bit, AdamW>;

template <class Pre, Mix M, bool C, std::int64_t B, std::int64_t T>
using run_t = Train<typename mixed<Pre, M, C>::type, Batch<B>, Seq<T>, Precision<Pre::dtype>, optimizer_for<M>>;

// ---- one summary row, planned at run time ----
template <class R>
void print_row(const char* preset, const char* mix) {
  RuntimePlan x = plan_at_run_time<R>();  // the constexpr pipeline of plan<R>(), run by the CPU (not const: no compile-time attempt)
  std::int64_t params = 0, trainable = 0;
  for (const auto& p : x.params) {
    params += p.rows * p.cols * p.instances;
    if (p.trainable) trainable += p.rows * p.cols * p.instances;
  }
  const std::int64_t peak = x.peak[static_cast<int>(Tier::device)], bound = x.lower_bound[static_cast<int>(Tier::device)];
  const double gib = double(1_GiB);
  const double flops_per_token = double(x.flops_fwd + x.flops_bwd + x.flops_recompute) / double(x.cfg.tokens());
  std::printf("%-13s %-13s %10s %10s %9.2f %10.2f   %-5s %13s\n", preset, mix, human_count(double(params)).c_str(),
              human_count(double(trainable)).c_str(), double(peak) / gib, double(bound) / gib, peak <= budget ? "yes" : "no",
              human_flops(flops_per_token).c_str());
}

// A preset whose context is shorter than seq is planned at its context.
template <class Pre, std::int64_t B, std::int64_t T>
void print_preset(const char* name) {
  constexpr std::int64_t context = Pre::template model<>::max_seq;
  constexpr std::int64_t S = T > context ? context : T;
  if constexpr (S < T) std::printf("%-13s (its context is %lld tokens: planned at seq %lld)\n", name, static_cast<long long>(context), static_cast<long long>(S));
  print_row<run_t<Pre, Mix::full, false, B, S>>(S < T ? "" : name, mix_name(Mix::full, false));
  print_row<run_t<Pre, Mix::full, true, B, S>>("", mix_name(Mix::full, true));
  print_row<run_t<Pre, Mix::lora, false, B, S>>("", mix_name(Mix::lora, false));
  print_row<run_t<Pre, Mix::lora, true, B, S>>("", mix_name(Mix::lora, true));
  print_row<run_t<Pre, Mix::qlora, false, B, S>>("", mix_name(Mix::qlora, false));
  print_row<run_t<Pre, Mix::qlora, true, B, S>>("", mix_name(Mix::qlora, true));
}

using gpt2_124m = GPT2Preset<models::gpt2_124m, BF16>;
using gpt2_355m = GPT2Preset<models::gpt2_355m, BF16>;
using llama2_7b = LlamaPreset<models::llama2_7b, BF16>;
using llama3_8b = LlamaPreset<models::llama3_8b, BF16>;
using llama3_2_1b = LlamaPreset<models::llama3_2_1b, BF16>;
using tiny_llama = LlamaPreset<models::tiny_llama, F32>;

// ---- everything for one (batch, seq) ----
template <std::int64_t B, std::int64_t T>
void run_pair() {
  std::printf("headroom plan presets: batch %lld x seq %lld = %s tokens per step\n", static_cast<long long>(B),
              static_cast<long long>(T), with_commas(B * T).c_str());
  std::printf("  full  = full fine-tuning, AdamW          LoRA  = LoRA r=16 on q,k,v,o (GPT-2: c_attn, c_proj), AdamW\n");
  std::printf("  QLoRA = NF4 base + LoRA r=16 on every projection, AdamW8bit     + ckpt = Apply<Checkpointed<>, EveryBlock>\n");
  std::printf("  storage bf16 with f32 master weights (tiny_llama: f32); peak = arena bytes of the device tier\n\n");
  std::printf("%-13s %-13s %10s %10s %9s %10s   %-5s %13s\n", "preset", "mix", "params", "trainable", "peak GiB", "bound GiB",
              "24GiB", "FLOPs/token");
  std::printf("%s\n", std::string(94, '-').c_str());
  print_preset<gpt2_124m, B, T>("gpt2_124m");
  print_preset<gpt2_355m, B, T>("gpt2_355m");
  print_preset<llama2_7b, B, T>("llama2_7b");
  print_preset<llama3_8b, B, T>("llama3_8b");
  print_preset<llama3_2_1b, B, T>("llama3_2_1b");
  print_preset<tiny_llama, B, T>("tiny_llama");

  // The full report of one run, planned by the compiler.
  using R = run_t<llama3_8b, Mix::qlora, true, B, T>;
  static constexpr auto plan = headroom::plan<R>();
  static_assert(plan.peak_bytes() <= 24_GiB, "Llama-3-8B QLoRA + checkpointing must fit a 24 GiB card");
  std::printf("\n==== full report: Llama-3-8B, QLoRA (NF4 + LoRA r=16, all projections) + checkpointing, AdamW8bit ====\n\n");
  std::cout << report(plan) << '\n';
  const std::string title = "Llama-3-8B QLoRA + checkpointing: batch " + std::to_string(B) + " x seq " + std::to_string(T) +
                            ", bf16, AdamW8bit";
  write_svg(plan, "plan.svg", Tier::device, title);
  std::cout << "wrote " << std::filesystem::absolute("plan.svg").string() << " (live bytes per event, by role)\n";
}

struct Pair {
  std::int64_t batch, seq;
  void (*run)();
};
// Each pair instantiates every run above (up to 36 rows + 1 compile-time plan);
// add a line to support another.
constexpr Pair pairs[] = {
    {1, 2048, &run_pair<1, 2048>},  // the default
    {1, 512, &run_pair<1, 512>},
    {4, 1024, &run_pair<4, 1024>},
    {8, 256, &run_pair<8, 256>},
};

std::string supported() {
  std::string s;
  for (const auto& p : pairs) {
    if (!s.empty()) s += ", ";
    s += '(';
    s += std::to_string(p.batch);
    s += ", ";
    s += std::to_string(p.seq);
    s += ')';
  }
  return s + "; the first is the default";
}

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: plan_presets [batch] [seq]\n"
               "  Plans a training step of six model presets under six fine-tuning mixes and prints\n"
               "  params, trainable params, peak and lower-bound GiB, whether it fits 24 GiB and FLOPs\n"
               "  per token; then the full report of Llama-3-8B QLoRA + checkpointing, and writes its\n"
               "  picture to ./plan.svg.\n"
               "  A run is a compile-time type, so only these (batch, seq) pairs are compiled in:\n"
               "    %s\n",
               supported().c_str());
}

bool parse(const char* s, std::int64_t& v) {
  const std::string_view sv(s);
  const auto [end, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), v);
  return ec == std::errc{} && end == sv.data() + sv.size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string_view(argv[1]) == "-h" || std::string_view(argv[1]) == "--help")) {
    usage(stdout);
    return 0;
  }
  if (argc > 3) {
    usage(stderr);
    return 2;
  }
  std::int64_t batch = pairs[0].batch, seq = pairs[0].seq;
  if ((argc > 1 && !parse(argv[1], batch)) || (argc > 2 && !parse(argv[2], seq))) {
    std::fprintf(stderr, "plan_presets: batch and seq must be integers\n");
    usage(stderr);
    return 2;
  }
  if (argc == 2) {  // batch alone: its first compiled pair
    for (const auto& p : pairs)
      if (p.batch == batch) {
        seq = p.seq;
        break;
      }
  }
  for (const auto& p : pairs)
    if (p.batch == batch && p.seq == seq) {
      p.run();
      return 0;
    }
  std::fprintf(stderr,
               "plan_presets: batch %lld x seq %lld is not compiled in. Supported (batch, seq): %s.\n"
               "(A run is a type: each pair is a compile-time instantiation; add one to `pairs` in examples/plan_presets.cpp.)\n",
               static_cast<long long>(batch), static_cast<long long>(seq), supported().c_str());
  return 2;
}

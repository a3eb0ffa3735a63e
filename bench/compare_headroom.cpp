// The headroom side of bench/compare: trains one configuration for a number
// of steps on one fixed batch of pseudo-random tokens (targets: the next
// token, wrapping around) and prints one JSON line with the timed steps'
// tokens/s and every step's loss. bench/compare runs it next to
// bench/compare_torch.py (the same model, batch, sequence length, optimizer
// and thread count written in PyTorch) or llm.c's train_gpt2 (gpt2_llmc),
// and measures each process's peak resident memory from outside.
//
//   compare_headroom CONFIG [--steps N] [--warmup N] [--threads N] [--save-init FILE] [--bf16]
//   CONFIG: tiny_full tiny_lora tiny_lora_ckpt gpt2_full gpt2_lora gpt2_lora_ckpt gpt2_llmc
//   --bf16             Precision<BF16>: bf16 weights, activations and gradients, f32
//                      master weights (compare_torch.py --bf16 runs PyTorch's CPU autocast)
//   compare_headroom sgemm [--threads N]   host::gemm's rate on the MLP's up projection
//                      (1024 x 3072 x 768, C = A B), the figure bench/compare
//                      sets beside PyTorch's torch.mm on the same shape
//   compare_headroom bgemm [--threads N]   the same product on bf16 A, B and C, as
//                      a Precision<BF16> run computes it
// Every JSON line carries host::cpu_report(): the CPU and the kernels chosen.
//   --save-init FILE   the initial weights, Hugging Face names (bench/compare
//                      converts them to llm.c's checkpoint format)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <headroom/headroom.hpp>
#include <headroom/host/cpu.hpp>
#include <headroom/host/gemm.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <type_traits>
#include <vector>

using namespace headroom;

namespace {

struct Args {
  std::string config;
  int steps = 5, warmup = 1, threads = 1;
  bool bf16 = false;
  std::string save_init;
};

// The demo's model (tiny_llama: d 256, 4 layers, 4 heads / 2 KV heads, byte vocabulary), B16 T128.
using Tiny = models::Llama<models::tiny_llama>;
using TinyLoRA = models::Llama<models::tiny_llama, Apply<LoRA<16>, On<q_proj, k_proj, v_proj, o_proj>>>;
using TinyLoRACkpt = models::Llama<models::tiny_llama, Apply<LoRA<16>, On<q_proj, k_proj, v_proj, o_proj>>,
                                   Apply<Checkpointed<>, EveryBlock>>;
// GPT-2-shaped and wide enough that GEMMs dominate: d 768, 4 layers, 12 heads, GPT-2's vocabulary, B4 T256.
constexpr models::GPT2Config gpt2_d768_l4{50257, 768, 4, 12, 1024};
using GPT2 = models::GPT2<gpt2_d768_l4>;
using GPT2LoRA = models::GPT2<gpt2_d768_l4, Apply<LoRA<16>, On<c_attn, c_proj, c_fc>>>;
using GPT2LoRACkpt = models::GPT2<gpt2_d768_l4, Apply<LoRA<16>, On<c_attn, c_proj, c_fc>>, Apply<Checkpointed<>, EveryBlock>>;

constexpr int max_workers = 2;
template <class M, int B, int T>
using Run = Train<M, Batch<B>, Seq<T>, AdamW, Workers<max_workers>>;
template <class M, int B, int T>
using Run16 = Train<M, Batch<B>, Seq<T>, AdamW, Workers<max_workers>, Precision<BF16>>;
// llm.c's train_gpt2.c: B4 T64, AdamW lr 1e-4 without weight decay, no clipping
using LlmcRun = Train<GPT2, Batch<4>, Seq<64>, AdamWith<Ratio<9, 10>, Ratio<999, 1000>, Ratio<0, 1>>, Workers<max_workers>>;

template <class R>
int run(const Args& a, double clip_norm = 1.0) {
  using Tr = host::Trainer<R>;
  if (a.threads < 1 || a.threads > max_workers) {
    std::fprintf(stderr, "compare_headroom: --threads must be 1..%d (Workers<%d> in this file)\n", max_workers, max_workers);
    return 2;
  }
  Tr t({.seed = 1, .threads = a.threads, .lr = 1e-4, .clip_norm = clip_norm});
  if (!a.save_init.empty()) io::save_pretrained(t, a.save_init);
  constexpr std::int64_t n = Tr::tokens_per_step, vocab = R::model::config.vocab;
  // the same sequence as compare_torch.py's tokens() and bench/compare's llm.c token file
  std::vector<std::int32_t> tok(n), tgt(n);
  std::uint32_t x = 12345;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    tok[i] = static_cast<std::int32_t>((x >> 9) % vocab);
  }
  for (std::int64_t i = 0; i < n; ++i) tgt[i] = tok[(i + 1) % n];
  std::string losses;
  char buf[32];
  auto step = [&] {
    std::snprintf(buf, sizeof buf, "%s%.6f", losses.empty() ? "" : ", ", t.step(tok, tgt).loss);
    losses += buf;
  };
  for (int s = 0; s < a.warmup; ++s) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < a.steps; ++s) step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"side\": \"headroom\", \"config\": \"%s\", \"tokens_per_s\": %.3f, \"step_s\": %.5f, \"losses\": [%s], "
              "\"arena_bytes\": %llu, \"plan_bytes\": %llu, \"threads\": %d, \"dtype\": \"%s\", \"cpu\": \"%s\"}\n",
              a.config.c_str(), a.steps * static_cast<double>(n) / secs, secs / a.steps, losses.c_str(),
              static_cast<unsigned long long>(t.arena_bytes()), static_cast<unsigned long long>(Tr::plan.peak_bytes()),
              a.threads, name_of(R::dtype).data(), host::cpu_report().c_str());
  return 0;
}

// One of the configurations, in f32 or bf16.
template <class M, int B, int T>
int run_config(const Args& a) {
  if (a.bf16) return run<Run16<M, B, T>>(a);
  return run<Run<M, B, T>>(a);
}

// host::gemm on (1024 x 768) by (768 x 3072), best of 5 rounds of 10
// products: In float (sgemm), or bf16 with a bf16 C (bgemm).
template <class In>
int gemm_rate(const Args& a) {
  constexpr std::int64_t m = 1024, n = 3072, k = 768;
  constexpr bool bf16 = std::is_same_v<In, host::bf16>;
  const auto value = [](float x) {
    if constexpr (bf16) return host::to_bf16(x);
    else return x;
  };
  std::vector<In> A(m * k, value(0.5f)), B(k * n, value(0.25f)), C(m * n);
  const std::int64_t per = GemmBlocking::panel_elements(m, n, k, bf16);
  std::vector<float> panels(static_cast<std::size_t>(per * a.threads + 64));
  const host::GemmPanels<float> ws{panels.data(), per};
  const auto product = [&] {
    host::gemm(host::Trans::no, host::Trans::no, m, n, k, 1.0f, A.data(), k, B.data(), n, 0.0f, C.data(), n, ws, a.threads);
  };
  product();
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) product();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 10 * 2.0 * m * n * k / secs * 1e-9);
  }
  std::printf("{\"side\": \"headroom\", \"%s_gflops\": %.1f, \"threads\": %d, \"cpu\": \"%s\"}\n", bf16 ? "bgemm" : "sgemm",
              best, a.threads, host::cpu_report().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--steps") && has_value) a.steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warmup") && has_value) a.warmup = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && has_value) a.threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--save-init") && has_value) a.save_init = argv[++i];
    else if (!std::strcmp(argv[i], "--bf16")) a.bf16 = true;
    else if (argv[i][0] != '-' && a.config.empty()) a.config = argv[i];
    else {
      std::fprintf(stderr, "usage: compare_headroom CONFIG [--steps N] [--warmup N] [--threads N] [--save-init FILE] [--bf16]\n");
      return 2;
    }
  }
  if (a.steps < 1 || a.warmup < 0) {
    std::fprintf(stderr, "compare_headroom: --steps must be >= 1 and --warmup >= 0\n");
    return 2;
  }
  if (a.config == "sgemm") return gemm_rate<float>(a);
  if (a.config == "bgemm") return gemm_rate<host::bf16>(a);
  if (a.config == "tiny_full") return run_config<Tiny, 16, 128>(a);
  if (a.config == "tiny_lora") return run_config<TinyLoRA, 16, 128>(a);
  if (a.config == "tiny_lora_ckpt") return run_config<TinyLoRACkpt, 16, 128>(a);
  if (a.config == "gpt2_full") return run_config<GPT2, 4, 256>(a);
  if (a.config == "gpt2_lora") return run_config<GPT2LoRA, 4, 256>(a);
  if (a.config == "gpt2_lora_ckpt") return run_config<GPT2LoRACkpt, 4, 256>(a);
  if (a.config == "gpt2_llmc") return run<LlmcRun>(a, 0.0);
  std::fprintf(stderr, "compare_headroom: unknown configuration '%s' (tiny_full tiny_lora tiny_lora_ckpt gpt2_full gpt2_lora gpt2_lora_ckpt gpt2_llmc)\n",
               a.config.c_str());
  return 2;
}

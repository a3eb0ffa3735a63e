// cuda::Trainer's training step on a GPU: tokens/s, MFU and device memory
// for one configuration, as one JSON line (bench/gpu runs it next to
// bench/cuda_torch.py, the same models in PyTorch eager and torch.compile).
//
//   cuda_step CONFIG [--steps N] [--warmup N] [--graph 0|1]
//   CONFIG: smoke        tiny Llama, f32 (seconds; checks the build)
//           gpt2_124m    GPT-2 124M, bf16, AdamW, B16 T1024, LM head in 4096-token chunks
//           llama_qlora  Llama-3.2-1B shape, NF4 + LoRA r16 on all seven projections,
//                        checkpointed blocks, AdamW8bit, bf16, B8 T1024
//
// --graph 1 (the default) replays the step from a captured CUDA graph
// (TrainOptions::cuda_graph); --graph 0 enqueues it kernel by kernel.
//
// MFU = the plan's model FLOPs per step (forward + backward; recompute not
// counted, as PaLM defines it) / step time / 989.4 TFLOP/s (H100/H200 SXM
// dense bf16). Device memory: the arena (= the plan's peak) and the device
// memory in use once the trainer is built (cudaMemGetInfo: arena + CUDA
// context + cuBLASLt, on a GPU running nothing else).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

using namespace headroom;

namespace {

constexpr double peak_bf16_flops = 989.4e12;

using GPT2Run = Train<models::GPT2<models::gpt2_124m>, Batch<16>, Seq<1024>, Precision<BF16>, LossChunk<4096>, OnCuda>;
using QLoRA = Quantized<NF4, LoRA<16>>;
using LlamaQ = models::Llama<models::llama3_2_1b, Apply<QLoRA, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>,
                             Apply<Checkpointed<>, EveryBlock>>;
using LlamaRun = Train<LlamaQ, Batch<8>, Seq<1024>, Precision<BF16>, AdamW8bit, LossChunk<2048>, OnCuda>;
using SmokeRun = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<64>, OnCuda>;

template <class R>
int run(const char* name, int steps, int warmup, bool graph) {
  using Tr = cuda::Trainer<R>;
  Tr t({.seed = 1, .lr = 1e-4, .clip_norm = 1.0, .cuda_graph = graph});
  std::size_t free_bytes = 0, total_bytes = 0;
  cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  constexpr std::int64_t n = Tr::tokens_per_step, vocab = Tr::vocab_size();
  std::vector<std::int32_t> tokens(n), targets(n);
  std::uint32_t s = 12345;
  for (std::int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    tokens[i] = static_cast<std::int32_t>((s >> 8) % vocab);
  }
  for (std::int64_t i = 0; i < n; ++i) targets[i] = tokens[(i + 1) % n];
  std::vector<double> losses;
  for (int i = 0; i < warmup; ++i) losses.push_back(t.step(tokens, targets).loss);
  cuda::check(cudaDeviceSynchronize(), "warmup");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) losses.push_back(t.step(tokens, targets).loss);
  cuda::check(cudaDeviceSynchronize(), "steps");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  constexpr auto p = Tr::plan;
  const double model_flops = static_cast<double>(p.flops_fwd + p.flops_bwd) * R::accumulate;
  const double step_s = secs / steps;
  std::printf("{\"engine\": \"%s\", \"config\": \"%s\", \"tokens_per_step\": %lld, \"steps\": %d, \"step_ms\": %.3f, "
              "\"tokens_per_s\": %.1f, \"model_tflop_per_step\": %.4f, \"mfu\": %.4f, \"arena_bytes\": %lld, "
              "\"offload_bytes\": %lld, \"device_bytes_in_use\": %lld, \"gemm_products\": %d, \"losses\": [",
              graph ? "headroom_graph" : "headroom", name, static_cast<long long>(n), steps, 1e3 * step_s, n / step_s, model_flops / 1e12,
              model_flops / step_s / peak_bf16_flops, static_cast<long long>(t.arena_bytes(Tier::device)),
              static_cast<long long>(t.arena_bytes(Tier::offload)), static_cast<long long>(total_bytes - free_bytes), t.blas().products());
  for (std::size_t i = 0; i < losses.size(); ++i) std::printf("%s%.6f", i ? ", " : "", losses[i]);
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cuda_step smoke|gpt2_124m|llama_qlora [--steps N] [--warmup N] [--graph 0|1]\n");
    return 2;
  }
  int steps = 10, warmup = 3;
  bool graph = true;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--warmup") == 0) warmup = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--graph") == 0) graph = std::atoi(argv[i + 1]) != 0;
  }
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "cuda_step: no CUDA device\n");
    return 77;
  }
  const std::string config = argv[1];
  if (config == "smoke") return run<SmokeRun>("smoke", steps, warmup, graph);
  if (config == "gpt2_124m") return run<GPT2Run>("gpt2_124m", steps, warmup, graph);
  if (config == "llama_qlora") return run<LlamaRun>("llama_qlora", steps, warmup, graph);
  std::fprintf(stderr, "cuda_step: unknown config %s\n", config.c_str());
  return 2;
}

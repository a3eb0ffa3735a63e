// Training steps of the host engine: tokens/s and achieved GFLOP/s (the
// plan's FLOPs per step over the step's time), per configuration and thread
// count. Figures, not tests: docs/benchmarks.md records a run.
//
//   build/bench/host_step --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <headroom/headroom.hpp>
#include <headroom/host/cpu.hpp>
#include <headroom/train/host/trainer.hpp>
#include <vector>

using namespace headroom;

namespace {

template <class R>
void train_step(benchmark::State& state) {
  using Tr = host::Trainer<R>;
  Tr t({.threads = static_cast<int>(state.range(0)), .lr = 1e-3});
  std::vector<std::int32_t> tok(Tr::tokens_per_step), tgt(Tr::tokens_per_step);
  const std::int64_t vocab = R::model::config.vocab;
  for (std::size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<std::int32_t>((i * 7 + i / 13) % vocab);
    tgt[i] = static_cast<std::int32_t>((i * 7 + 7 + i / 13) % vocab);
  }
  t.step(tok, tgt);  // warm-up
  for (auto _ : state) benchmark::DoNotOptimize(t.step(tok, tgt).loss);
  const double steps = static_cast<double>(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(steps * Tr::tokens_per_step, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(steps * static_cast<double>(Tr::plan.flops()) * 1e-9, benchmark::Counter::kIsRate);
  state.counters["arena_MiB"] = static_cast<double>(t.arena_bytes()) / (1 << 20);
}

using Tiny = models::Llama<models::tiny_llama>;
using TinyQLoRA = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<16>>, On<q_proj, k_proj, v_proj, o_proj>>,
                                Apply<Checkpointed<>, EveryBlock>>;
// GPT-2-shaped, wide enough that GEMMs dominate: d 768, 4 layers, T 256
constexpr models::GPT2Config gpt2_small4{50257, 768, 4, 12, 1024};
using GPT2Wide = models::GPT2<gpt2_small4>;
using GPT2WideLoRACkpt = models::GPT2<gpt2_small4, Apply<LoRA<16>, On<c_attn, c_proj, c_fc>>, Apply<Checkpointed<>, EveryBlock>>;

using TinyFull = Train<Tiny, Batch<16>, Seq<128>, Workers<2>>;
using TinyQ = Train<TinyQLoRA, Batch<16>, Seq<128>, Workers<2>>;
using GPT2Full = Train<GPT2Wide, Batch<4>, Seq<256>, Workers<2>>;
using GPT2LoRA = Train<GPT2WideLoRACkpt, Batch<4>, Seq<256>, Workers<2>>;

}  // namespace

BENCHMARK_TEMPLATE(train_step, TinyFull)->Name("step/tiny_llama_full_B16_T128")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(train_step, TinyQ)->Name("step/tiny_llama_qlora_ckpt_B16_T128")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(train_step, GPT2Full)->Name("step/gpt2_d768_L4_full_B4_T256")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(train_step, GPT2LoRA)->Name("step/gpt2_d768_L4_lora_ckpt_B4_T256")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernels", host::cpu_report());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

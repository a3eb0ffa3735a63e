// The planner at native speed: building, expanding and packing a plan at run
// time (the same constexpr code the compiler evaluates), per preset.
// Compile-time cost is measured by bench/compile-time.
#include <benchmark/benchmark.h>

#include <headroom/headroom.hpp>

using namespace headroom;
using QLoRA = Quantized<NF4, LoRA<16>>;
using AllProjections = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;

template <class R>
static void plan_at_run_time(benchmark::State& state) {
  std::int64_t peak = 0, buffers = 0;
  for (auto _ : state) {
    RuntimePlan x = plan_at_run_time<R>();  // not const: keep it out of constant evaluation
    peak = x.peak[0];
    buffers = static_cast<std::int64_t>(x.buffers.size());
    benchmark::DoNotOptimize(peak);
  }
  state.counters["buffers"] = static_cast<double>(buffers);
  state.counters["peak_GiB"] = static_cast<double>(peak) / (1 << 30);
}

using Gpt2Full = Train<models::GPT2<models::gpt2_124m>, Batch<4>, Seq<1024>>;
using Llama8bQLoRA = Train<models::Llama<models::llama3_8b, Apply<QLoRA, AllProjections>, Apply<Checkpointed<>, EveryBlock>>,
                           Batch<1>, Seq<2048>, AdamW8bit, Precision<BF16>>;
BENCHMARK(plan_at_run_time<Gpt2Full>)->Name("plan/gpt2_124m_full")->Unit(benchmark::kMillisecond);
BENCHMARK(plan_at_run_time<Llama8bQLoRA>)->Name("plan/llama3_8b_qlora_ckpt")->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();

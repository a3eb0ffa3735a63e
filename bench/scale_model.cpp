// Step time at scale, predicted from plans (plan/step_time.hpp): a table for
// 8 to 1,024 GPUs for two layouts, the check against Megatron-LM's published
// throughput (Narayanan et al. 2021), and an SVG plot of the prediction.
//
//   scale_model [plot.svg]      (docs/scale_model.svg is its output)
//
// Every figure is computed here from plans made at run time
// (plan_at_run_time), so the program compiles in seconds.
#include <headroom/headroom.hpp>
#include <headroom/plan/step_time.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

using namespace headroom;

namespace {

constexpr double tera = 1e12;
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// GPT models as Megatron-LM trains them (GPT-2's layer: LayerNorm, learned
// positions, fused QKV, GeLU MLP of 4 h, tied head), sequences of 2,048,
// every block recomputed, bf16 with AdamW, one sequence per micro-batch.
template <std::int64_t H, int L, std::int64_t Heads, int M, int N, int Micro>
using Gpt =
    Train<models::GPT2<models::GPT2Config{51200, H, L, Heads, 2048}, Apply<Checkpointed<>, EveryBlock>>, Batch<1>,
          Seq<2048>, Precision<BF16>, AdamW, OnCuda, Accumulate<Micro>, DataParallel<N>, TensorParallel<M>>;

// Megatron-LM's FLOPs of a step (Narayanan et al. 2021, equation 3): the
// transformer's and the logit layer's GEMMs, with every layer's forward run
// twice (activation recomputation) and full (not causal) attention.
double megatron_flops(double batch, double s, double l, double h, double V) {
  return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

// The same work as Megatron-LM 2021 ran it: its full recomputation runs each
// block's whole forward again, with the block's last tensor-parallel
// all-reduce, where the plan skips the block's last projection (its output
// is not needed for backward). The block's forward comes from the plans of
// 1 and 2 blocks.
Work megatron_recompute(Work w, const Work& one, const Work& two, int layers, double boundary_bytes) {
  w.flops_recompute = layers * (two.flops_fwd - one.flops_fwd);
  w.communication.tensor_all_reduce +=
      static_cast<std::int64_t>(layers) * w.micro_batches * static_cast<std::int64_t>(boundary_bytes);
  w.communication.tensor_all_reduce_calls += static_cast<std::int64_t>(layers) * w.micro_batches;
  return w;
}

struct Row {
  int gpus = 0;
  std::string layout;
  StepTime t;
  double peak_gib = -1;  // planned bytes per GPU, where the whole run is planned
};

void print_header() {
  std::printf("  %5s  %-24s %8s %7s %6s %7s %6s %8s %11s %9s %6s %6s %9s\n", "GPUs", "layout (TP x PP x DP, m)",
              "compute", "tensor", "sends", "bubble", "data", "step s", "tokens/s", "TFLOP/s", "MFU", "HFU", "GiB/GPU");
}

void print_row(const Row& r) {
  const StepTime& t = r.t;
  std::printf("  %5d  %-24s %8.2f %7.2f %6.3f %7.2f %6.3f %8.2f %11.0f %9.1f %5.1f%% %5.1f%%", r.gpus, r.layout.c_str(),
              t.compute, t.tensor, t.sends, t.bubble, t.data, t.total(), t.tokens_per_second(),
              t.model_flops_per_gpu() / tera, 100 * t.mfu(), 100 * t.hfu());
  if (r.peak_gib >= 0)
    std::printf(" %9.2f\n", r.peak_gib);
  else
    std::printf(" %9s\n", "-");
}

std::string layout(int M, int P, int N, int m) {
  return std::to_string(M) + " x " + std::to_string(P) + " x " + std::to_string(N) + ", m " + std::to_string(m);
}

// GPT-3 175B (96 layers, h 12,288, 96 heads) as Megatron-LM ran it: TP 8 x
// PP 8, global batch 1,536 sequences of micro-batch 1; N = GPUs / 64.
constexpr int gpt3_layers = 96;
constexpr std::int64_t gpt3_h = 12288;
constexpr double gpt3_boundary = 2048.0 * gpt3_h * 2;  // one sequence's activation, bf16
const Pipeline gpt3_pipe{8, 1, static_cast<std::int64_t>(gpt3_boundary), true};

template <int N>
Row gpt3_row(const Machine& machine) {
  constexpr int m = 1536 / N;
  RuntimePlan p = plan_at_run_time<Gpt<gpt3_h, gpt3_layers, 96, 8, N, m>>();
  return Row{8 * 8 * N, layout(8, 8, N, m), step_time(work(p), machine, gpt3_pipe)};
}

// Llama-2-7B's shape and batch (4M tokens: 1,024 sequences of 4,096 per
// step), data parallel with ZeRO 1, every block recomputed, bf16 with
// AdamW, one sequence per micro-batch: m = 1,024 / GPUs.
template <int N>
using Llama7B = Train<models::Llama<models::llama2_7b, Apply<Checkpointed<>, EveryBlock>>, Batch<1>, Seq<4096>,
                      Precision<BF16>, AdamW, OnCuda, Accumulate<1024 / N>, DataParallel<N>, ZeRO<1>>;

template <int N>
Row llama_row(const Machine& machine) {
  RuntimePlan p = plan_at_run_time<Llama7B<N>>();
  return Row{N, layout(1, 1, N, 1024 / N), step_time(work(p), machine), static_cast<double>(p.peak[0]) / GiB};
}

// The efficiency at which the model's TFLOP/s (counted as the paper counts)
// equals `published`: the step time is affine in 1 / efficiency.
double implied_efficiency(const Work& w, Machine machine, const Pipeline& pipe, double flops, double published) {
  double lo = 0.05, hi = 1.0;
  for (int i = 0; i < 60; ++i) {
    machine.efficiency = (lo + hi) / 2;
    const StepTime t = step_time(w, machine, pipe);
    (flops / (t.gpus * t.total()) < published ? lo : hi) = machine.efficiency;
  }
  return (lo + hi) / 2;
}

struct Check {
  const char* name;
  double published;  // TFLOP/s per GPU, the paper's count
  double predicted_plan = 0, predicted = 0, implied = 0;
};

// One published configuration: the plan's prediction, the prediction for
// Megatron's full recomputation, and the efficiency that would match.
template <std::int64_t H, int L, std::int64_t Heads, int N, int Micro>
Check check(const char* name, int P, int batch, double published, const Machine& machine, bool print_parts) {
  const Work one = work(plan_at_run_time<Gpt<H, 1, Heads, 8, N, Micro>>());
  const Work two = work(plan_at_run_time<Gpt<H, 2, Heads, 8, N, Micro>>());
  const Work whole = work(plan_at_run_time<Gpt<H, L, Heads, 8, N, Micro>>());
  const Work extrapolated = work_of_layers(one, two, L);
  const bool exact =
      extrapolated.flops_fwd == whole.flops_fwd && extrapolated.flops_bwd == whole.flops_bwd &&
      extrapolated.flops_recompute == whole.flops_recompute &&
      extrapolated.communication.tensor_all_reduce == whole.communication.tensor_all_reduce &&
      extrapolated.communication.tensor_all_reduce_calls == whole.communication.tensor_all_reduce_calls &&
      extrapolated.communication.all_reduce == whole.communication.all_reduce &&
      extrapolated.communication.all_reduce_calls == whole.communication.all_reduce_calls;
  const double boundary = 2048.0 * H * 2;
  const Pipeline pipe{P, 1, static_cast<std::int64_t>(boundary), true};
  const Work megatron = megatron_recompute(whole, one, two, L, boundary);
  const double flops = megatron_flops(batch, 2048, L, H, 51200);
  const StepTime tp = step_time(whole, machine, pipe), tm = step_time(megatron, machine, pipe);
  Check c{name, published};
  c.predicted_plan = flops / (tp.gpus * tp.total()) / tera;
  c.predicted = flops / (tm.gpus * tm.total()) / tera;
  c.implied = implied_efficiency(megatron, machine, pipe, flops, published * tera);
  std::printf("\n%s: TP 8 x PP %d x DP %d, micro-batch 1, m = %d, global batch %d, %d GPUs\n", name, P, N, Micro, batch,
              tm.gpus);
  std::printf("  plans of 1 and 2 blocks extrapolated to %d = the %d-block plan (FLOPs, exchange, calls): %s\n", L, L,
              exact ? "yes" : "NO");
  std::printf(
      "  the paper's FLOPs per step (eq. 3) %.4g; the plan executes %.4g (%.3f of it), Megatron's recompute %.4g "
      "(%.3f)\n",
      flops, tp.executed_flops * tp.gpus, tp.executed_flops * tp.gpus / flops, tm.executed_flops * tm.gpus,
      tm.executed_flops * tm.gpus / flops);
  const double outside = (2 * one.flops_fwd - two.flops_fwd) + (2 * one.flops_bwd - two.flops_bwd);
  std::printf(
      "  outside the blocks (embedding, positions, final norm, LM head): %.2f%% of the plan's forward + backward; "
      "on one stage: %.1f%% of a stage's share (modeled as spread over the stages)\n",
      100 * outside / (whole.flops_fwd + whole.flops_bwd),
      100 * outside / ((megatron.flops_fwd + megatron.flops_bwd + megatron.flops_recompute) / P));
  if (print_parts) {
    std::printf("  %-34s %8s %7s %6s %7s %6s %8s\n", "", "compute", "tensor", "sends", "bubble", "data", "step s");
    for (auto [label, t] : {std::pair{"the plan's recompute", tp}, std::pair{"Megatron's full recompute", tm}})
      std::printf("  %-34s %8.2f %7.2f %6.3f %7.2f %6.3f %8.2f\n", label, t.compute, t.tensor, t.sends, t.bubble,
                  t.data, t.total());
  }
  std::printf(
      "  TFLOP/s per GPU (the paper's count): published %.0f; predicted %.1f (%+.1f%%) for Megatron's work, %.1f "
      "(%+.1f%%) for the plan's\n",
      published, c.predicted, 100 * (c.predicted / published - 1), c.predicted_plan,
      100 * (c.predicted_plan / published - 1));
  std::printf("  efficiency at which the model gives the published figure: %.3f (the machine's: %.2f)\n", c.implied,
              machine.efficiency);
  return c;
}

// What the GPT-3 prediction at 1,024 GPUs depends on: one input changed at a time.
void sensitivity(const Machine& machine) {
  const Work one = work(plan_at_run_time<Gpt<gpt3_h, 1, 96, 8, 16, 96>>());
  const Work two = work(plan_at_run_time<Gpt<gpt3_h, 2, 96, 8, 16, 96>>());
  const Work w = megatron_recompute(work(plan_at_run_time<Gpt<gpt3_h, gpt3_layers, 96, 8, 16, 96>>()), one, two,
                                    gpt3_layers, gpt3_boundary);
  const double flops = megatron_flops(1536, 2048, gpt3_layers, gpt3_h, 51200);
  const auto tflops = [&](const Machine& mc, const Pipeline& pp, bool data_hidden) {
    StepTime t = step_time(w, mc, pp);
    if (data_hidden) t.data = 0;
    return flops / (t.gpus * t.total()) / tera;
  };
  const double base = tflops(machine, gpt3_pipe, false);
  std::printf(
      "\nGPT-3 175B on 1,024 GPUs, Megatron's work: one input changed at a time (TFLOP/s per GPU, the paper's "
      "count)\n");
  std::printf("  %-66s %7.1f\n", "as above", base);
  Machine nv = machine;
  nv.intra_node_bandwidth = 200e9;
  std::printf("  %-66s %7.1f\n", "NVLink at 200 GB/s (nccl-tests' all-reduce bus bandwidth) not 300",
              tflops(nv, gpt3_pipe, false));
  Machine ib = machine;
  ib.inter_node_bandwidth = 12.5e9;
  std::printf("  %-66s %7.1f\n", "InfiniBand at 12.5 GB/s per GPU, not 25", tflops(ib, gpt3_pipe, false));
  Machine zero_latency = machine;
  zero_latency.latency = 0;
  std::printf("  %-66s %7.1f\n", "no latency per call, not 20 us", tflops(zero_latency, gpt3_pipe, false));
  std::printf("  %-66s %7.1f\n", "data-parallel all-reduce hidden behind backward", tflops(machine, gpt3_pipe, true));
  Pipeline interleaved = gpt3_pipe;
  interleaved.interleave = 2;
  std::printf("  %-66s %7.1f\n", "interleaved schedule, 2 chunks per stage (bubble / 2, sends x 2)",
              tflops(machine, interleaved, false));
  Pipeline no_scatter = gpt3_pipe;
  no_scatter.scatter_gather = false;
  std::printf("  %-66s %7.1f\n", "no scatter / gather (whole activations between stages)",
              tflops(machine, no_scatter, false));
  Machine eff = machine;
  eff.efficiency = 0.50;
  std::printf("  %-66s %7.1f\n", "efficiency 0.50, not 0.44", tflops(eff, gpt3_pipe, false));
}

// The pipeline planned against the pipeline modeled: Llama-2-7B (its head is
// not tied, so PipelineParallel can plan its stages; GPT-2's tied head cannot
// be split over stages yet) on 4 stages x 8 data-parallel ranks, 32
// micro-batches of one sequence of 4,096 per step. Modeled: each stage does
// 1 / 4 of the whole model's plan; planned: each stage's own plan (the first
// holds the embedding, the last the final norm and the LM head), the
// slowest stage setting the pace.
template <int P, int... S>
void pipeline_planned_vs_modeled(const Machine& machine, std::integer_sequence<int, S...>) {
  using Whole = Train<models::Llama<models::llama2_7b, Apply<Checkpointed<>, EveryBlock>>, Batch<1>, Seq<4096>,
                      Precision<BF16>, AdamW, OnCuda, Accumulate<32>, DataParallel<8>, ZeRO<1>>;
  using Staged = Train<models::Llama<models::llama2_7b, Apply<Checkpointed<>, EveryBlock>>, Batch<1>, Seq<4096>,
                       Precision<BF16>, AdamW, OnCuda, Accumulate<32>, DataParallel<8>, ZeRO<1>, PipelineParallel<P>>;
  const Pipeline pipe{P, 1, 4096 * 4096 * 2, true};
  const StepTime modeled = step_time(work(plan_at_run_time<Whole>()), machine, pipe);
  const StepTime stages[] = {step_time(work(plan_at_run_time<pipeline_stage<Staged, S>>()), machine, pipe)...};
  std::printf("\nLlama-2-7B on %d stages x 8 data-parallel ranks (32 GPUs), m = 32: the pipeline modeled (1 / %d of the "
              "whole model's plan) and planned (PipelineParallel<%d>: each stage's plan)\n",
              P, P, P);
  std::printf("  %-22s %8s %7s %6s %7s %6s %8s %6s\n", "", "compute", "tensor", "sends", "bubble", "data", "step s", "MFU");
  const auto row = [](const std::string& label, const StepTime& t) {
    std::printf("  %-22s %8.2f %7.2f %6.3f %7.2f %6.3f %8.2f %5.1f%%\n", label.c_str(), t.compute, t.tensor, t.sends,
                t.bubble, t.data, t.total(), 100 * t.mfu());
  };
  row("modeled, every stage", modeled);
  double slowest = 0, model_flops = 0;
  for (int s = 0; s < P; ++s) {
    row("planned, stage " + std::to_string(s), stages[s]);
    slowest = std::max(slowest, stages[s].total());
    model_flops += stages[s].model_flops;
  }
  std::printf("  the slowest stage's step: %.2f s, %+.1f%% on the modeled %.2f s; MFU over the stages %.1f%% "
              "(modeled %.1f%%)\n",
              slowest, 100 * (slowest / modeled.total() - 1), modeled.total(),
              100 * model_flops / P / (slowest * machine.peak_flops), 100 * modeled.mfu());
}

// ---------------------------------------------------------------- the plot

struct Series {
  std::string name, colour;
  std::vector<std::pair<int, double>> points;  // GPUs, MFU
};

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

bool write_svg(const char* path, const std::vector<Series>& series, const Check& gpt3) {
  const double W = 860, H = 430, left = 70, right = 370, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom, ymax = 60;
  const double lx = left + pw + 30;                                                   // the legend
  const auto x = [&](double gpus) { return left + pw * (std::log2(gpus) - 3) / 7; };  // 8 .. 1024
  const auto y = [&](double percent) { return top + ph * (1 - percent / ymax); };
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", W) + "\" height=\"" + fmt("%.0f", H) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt("%.0f", left) +
       "\" y=\"22\" font-size=\"14\">Predicted model FLOPs utilization (DGX A100, plan/step_time.hpp)</text>\n";
  for (int p = 0; p <= ymax; p += 10) {
    s += "<line x1=\"" + fmt("%.1f", left) + "\" x2=\"" + fmt("%.1f", left + pw) + "\" y1=\"" + fmt("%.1f", y(p)) +
         "\" y2=\"" + fmt("%.1f", y(p)) + "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + fmt("%.1f", left - 8) + "\" y=\"" + fmt("%.1f", y(p) + 4) + "\" text-anchor=\"end\">" +
         fmt("%.0f%%", p) + "</text>\n";
  }
  for (int g = 8; g <= 1024; g *= 2) {
    s += "<line x1=\"" + fmt("%.1f", x(g)) + "\" x2=\"" + fmt("%.1f", x(g)) + "\" y1=\"" + fmt("%.1f", top) +
         "\" y2=\"" + fmt("%.1f", top + ph) + "\" stroke=\"#eee\"/>\n";
    s += "<text x=\"" + fmt("%.1f", x(g)) + "\" y=\"" + fmt("%.1f", top + ph + 18) + "\" text-anchor=\"middle\">" +
         std::to_string(g) + "</text>\n";
  }
  s += "<rect x=\"" + fmt("%.1f", left) + "\" y=\"" + fmt("%.1f", top) + "\" width=\"" + fmt("%.1f", pw) +
       "\" height=\"" + fmt("%.1f", ph) + "\" fill=\"none\" stroke=\"black\"/>\n";
  s += "<text x=\"" + fmt("%.1f", left + pw / 2) + "\" y=\"" + fmt("%.1f", H - 18) +
       "\" text-anchor=\"middle\">GPUs</text>\n";
  s += "<text transform=\"translate(18 " + fmt("%.1f", top + ph / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">MFU (forward + backward FLOPs / peak)</text>\n";
  double ly = top + 10;
  for (const Series& se : series) {
    std::string pts;
    for (auto [g, mfu] : se.points) pts += fmt("%.1f", x(g)) + "," + fmt("%.1f", y(100 * mfu)) + " ";
    s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"" + se.colour + "\" stroke-width=\"2\"/>\n";
    for (auto [g, mfu] : se.points)
      s += "<circle cx=\"" + fmt("%.1f", x(g)) + "\" cy=\"" + fmt("%.1f", y(100 * mfu)) + "\" r=\"3\" fill=\"" +
           se.colour + "\"/>\n";
    s += "<line x1=\"" + fmt("%.1f", lx) + "\" x2=\"" + fmt("%.1f", lx + 20) + "\" y1=\"" + fmt("%.1f", ly) +
         "\" y2=\"" + fmt("%.1f", ly) + "\" stroke=\"" + se.colour + "\" stroke-width=\"2\"/>\n";
    s += "<text x=\"" + fmt("%.1f", lx + 26) + "\" y=\"" + fmt("%.1f", ly + 4) + "\">" + se.name + "</text>\n";
    ly += 20;
  }
  // the published point and the prediction for it, both counted as the paper
  // counts (its equation 3, recompute included), as percent of peak
  const double px = x(1024);
  const double published = 100 * gpt3.published * tera / dgx_a100.peak_flops;
  const double predicted = 100 * gpt3.predicted * tera / dgx_a100.peak_flops;
  const auto square = [&](double cx, double cy) {
    return "<rect x=\"" + fmt("%.1f", cx - 5) + "\" y=\"" + fmt("%.1f", cy - 5) +
           "\" width=\"10\" height=\"10\" fill=\"none\" stroke=\"black\" stroke-width=\"2\"/>\n";
  };
  const auto triangle = [&](double cx, double cy) {
    return "<path d=\"M " + fmt("%.1f", cx - 6) + " " + fmt("%.1f", cy + 5) +
           " l 6 -10 l 6 10 z\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  };
  const auto text = [&](double ty, const std::string& t) {
    return "<text x=\"" + fmt("%.1f", lx + 26) + "\" y=\"" + fmt("%.1f", ty) + "\">" + t + "</text>\n";
  };
  s += square(px, y(published)) + triangle(px, y(predicted));
  ly += 16;
  s += text(ly, "GPT-3 175B on 1,024 GPUs, % of peak");
  s += text(ly + 15, "as the paper counts (eq. 3, with recompute):");
  ly += 36;
  s += square(lx + 10, ly - 4) + text(ly, "published 140 TFLOP/s (" + fmt("%.1f", published) + "%),");
  s += text(ly + 15, "Narayanan et al. 2021");
  ly += 36;
  s += triangle(lx + 10, ly - 4) + text(ly, "predicted for Megatron's work: " + fmt("%.1f", gpt3.predicted));
  s += text(ly + 15, "TFLOP/s (" + fmt("%.1f", predicted) + "%)");
  s += "</svg>\n";
  std::FILE* f = std::fopen(path, "w");
  if (!f) return false;
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  return std::fclose(f) == 0 && ok;
}

template <int... N>
std::vector<Row> gpt3_rows(const Machine& machine, std::integer_sequence<int, N...>) {
  return {gpt3_row<N>(machine)...};
}
template <int... N>
std::vector<Row> llama_rows(const Machine& machine, std::integer_sequence<int, N...>) {
  return {llama_row<N>(machine)...};
}

}  // namespace

int main(int argc, char** argv) {
  const Machine machine = dgx_a100;
  std::printf(
      "machine: DGX A100 80GB: %.0f TFLOP/s bf16 peak x efficiency %.2f, NVLink %.0f GB/s, InfiniBand %.0f GB/s "
      "per GPU, %d GPUs per node, %.0f us per call\n",
      machine.peak_flops / tera, machine.efficiency, machine.intra_node_bandwidth / 1e9,
      machine.inter_node_bandwidth / 1e9, machine.gpus_per_node, machine.latency * 1e6);
  std::printf(
      "seconds per optimizer step; TFLOP/s = model FLOPs (forward + backward) per GPU; MFU = that / peak; HFU "
      "with recompute\n");

  std::printf(
      "\nGPT-3 175B (96 x 12288, 96 heads, seq 2048), TP 8 x PP 8 (pipeline modeled), global batch 1536, "
      "micro-batch 1; fewer than 64 GPUs cannot hold this layout\n");
  print_header();
  const std::vector<Row> gpt3 = gpt3_rows(machine, std::integer_sequence<int, 1, 2, 4, 8, 16>{});
  for (int g : {8, 16, 32}) std::printf("  %5d  %-24s\n", g, "- (TP 8 x PP 8 needs 64)");
  for (const Row& r : gpt3) print_row(r);

  std::printf(
      "\nLlama-2-7B (32 x 4096, seq 4096), data parallel, ZeRO 1, global batch 1024 sequences (4M tokens), "
      "micro-batch 1; GiB/GPU: the plan's peak\n");
  print_header();
  const std::vector<Row> llama = llama_rows(machine, std::integer_sequence<int, 8, 16, 32, 64, 128, 256, 512, 1024>{});
  for (const Row& r : llama) print_row(r);

  std::printf(
      "\nAgainst the published figures (Narayanan et al. 2021, SC21: TFLOP/s per GPU counted by their equation "
      "3, recompute included)\n");
  const Check c175 = check<gpt3_h, gpt3_layers, 96, 16, 96>(
      "GPT-3 175B on 1024 A100s, batch 1536 (section 5.1: 140 TFLOP/s; layout: TP 8 x PP 8 assumed)", 8, 1536, 140,
      machine, true);
  check<25600, 128, 160, 6, 512>(
      "1T on 3072 A100s, batch 3072 (section 5.1: 163 TFLOP/s; layout: Megatron-LM's examples/sc21/run_table_1.sh)", 64,
      3072, 163, machine, true);
  sensitivity(machine);
  pipeline_planned_vs_modeled<4>(machine, std::make_integer_sequence<int, 4>{});

  std::vector<Series> series{{"GPT-3 175B, TP 8 x PP 8: MFU", "#1f77b4", {}},
                             {"Llama-2-7B, DP + ZeRO 1: MFU", "#d62728", {}}};
  for (const Row& r : gpt3) series[0].points.push_back({r.gpus, r.t.mfu()});
  for (const Row& r : llama) series[1].points.push_back({r.gpus, r.t.mfu()});
  const char* svg = argc > 1 ? argv[1] : "scale_model.svg";
  if (!write_svg(svg, series, c175)) {
    std::fprintf(stderr, "cannot write %s\n", svg);
    return 1;
  }
  std::printf("\nplot: %s\n", svg);
}

#pragma once
// The time of one optimizer step at scale, predicted from one rank's plan
// (its FLOPs per micro-batch and its communication per step) and a
// description of the machine:
//
//   constexpr auto p = plan<MyRun>();            // DataParallel<N>, TensorParallel<M>, Accumulate<m>
//   constexpr StepTime t = step_time(work(p), dgx_a100, Pipeline{.stages = 8, .boundary_bytes = ...});
//   t.total(); t.mfu(); t.tokens_per_second();
//
// The model, per optimizer step, on the critical path of one GPU:
//
//   micro-batch  = compute + tensor + sends       one micro-batch on one pipeline stage
//     compute    = a stage's share of the plan's FLOPs (forward, backward, recompute)
//                  / (peak x efficiency)
//     tensor     = a stage's share of the plan's tensor-parallel bytes sent by this rank
//                  (ring) / m / link + calls / m x latency: not overlapped with compute
//     sends      = 2 v point-to-point sends of the activation between stages
//                  (forward and its gradient, v = interleave), 1 / M of it with
//                  Megatron's scatter / gather, + latency each
//   step         = (m + (P - 1) / v) x micro-batch + data
//     bubble     = (P - 1) / v micro-batches: the 1F1B pipeline's fill and drain
//     data       = a stage's share of the plan's data-parallel bytes sent by this rank
//                  (ring) / link + calls x latency, after the last micro-batch: NOT overlapped
//                  with backward (Megatron-LM's 2021 data-parallel all-reduce ran after
//                  the pipeline flush; overlap would hide up to all of it)
//
// where m is the plan's Accumulate<m> (micro-batches per optimizer step and
// data-parallel rank). A stage's share: a plan of a PipelineParallel<P> run
// is one stage's, taken whole, with its P; a plan of the whole model (one
// tensor-parallel rank's) is divided into Pipeline::stages equal shares, a
// pipeline modeled, not planned (no stage holds the embedding or the LM head
// alone, and no stage's memory is planned).
//
// Links: the processes are ordered tensor-parallel rank fastest, then
// data-parallel, then pipeline stage (Megatron-LM's order), GPUs filling
// nodes in that order. A tensor-parallel group of M <= gpus_per_node is
// inside a node (NVLink); a data-parallel group spans nodes when
// M x N > gpus_per_node; the pipeline's sends cross nodes when the M x N x P
// GPUs of one pipeline are more than a node. A collective spanning nodes
// runs at the inter-node bandwidth of one GPU's NIC (a ring through every
// rank).
#include <cstdint>

#include "plan.hpp"

namespace headroom {

// One GPU and its links.
struct Machine {
  double peak_flops = 0;            // dense FLOP/s of one GPU in the run's dtype
  double efficiency = 1;            // fraction of peak_flops a training step's compute reaches
  double intra_node_bandwidth = 0;  // bytes/s one GPU sends inside its node, per direction
  double inter_node_bandwidth = 0;  // bytes/s one GPU sends to other nodes, per direction
  int gpus_per_node = 8;
  double latency = 0;  // seconds added per collective call and per point-to-point send
};

// DGX A100 (80 GB) as in Selene, where Megatron-LM's figures were measured
// (Narayanan et al. 2021, section 5): A100 bf16 dense peak 312 TFLOP/s;
// efficiency 0.44, the fraction of peak Megatron-LM reached end to end on
// its smallest configuration (1.7B parameters, no tensor or pipeline
// parallelism, 32 GPUs: "44% of peak device throughput for the smallest
// model", section 5.1); NVLink 3 at 300 GB/s per direction (12 links of
// 25 GB/s); one 200 Gb/s HDR InfiniBand adapter per GPU, 25 GB/s; 8 GPUs per
// node; 20 us per call (the order of NCCL's small-message all-reduce time).
inline constexpr Machine dgx_a100{312e12, 0.44, 300e9, 25e9, 8, 20e-6};

// What a pipeline adds (Megatron-LM's 1F1B schedule).
struct Pipeline {
  int stages = 1;                   // P for a plan of the whole model: each stage does 1 / P of it
                                    // (a PipelineParallel plan is a stage's: its own P, this is not read)
  int interleave = 1;               // v: model chunks per stage (Megatron's interleaved 1F1B)
  std::int64_t boundary_bytes = 0;  // one micro-batch's activation between two stages (tokens x width x element bytes);
                                    // 0: a PipelineParallel plan's own (Work::boundary_bytes)
  bool scatter_gather = true;       // each of the M tensor-parallel ranks sends 1 / M of it (Megatron-LM, section 4.1)
};

// One rank's work, as a plan gives it.
struct Work {
  double flops_fwd = 0, flops_bwd = 0, flops_recompute = 0;  // per micro-batch
  Communication communication{};                             // per optimizer step
  int data_parallel = 1, tensor_parallel = 1;                // N, M
  int pipeline_stages = 1;                                   // P of a PipelineParallel plan (a stage's); 1: whole model
  int micro_batches = 1;                                     // m: Accumulate<m>
  std::int64_t tokens = 0;                                   // per micro-batch and data-parallel rank
  // a PipelineParallel plan's: one micro-batch's activation at its stage's
  // boundary, from the bytes it sends (Communication::pipeline_sent: m of
  // them to each neighbour per step, the activation forward, its gradient back)
  std::int64_t boundary_bytes = 0;
};

// From a plan<R>() or a plan_at_run_time<R>().
template <class P>
constexpr Work work(const P& plan) {
  const RunConfig* cfg = nullptr;
  if constexpr (requires { plan.cfg; })
    cfg = &plan.cfg;  // RuntimePlan
  else
    cfg = &plan.config;
  Work w;
  w.flops_fwd = static_cast<double>(plan.flops_fwd);
  w.flops_bwd = static_cast<double>(plan.flops_bwd);
  w.flops_recompute = static_cast<double>(plan.flops_recompute);
  w.communication = plan.communication;
  w.data_parallel = cfg->dp;
  w.tensor_parallel = cfg->tp;
  w.pipeline_stages = cfg->pp;
  w.micro_batches = cfg->accumulate;
  w.tokens = cfg->tokens();
  if (cfg->pp > 1) {
    const int neighbours = (cfg->stage > 0) + (cfg->stage < cfg->pp - 1);
    w.boundary_bytes = plan.communication.pipeline_sent / (cfg->accumulate * neighbours);
  }
  return w;
}

// The work of a model of `layers` blocks from the plans of the same run with
// 1 and 2 blocks (one Repeat count apart): every FLOP and byte of a Repeat
// is its block's times the count, so this is exact, and it spares compiling
// a deep plan.
constexpr Work work_of_layers(const Work& one, const Work& two, int layers) {
  const auto at = [&](auto a, auto b) { return a + (layers - 1) * (b - a); };
  Work w = one;
  w.flops_fwd = at(one.flops_fwd, two.flops_fwd);
  w.flops_bwd = at(one.flops_bwd, two.flops_bwd);
  w.flops_recompute = at(one.flops_recompute, two.flops_recompute);
  const Communication &c1 = one.communication, &c2 = two.communication;
  Communication& c = w.communication;
  c.all_reduce = at(c1.all_reduce, c2.all_reduce);
  c.reduce_scatter = at(c1.reduce_scatter, c2.reduce_scatter);
  c.all_gather = at(c1.all_gather, c2.all_gather);
  c.all_reduce_calls = at(c1.all_reduce_calls, c2.all_reduce_calls);
  c.reduce_scatter_calls = at(c1.reduce_scatter_calls, c2.reduce_scatter_calls);
  c.all_gather_calls = at(c1.all_gather_calls, c2.all_gather_calls);
  c.tensor_all_reduce = at(c1.tensor_all_reduce, c2.tensor_all_reduce);
  c.tensor_all_gather = at(c1.tensor_all_gather, c2.tensor_all_gather);
  c.tensor_all_reduce_calls = at(c1.tensor_all_reduce_calls, c2.tensor_all_reduce_calls);
  c.tensor_all_gather_calls = at(c1.tensor_all_gather_calls, c2.tensor_all_gather_calls);
  c.tensor_grad_all_reduce = at(c1.tensor_grad_all_reduce, c2.tensor_grad_all_reduce);
  c.tensor_grad_all_reduce_calls = at(c1.tensor_grad_all_reduce_calls, c2.tensor_grad_all_reduce_calls);
  return w;
}

// One optimizer step's predicted time, in seconds, by part.
struct StepTime {
  double compute = 0;         // m micro-batches' FLOPs on one stage
  double tensor = 0;          // their tensor-parallel exchange
  double sends = 0;           // their point-to-point sends between stages
  double bubble = 0;          // (P - 1) / v micro-batches of idle
  double data = 0;            // data-parallel collectives after the last micro-batch
  int gpus = 1;               // M x N x P
  double peak = 0;            // FLOP/s of one GPU
  double model_flops = 0;     // per GPU and step: forward and backward (no recompute)
  double executed_flops = 0;  // per GPU and step: with recompute
  double tokens = 0;          // per step, all GPUs

  constexpr double total() const { return compute + tensor + sends + bubble + data; }
  constexpr double tokens_per_second() const { return tokens / total(); }
  // FLOP/s of one GPU: model FLOPs, or all it executes (recompute included)
  constexpr double model_flops_per_gpu() const { return model_flops / total(); }
  constexpr double executed_flops_per_gpu() const { return executed_flops / total(); }
  // model FLOPs utilization: model FLOPs / (GPUs x peak x time), per GPU
  constexpr double mfu() const { return model_flops_per_gpu() / peak; }
  constexpr double hfu() const { return executed_flops_per_gpu() / peak; }
};

constexpr StepTime step_time(const Work& w, const Machine& machine, const Pipeline& pipe = {}) {
  const bool staged = w.pipeline_stages > 1;  // the plan is one stage's
  const int N = w.data_parallel, M = w.tensor_parallel, P = staged ? w.pipeline_stages : pipe.stages;
  const int v = pipe.interleave;
  const double m = w.micro_batches, share = staged ? 1.0 : 1.0 / P;  // of the plan, what one stage does
  const auto link = [&](bool inside) { return inside ? machine.intra_node_bandwidth : machine.inter_node_bandwidth; };
  const double tensor_link = link(M <= machine.gpus_per_node);
  const double data_link = link(M * N <= machine.gpus_per_node);
  const double stage_link = link(M * N * P <= machine.gpus_per_node);
  const Communication& c = w.communication;

  const double flops = (w.flops_fwd + w.flops_bwd + w.flops_recompute) * share;  // one micro-batch, one stage
  const double compute = flops / (machine.peak_flops * machine.efficiency);
  const double tensor =
      M <= 1 ? 0
             : (c.tensor_sent_per_rank(M) / tensor_link +
                static_cast<double>(c.tensor_all_reduce_calls + c.tensor_all_gather_calls + c.tensor_grad_all_reduce_calls) *
                    machine.latency) *
                   share / m;
  const std::int64_t boundary = pipe.boundary_bytes > 0 ? pipe.boundary_bytes : w.boundary_bytes;
  const double send_bytes = static_cast<double>(boundary) / (pipe.scatter_gather ? M : 1);
  const double sends = P <= 1 ? 0 : 2.0 * v * (send_bytes / stage_link + machine.latency);
  const double micro_batch = compute + tensor + sends;

  StepTime t;
  t.compute = m * compute;
  t.tensor = m * tensor;
  t.sends = m * sends;
  t.bubble = static_cast<double>(P - 1) / v * micro_batch;
  t.data =
      N <= 1
          ? 0
          : (c.sent_per_rank(N) / data_link +
             static_cast<double>(c.all_reduce_calls + c.reduce_scatter_calls + c.all_gather_calls) * machine.latency) *
                share;
  t.gpus = M * N * P;
  t.peak = machine.peak_flops;
  t.model_flops = m * (w.flops_fwd + w.flops_bwd) * share;
  t.executed_flops = m * flops;
  t.tokens = m * static_cast<double>(N) * static_cast<double>(w.tokens);
  return t;
}

}  // namespace headroom

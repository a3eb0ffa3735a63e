#pragma once
// The ops an engine runs for a run type, chosen at compile time.
//
//   using Table = OpTable<Run>;          // ops_of<Run::model>
//   Table::kernel[g]                      // step g's position in Table::ops (-1: no op)
//   Table::visit(g, [&]<class E>() { E::op::forward(k); });
//
// The table is computed from the schedule while the engine compiles: every
// op a step runs must be the op of some layer's `ops` list (ops_of), named
// uniquely; each engine then checks its own kernels (check_kernels). An op
// on a lane other than compute runs beside the steps after it; join_steps
// says where the engine waits for it.
#include <array>
#include <cstddef>
#include <string_view>

#include "../core/diagnostic.hpp"
#include "../graph/bound.hpp"
#include "../layers/ops_of.hpp"
#include "../ops/collectives.hpp"
#include "../ops/pipeline.hpp"
#include "../ops/tensor_parallel.hpp"
#include "../plan/schedule.hpp"
#include "../run.hpp"

namespace headroom::trainers {

namespace detail {
// Whether two ops of the list share a name (the schedule could not tell them apart).
template <class... Es>
constexpr int duplicate_name(type_list<Es...>) {
  constexpr std::string_view names[] = {std::string_view(Es::op::name)..., std::string_view{}};
  for (std::size_t i = 0; i < sizeof...(Es); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) return static_cast<int>(i);
  return -1;
}
// The epilogue pairs (ops/epilogue.hpp) of a list of op entries where only one side names the other.
template <class... Es>
ops::epilogue_not_listed<typename Es::op...> epilogue_not_listed(type_list<Es...>);
template <class... Es>
ops::epilogue_not_named<typename Es::op...> epilogue_not_named(type_list<Es...>);
}  // namespace detail

// The ops of a run: its model's (ops_of), the collectives of its
// data-parallel layout (listed under DataParallel<N>) and the sums of its
// tensor-parallel one (under TensorParallel<N>).
template <class R>
struct run_ops {
  static constexpr RunConfig cfg = R::config();
  using layout = DataParallel<cfg.dp>;
  using collectives = std::conditional_t<
      cfg.dp <= 1, type_list<>,
      std::conditional_t<cfg.zero <= 1, type_list<op_entry<layout, ops::AllReduceGrads>>,
                         std::conditional_t<cfg.zero == 2, type_list<op_entry<layout, ops::ReduceScatterGrads>>,
                                            type_list<op_entry<layout, ops::ReduceScatterGrads>,
                                                      op_entry<layout, ops::AllGatherParams>>>>>;
  // tensor parallelism: the sums the layers emit between split projections
  using tensor_parallel = std::conditional_t<cfg.tp <= 1, type_list<>,
                                             type_list<op_entry<TensorParallel<cfg.tp>, ops::TensorParallelInput>,
                                                       op_entry<TensorParallel<cfg.tp>, ops::TensorParallelOutput>>>;
  // pipeline parallelism: the transfers between stages
  using pipeline = std::conditional_t<cfg.pp <= 1, type_list<>,
                                      type_list<op_entry<PipelineParallel<cfg.pp>, ops::PipelineRecv>,
                                                op_entry<PipelineParallel<cfg.pp>, ops::PipelineSend>>>;
  using type = typename headroom::detail::concat<ops_of<typename R::model>, collectives, tensor_parallel, pipeline>::type;
};

template <class R, const auto& Sched>
struct OpTable {
  using ops = typename run_ops<R>::type;
  static constexpr std::size_t steps = Sched.steps.size();
  static constexpr std::array<int, steps> kernel = [] {
    std::array<int, steps> k{};
    for (std::size_t g = 0; g < steps; ++g) k[g] = Sched.steps[g].op.empty() ? -1 : op_index(ops{}, Sched.steps[g].op);
    return k;
  }();
  // the first step whose op no layer lists, or -1
  static constexpr int unlisted = [] {
    for (std::size_t g = 0; g < steps; ++g)
      if (!Sched.steps[g].op.empty() && kernel[g] < 0) return static_cast<int>(g);
    return -1;
  }();
  static constexpr int unlisted_node = unlisted < 0 ? -1 : Sched.steps[unlisted].node;
  // its name, for the message
  struct unlisted_op {
    static constexpr std::string_view name = unlisted < 0 ? std::string_view{} : Sched.steps[unlisted].op;
  };
  HEADROOM_REQUIRE(unlisted < 0,
                   "Train<Model, ...>: step {} (graph node {}) runs the op {}, which no layer of the model lists; the layer that "
                   "emits it must list its op type in `using ops = type_list<...>`",
                   unlisted, unlisted_node, diag::name<unlisted_op>);
  static constexpr int duplicate = detail::duplicate_name(ops{});
  HEADROOM_REQUIRE(duplicate < 0, "Train<Model, ...>: two op types of the model have the same name (op {} of ops_of<Model>)",
                   duplicate);
  // epilogue fusion: a fused op's forward runs in its producer's kernel, which must know it
  using unlisted_epilogue = decltype(detail::epilogue_not_listed(ops{}));
  HEADROOM_REQUIRE(!unlisted_epilogue::found,
                   "Train<Model, ...>: op {} names op {} as the producer that computes it in its epilogue (EpilogueOf), but that "
                   "op does not list it in `using epilogues = type_list<...>`: its kernels would not compute it, so fused "
                   "there it would never run",
                   diag::name<typename unlisted_epilogue::op>, diag::name<typename unlisted_epilogue::producer>);
  using unnamed_epilogue = decltype(detail::epilogue_not_named(ops{}));
  HEADROOM_REQUIRE(!unnamed_epilogue::found,
                   "Train<Model, ...>: op {} lists op {} in its epilogues, but that op does not declare "
                   "`static constexpr ops::EpilogueOf<{}> epilogue{x};`",
                   diag::name<typename unnamed_epilogue::producer>, diag::name<typename unnamed_epilogue::op>,
                   diag::name<typename unnamed_epilogue::producer>);

  template <class F>
  static void visit(std::size_t g, F&& f) {
    visit_op(ops{}, kernel[g], f);
  }
};

// Binds step `st` for a kernel: every operand of the step, as a pointer into
// the arena whose base is `base` (the device tier), the parameters' weights,
// gradients and quantized views, and the run's shape. `copy`: with pipeline
// parallelism, the micro-batch's copy of what is kept once per micro-batch
// in flight (Slot::stride).
template <class T, class Sched>
void bind_step(ops::Bound<T>& k, const Sched& sched, const Step& st, std::byte* base, int copy = 0) {
  const RunConfig& cfg = sched.config;
  auto at = [base, copy](const Slot& s) -> void* { return s.bound() ? base + s.offset + copy * s.stride : nullptr; };
  k.event = st.kind;
  k.node = st.node;
  k.instance = st.instance;
  for (int d = 0; d < graph::max_dims; ++d) k.dims[d] = st.dim[d];
  k.n_rows = cfg.batch * cfg.seq;
  k.n_batch = cfg.batch;
  k.n_seq = cfg.seq;
  k.accumulated = cfg.accumulate;
  for (int q = 0; q < graph::max_in; ++q) {
    k.in_[q] = at(st.in[q]);
    k.d_in_[q] = at(st.d_in[q]);
    k.d_in_first_[q] = st.d_in[q].first;
  }
  for (int q = 0; q < graph::max_out; ++q) {
    k.out_[q] = at(st.out[q]);
    k.out_first_[q] = st.out[q].first;
    k.d_out_[q] = at(st.d_out[q]);
  }
  for (int q = 0; q < graph::max_saved; ++q) k.saved_[q] = at(st.saved[q]);
  k.inout_ = at(st.inout);
  k.d_inout_ = at(st.d_inout);
  k.scratch_ = at(st.scratch);
  k.scratch_bytes_ = st.scratch.bytes;
  for (int w = 0; w < graph::max_weights; ++w) {
    if (st.param[w] < 0) continue;
    const ParamSlot& p = sched.params[st.param[w]];
    if (p.quant.kind != QuantKind::none) {
      k.quantized_[w] = true;
      k.quant_[w] = math::QuantView{p.quant, reinterpret_cast<std::uint8_t*>(base + p.weight),
                                    reinterpret_cast<std::uint8_t*>(base + p.scales),
                                    sched.quant_table >= 0 ? reinterpret_cast<float*>(base + sched.quant_table) : nullptr, p.rows,
                                    p.cols};
    } else {
      k.weight_[w] = reinterpret_cast<T*>(base + p.weight);
    }
    // ZeRO 3: the parameter as gathered for this event, not this rank's shard
    if (st.weight[w].bound()) {
      if (k.quantized_[w]) {
        k.quant_[w].codes = reinterpret_cast<std::uint8_t*>(base + st.weight[w].offset);
        k.quant_[w].scales = reinterpret_cast<std::uint8_t*>(base + st.scales[w].offset);
      } else {
        k.weight_[w] = reinterpret_cast<T*>(base + st.weight[w].offset);
      }
    }
    k.weight_grad_[w] = p.trainable && p.grad >= 0 ? reinterpret_cast<T*>(base + p.grad) : nullptr;
    k.weight_grad_first_[w] = st.grad_first[w];
  }
}

// ---- lanes -------------------------------------------------------------------------------------------------
// Whether two slots share a byte of the device arena (every copy of each).
constexpr bool overlap(const Slot& a, const Slot& b) {
  return a.bound() && b.bound() && a.offset < b.offset + b.extent() && b.offset < a.offset + a.extent();
}

namespace detail {
template <class F>
constexpr void for_each_slot(const Step& s, F&& f) {
  for (const Slot& x : s.in) f(x);
  for (const Slot& x : s.out) f(x);
  for (const Slot& x : s.saved) f(x);
  for (const Slot& x : s.d_out) f(x);
  for (const Slot& x : s.d_in) f(x);
  f(s.inout);
  f(s.d_inout);
  f(s.scratch);
  for (const Slot& x : s.weight) f(x);
  for (const Slot& x : s.scales) f(x);
  for (const Slot& x : s.param_grad) f(x);
}
}  // namespace detail

// The byte ranges of the device arena a step's bound slots cover, collected
// once so that comparing the step with many others costs one pass over
// theirs (join_steps runs at compile time for every lane step).
struct Touched {
  static constexpr int capacity = 2 * graph::max_in + 2 * graph::max_out + graph::max_saved + 3 + 3 * graph::max_weights;
  std::int64_t begin[capacity]{}, end[capacity]{};
  int count = 0;
  constexpr explicit Touched(const Step& s) {
    detail::for_each_slot(s, [this](const Slot& x) {
      if (!x.bound()) return;
      begin[count] = x.offset;
      end[count] = x.offset + x.extent();
      ++count;
    });
  }
  constexpr bool overlaps(const Slot& y) const {
    if (!y.bound()) return false;
    for (int i = 0; i < count; ++i)
      if (begin[i] < y.offset + y.extent() && y.offset < end[i]) return true;
    return false;
  }
};

// Whether steps a and b touch a common byte of the device arena (a slot of
// one overlaps a slot of the other) or a common parameter; `touched` is a's.
constexpr bool conflict(const Touched& touched, const Step& a, const Step& b) {
  for (int p : a.param)
    for (int q : b.param)
      if (p >= 0 && p == q) return true;
  bool hit = false;
  detail::for_each_slot(b, [&](const Slot& y) { hit = hit || touched.overlaps(y); });
  return hit;
}
constexpr bool conflict(const Step& a, const Step& b) { return conflict(Touched(a), a, b); }

// For each step g in [0, end) whose op runs on a lane other than compute,
// the first later step before `end` that touches any byte or parameter g
// touches: the engine waits for g's work before running that step (or at
// `end`, the end of the micro-batch, when no step does). -1 for the others.
template <const auto& Sched, int End>
constexpr auto join_steps() {
  std::array<int, Sched.steps.size()> at{};
  for (std::size_t g = 0; g < Sched.steps.size(); ++g) {
    at[g] = -1;
    if (static_cast<int>(g) >= End || Sched.steps[g].op.empty() || Sched.steps[g].lane == ops::Lane::compute) continue;
    const Touched touched(Sched.steps[g]);
    int h = static_cast<int>(g) + 1;
    while (h < End && !conflict(touched, Sched.steps[g], Sched.steps[h])) ++h;
    at[g] = h;
  }
  return at;
}

}  // namespace headroom::trainers

#pragma once
// The CUDA engine's optimizer step, the counterpart of host/kernels/optimizer.hpp:
// the global gradient norm with its clip scale, the finiteness check, and
// the machinery an optimizer's kernel is written with (optim/adamw.hpp,
// optim/lion.hpp, ...): one multi-tensor pass over a list of parameters
// (separate buffers of one arena) per call. Element math: math/optim.hpp,
// in f32.
//
// A parameter is a ParamRef: its weight and gradient in the storage type S,
// its f32 master weights (null when S = float: the weight is then its own
// master, or when the run keeps no master copy: the weight is updated through
// f32), and its optimizer state, laid out as the optimizer's desc says
// (state_offset, core/optim_state.hpp). The launchers pack up to 72
// parameters into a TensorList passed by value as a kernel parameter (under
// 4 KB, safe with any driver); a block finds its parameter by binary search
// over the entries' first chunk. Longer lists take several launches.
//
// Non-finite values never enter the weights or the optimizer state: every
// parameter of a list has a position (its index in the step's update order),
// and an update kernel leaves a parameter alone when the loss was not finite
// (control->skip) or when its position is at or after control->first_bad,
// the first position whose gradient was found not finite: by clip_scale_kernel
// (a non-finite global norm sets it to 0: nothing is updated) or, with
// UpdateInBackward, by check_gradients run before each group of updates.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../../math/dynamic_map.hpp"
#include "../../math/optim.hpp"
#include "../../core/workspace.hpp"
#include "../device.cuh"
#include "pointwise.cuh"

namespace headroom::cuda {

struct ParamRef {
  void* weight;         // (n) S
  float* master;        // (n) f32, or null
  const void* grad;     // (n) S
  std::byte* state;     // the optimizer's state (see above), or null
  std::int64_t n;
};

inline constexpr int reduction_slots = 2048;  // squared_norm's partial sums
static_assert(reduction_slots == CudaWorkspace::reduction_slots, "optimizer.cuh: the plan's reductions buffer holds the partial sums");

// What the update kernels read from the device instead of kernel arguments,
// so one captured CUDA graph serves every step: the step's hyperparameters
// (copied in at the start of the step), the clip scale and gradient norm
// (written by squared_norm), the loss of the step (summed by finish_loss),
// a skip flag (set by finish_loss when a loss is not finite, or by an
// LLM.int8 projection that refuses its batch: every update kernel then
// returns at once and the weights stay those of the last step) and the
// first update position whose gradient is not finite (see above).
// It lives in the plan's reductions buffer, after the partial sums.
inline constexpr std::int32_t no_bad_gradient = 0x7fffffff;
inline constexpr int optimizer_step_bytes = 28;  // an optimizer's Step<float>: up to 7 floats (AdamW's)
struct UpdateControl {
  float grad_scale;              // the update's gradient factor: the clip scale / the loss scale
  float norm;                    // global gradient norm before clipping (of the unscaled gradients)
  float loss;                    // mean loss of the step, summed over its micro-batches
  float skip;                    // nonzero: a loss was not finite; no update runs
  std::int32_t first_bad = no_bad_gradient;  // updates at this position and later do not run (no_bad_gradient: none)
  // the optimizer's constants of this step (its Step<float>: lr, betas, bias corrections, ...)
  alignas(float) unsigned char optimizer_step[optimizer_step_bytes] = {};
  std::int32_t step = 0;         // the step in progress (dropout masks: kernels/dropout.cuh); 0: evaluation
  float loss_scale = 1.0f;       // the loss's gradient is multiplied by it (train/loss_scaling.hpp); 1: off
  // LLM.int8 (kernels/llm_int8.cuh): the step's first projection whose input
  // had more outlier columns than the plan's bound (it also sets skip): the
  // columns it found (0: none) and its schedule step.
  std::int32_t outliers_found = 0;
  std::int32_t outlier_step = -1;

  template <class Step>
  HEADROOM_HOST_DEVICE const Step& step_constants() const {
    static_assert(sizeof(Step) <= optimizer_step_bytes, "UpdateControl: an optimizer's Step<float> fits optimizer_step");
    return *reinterpret_cast<const Step*>(optimizer_step);
  }
  template <class Step>
  void set_step_constants(const Step& s) {
    static_assert(sizeof(Step) <= optimizer_step_bytes, "UpdateControl: an optimizer's Step<float> fits optimizer_step");
    std::memcpy(optimizer_step, &s, sizeof(Step));
  }
};
static_assert(sizeof(UpdateControl) <= CudaWorkspace::control_floats * sizeof(float),
              "optimizer.cuh: UpdateControl must fit the plan's control block");

// ---- the by-value parameter list -----------------------------------------------------------------------------------

struct TensorEntry {
  void* weight;
  float* master;
  const void* grad;
  std::byte* state;
  std::int64_t n;
  std::int64_t first_chunk;  // the entry's chunks are [first_chunk, next entry's first_chunk)
  std::int32_t position;     // in the step's update order (UpdateControl::first_bad)
};

template <int Max>
struct TensorList {
  TensorEntry entries[Max];
  int count;
  std::int64_t chunks;  // over all entries

  // The entry that holds `chunk` (< chunks): the last with first_chunk <= chunk.
  __device__ const TensorEntry& find(std::int64_t chunk) const {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (entries[mid].first_chunk <= chunk) lo = mid;
      else hi = mid - 1;
    }
    return entries[lo];
  }
};

inline constexpr int tensor_list_entries = 72;
using ParamList = TensorList<tensor_list_entries>;
static_assert(sizeof(ParamList) <= 4096, "ParamList: keep kernel parameters under 4 KB");

inline constexpr int optimizer_threads = 256;
inline constexpr int optimizer_pack = 8;  // elements per thread and pack
inline constexpr std::int64_t optimizer_chunk = optimizer_threads * optimizer_pack;

namespace optimizer_detail {

// Calls launch_list(list, index) for successive lists of at most tensor_list_entries of
// `params` (entries with n == 0 skipped), each element chunk `chunk` elements;
// params[i] gets the position first_position + i.
template <class Launch>
void for_each_list(std::span<const ParamRef> params, std::int64_t chunk, int first_position, Launch&& launch_list) {
  ParamList list{};
  int index = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    if (p.n <= 0) continue;
    if (list.count == tensor_list_entries) {
      launch_list(list, index++);
      list = ParamList{};
    }
    list.entries[list.count++] = {p.weight, p.master, p.grad, p.state, p.n, list.chunks,
                                  first_position + static_cast<std::int32_t>(i)};
    list.chunks += ceil_div(p.n, chunk);
  }
  if (list.count > 0) launch_list(list, index);
}

// Whether the update of entry e does not run (see the top of this file).
__device__ __forceinline__ bool update_stopped(const UpdateControl* control, const TensorEntry& e) {
  return control->skip != 0.0f || e.position >= control->first_bad;
}

// Calls f(i, Width<K>) for the elements [begin, end) of a chunk: packs of
// optimizer_pack (thread t: [begin + 8 t, begin + 8 t + 8)) when `vectorized`,
// then one element at a time for the rest.
template <class F>
__device__ __forceinline__ void chunk_elements(std::int64_t begin, std::int64_t end, bool vectorized, F&& f) {
  std::int64_t tail = begin;
  if (vectorized) {
    tail = begin + (end - begin) / optimizer_pack * optimizer_pack;
    for (std::int64_t i = begin + threadIdx.x * optimizer_pack; i < tail; i += optimizer_threads * optimizer_pack)
      f(i, packs::Width<optimizer_pack>{});
  }
  for (std::int64_t i = tail + threadIdx.x; i < end; i += optimizer_threads) f(i, packs::Width<1>{});
}

}  // namespace optimizer_detail

// ---- gradient norm and clip scale ----------------------------------------------------------------------------------

// partials[b] (+)= sum of g^2 over the chunks b, b + gridDim.x, ... of the list (in order)
template <class S>
__global__ __launch_bounds__(optimizer_threads) void squared_norm_kernel(const ParamList list, float* __restrict__ partials,
                                                                         bool accumulate) {
  __shared__ float reduce[warp_size];
  float acc = 0.0f;
  for (std::int64_t c = blockIdx.x; c < list.chunks; c += gridDim.x) {
    const TensorEntry& e = list.find(c);
    const S* g = static_cast<const S*>(e.grad);
    const std::int64_t begin = (c - e.first_chunk) * optimizer_chunk;
    const std::int64_t end = begin + optimizer_chunk < e.n ? begin + optimizer_chunk : e.n;
    optimizer_detail::chunk_elements(begin, end, packs::aligned(g), [&](std::int64_t i, auto width) {
      float v[decltype(width)::value];
      packs::load(g + i, v);
      for (float x : v) acc += x * x;
    });
  }
  acc = block_sum<optimizer_threads>(acc, reduce);
  if (threadIdx.x == 0) partials[blockIdx.x] = accumulate ? partials[blockIdx.x] + acc : acc;
}

// control->norm = sqrt(sum of partials: (slots)) / control->loss_scale (the partials sum the scaled gradients'
// squares), control->grad_scale = the clip scale (1 when off or under the limit) / control->loss_scale; a norm
// that is not finite (a NaN or an infinite gradient, or a sum of squares beyond f32) stops every update:
// control->first_bad = 0
template <int Threads>
__global__ __launch_bounds__(Threads) void clip_scale_kernel(const float* __restrict__ partials, int slots,
                                                             UpdateControl* __restrict__ control, float clip_norm) {
  __shared__ float reduce[warp_size];
  float s = 0.0f;
  for (int i = threadIdx.x; i < slots; i += Threads) s += partials[i];
  s = block_sum<Threads>(s, reduce);
  if (threadIdx.x == 0) {
    const float inverse = 1.0f / control->loss_scale;  // exact for a power of two
    const float norm = sqrtf(s) * inverse;
    control->norm = norm;
    control->grad_scale = (clip_norm > 0.0f && norm > clip_norm ? clip_norm / (norm + 1e-6f) : 1.0f) * inverse;
    if (!(norm - norm == 0.0f)) control->first_bad = 0;  // NaN or infinite
  }
}

// The global gradient norm over params' gradients, and the clip scale
// (host Trainer::update's rule), into control->norm and control->grad_scale.
// partials: (reduction_slots). Deterministic: min(reduction_slots - 1,
// chunks) blocks, block b summing chunks b, b + blocks, ... in order (a
// parameter list longer than one launch adds launch after launch into the
// same slots), then one block sums the partial sums.
//
// In two parts for data parallelism, where each rank sums the squares of
// its shards and the ranks add their sums before the norm:
// squared_norm_partials leaves the partial sums in partials (returns how
// many slots), and clip_scale makes norm, scale and the stop flag from the
// sum of `slots` of them.
template <class S>
int squared_norm_partials(std::span<const ParamRef> params, float* partials, cudaStream_t stream) {
  std::int64_t chunks = 0;
  for (const ParamRef& p : params)
    if (p.n > 0) chunks += ceil_div(p.n, optimizer_chunk);
  const int blocks = static_cast<int>(chunks < reduction_slots - 1 ? chunks : reduction_slots - 1);
  optimizer_detail::for_each_list(params, optimizer_chunk, 0, [&](const ParamList& list, int index) {
    launch(squared_norm_kernel<S>, "squared_norm_kernel", dim3(blocks), dim3(optimizer_threads), stream, list, partials, index > 0);
  });
  return blocks;
}
inline void clip_scale(const float* partials, int slots, UpdateControl* control, float clip_norm, cudaStream_t stream) {
  launch(clip_scale_kernel<optimizer_threads>, "clip_scale_kernel", dim3(1), dim3(optimizer_threads), stream, partials, slots, control,
         clip_norm);
}
template <class S>
void squared_norm(std::span<const ParamRef> params, float* partials, UpdateControl* control, float clip_norm,
                  cudaStream_t stream) {
  clip_scale(partials, squared_norm_partials<S>(params, partials, stream), control, clip_norm, stream);
}

// ---- the same sum of squares on the host ---------------------------------------------------------------------------

namespace optimizer_detail {
// block_sum<optimizer_threads> of v[0 .. optimizer_threads) on the host, in
// the device's order: each warp's xor butterfly (lane 0's value), then the
// first warp's butterfly over the warps' sums (0 for the lanes past them).
inline float host_block_sum(const float* v) {
  auto warp = [](float (&w)[warp_size]) {
    for (int o = warp_size / 2; o > 0; o /= 2) {
      float next[warp_size];
      for (int l = 0; l < warp_size; ++l) next[l] = w[l] + w[l ^ o];
      for (int l = 0; l < warp_size; ++l) w[l] = next[l];
    }
    return w[0];
  };
  constexpr int warps = optimizer_threads / warp_size;
  float sums[warp_size] = {};
  for (int w = 0; w < warps; ++w) {
    float lanes[warp_size];
    for (int l = 0; l < warp_size; ++l) lanes[l] = v[w * warp_size + l];
    sums[w] = warp(lanes);
  }
  return warp(sums);
}
}  // namespace optimizer_detail

// squared_norm's sum of squares (before its square root), computed on the
// host from copies of the gradients: values[i] holds params[i].grad's n
// elements (params[i].grad is only looked at for its alignment, which chose
// the kernel's loads). The same additions in the same order as
// squared_norm_partials and clip_scale_kernel (blocks, chunks, lists of
// tensor_list_entries, each thread's packs and tail, the block sums), so the
// result is the device's bit for bit where the host rounds as the device
// does (the CPU emulator; a GPU contracts acc + x x into one FMA, which the
// host may not). for_blocks(blocks, f) calls f(b) for every b in [0, blocks),
// in any order or concurrently.
//
// In two parts, as on the device: squared_norm_partials_on_host leaves
// squared_norm_partials's partial sums in `partials` (returns how many),
// squared_norm_on_host adds them as clip_scale_kernel does.
template <class S, class ForBlocks>
int squared_norm_partials_on_host(std::span<const ParamRef> params, std::span<const S* const> values, std::vector<float>& partials,
                                  ForBlocks&& for_blocks) {
  struct Entry {
    const S* g;
    std::int64_t n, first_chunk;
    bool vectorized;
  };
  std::vector<std::vector<Entry>> lists;
  std::vector<std::int64_t> list_chunks;
  std::int64_t chunks = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].n <= 0) continue;
    if (lists.empty() || static_cast<int>(lists.back().size()) == tensor_list_entries) {
      lists.emplace_back();
      list_chunks.push_back(0);
    }
    lists.back().push_back(Entry{values[i], params[i].n, list_chunks.back(), packs::aligned(params[i].grad)});
    const std::int64_t c = ceil_div(params[i].n, optimizer_chunk);
    list_chunks.back() += c;
    chunks += c;
  }
  const int blocks = static_cast<int>(chunks < reduction_slots - 1 ? chunks : reduction_slots - 1);
  partials.assign(static_cast<std::size_t>(blocks), 0.0f);
  for (std::size_t l = 0; l < lists.size(); ++l) {
    const std::vector<Entry>& list = lists[l];
    for_blocks(blocks, [&](int b) {
      float acc[optimizer_threads] = {};
      std::size_t e = 0;
      for (std::int64_t c = b; c < list_chunks[l]; c += blocks) {
        while (e + 1 < list.size() && list[e + 1].first_chunk <= c) ++e;
        const Entry& x = list[e];
        const std::int64_t begin = (c - x.first_chunk) * optimizer_chunk;
        const std::int64_t end = begin + optimizer_chunk < x.n ? begin + optimizer_chunk : x.n;
        const std::int64_t tail = x.vectorized ? begin + (end - begin) / optimizer_pack * optimizer_pack : begin;
        for (int t = 0; t < optimizer_threads; ++t) {
          for (std::int64_t i = begin + t * optimizer_pack; i < tail; i += optimizer_threads * optimizer_pack)
            for (int k = 0; k < optimizer_pack; ++k) {
              const float v = to_float(x.g[i + k]);
              acc[t] += v * v;
            }
          for (std::int64_t i = tail + t; i < end; i += optimizer_threads) {
            const float v = to_float(x.g[i]);
            acc[t] += v * v;
          }
        }
      }
      const float sum = optimizer_detail::host_block_sum(acc);
      partials[static_cast<std::size_t>(b)] = l > 0 ? partials[static_cast<std::size_t>(b)] + sum : sum;
    });
  }
  return blocks;
}
template <class S, class ForBlocks>
float squared_norm_on_host(std::span<const ParamRef> params, std::span<const S* const> values, ForBlocks&& for_blocks) {
  std::vector<float> partials;
  const int blocks = squared_norm_partials_on_host<S>(params, values, partials, for_blocks);
  float s[optimizer_threads] = {};
  for (int t = 0; t < optimizer_threads; ++t)
    for (int i = t; i < blocks; i += optimizer_threads) s[t] += partials[static_cast<std::size_t>(i)];
  return optimizer_detail::host_block_sum(s);
}


// ---- finiteness of gradients ---------------------------------------------------------------------------------------

// One block per chunk of 2048 elements: when the chunk holds a NaN or an
// infinity, flags[position] = 1 (when flags is not null) and
// control->first_bad = min(control->first_bad, position).
template <class S>
__global__ __launch_bounds__(optimizer_threads) void check_gradients_kernel(const ParamList list, UpdateControl* __restrict__ control,
                                                                            float* __restrict__ flags) {
  __shared__ float reduce[warp_size];
  const TensorEntry& e = list.find(blockIdx.x);
  const S* grad = static_cast<const S*>(e.grad);
  const std::int64_t begin = (blockIdx.x - e.first_chunk) * optimizer_chunk;
  const std::int64_t end = begin + optimizer_chunk < e.n ? begin + optimizer_chunk : e.n;
  float bad = 0.0f;
  optimizer_detail::chunk_elements(begin, end, packs::aligned(grad), [&](std::int64_t i, auto width) {
    float v[decltype(width)::value];
    packs::load(grad + i, v);
    for (float x : v)
      if (!(x - x == 0.0f)) bad = 1.0f;  // NaN or infinite
  });
  bad = block_max<optimizer_threads>(bad, reduce);
  if (threadIdx.x == 0 && bad != 0.0f) {
    if (flags != nullptr) flags[e.position] = 1.0f;
    atomicMin(&control->first_bad, e.position);
  }
}

// Checks params' gradients (positions first_position + i) for NaN and
// infinite values: the updates of the first position found not finite and
// of every later one do not run (control->first_bad); flags: (positions)
// f32, set to 1 at each position found not finite (null: none kept).
// UpdateInBackward runs it before each group of updates; the other runs
// need it only to name the parameter once the global norm came out non-finite.
template <class S>
void check_gradients(std::span<const ParamRef> params, UpdateControl* control, float* flags, cudaStream_t stream,
                     int first_position = 0) {
  optimizer_detail::for_each_list(params, optimizer_chunk, first_position, [&](const ParamList& list, int) {
    launch(check_gradients_kernel<S>, "check_gradients_kernel", dim3(static_cast<unsigned>(list.chunks)),
           dim3(optimizer_threads), stream, list, control, flags);
  });
}

// ---- the step's loss ----------------------------------------------------------------------------------------------

// control->loss += *summed_loss * scale (one micro-batch's mean, over the
// step's micro-batches); control->skip = 1 when that loss is not finite.
// (A template so that the header-only kernel has one definition across translation units.)
template <int = 0>
__global__ void finish_loss_kernel(const float* __restrict__ summed_loss, float scale, UpdateControl* __restrict__ control) {
  const float l = *summed_loss * scale;
  control->loss += l;
  if (!(l - l == 0.0f)) control->skip = 1.0f;  // NaN or infinite
}
inline void finish_loss(const float* summed_loss, float scale, UpdateControl* control, cudaStream_t stream) {
  launch(finish_loss_kernel<>, "finish_loss_kernel", dim3(1), dim3(1), stream, summed_loss, scale, control);
}

// Data parallelism: control->loss, summed over the ranks (an all-reduce),
// becomes their mean; a mean that is not finite (some rank's loss was not)
// sets control->skip on every rank alike.
template <int = 0>
__global__ void mean_loss_kernel(UpdateControl* __restrict__ control, float inv_ranks) {
  const float l = control->loss * inv_ranks;
  control->loss = l;
  if (!(l - l == 0.0f)) control->skip = 1.0f;  // NaN or infinite
}
inline void mean_loss(UpdateControl* control, float inv_ranks, cudaStream_t stream) {
  launch(mean_loss_kernel<>, "mean_loss_kernel", dim3(1), dim3(1), stream, control, inv_ranks);
}

}  // namespace headroom::cuda

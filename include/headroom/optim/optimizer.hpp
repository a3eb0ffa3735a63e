#pragma once
// Optimizers as types. An optimizer is a struct of static members, like an
// op (ops/op.hpp): what the plan needs, and the kernels each engine runs.
//
//   struct Lion {
//     static constexpr std::string_view name = "Lion";
//     // its state, declared once: the plan sizes it, both engines and io lay it out from it
//     static constexpr OptimDesc desc = OptimDesc::of(name, 1, "f32", {StateSection{4, 1}});
//     template <class C> using Step = math::LionStep<C>;            // one step's constants
//     template <class C> static Step<C> step(double lr, int step);  // from the schedule's lr and the step (1, 2, ...)
//
//     // elements [0, n) of a range of one parameter, on the calling thread:
//     // p the values (or their f32 masters), g the gradients, both in C;
//     // `state` where the range's state lies; `table` the model's shared
//     // tables (desc.table_bytes(), filled by fill_tables) or null
//     template <class C>
//     static void update(C* p, const C* g, const StateAt& state, std::int64_t n, const Step<C>& s, C grad_scale,
//                        const float* table);
//
//     // the CUDA engine: one multi-tensor pass over params (cuda/kernels/optimizer.cuh),
//     // reading its Step<float> from the control block; declared where the
//     // CUDA kernels are compiled (HEADROOM_CUDA_KERNELS)
//     template <class S>
//     static void update(std::span<const cuda::ParamRef> params, const cuda::UpdateControl* control, const float* table,
//                        bool clip, cudaStream_t stream, int first_position);
//   };
//
// The host engine runs `update` over ranges of each parameter on its
// workers (a 16-bit parameter through its f32 master weights), and so does
// the CUDA engine where the optimizer is offloaded to the CPU. A range starts
// on a multiple of desc.align elements (AdamW8bit's 256-element blocks).
//
// The built-in optimizers: SGD (optim/sgd.hpp), AdamW (optim/adamw.hpp),
// AdamW8bit (optim/adamw8bit.hpp) and Lion (optim/lion.hpp).
#include "../core/optim_state.hpp"

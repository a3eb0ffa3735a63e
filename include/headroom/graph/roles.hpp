#pragma once
// The vocabulary of the plan: roles, tiers and event kinds.
#include <cstdint>
#include <string_view>

namespace headroom {

// What a buffer is for. Every byte of a step has exactly one role.
enum class Role : std::uint8_t {
  weights,           // parameters as stored (dense or quantized codes)
  quant_scales,      // block absmaxes of quantized weights and shared code tables
  master_weights,    // f32 copies of 16-bit trainable weights
  grads,             // gradients of trainable parameters
  optimizer_state,   // momentum / Adam moments (f32 or block-wise 8-bit)
  batch_io,          // token ids, targets, loss
  saved_activation,  // produced in forward, read again in backward
  activation,        // produced in forward (or recompute), read only in forward
  activation_grad,   // gradient of an activation, flowing backward
  recompute,         // produced by a checkpointed layer's recompute, read in its backward
  scratch,           // lives inside one event (GEMM panels, logits chunks, attention tiles)
  communication,     // what a collective sends or receives: a gradient bucket before its reduce-scatter,
                     // parameters gathered from their shards (sharded data parallelism)
};
inline constexpr int role_count = 12;

constexpr std::string_view name_of(Role r) {
  switch (r) {
    case Role::weights: return "weights";
    case Role::quant_scales: return "quant scales";
    case Role::master_weights: return "master weights";
    case Role::grads: return "grads";
    case Role::optimizer_state: return "optimizer state";
    case Role::batch_io: return "batch io";
    case Role::saved_activation: return "saved activation";
    case Role::activation: return "activation";
    case Role::activation_grad: return "activation grad";
    case Role::recompute: return "recompute";
    case Role::scratch: return "scratch";
    case Role::communication: return "communication";
  }
  return "?";
}

// Where a buffer lives: device memory (host RAM for the host backend) or the
// offload tier (pinned host RAM for CUDA, a file-backed mapping on the host).
enum class Tier : std::uint8_t { device, offload };
inline constexpr int tier_count = 2;

constexpr std::string_view name_of(Tier t) { return t == Tier::device ? "device" : "offload"; }

// One step of the training timeline.
// collective: a communication between ranks (a gradient bucket reduced, a
// layer's parameters gathered from their shards), run by an op on the
// communication lane.
// fetch: parameters kept in the offload tier (OffloadParameters) copied
// into device buffers for the compute event after it.
enum class EventKind : std::uint8_t { load_batch, forward, loss, backward, recompute, offload, prefetch, update, collective, fetch };

constexpr std::string_view name_of(EventKind k) {
  switch (k) {
    case EventKind::load_batch: return "load batch";
    case EventKind::forward: return "forward";
    case EventKind::loss: return "loss";
    case EventKind::backward: return "backward";
    case EventKind::recompute: return "recompute";
    case EventKind::offload: return "offload";
    case EventKind::prefetch: return "prefetch";
    case EventKind::update: return "update";
    case EventKind::collective: return "collective";
    case EventKind::fetch: return "fetch";
  }
  return "?";
}

}  // namespace headroom

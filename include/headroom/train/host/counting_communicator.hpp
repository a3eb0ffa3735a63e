#pragma once
// host::CountingCommunicator: forwards every call to another Communicator and
// counts what passed, by kind, in the terms of the plan's Communication
// (plan/plan.hpp): the payload of each collective (the bytes of the whole
// buffer reduced or gathered) and the calls. Single-element all-reduces of
// F64 (the loss and the squared gradient norm the engine reduces) are
// counted apart, as scalars.
//
//   host::MpiCommunicator mpi;
//   host::CountingCommunicator comm(mpi);
//   host::Trainer<Run> t(options, comm);
//   t.step(tokens, targets);
//   comm.counted().all_gather == host::Trainer<Run>::plan.communication.all_gather
#include <cstdint>
#include <memory>
#include <utility>

#include "../../host/communicator.hpp"
#include "../../plan/plan.hpp"

namespace headroom::host {

class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }

  void all_reduce_sum(void* data, std::int64_t n, DType t) override {
    if (n == 1 && t == DType::F64) {
      ++scalars_;
    } else {
      counted_.all_reduce += n * size_of(t);
      ++counted_.all_reduce_calls;
    }
    inner_.all_reduce_sum(data, n, t);
  }
  void reduce_scatter_sum(const void* send, void* recv, std::int64_t n, DType t) override {
    counted_.reduce_scatter += n * size() * size_of(t);
    ++counted_.reduce_scatter_calls;
    inner_.reduce_scatter_sum(send, recv, n, t);
  }
  void all_gather(void* data, std::int64_t block_bytes) override {
    counted_.all_gather += block_bytes * size();
    ++counted_.all_gather_calls;
    inner_.all_gather(data, block_bytes);
  }
  void send(const void* data, std::int64_t bytes, int peer, int tag) override {
    sent_ += bytes;
    inner_.send(data, bytes, peer, tag);
  }
  void begin_send(const void* data, std::int64_t bytes, int peer, int tag) override {
    sent_ += bytes;
    inner_.begin_send(data, bytes, peer, tag);
  }
  void finish_send(int peer, int tag) override { inner_.finish_send(peer, tag); }
  void recv(void* data, std::int64_t bytes, int peer, int tag) override {
    received_ += bytes;
    inner_.recv(data, bytes, peer, tag);
  }
  void barrier() override { inner_.barrier(); }
  // The group counts its own calls (the communicator returned), not this one.
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<CountingCommunicator>(inner_.split(color, key));
  }
  // Owns the communicator it counts (a group split from another).
  explicit CountingCommunicator(std::unique_ptr<Communicator> owned) : owned_(std::move(owned)), inner_(*owned_) {}

  const Communication& counted() const { return counted_; }
  std::int64_t scalars() const { return scalars_; }
  std::int64_t sent() const { return sent_; }
  std::int64_t received() const { return received_; }
  void reset() {
    counted_ = Communication{};
    scalars_ = sent_ = received_ = 0;
  }

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  Communication counted_{};
  std::int64_t scalars_ = 0, sent_ = 0, received_ = 0;
};

}  // namespace headroom::host

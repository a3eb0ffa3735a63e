// Data-parallel training speed and communication, one configuration per
// run: started by bench/distributed under mpirun (or alone, for one rank).
// Trains the GPT-2-shaped benchmark model of bench/compare (d 768, 4 layers,
// 12 heads, GPT-2's vocabulary; full fine-tuning with AdamW) with Batch<4>
// x Seq<256> per rank, on pseudo-random tokens, and prints one JSON line
// (rank 0): the global tokens/s of the timed steps, each rank's peak
// resident memory against its plan, and the bytes each collective moved in
// a step against the plan's count.
//
//   mpirun -np N data_parallel_bench --zero S [--steps K] [--warmup K] [--threads T] [--overlap]
//   data_parallel_bench --zero 0             (one process: the baseline)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/host/resident.hpp>
#include <headroom/train/host/counting_communicator.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <vector>

using namespace headroom;

namespace {

constexpr models::GPT2Config gpt2_d768_l4{50257, 768, 4, 12, 1024};
using Model = models::GPT2<gpt2_d768_l4>;
constexpr int max_workers = 2;
template <int N, int S>
using Run = Train<Model, Batch<4>, Seq<256>, AdamW, Workers<max_workers>, DataParallel<N>, ZeRO<S>>;
using OneRun = Train<Model, Batch<4>, Seq<256>, AdamW, Workers<max_workers>>;

struct Args {
  int zero = 0, steps = 4, warmup = 1, threads = 1;
  bool overlap = false;
};

template <class Tr>
std::vector<std::int32_t> tokens(int rank, int step) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(Tr::tokens_per_step));
  std::uint32_t x = 12345u + 7919u * static_cast<std::uint32_t>(rank) + 104729u * static_cast<std::uint32_t>(step);
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<std::int32_t>((x >> 9) % gpt2_d768_l4.vocab);
  }
  return t;
}

template <class Tr>
int train(const Args& a, host::Communicator* mpi) {
  host::TrainOptions o{.seed = 1, .threads = a.threads, .lr = 1e-4, .clip_norm = 1.0, .overlap_communication = a.overlap};
  std::unique_ptr<host::CountingCommunicator> counting = mpi ? std::make_unique<host::CountingCommunicator>(*mpi) : nullptr;
  std::unique_ptr<Tr> t;
  if constexpr (Tr::config.dp > 1) t = std::make_unique<Tr>(o, *counting);
  else t = std::make_unique<Tr>(o);
  const int rank = t->rank(), ranks = Tr::config.dp;
  double loss = 0;
  auto step = [&](int s) {
    const auto x = tokens<Tr>(rank, s), y = tokens<Tr>(rank, s + 1000);
    loss = t->step(x, y).loss;
  };
  for (int s = 0; s < a.warmup; ++s) step(s);
  if (counting) counting->reset();
  if (mpi) mpi->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < a.steps; ++s) step(a.warmup + s);
  if (mpi) mpi->barrier();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // every rank's peak resident memory, against its plan
  double rss = static_cast<double>(host::peak_resident_bytes());
  std::vector<double> all(static_cast<std::size_t>(ranks), 0.0);
  all[static_cast<std::size_t>(rank)] = rss;
  if (mpi) mpi->all_reduce_sum(all.data(), ranks, DType::F64);
  if (rank != 0) return 0;
  std::string rss_list;
  for (double r : all) rss_list += (rss_list.empty() ? "" : ", ") + std::to_string(static_cast<long long>(r));
  const Communication planned = Tr::plan.communication;
  const Communication counted = counting ? counting->counted() : Communication{};
  std::printf("{\"ranks\": %d, \"zero\": %d, \"overlap\": %s, \"threads\": %d, \"steps\": %d, \"tokens_per_s\": %.2f, \"step_s\": %.4f, "
              "\"loss\": %.6f, \"plan_bytes\": %lld, \"peak_rss\": [%s], "
              "\"comm_planned\": {\"all_reduce\": %lld, \"reduce_scatter\": %lld, \"all_gather\": %lld}, "
              "\"comm_counted\": {\"all_reduce\": %lld, \"reduce_scatter\": %lld, \"all_gather\": %lld}, "
              "\"sent_per_rank_planned\": %.0f}\n",
              ranks, Tr::config.zero, a.overlap ? "true" : "false", a.threads, a.steps, a.steps * static_cast<double>(Tr::tokens_per_step) * ranks / secs,
              secs / a.steps, loss, static_cast<long long>(Tr::plan.peak_bytes()), rss_list.c_str(),
              static_cast<long long>(planned.all_reduce * a.steps), static_cast<long long>(planned.reduce_scatter * a.steps),
              static_cast<long long>(planned.all_gather * a.steps), static_cast<long long>(counted.all_reduce),
              static_cast<long long>(counted.reduce_scatter), static_cast<long long>(counted.all_gather),
              planned.sent_per_rank(ranks) * a.steps);
  return 0;
}

template <int N>
int dispatch(const Args& a, host::Communicator* mpi) {
  switch (a.zero) {
    case 0: return train<host::Trainer<Run<N, 0>>>(a, mpi);
    case 1: return train<host::Trainer<Run<N, 1>>>(a, mpi);
    case 2: return train<host::Trainer<Run<N, 2>>>(a, mpi);
    case 3: return train<host::Trainer<Run<N, 3>>>(a, mpi);
  }
  std::fprintf(stderr, "data_parallel_bench: --zero must be 0..3\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const int v = i + 1 < argc ? std::atoi(argv[i + 1]) : 0;
    if (k == "--zero") a.zero = v, ++i;
    else if (k == "--steps") a.steps = v, ++i;
    else if (k == "--warmup") a.warmup = v, ++i;
    else if (k == "--threads") a.threads = v, ++i;
    else if (k == "--overlap") a.overlap = true;
    else {
      std::fprintf(stderr, "usage: data_parallel_bench --zero S [--steps K] [--warmup K] [--threads T] [--overlap]\n");
      return 2;
    }
  }
  if (a.threads < 1 || a.threads > max_workers) {
    std::fprintf(stderr, "data_parallel_bench: --threads must be 1..%d\n", max_workers);
    return 2;
  }
  host::MpiCommunicator mpi(std::chrono::seconds(600));
  try {
    switch (mpi.size()) {
      case 1: return train<host::Trainer<OneRun>>(a, nullptr);
      case 2: return dispatch<2>(a, &mpi);
      case 4: return dispatch<4>(a, &mpi);
    }
    std::fprintf(stderr, "data_parallel_bench: run it with 1, 2 or 4 ranks\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel_bench: %s\n", e.what());
    return 1;
  }
}

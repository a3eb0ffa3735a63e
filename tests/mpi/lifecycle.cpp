// MpiCommunicator initializing and finalizing MPI itself (ctest
// mpi.lifecycle.np1 / .np2), and leaving a program's own SIGTERM handler
// alone (mpi.lifecycle_own_handler.np2, argument own-handler). A plain main:
// prints what failed and returns 1.
#include <headroom/host/mpi.hpp>

#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

using headroom::DType;
using headroom::host::communication_error;
using headroom::host::MpiCommunicator;

namespace {

int failures = 0;
#define EXPECT(cond)                                                             \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::printf("lifecycle: FAILED at line %d: %s\n", __LINE__, #cond);       \
      ++failures;                                                                \
    }                                                                            \
  } while (0)

void (*term_handler())(int) {
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  return now.sa_handler;
}

bool initialized() {
  int f = 0;
  MPI_Initialized(&f);
  return f != 0;
}
bool finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

void sums(MpiCommunicator& c) {
  std::vector<double> v(100, c.rank() + 1.0);
  c.all_reduce_sum(v.data(), 100, DType::F64);
  EXPECT(v[99] == c.size() * (c.size() + 1) / 2.0);
  std::vector<float> send(static_cast<std::size_t>(3 * c.size()), 2.0f), recv(3, 0.0f);
  c.reduce_scatter_sum(send.data(), recv.data(), 3, DType::F32);
  EXPECT(recv[2] == 2.0f * static_cast<float>(c.size()));
  std::vector<int> ranks(static_cast<std::size_t>(c.size()), -1);
  ranks[static_cast<std::size_t>(c.rank())] = c.rank();
  c.all_gather(ranks.data(), sizeof(int));
  for (int r = 0; r < c.size(); ++r) EXPECT(ranks[static_cast<std::size_t>(r)] == r);
  EXPECT(c.agree(42) == 42);
}

void own_term(int) {}

}  // namespace

int main(int argc, char** argv) {
  const bool own_handler = argc > 1 && std::string(argv[1]) == "own-handler";
  if (own_handler) {
    struct sigaction mine {};
    mine.sa_handler = &own_term;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGTERM, &mine, nullptr);
  }
  EXPECT(!initialized());
  {
    MpiCommunicator c(std::chrono::seconds(20));
    EXPECT(initialized());
    int level = -1;
    MPI_Query_thread(&level);
    EXPECT(level == MPI_THREAD_MULTIPLE);
    if (own_handler)
      EXPECT(term_handler() == &own_term);  // the program's own handler is left alone
    else
      EXPECT(term_handler() != SIG_DFL);  // the one-line report on mpirun's SIGTERM
    sums(c);
    {
      MpiCommunicator second(std::chrono::seconds(20));
      second.barrier();
      sums(second);
    }
    EXPECT(!finalized());  // the first one still lives
    sums(c);
  }
  EXPECT(finalized());  // the last MpiCommunicator finalized what the first initialized
  EXPECT(term_handler() == (own_handler ? &own_term : SIG_DFL));
  try {
    MpiCommunicator again;
    EXPECT(!"a communicator after MPI_Finalize");
  } catch (const communication_error& e) {
    EXPECT(std::string(e.what()).find("MPI was already finalized") != std::string::npos);
  }
  if (failures == 0) std::printf("lifecycle: ok\n");
  return failures == 0 ? 0 : 1;
}

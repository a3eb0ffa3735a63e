// Jobs that fail on purpose, run under mpirun by tests/mpi/run_fault.cmake,
// which checks what they print and that mpirun exits nonzero in bounded time
// (ctest mpi.fault_*). faults <scenario>:
//   hang       the last rank stops participating (sleeps) before an all_reduce_sum;
//              the others must throw communication_error after the 2 s timeout,
//              naming themselves and the call, and refuse later calls
//   hang-recv  rank 1 never sends; rank 0's recv must time out naming rank 1
//   kill       every rank loops all_reduce_sum; the last rank SIGKILLs itself
//              after 0.5 s: mpirun SIGTERMs the others, each prints one line
//              (the MpiCommunicator's SIGTERM handler) and exits 143
//   abort      rank 0 calls abort("...") while the others wait in a barrier
// Lines starting "headroom-test:" are this program's; a check that fails
// prints "headroom-test: FAILED ...".
#include <headroom/host/mpi.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using headroom::DType;
using headroom::host::communication_error;
using headroom::host::MpiCommunicator;
using clock_type = std::chrono::steady_clock;

namespace {

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

int fail(const std::string& what) {
  std::printf("headroom-test: FAILED: %s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

// A survivor's expected timeout: reported with how long it took, then every later call refused.
int expect_timeout(MpiCommunicator& comm, const std::string& call_text, double timeout_s, void (*call)(MpiCommunicator&)) {
  const auto t0 = clock_type::now();
  try {
    call(comm);
  } catch (const communication_error& e) {
    const double took = since(t0);
    const std::string what = e.what();
    if (!contains(what, comm.who() + ": " + call_text + " did not complete within 2 s")) return fail("message: " + what);
    if (took < timeout_s || took > timeout_s + 2.0) return fail("timed out after " + std::to_string(took) + " s: " + what);
    if (!comm.failed()) return fail("failed() is false after a timeout");
    try {
      comm.barrier();
      return fail("a barrier after the timeout did not throw");
    } catch (const communication_error& later) {
      if (!contains(later.what(), "barrier refused: this communicator failed earlier"))
        return fail(std::string("later call: ") + later.what());
    }
    char took_text[32];
    std::snprintf(took_text, sizeof took_text, "%.2f", took);
    std::printf("headroom-test: %s (after %s s)\n", what.c_str(), took_text);
    std::fflush(stdout);
    // The communicator failed: its destructor leaves MPI alone, and the
    // process ends without MPI_Finalize, which makes mpirun end the job.
    return 1;
  }
  return fail(comm.who() + ": " + call_text + " returned, but a rank was not participating");
}

int hang() {
  MpiCommunicator comm(std::chrono::seconds(2));
  std::vector<float> v(1024, 1.0f);
  comm.all_reduce_sum(v.data(), 1024, DType::F32);  // all present once
  if (v[0] != static_cast<float>(comm.size())) return fail("the first all_reduce_sum is wrong");
  if (comm.rank() == comm.size() - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // stopped: mpirun's SIGTERM ends it
    return fail("the sleeping rank was not stopped by the launcher");
  }
  return expect_timeout(comm, "all_reduce_sum of 1024 f32", 2.0, [](MpiCommunicator& c) {
    std::vector<float> w(1024, 1.0f);
    c.all_reduce_sum(w.data(), 1024, DType::F32);
  });
}

int hang_recv() {
  MpiCommunicator comm(std::chrono::seconds(2));
  comm.barrier();
  if (comm.rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return fail("the silent rank was not stopped by the launcher");
  }
  return expect_timeout(comm, "recv of 64 bytes from rank 1 (tag 7)", 2.0, [](MpiCommunicator& c) {
    char buf[64];
    c.recv(buf, 64, 1, 7);
  });
}

int kill() {
  MpiCommunicator comm;  // the default 60 s: the survivors must be ended by the launcher, not by a timeout
  std::vector<float> v(1 << 18, 1.0f);
  if (comm.rank() == comm.size() - 1) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const auto us =
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
      char line[64];
      int n = std::snprintf(line, sizeof line, "headroom-test: killed at %lld\n", static_cast<long long>(us));
      ssize_t ignored = ::write(STDOUT_FILENO, line, static_cast<std::size_t>(n));
      (void)ignored;
      ::kill(::getpid(), SIGKILL);
    }).detach();
  }
  const auto t0 = clock_type::now();
  try {
    while (since(t0) < 30.0) comm.all_reduce_sum(v.data(), static_cast<std::int64_t>(v.size()), DType::F32);
  } catch (const communication_error& e) {
    return fail(std::string("a survivor threw instead of being stopped by the launcher: ") + e.what());
  }
  return fail("30 s of all_reduce_sum and nobody was stopped");
}

int abort_job() {
  MpiCommunicator comm;
  comm.barrier();
  if (comm.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm.abort("the test gives up");
  }
  try {
    comm.barrier();  // never completes: rank 0 does not come
  } catch (const communication_error& e) {
    return fail(std::string("a rank threw instead of being stopped by the launcher: ") + e.what());
  }
  return fail("the barrier completed without rank 0");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "hang") return hang();
  if (scenario == "hang-recv") return hang_recv();
  if (scenario == "kill") return kill();
  if (scenario == "abort") return abort_job();
  std::fprintf(stderr, "usage: faults hang | hang-recv | kill | abort\n");
  return 2;
}

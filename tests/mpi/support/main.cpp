// The main of the Catch2 mpi tests (tests/mpi/CMakeLists.txt): every rank
// runs the whole session. MPI is initialized here, once, before the session
// and finalized after it, so test cases construct and destroy
// MpiCommunicators as they like (one that finds MPI initialized leaves
// finalizing to the program). A rank whose session fails ends the job with
// MPI_Abort: the other ranks may be waiting for it in a collective, and
// mpirun then exits nonzero, failing the ctest entry.
#include "catch_session.hpp"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "mpi tests: MPI_Init_thread failed\n");
    return 2;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int result = headroom_test::run_catch_session(argc, argv);
  if (result != 0) {
    std::fprintf(stderr, "mpi tests: rank %d failed %d test case(s); aborting the job\n", rank, result);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}

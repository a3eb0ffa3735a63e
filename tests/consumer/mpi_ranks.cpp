// Built against an installed headroom and the system's MPI by the
// consumer_package test, with the CMake lines docs/distributed.md gives
// (headroom::headroom and MPI::MPI_CXX alone): the MPI communicator compiles
// and links. Given an argument (under mpirun), it also joins the ranks.
#include <headroom/host/mpi.hpp>

#include <cstdio>

int main(int argc, char**) {
  if (argc > 1) {
    headroom::host::MpiCommunicator comm;
    std::printf("rank %d of %d\n", comm.rank(), comm.size());
  }
  std::printf("headroom consumer: the MPI communicator linked\n");
  return 0;
}

#pragma once
// Catch2's session for the test programs that own their main (the emulated
// and nvcc-built CUDA programs, the mpi programs): their main does its own
// setup, then calls run_catch_session. Catch2's implementation is compiled
// once, in catch_session.cpp (the headroom_catch_session library), instead of
// once per program (CATCH_CONFIG_RUNNER in each main: ~14 CPU-s of g++ -O0
// each). The programs with no main of their own link Catch2's
// Catch2WithMain.

namespace headroom_test {

// Runs the test cases argv selects, as Catch::Session().run(argc, argv); the
// session is destroyed when it returns. Returns the number of failed test
// cases, capped at 255.
int run_catch_session(int argc, char** argv);

}  // namespace headroom_test

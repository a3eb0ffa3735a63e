// Catch2's implementation and session, compiled once for every test program
// that owns its main (catch_session.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

namespace headroom_test {

int run_catch_session(int argc, char** argv) {
  Catch::Session session;
  return session.run(argc, argv);
}

}  // namespace headroom_test

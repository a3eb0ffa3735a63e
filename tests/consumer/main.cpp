// Built against an installed headroom by the consumer_package test.
#include <headroom/headroom.hpp>

#include <cstdio>

static_assert(headroom::version_major == 0);

int main() {
  std::printf("headroom consumer: found headroom %d.x via find_package\n", headroom::version_major);
  return 0;
}

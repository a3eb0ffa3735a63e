#pragma once
// The tests' call of the layer test harness: test_layer<L, Options...>()
// passes, compared some gradient elements and ran some steps in a poisoned
// arena; the report is shown when it fails.
#include <catch2/catch.hpp>

#include <headroom/testing/layer_test.hpp>

template <class L, class... Options>
void check_layer() {
  const headroom::testing::LayerTestResult r = headroom::testing::test_layer<L, Options...>();
  INFO(r.report);
  CHECK(r.passed);
  CHECK(r.elements_checked > 0);
  CHECK(r.steps_checked > 0);
}

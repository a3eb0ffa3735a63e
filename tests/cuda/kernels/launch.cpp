// Every launch the engine makes is checked: a configuration CUDA refuses
// (here grids past an H200's limits, which the launchers compute from the
// shapes they are given) does nothing on a GPU and would only show up as
// wrong numbers; cuda::launch reads cudaGetLastError after the launch and
// throws cuda_error naming the kernel and its shape. The kernels are refused
// before they run, so their pointers are never read.
#include "../support/kernel_test.hpp"

#include <headroom/cuda/kernels/attention.cuh>
#include <headroom/cuda/kernels/optimizer.cuh>

#include <cstdint>
#include <vector>

namespace headroom::launch_test {

using cuda::bf16;

TEST_CASE("launchers: a refused launch throws cuda_error naming the kernel and its grid", "[launch]") {
  REQUIRE(cudaGetLastError() == cudaSuccess);
  SECTION("attention backward over 65,535 sequences of 65,535 heads: delta's grid.x above 2^31 - 1") {
    // delta = rowsum(dO * O) takes one warp per (b, h, t) row, 8 rows per block:
    // 65,535 x 65,535 x 8 / 8 = 4,294,836,225 blocks
    const cuda::AttentionShape d{65535, 8, 65535, 1, 8, false, 10000.0f};
    bf16* any = reinterpret_cast<bf16*>(std::uintptr_t{256});
    float* f = reinterpret_cast<float*>(std::uintptr_t{256});
    CHECK_THROWS_WITH(cuda::attention_backward<bf16>(d, any, 65535 * 8, any, 8, any, 8, any, f, any, any, 65535 * 8, any, 8, any, 8, f,
                                                     nullptr),
                      Catch::Contains("attention_delta_kernel") && Catch::Contains("cudaErrorInvalidConfiguration") &&
                          Catch::Contains("grid (4294836225, 1, 1)"));
  }
  SECTION("AdamW over a parameter of 2^43 elements: 2^32 chunks, a grid.x that wraps to 0") {
    const cuda::ParamRef p{reinterpret_cast<void*>(std::uintptr_t{256}), nullptr, reinterpret_cast<const void*>(std::uintptr_t{256}),
                           reinterpret_cast<std::byte*>(std::uintptr_t{256}), std::int64_t{1} << 43};
    const auto* control = reinterpret_cast<const cuda::UpdateControl*>(std::uintptr_t{256});
    CHECK_THROWS_WITH(AdamW::update<float>(std::vector<cuda::ParamRef>{p}, control, nullptr, false, nullptr, 0),
                      Catch::Contains("adamw_kernel") && Catch::Contains("grid (0, 1, 1)"));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace headroom::launch_test

// CUDA compiles from day one: this translation unit includes the DSL and the
// planner, evaluates a plan under nvcc, and runs a kernel template whose
// compile-time arguments come from a layer's lowered descriptor.
// Exit code 77 (skipped) where no CUDA device / driver is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <headroom/headroom.hpp>

using namespace headroom;

using Proj = Quantized<NF4, LoRA<4, Linear<64, 32>>>;
constexpr ProjectionDesc desc = lower_projection<Proj>();
static_assert(desc.in == 64 && desc.out == 32 && desc.lora_rank == 4 && desc.quant.kind == QuantKind::nf4);
static_assert(desc.quant.block == 64 && desc.frozen);

using TinyRun = Train<models::Llama<models::tiny_llama, Apply<LoRA<8>, On<q_proj, v_proj>>>, Batch<1>, Seq<32>>;
constexpr auto tiny_plan = plan<TinyRun>();
static_assert(tiny_plan.trainable_parameters() == 4 * (8 * (256 + 256) + 8 * (256 + 128)));

// y (N, Out) = s * B (Out, R) . (A (R, In) . x (N, In)): the LoRA path, dims fixed at compile time.
template <std::int64_t In, std::int64_t Out, int Rank>
__global__ void lora_delta(const float* x, const float* a, const float* b, float scale, float* y, int n) {
  static_assert(Rank >= 1 && In > 0 && Out > 0, "lora_delta: dims from the lowered descriptor");
  const int row = blockIdx.x;
  const int col = threadIdx.x;
  if (row >= n || col >= Out) return;
  float ax[Rank];
  for (int r = 0; r < Rank; ++r) {
    float s = 0.f;
    for (std::int64_t i = 0; i < In; ++i) s += a[r * In + i] * x[row * In + i];
    ax[r] = s;
  }
  float acc = 0.f;
  for (int r = 0; r < Rank; ++r) acc += b[col * Rank + r] * ax[r];
  y[row * Out + col] = scale * acc;
}

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice || err == cudaErrorStubLibrary || devices == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", cudaGetErrorString(err));
    return 77;
  }
  constexpr int n = 3;
  std::vector<float> x(n * desc.in), a(desc.lora_rank * desc.in), b(desc.out * desc.lora_rank), y(n * desc.out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::cos(0.07f * i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.01f * static_cast<float>(i % 13);
  const float scale = static_cast<float>(desc.alpha_num) / static_cast<float>(desc.alpha_den * desc.lora_rank);
  float *dx, *da, *db, *dy;
  cudaMalloc(&dx, x.size() * 4);
  cudaMalloc(&da, a.size() * 4);
  cudaMalloc(&db, b.size() * 4);
  cudaMalloc(&dy, y.size() * 4);
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  lora_delta<desc.in, desc.out, desc.lora_rank><<<n, desc.out>>>(dx, da, db, scale, dy, n);
  cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
  double worst = 0;
  for (int row = 0; row < n; ++row)
    for (int col = 0; col < desc.out; ++col) {
      double acc = 0;
      for (int r = 0; r < desc.lora_rank; ++r) {
        double s = 0;
        for (int i = 0; i < desc.in; ++i) s += a[r * desc.in + i] * x[row * desc.in + i];
        acc += b[col * desc.lora_rank + r] * s;
      }
      worst = std::fmax(worst, std::fabs(scale * acc - y[row * desc.out + col]));
    }
  cudaFree(dx);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dy);
  std::printf("lora_delta<%lld, %lld, %d>: max |err| = %g; tiny plan peak %lld bytes\n", (long long)desc.in,
              (long long)desc.out, desc.lora_rank, worst, (long long)tiny_plan.peak_bytes());
  return worst < 1e-3 ? 0 : 1;
}

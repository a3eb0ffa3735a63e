#pragma once
// GEMMs through cuBLASLt, in the row-major terms the rest of headroom uses:
//
//   C (m, n) = alpha op(A) op(B) + beta C     [+ bias (n) per row]   [then C = gelu(pre), pre kept]
//
// with bf16 / f16 / f32 operands and f32 accumulation (CUBLAS_COMPUTE_32F).
// cuBLASLt is column-major: a row-major (r, c) matrix is its column-major
// transpose, so C^T = op(B)^T op(A)^T is computed with the operands swapped.
// Epilogues: bias (CUBLASLT_EPILOGUE_BIAS) and bias + GELU keeping the
// pre-activation as the auxiliary output (CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
// cuBLASLt's GELU is the tanh form, GPT-2's), which is exactly the pair of
// tensors the plan holds for a Linear followed by GELU.
//
// The workspace is the plan's "cublaslt workspace" buffer (CudaWorkspace,
// graph/graph.hpp). Each distinct product (shape, layouts, strides, epilogue,
// and the alignment of each of its pointers: A, B, C = D, bias, aux) is
// described and given an algorithm once, the first time it runs, with every
// pointer attribute that may steer the choice (bias, aux) already set on the
// descriptor; later steps look it up in a fixed table made at construction,
// so a step allocates nothing. An algorithm is only ever used with pointers
// at least as aligned as the ones it was chosen for.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cublasLt.h>

#include "device.cuh"
#include "runtime.cuh"

namespace headroom::cuda {

enum class Trans : std::uint8_t { no, yes };
enum class GemmEpilogue : std::uint8_t { none, bias, gelu_aux_bias };

inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("headroom::cuda: ") + what + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

template <class S>
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<S, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<S, bf16>) return CUDA_R_16BF;
  else return CUDA_R_16F;
}

class Blas {
 public:
  static constexpr int max_products = 1024;  // distinct products one run may use

  Blas(void* workspace, std::int64_t workspace_bytes) : workspace_(workspace), workspace_bytes_(workspace_bytes) {
    check(cublasLtCreate(&handle_), "cublasLtCreate");
    products_.reserve(max_products);
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  ~Blas() {
    for (Product& p : products_) {
      cublasLtMatmulDescDestroy(p.op);
      for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c}) cublasLtMatrixLayoutDestroy(l);
    }
    cublasLtDestroy(handle_);
  }

  // C (m, n) = alpha op(A) op(B) + beta C, row-major; op(A): (m, k), op(B): (k, n).
  // bias: (n) added to every row; with GemmEpilogue::gelu_aux_bias, `pre`
  // (m, n, stride ldc) receives A B + bias and C receives gelu of it.
  template <class S>
  void gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const S* a, std::int64_t lda,
            const S* b, std::int64_t ldb, float beta, S* c, std::int64_t ldc, cudaStream_t stream,
            GemmEpilogue epilogue = GemmEpilogue::none, const S* bias = nullptr, S* pre = nullptr) {
    if (m == 0 || n == 0) return;
    Key key{};
    key.ta = ta;
    key.tb = tb;
    key.epilogue = epilogue;
    key.type = data_type<S>();
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.align_a = alignment(a), key.align_b = alignment(b), key.align_c = alignment(c);
    key.align_bias = epilogue != GemmEpilogue::none ? alignment(bias) : 0;
    key.align_aux = epilogue == GemmEpilogue::gelu_aux_bias ? alignment(pre) : 0;
    Product& p = find(key, bias, pre);
    set_pointers(p, bias, pre);
    // column-major: D^T (n, m) = op(B)^T (n, k) op(A)^T (k, m)
    check(cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo, workspace_,
                         static_cast<std::size_t>(workspace_bytes_), stream),
          "cublasLtMatmul");
  }

  int products() const { return static_cast<int>(products_.size()); }
  // True where cuBLASLt can fuse bias + GELU for an output with this row stride
  // (its auxiliary output's leading dimension must be a multiple of 8).
  static bool gelu_epilogue_fits(std::int64_t ldc) { return ldc % 8 == 0; }

 private:
  struct Key {
    Trans ta{}, tb{};
    GemmEpilogue epilogue{};
    cudaDataType_t type{};
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    // bytes each pointer is aligned to (up to 256): A, B, C = D, bias and aux (0: none)
    std::int64_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
    bool operator==(const Key&) const = default;
  };
  struct Product {
    Key key{};
    cublasLtMatmulDesc_t op{};
    cublasLtMatrixLayout_t a{}, b{}, c{};  // cuBLASLt's A (our B), B (our A), C = D
    cublasLtMatmulAlgo_t algo{};
  };

  cublasLtHandle_t handle_{};
  void* workspace_;
  std::int64_t workspace_bytes_;
  std::vector<Product> products_;

  // The pointers of this call on the product's descriptor (before its
  // algorithm is chosen, and before every call: one descriptor per product).
  void set_pointers(Product& p, const void* bias, void* pre) {
    if (p.key.epilogue != GemmEpilogue::none)
      check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "bias pointer");
    if (p.key.epilogue == GemmEpilogue::gelu_aux_bias)
      check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pre, sizeof(pre)), "aux pointer");
  }

  static std::int64_t alignment(const void* p) {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    std::int64_t a = 256;
    while (a > 1 && v % static_cast<std::uintptr_t>(a) != 0) a /= 2;
    return a;
  }

  Product& find(const Key& key, const void* bias, void* pre) {
    for (Product& p : products_)
      if (p.key == key) return p;
    if (static_cast<int>(products_.size()) == max_products)
      throw std::logic_error("headroom::cuda::Blas: more than " + std::to_string(max_products) + " distinct GEMM shapes in one run");
    Product p{};
    p.key = key;
    check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // swapped operands: cuBLASLt's A is our B, its B is our A
    const cublasOperation_t op_a = key.tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "TRANSB");
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (key.epilogue == GemmEpilogue::bias) epi = CUBLASLT_EPILOGUE_BIAS;
    if (key.epilogue == GemmEpilogue::gelu_aux_bias) epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "EPILOGUE");
    if (key.epilogue != GemmEpilogue::none) {
      const cudaDataType_t bias_type = key.type;
      check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)), "BIAS_DATA_TYPE");
    }
    if (key.epilogue == GemmEpilogue::gelu_aux_bias) {
      const std::int64_t ld = key.ldc;
      check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)), "EPILOGUE_AUX_LD");
      const cudaDataType_t aux_type = key.type;
      check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)),
            "EPILOGUE_AUX_DATA_TYPE");
    }
    // column-major views of the row-major operands
    const auto rows_b = static_cast<std::uint64_t>(key.tb == Trans::yes ? key.k : key.n);  // our B^T as stored
    const auto cols_b = static_cast<std::uint64_t>(key.tb == Trans::yes ? key.n : key.k);
    const auto rows_a = static_cast<std::uint64_t>(key.ta == Trans::yes ? key.m : key.k);
    const auto cols_a = static_cast<std::uint64_t>(key.ta == Trans::yes ? key.k : key.m);
    check(cublasLtMatrixLayoutCreate(&p.a, key.type, rows_b, cols_b, key.ldb), "layout of B");
    check(cublasLtMatrixLayoutCreate(&p.b, key.type, rows_a, cols_a, key.lda), "layout of A");
    check(cublasLtMatrixLayoutCreate(&p.c, key.type, static_cast<std::uint64_t>(key.n), static_cast<std::uint64_t>(key.m), key.ldc),
          "layout of C");
    cublasLtMatmulPreference_t pref{};
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = static_cast<std::uint64_t>(workspace_bytes_);
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "MAX_WORKSPACE");
    // swapped operands: cuBLASLt's A is our B, its B is our A; C and D are our C
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::int64_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto& [attr, bytes] : alignments) {
      const std::uint32_t align = static_cast<std::uint32_t>(bytes);
      check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)), "MIN_ALIGNMENT");
    }
    set_pointers(p, bias, pre);  // the bias and aux pointers may steer the choice too
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      throw std::runtime_error("headroom::cuda::Blas: cuBLASLt has no algorithm for C (" + std::to_string(key.m) + ", " +
                               std::to_string(key.n) + ") = op(A) op(B) with k = " + std::to_string(key.k) +
                               ", epilogue " + std::to_string(static_cast<int>(key.epilogue)) + ", pointers aligned to " +
                               std::to_string(key.align_a) + " / " + std::to_string(key.align_b) + " / " +
                               std::to_string(key.align_c) + " B (A / B / C), bias " + std::to_string(key.align_bias) +
                               " B, aux " + std::to_string(key.align_aux) + " B");
    p.algo = result.algo;
    products_.push_back(p);
    return products_.back();
  }
};

}  // namespace headroom::cuda

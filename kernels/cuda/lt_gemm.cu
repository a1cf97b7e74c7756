// cuBLASLt GEMMs with bias / GELU epilogues, and FP8 GEMMs with their scales (lt_gemm.cuh). Row-major relay
// matrices are column-major transposes to cuBLASLt: c^T (n, m) = op(b)^T (n, k) @ op(a)^T (k, m), so b is cuBLASLt's A, a its B,
// and the bias (n) runs along the rows of cuBLASLt's D, as its epilogues broadcast it.
#include "kernels/cuda/lt_gemm.cuh"

#include <cstdio>
#include <unordered_map>

#include "kernels/cuda/cuda_check.cuh"

namespace relay::cuda {

namespace {

// The largest power of two up to 256 that divides the address: cuBLASLt's algorithms have minimum
// operand alignments, so the heuristic is told the real ones and the cache keys on them.
uint32_t alignment(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && addr % a != 0) a /= 2;
  return a;
}

cublasLtEpilogue_t epilogue_of(const LtMatmul& p) {
  if (p.dgelu_in) return CUBLASLT_EPILOGUE_DGELU;
  if (!p.gelu) return p.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (p.aux) return p.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  return p.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
}

// Everything the algorithm choice depends on.
struct Key {
  bool trans_a, trans_b, beta_zero;
  int64_t m, n, k, lda, ldb, ldc;
  int ab_type, c_type, compute, epilogue, b_type, a_scale_mode, b_scale_mode;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 0xCBF29CE484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ull + (h >> 31); };
    mix(uint64_t(key.trans_a) | uint64_t(key.trans_b) << 1 | uint64_t(key.beta_zero) << 2);
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(uint64_t(v));
    for (int v : {key.ab_type, key.c_type, key.compute, key.epilogue, key.b_type, key.a_scale_mode, key.b_scale_mode})
      mix(uint64_t(v));
    for (uint32_t v : {key.align_a, key.align_b, key.align_c, key.align_bias, key.align_aux}) mix(v);
    return size_t(h);
  }
};

// One call signature's descriptors and chosen algorithm; found is false when the heuristic had none.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;

  ~Plan() {  // no checks: may run at exit after the runtime has shut down
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

bool is_fp8(int t) { return t == int(CUDA_R_8F_E4M3) || t == int(CUDA_R_8F_E5M2); }

// FP8: the scales as cuBLASLt reads them, cuBLASLt's A being Relay's b and its B Relay's a (see the top).
void set_fp8_scales(cublasLtMatmulDesc_t desc, const LtMatmul& p) {
  set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.b_scale));
  set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.a_scale));
}

Key key_of(const LtMatmul& p) {
  return Key{p.trans_a, p.trans_b, p.beta == 0.f, p.m, p.n, p.k, p.lda, p.ldb, p.ldc,
             int(p.ab_type), int(p.c_type), int(p.compute), int(epilogue_of(p)), p.b_type, p.a_scale_mode,
             p.b_scale_mode,
             alignment(p.a), alignment(p.b), alignment(p.c),
             p.bias ? alignment(p.bias) : 0u, p.aux ? alignment(p.aux) : p.dgelu_in ? alignment(p.dgelu_in) : 0u};
}

}  // namespace

struct LtGemm::Cache {
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
};

LtGemm::LtGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes), cache_(std::make_unique<Cache>()) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  cache_.reset();
  if (handle_) cublasLtDestroy(handle_);
}

size_t LtGemm::cached() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_->plans.size();
}

bool LtGemm::run(const LtMatmul& p, cudaStream_t stream) {
  // cuBLASLt's rule for the leading dimension of the GELU input it writes or reads.
  if ((p.aux || p.dgelu_in) && p.ldc % 8 != 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  const Key key = key_of(p);
  auto it = cache_->plans.find(key);
  if (it == cache_->plans.end()) {
    auto plan = std::make_unique<Plan>();
    // cuBLASLt's problem (column-major): D (M, N) = A (M, K) B (K, N), M = n, N = m, A = op(b)^T, B = op(a)^T.
    const uint64_t M = uint64_t(p.n), N = uint64_t(p.m), K = uint64_t(p.k);
    const cublasOperation_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, p.compute, CUDA_R_32F));  // alpha, beta: float
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(op_a));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(op_b));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue_of(p)));
    if (p.bias) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(p.c_type));
    if (p.aux || p.dgelu_in) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(p.ldc));
    // The layouts as stored: A is b's storage, (M, K) or (K, M) when transposed; B is a's, likewise.
    const bool fp8 = is_fp8(p.ab_type);
    if (fp8) {  // the scale modes before the heuristic: they choose the kernels
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(p.b_scale_mode));
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(p.a_scale_mode));
      set_fp8_scales(plan->desc, p);
    }
    const cudaDataType_t b_type = p.b_type >= 0 ? cudaDataType_t(p.b_type) : p.ab_type;  // cuBLASLt's A
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, b_type, p.trans_b ? K : M, p.trans_b ? M : K, p.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, p.ab_type, p.trans_a ? N : K, p.trans_a ? K : N, p.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, p.c_type, M, N, p.ldc));
    // The heuristic reads the epilogue pointers' values (their alignment), so they are set first.
    if (p.bias) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (p.aux) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
    if (p.dgelu_in) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.dgelu_in);

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    };
    set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes_));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A is b
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                                             pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED: no algorithm for this combination (an epilogue with these types, say): fall back. FP8: also
    // INVALID_VALUE (a scale mode this GPU or these types do not take).
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && !(fp8 && st == CUBLAS_STATUS_INVALID_VALUE)) CUBLAS_CHECK(st);
    plan->found = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->found) plan->algo = result.algo;
    it = cache_->plans.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *it->second;
  if (!plan.found) return false;
  if (p.bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  if (p.aux) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
  if (p.dgelu_in) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.dgelu_in);
  if (!is_fp8(p.ab_type)) {
    CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &p.alpha, p.b, plan.a, p.a, plan.b, &p.beta, p.c, plan.c, p.c,
                                plan.c, &plan.algo, workspace_, workspace_bytes_, stream));
    return true;
  }
  set_fp8_scales(plan.desc, p);
  const cublasStatus_t st = cublasLtMatmul(handle_, plan.desc, &p.alpha, p.b, plan.a, p.a, plan.b, &p.beta, p.c,
                                           plan.c, p.c, plan.c, &plan.algo, workspace_, workspace_bytes_, stream);
  // cublasLtMatmul checks its arguments before it queues anything: a refusal leaves nothing on the stream.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    std::fprintf(stderr,
                 "relay: cuBLASLt refused an FP8 GEMM (m %lld, n %lld, k %lld, scale modes a %d b %d, status %d); "
                 "it runs on Relay's plain FP8 kernel\n",
                 static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), p.a_scale_mode,
                 p.b_scale_mode, int(st));
    plan.found = false;
    return false;
  }
  CUBLAS_CHECK(st);
  return true;
}

}  // namespace relay::cuda

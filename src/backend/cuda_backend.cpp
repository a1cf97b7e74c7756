// The CUDA backend: every op is a cuBLASLt GEMM (cuBLAS's when cuBLASLt has no algorithm for it) or a
// launcher from kernels/cuda, queued on the one
// stream this backend owns, so ops run in program order without host synchronisation. Only
// download, sum_squares and synchronize wait for the GPU. The front door (backend.cpp) has checked
// every op's devices, dtypes and shapes; the *_impl methods here pick the kernel for the storage type
// (float32 or bfloat16) and launch it.
#include "backend/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <initializer_list>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/op_profile_table.hpp"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention_decode_latent.cuh"
#include "kernels/cuda/attention_merge.cuh"
#include "kernels/cuda/bias.cuh"
#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/fp8_amax.cuh"
#include "kernels/cuda/fp8_quantize.cuh"
#include "kernels/cuda/fp8_transpose.cuh"
#include "kernels/fp8_lt_layout.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/lt_gemm.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_group_router.cuh"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda/sum_squares.cuh"
#include "kernels/cuda/transformer.cuh"

namespace relay {
namespace {

std::string mib(size_t bytes) { return cat(bytes / (1024 * 1024), " MiB"); }

// A caching device allocator: freed blocks go to a free list keyed by their (rounded) size and are
// handed out again for the same size, so the steady-state training step never calls cudaMalloc or
// cudaFree (both may synchronise the device, which also stalls NCCL). Reuse needs no event: a block
// is only reused by work queued after its last use on the backend's stream (or, for communication
// streams, after Request::wait() has ordered the compute stream behind them).
// Tensors hold a shared_ptr to the pool, so the pool outlives the backend if tensors do.
class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  static constexpr size_t kGranule = 512;  // cudaMalloc aligns to 256; rounding up merges near sizes

  ~DevicePool() {
    // May run at process exit after the CUDA runtime has shut down: errors are ignored.
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) cudaFree(p);
  }

  std::shared_ptr<std::byte> allocate(size_t bytes) {
    const size_t size = (std::max<size_t>(bytes, 1) + kGranule - 1) / kGranule * kGranule;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
      }
    }
    if (!p) p = device_malloc(size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ += size;
    }
    auto self = shared_from_this();
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [self, size](std::byte* q) { self->release(q, size); });
  }

 private:
  void release(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(p);
    in_use_ -= size;
    cached_ += size;
  }

  void* device_malloc(size_t size) {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it, or the next launcher's check would report it
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [s, blocks] : free_)
        for (void* b : blocks) CUDA_CHECK(cudaFree(b));
      free_.clear();
      cached_ = 0;
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaGetLastError();
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      fatal(cat("cudaMalloc of ", mib(size), " failed: out of GPU memory (", mib(in_use_),
                " held by Relay tensors, ", mib(free_bytes), " free of ", mib(total_bytes), ")"),
            __FILE__, __LINE__, cuda::cuda_error_hint(cudaErrorMemoryAllocation));
    }
    if (err != cudaSuccess) cuda::cuda_fail(err, "cudaMalloc", __FILE__, __LINE__);
    return p;
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // rounded size -> cached blocks
  size_t in_use_ = 0;
  size_t cached_ = 0;
};

cuda::ActKind kernel_act(Activation act) {
  switch (act) {
    case Activation::relu: return cuda::ActKind::relu;
    case Activation::gelu: return cuda::ActKind::gelu;
    case Activation::tanh: return cuda::ActKind::tanh;
    case Activation::gelu_tanh: return cuda::ActKind::gelu_tanh;
  }
  RELAY_ASSERT(false, "unknown activation " << static_cast<int>(act));
  return cuda::ActKind::relu;
}

// A float tensor's device storage: float, or __nv_bfloat16 (the same bits as relay::bf16).
static_assert(sizeof(__nv_bfloat16) == sizeof(bf16), "__nv_bfloat16 and relay::bf16 share one layout");
template <typename X>
X* ptr(Tensor& t);
template <>
float* ptr<float>(Tensor& t) { return t.f32(); }
template <>
__nv_bfloat16* ptr<__nv_bfloat16>(Tensor& t) { return reinterpret_cast<__nv_bfloat16*>(t.b16()); }
template <typename X>
const X* ptr(const Tensor& t);
template <>
const float* ptr<float>(const Tensor& t) { return t.f32(); }
template <>
const __nv_bfloat16* ptr<__nv_bfloat16>(const Tensor& t) { return reinterpret_cast<const __nv_bfloat16*>(t.b16()); }
template <typename X>
X* ptr_or_null(Tensor* t) { return t ? ptr<X>(*t) : nullptr; }
template <typename X>
const X* ptr_or_null(const Tensor& t) { return t.defined() ? ptr<X>(t) : nullptr; }

// Calls f with a null pointer of the tensor's storage type, f(static_cast<float*>(nullptr)) or
// f(static_cast<__nv_bfloat16*>(nullptr)); the front door has checked that it is one of the two.
template <typename F>
void by_dtype(const Tensor& t, F&& f) {
  if (t.dtype() == DType::bf16)
    f(static_cast<__nv_bfloat16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}
#define X_OF(p) std::remove_pointer_t<decltype(p)>

// The bf16 working copy an optimizer step also writes, or null when the tensor is undefined.
__nv_bfloat16* bf16_work(Tensor& work) { return work.defined() ? ptr<__nv_bfloat16>(work) : nullptr; }

cudaDataType_t cuda_type(DType dt) { return dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
cudaDataType_t fp8_cuda_type(DType dt) { return dt == DType::fp8_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

// The largest power of two up to 256 that divides every address (cuBLASLt's FP8 kernels need 16).
uint32_t alignment_of(std::initializer_list<const void*> ptrs) {
  uint32_t a = 256;
  for (const void* p : ptrs)
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// The CUDA FlashAttention kernels take head dimensions up to cuda::kFlashMaxHeadDim (a register tile per
// lane); the CPU takes any. A user's model choice, so an Error naming the config keys, not an assertion.
void check_flash_head_dim(const char* op, int64_t C, int64_t H) {
  if (C / H > cuda::kFlashMaxHeadDim)
    throw Error(cat(op, ": head dimension C / H = ", C / H, " (C = ", C, ", H = ", H,
                    ") is above the CUDA FlashAttention kernels' limit of ", cuda::kFlashMaxHeadDim,
                    "; choose model.n_embd / model.n_head <= ", cuda::kFlashMaxHeadDim));
}

// The same limit for grouped-query attention, whose head dimension is q's columns / H, and for its value heads
// (v's columns / KV), which may be narrower or wider (DeepSeek-V3's MLA); returns the value head dimension.
int64_t check_gqa_head_dim(const char* op, int64_t hd, int64_t H, const Tensor& v, int64_t KV) {
  const int64_t hd_v = cols_of(v) / KV;
  if (hd > cuda::kFlashMaxHeadDim || hd_v > cuda::kFlashMaxHeadDim)
    throw Error(cat(op, ": head dimensions ", hd, " (query/key: q columns / H = ", H, ") and ", hd_v,
                    " (value: v columns / KV = ", KV, "): the CUDA FlashAttention kernels' limit is ",
                    cuda::kFlashMaxHeadDim, " for each"));
  return hd_v;
}

// RELAY_OP_PROFILE=1: each outermost op's GPU time from a pair of CUDA events recorded around it on the
// backend's stream, summed by op name, and the gaps between consecutive ops (the GPU idle while the host
// prepares work, waits for data or synchronises), printed to stderr when the backend is destroyed. Events are
// read back every kFlushOps ops (one stream synchronisation each), so the profile perturbs the run slightly.
class OpProfile {
 public:
  ~OpProfile() {
    for (auto& [ops, e] : pending_) cudaEventDestroy(e.first), cudaEventDestroy(e.second);
    for (auto& e : free_) cudaEventDestroy(e.first), cudaEventDestroy(e.second);
    if (last_end_) cudaEventDestroy(last_end_);
  }
  void begin(const char* op, cudaStream_t stream) {
    if (free_.empty()) {
      std::pair<cudaEvent_t, cudaEvent_t> e;
      CUDA_CHECK(cudaEventCreate(&e.first));
      CUDA_CHECK(cudaEventCreate(&e.second));
      free_.push_back(e);
    }
    open_ = {op, free_.back()};
    free_.pop_back();
    CUDA_CHECK(cudaEventRecord(open_.second.first, stream));
  }
  // Appends detail to the open op's name (RELAY_OP_PROFILE=shapes: a GEMM's shape and types).
  void label(const std::string& detail) { open_.first += detail; }
  void end(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(open_.second.second, stream));
    pending_.push_back(open_);
    if (pending_.size() >= kFlushOps) flush();
  }
  void flush() {
    if (pending_.empty()) return;
    CUDA_CHECK(cudaEventSynchronize(pending_.back().second.second));
    for (auto& [op, e] : pending_) {
      float ms = 0.f, gap = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e.first, e.second));
      OpTotal& t = t_.ops[op];
      t.ms += ms;
      ++t.count;
      t_.busy_ms += ms;
      ++t_.count;
      if (last_end_) {
        CUDA_CHECK(cudaEventElapsedTime(&gap, last_end_, e.first));
        (gap < kLongGapMs ? t_.short_gaps_ms : t_.long_gaps_ms) += gap;
      } else {
        CUDA_CHECK(cudaEventCreate(&last_end_));  // a spare, handed to the pair below
      }
      std::swap(last_end_, e.second);  // this op's end is the next gap's start; the pair takes the other event
      free_.push_back(e);
    }
    pending_.clear();
  }
  void restart() {
    flush();
    t_ = OpProfileTotals();
  }
  void print(const std::string& device) const {
    std::fputs(op_profile_table("GPU time", device, "ms busy", "gaps between ops", kLongGapMs, t_).c_str(), stderr);
  }

 private:
  static constexpr size_t kFlushOps = 8192;
  static constexpr float kLongGapMs = 50.f;
  std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>> open_;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> pending_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> free_;
  OpProfileTotals t_;
  cudaEvent_t last_end_ = nullptr;
};

// An optional i32 tensor's device pointer: positions, document starts (undefined: null, the kernel's default).
const int32_t* i32_or_null(const Tensor& t) { return t.defined() ? t.i32() : nullptr; }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts) : device_(opts.gpu) {
    bind();
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    pool_ = std::make_shared<DevicePool>();
    reduce_scratch_ = pool_->allocate((cuda::kSumSquaresMaxBlocks + 1) * sizeof(double));
    lt_workspace_ = pool_->allocate(kLtWorkspaceBytes);
    lt_ = std::make_unique<cuda::LtGemm>(lt_workspace_.get(), kLtWorkspaceBytes);
    host_scalar_ = allocate_host(sizeof(double));
    for (Staging& slot : staging_) {
      CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&slot.consumed, cudaEventDisableTiming));
    }
    set_precision(opts.precision);
    if (const char* v = std::getenv("RELAY_OP_PROFILE"); v && (std::string(v) == "1" || std::string(v) == "shapes")) {
      profile_ = std::make_unique<OpProfile>();
      profile_shapes_ = std::string(v) == "shapes";
    }
  }

  ~CudaBackend() override {
    if (profile_) {
      try {
        profile_->flush();
        profile_->print(describe());
      } catch (...) {  // shutting down after an error elsewhere: no profile
      }
      profile_.reset();
    }
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    // No CHECKs: this may run during shutdown after an error elsewhere.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    reduce_scratch_.reset();
    lt_.reset();
    lt_workspace_.reset();
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (Staging& slot : staging_) {
      if (slot.copied) cudaEventDestroy(slot.copied);
      if (slot.consumed) cudaEventDestroy(slot.consumed);
      if (slot.landing) cudaFree(slot.landing);
    }
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda; }

  void op_begin(const char* op) const override {
    if (!profile_ || op_depth_++ > 0) return;
    cudaSetDevice(device_);
    profile_->begin(op, stream_);
  }
  void op_end() const override {
    if (!profile_ || --op_depth_ > 0) return;
    profile_->end(stream_);
  }
  void op_profile_restart() override {
    if (profile_) profile_->restart();
  }

  std::shared_ptr<std::byte> allocate(size_t bytes) override {
    bind();
    return pool_->allocate(bytes);
  }

  int64_t available_bytes() const override {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(free_bytes);
  }
  std::string describe() const override {
    int cublas_version = 0;
    CUBLAS_CHECK(cublasGetVersion(cublas_, &cublas_version));
    return cat("cuda:", device_, " ", prop_.name, " (sm_", prop_.major, prop_.minor, ", ",
               prop_.multiProcessorCount, " SMs, ", prop_.totalGlobalMem / (1024 * 1024 * 1024), " GiB), cuBLAS ",
               cublas_version, ", precision ", precision_name(precision_));
  }

  // fp32 and bf16: default math, so float32 GEMMs agree with the CPU to ~1e-6 (unless the environment sets
  // NVIDIA_TF32_OVERRIDE=1); bf16 GEMMs take their dtype from their tensors. tf32: float32 GEMMs on TF32
  // tensor cores. bf16 and tf32 tensor cores need Ampere (sm_80) or newer.
  void set_precision(Precision p) override {
    // fp8: every op an FP8 step calls has a CUDA kernel (fp8_amax, fp8_quantize, fp8_quantize_amax; fp8_matmul on
    // cuBLASLt or the plain kernel, the experts' grouped GEMMs included, one group at a time); the working copies
    // and activations are bf16, so it needs sm_80 as bf16 does. None of it has run on a GPU yet: the trainer says so
    // at start-up (train/trainer.cpp) until a GPU session has run test_backend_ops' fp8 rows.
    if ((p == Precision::bf16 || p == Precision::tf32 || p == Precision::fp8) && prop_.major < 8)
      throw Error(cat("train.precision = \"", precision_name(p),
                      "\" needs a GPU with compute capability 8.0 or newer; cuda:", device_, " (", prop_.name,
                      ") is sm_", prop_.major, prop_.minor, ". Use train.precision = \"fp32\""));
    bind();
    CUBLAS_CHECK(cublasSetMathMode(cublas_, p == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    precision_ = p;
  }

  bool supports(DType dt) const override {
    return dt == DType::f32 || dt == DType::i32 || dt == DType::bf16 || dt == DType::fp8_e4m3 ||
           dt == DType::fp8_e5m2;
  }

  // --- memory ---------------------------------------------------------------------------------

  std::shared_ptr<std::byte> allocate_host(size_t bytes) override {
    bind();
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { cudaFreeHost(q); });
  }

  // Through a pinned staging buffer: the caller may overwrite host_src as soon as this returns, and
  // the copy is queued without draining the stream (a copy straight from pageable memory would
  // synchronise it). The host waits only when the upload two calls back is still being copied.
  void upload(Tensor& dst, const void* host_src) override {
    bind();
    RELAY_ASSERT(dst.defined() && dst.device() == Device::cuda, "upload: destination is not a CUDA tensor");
    const size_t bytes = dst.bytes();
    if (bytes == 0) return;
    RELAY_ASSERT(host_src, "upload: null host pointer");
    if (bytes >= kLandedUploadBytes) return upload_landed(dst, host_src, bytes, /*round_to_bf16=*/false);
    Staging& slot = next_slot();
    stage(slot, host_src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), slot.buffer.get(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
  }

  // float32 from the host into a bf16 tensor: copied as float32 and rounded on the GPU (the host's rounding loop
  // cost the bf16 MLP benchmark 230 ms a step for its 8192 x 8192 batches).
  void upload_f32_bf16_impl(Tensor& dst, const float* host_src) override {
    bind();
    const size_t bytes = size_t(dst.numel()) * sizeof(float);
    if (bytes == 0) return;
    RELAY_ASSERT(host_src, "upload_f32: null host pointer");
    upload_landed(dst, host_src, bytes, /*round_to_bf16=*/true);
  }

  void download(void* host_dst, const Tensor& src) override {
    bind();
    RELAY_ASSERT(src.defined() && src.device() == Device::cuda, "download: source is not a CUDA tensor");
    if (src.bytes() == 0) return;
    RELAY_ASSERT(host_dst, "download: null host pointer");
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void synchronize() override {
    bind();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void* native_stream() override { return stream_; }

  // CUDA events in stream order: a trace measures the GPU's work, not the host's launches. Events are
  // pooled and reused after clear_marks().
  int64_t timing_mark() override {
    bind();
    if (marks_used_ == marks_.size()) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreate(&e));
      marks_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(marks_[marks_used_], stream_));
    return static_cast<int64_t>(marks_used_++);
  }
  double mark_seconds(int64_t mark) override {
    bind();
    RELAY_ASSERT(mark >= 0 && static_cast<size_t>(mark) < marks_used_, "timing mark " << mark);
    float ms = 0.f;
    CUDA_CHECK(cudaEventSynchronize(marks_[static_cast<size_t>(mark)]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[0], marks_[static_cast<size_t>(mark)]));
    return double(ms) / 1000.0;
  }
  void clear_marks() override { marks_used_ = 0; }

 protected:
  // Every *_impl runs after the front door's checks (backend.cpp): devices, dtypes and shapes are right.

  void copy_impl(Tensor& dst, const Tensor& src) override {
    bind();
    if (src.bytes() == 0 || dst.raw() == src.raw()) return;
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void gather_rows_impl(const Tensor& src, const Tensor& index, Tensor& dst) override {
    bind();
    by_dtype(dst, [&](auto* t) {
      cuda::gather_rows(ptr<X_OF(t)>(src), index.i32(), ptr<X_OF(t)>(dst), rows_of(dst), cols_of(dst), stream_);
    });
  }

  void copy_columns_impl(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override {
    bind();
    const size_t elem = dtype_size(dst.dtype());
    if (rows_of(dst) == 0 || width == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(static_cast<std::byte*>(dst.raw()) + size_t(dst_col) * elem, size_t(cols_of(dst)) * elem,
                                 static_cast<const std::byte*>(src.raw()) + size_t(src_col) * elem,
                                 size_t(cols_of(src)) * elem, size_t(width) * elem, size_t(rows_of(dst)),
                                 cudaMemcpyDeviceToDevice, stream_));
  }

  // Mixture of experts (kernels/cuda/moe.cu): the CPU's routing semantics, tie order included.
  void moe_router_forward_impl(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse,
                               Tensor& experts, Tensor& weights, const Tensor& bias) override {
    bind();
    const int64_t E = cols_of(logits);
    if (E > cuda::kMoeMaxExperts)  // a model choice: an Error naming the key, not an assertion
      throw Error(cat("moe_router_forward: ", E, " experts per layer are above the CUDA router's limit of ",
                      cuda::kMoeMaxExperts, "; choose model.n_experts <= ", cuda::kMoeMaxExperts,
                      " or train.device = \"cpu\""));
    by_dtype(logits, [&](auto* t) {
      cuda::moe_router_forward(ptr<X_OF(t)>(logits), probs.f32(), lse.f32(), experts.i32(), weights.f32(),
                               rows_of(logits), E, k, renormalize, bias.defined() ? bias.f32() : nullptr, stream_);
    });
  }
  void moe_router_backward_impl(const Tensor& probs, const Tensor& lse, const Tensor& experts, const Tensor& dweights,
                                bool renormalize, const Tensor& seq_grad, int64_t T, float z_scale,
                                Tensor& dlogits) override {
    bind();
    by_dtype(dlogits, [&](auto* t) {
      cuda::moe_router_backward(probs.f32(), lse.f32(), experts.i32(), dweights.f32(), renormalize,
                                seq_grad.defined() ? seq_grad.f32() : nullptr, T, z_scale, ptr<X_OF(t)>(dlogits),
                                rows_of(probs), cols_of(probs), cols_of(experts), stream_);
    });
  }
  // DeepSeek-V3's sigmoid, group-limited router (kernels/cuda/moe_group_router.cu): the CPU's semantics, tie order
  // included.
  void moe_group_router_forward_impl(const Tensor& logits, const GroupRouting& r, Tensor& probs, Tensor& experts,
                                     Tensor& weights, const Tensor& bias) override {
    bind();
    const int64_t E = cols_of(logits);
    if (E > cuda::kGroupRouterMaxExperts || r.n_group > cuda::kGroupRouterMaxGroups)  // model choices: name the keys
      throw Error(cat("moe_group_router_forward: ", E, " experts in ", r.n_group, " groups are above the CUDA ",
                      "router's limits of ", cuda::kGroupRouterMaxExperts, " experts and ",
                      cuda::kGroupRouterMaxGroups, " groups; choose model.n_routed_experts <= ",
                      cuda::kGroupRouterMaxExperts, " and model.n_group <= ", cuda::kGroupRouterMaxGroups,
                      " or train.device = \"cpu\""));
    by_dtype(logits, [&](auto* t) {
      cuda::moe_group_router_forward(ptr<X_OF(t)>(logits), probs.f32(), experts.i32(), weights.f32(), rows_of(logits),
                                     E, r.k, r.n_group, r.topk_group, r.renormalize, r.scale,
                                     bias.defined() ? bias.f32() : nullptr, stream_);
    });
  }
  void moe_group_router_backward_impl(const Tensor& probs, const Tensor& experts, const Tensor& dweights,
                                      const GroupRouting& r, const Tensor& seq_grad, int64_t T,
                                      Tensor& dlogits) override {
    bind();
    by_dtype(dlogits, [&](auto* t) {
      cuda::moe_group_router_backward(probs.f32(), experts.i32(), dweights.f32(), r.renormalize, r.scale,
                                      seq_grad.defined() ? seq_grad.f32() : nullptr, T, ptr<X_OF(t)>(dlogits),
                                      rows_of(probs), cols_of(probs), r.k, stream_);
    });
  }
  void moe_combine_impl(const Tensor& rows, const Tensor& pos, const Tensor& weights, Tensor& y) override {
    bind();
    by_dtype(y, [&](auto* t) {
      cuda::moe_combine(ptr<X_OF(t)>(rows), pos.i32(), weights.defined() ? weights.f32() : nullptr, ptr<X_OF(t)>(y),
                        rows_of(y), cols_of(pos), cols_of(y), stream_);
    });
  }
  void moe_combine_backward_impl(const Tensor& dy, const Tensor& rows, const Tensor& pos, const Tensor& weights,
                                 Tensor& drows, Tensor& dweights) override {
    bind();
    by_dtype(dy, [&](auto* t) {
      cuda::moe_combine_backward(ptr<X_OF(t)>(dy), ptr<X_OF(t)>(rows), pos.i32(), weights.f32(), ptr<X_OF(t)>(drows),
                                 dweights.f32(), rows_of(dy), cols_of(pos), cols_of(dy), stream_);
    });
  }

  void fill_impl(Tensor& x, float value) override {
    bind();
    if (x.dtype() == DType::i32) return cuda::fill_i32(x.i32(), static_cast<int32_t>(value), x.numel(), stream_);
    by_dtype(x, [&](auto* t) { cuda::fill(ptr<X_OF(t)>(x), value, x.numel(), stream_); });
  }

  void convert_impl(const Tensor& src, Tensor& dst) override {
    bind();
    if (src.dtype() == dst.dtype()) return copy_impl(dst, src);
    if (src.dtype() == DType::f32)
      cuda::convert(src.f32(), ptr<__nv_bfloat16>(dst), src.numel(), stream_);
    else
      cuda::convert(ptr<__nv_bfloat16>(src), dst.f32(), src.numel(), stream_);
  }

  // --- linear algebra -------------------------------------------------------------------------

  // The GEMM's types come from its tensors: a, b float32 or bfloat16 (CUDA_R_16BF), y float32 or
  // bfloat16; accumulation in float32 (CUBLAS_COMPUTE_32F), on TF32 tensor cores for float32 inputs
  // under train.precision = "tf32".
  void matmul_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                   float beta) override {
    bind();
    const int64_t m = y.size(0), n = y.size(1), k = trans_a ? a.size(0) : a.size(1);
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: y = beta * y, and beta == 0 must not read y (BLAS convention)
      by_dtype(y, [&](auto* t) {
        if (beta == 0.0f)
          cuda::fill(ptr<X_OF(t)>(y), 0.0f, y.numel(), stream_);
        else
          cuda::scale(ptr<X_OF(t)>(y), beta, y.numel(), stream_);
      });
      return;
    }
    RELAY_ASSERT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && a.size(1) <= INT_MAX && b.size(1) <= INT_MAX,
                 "matmul: dimensions (" << m << ", " << n << ", " << k << ") exceed cuBLAS's int range");
    if (matmul_padded(a, trans_a, b, trans_b, y, alpha, beta)) return;
    gemm(trans_a, trans_b, m, n, k, a.raw(), a.size(1), b.raw(), b.size(1), y.raw(), n, a.dtype(), y.dtype(), alpha,
         beta);
  }

  // Row-major y (m, n) at row stride ldy = alpha op(a) op(b) + beta y, a and b at row strides lda and ldb.
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
            int64_t ldb, void* y, int64_t ldy, DType ab, DType yt, float alpha, float beta) {
    cuda::LtMatmul lt;
    lt.trans_a = trans_a;
    lt.trans_b = trans_b;
    lt.m = m;
    lt.n = n;
    lt.k = k;
    lt.lda = lda;
    lt.ldb = ldb;
    lt.ldc = ldy;
    lt.ab_type = cuda_type(ab);
    lt.c_type = cuda_type(yt);
    lt.compute = compute_type(ab);
    lt.alpha = alpha;
    lt.beta = beta;
    lt.a = a;
    lt.b = b;
    lt.c = y;
    if (label_gemm(lt), lt_->run(lt, stream_)) return;

    // cuBLASLt had no algorithm: cublasGemmEx.
    // Row-major y = op(a) op(b) is column-major y^T = op(b)^T op(a)^T: cuBLAS sees each row-major
    // matrix as its transpose, so b goes first and m, n swap. The leading dimension of each operand
    // is its row length as stored.
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                              &alpha, b, cuda_type(ab), static_cast<int>(ldb), a, cuda_type(ab), static_cast<int>(lda),
                              &beta, y, cuda_type(yt), static_cast<int>(ldy), compute_type(ab), CUBLAS_GEMM_DEFAULT));
  }

  // A large GEMM with a contiguous extent (a stored row's length) that is not a multiple of 16 bytes runs on
  // zero-padded copies of its operands in pool scratch, at the padded size: cuBLASLt serves the unpadded one with its
  // align-2 kernels, at a fraction of the tensor cores' rate (H200, GPT-2's head at its vocabulary of 50,257:
  // 95 TFLOP/s against 450-700 for the blocks' GEMMs; the same model at 50,304 ran 1.57x faster). The copies cost
  // one pass over each padded operand. Which extents are contiguous: k for a (m, k) and for b stored (n, k); m for
  // a stored (k, m); n for y and for b stored (k, n). A padded m or n adds rows or columns to y that are dropped; a
  // padded k adds zero products (both operands' pads are zero).
  static constexpr double kPadMinMnk = double(int64_t(1) << 30);  // m n k: smaller GEMMs run as they are
  bool matmul_padded(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                     float beta) {
    const int64_t m = y.size(0), n = y.size(1), k = trans_a ? a.size(0) : a.size(1);
    if (double(m) * double(n) * double(k) < kPadMinMnk) return false;
    const int64_t ea = int64_t(dtype_size(a.dtype())), ey = int64_t(dtype_size(y.dtype()));
    auto odd = [](int64_t d, int64_t bytes) { return (d * bytes) % 16 != 0; };
    auto pad = [](int64_t d) { const int64_t q = d < 1024 ? 8 : 64; return (d + q - 1) / q * q; };
    const int64_t pm = trans_a && odd(m, ea) ? pad(m) : m;
    const int64_t pn = odd(n, ey) || (!trans_b && odd(n, ea)) ? pad(n) : n;
    const int64_t pk = (!trans_a || trans_b) && odd(k, ea) ? pad(k) : k;
    if (pm == m && pn == n && pk == k) return false;
    if (std::max({pm, pn, pk}) > INT_MAX) return false;
    // src (rows, cols) at row stride cols -> dst (prows, pcols), zeros outside.
    auto padded = [&](const void* src, int64_t rows, int64_t cols, int64_t prows, int64_t pcols, int64_t e,
                      std::shared_ptr<std::byte>& keep) -> const void* {
      if (rows == prows && cols == pcols) return src;
      keep = pool_->allocate(size_t(prows * pcols * e));
      std::byte* d = keep.get();
      CUDA_CHECK(cudaMemcpy2DAsync(d, size_t(pcols * e), src, size_t(cols * e), size_t(cols * e), size_t(rows),
                                   cudaMemcpyDeviceToDevice, stream_));
      if (pcols > cols)
        CUDA_CHECK(cudaMemset2DAsync(d + cols * e, size_t(pcols * e), 0, size_t((pcols - cols) * e), size_t(rows),
                                     stream_));
      if (prows > rows)
        CUDA_CHECK(cudaMemsetAsync(d + rows * pcols * e, 0, size_t((prows - rows) * pcols * e), stream_));
      return d;
    };
    std::shared_ptr<std::byte> ka, kb, ky;  // scratch, back in the pool once the work is queued (one stream)
    const void* pa = trans_a ? padded(a.raw(), k, m, pk, pm, ea, ka) : padded(a.raw(), m, k, pm, pk, ea, ka);
    const void* pb = trans_b ? padded(b.raw(), n, k, pn, pk, ea, kb) : padded(b.raw(), k, n, pk, pn, ea, kb);
    void* py = y.raw();
    if (pm != m || pn != n) {
      ky = pool_->allocate(size_t(pm * pn * ey));
      py = ky.get();
      if (beta != 0.f)
        CUDA_CHECK(cudaMemcpy2DAsync(py, size_t(pn * ey), y.raw(), size_t(n * ey), size_t(n * ey), size_t(m),
                                     cudaMemcpyDeviceToDevice, stream_));
    }
    gemm(trans_a, trans_b, pm, pn, pk, pa, trans_a ? pm : pk, pb, trans_b ? pk : pn, py, pn, a.dtype(), y.dtype(),
         alpha, beta);
    if (py != y.raw())
      CUDA_CHECK(cudaMemcpy2DAsync(y.raw(), size_t(n * ey), py, size_t(pn * ey), size_t(n * ey), size_t(m),
                                   cudaMemcpyDeviceToDevice, stream_));
    return true;
  }

  // --- grouped GEMMs ----------------------------------------------------------------------------

  // One row-major GEMM of a grouped call: y (m, n) = op(a) (m, k) @ op(b) (k, n) + beta * y.
  struct GroupGemm {
    const void *a, *b;
    void* y;
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldy;
  };

  // Every problem in one cublasGemmGroupedBatchedEx call (cuBLAS >= 12.5), one group each, when a, b and y share a
  // dtype; false (the caller then runs matmul_impl a group) for bf16 inputs into f32 weight gradients, without the
  // call, or when cuBLAS declines it. Row-major y = op(a) op(b) is column-major y^T = op(b)^T op(a)^T, as in
  // matmul_impl: b goes first and m, n swap.
  bool run_grouped(const std::vector<GroupGemm>& ps, DType ab, DType c, float beta) {
#if CUBLAS_VERSION >= 120500
    if (ab != c) return false;
    if (ps.empty()) return true;
    bind();
    const size_t P = ps.size();
    std::vector<cublasOperation_t> ta(P), tb(P);
    std::vector<int> m(P), n(P), k(P), lda(P), ldb(P), ldc(P), one(P, 1);
    std::vector<float> alphas(P, 1.f), betas(P, beta);
    std::vector<const void*> host(3 * P);  // A (b's), B (a's), C (y's) pointers, as cuBLAS names them
    for (size_t i = 0; i < P; ++i) {
      const GroupGemm& p = ps[i];
      RELAY_ASSERT(p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX && p.lda <= INT_MAX && p.ldb <= INT_MAX,
                   "grouped GEMM dimensions exceed cuBLAS's int range");
      ta[i] = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      tb[i] = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      m[i] = int(p.n), n[i] = int(p.m), k[i] = int(p.k);
      lda[i] = int(p.ldb), ldb[i] = int(p.lda), ldc[i] = int(p.ldy);
      host[i] = p.b, host[P + i] = p.a, host[2 * P + i] = p.y;
    }
    Tensor pointers(*this, {int64_t(6 * P)}, DType::i32);  // (3 P) device pointers, 8 bytes each
    upload(pointers, host.data());
    const void* const* dev = reinterpret_cast<const void* const*>(pointers.raw());
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        cublas_, ta.data(), tb.data(), m.data(), n.data(), k.data(), alphas.data(), dev, cuda_type(ab), lda.data(),
        dev + P, cuda_type(ab), ldb.data(), betas.data(), const_cast<void* const*>(dev + 2 * P), cuda_type(c),
        ldc.data(), int(P), one.data(), compute_type(ab));
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    RELAY_ASSERT(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE,
                 "cublasGemmGroupedBatchedEx failed with status " << int(st));
#else
    (void)ps, (void)ab, (void)c, (void)beta;
#endif
    return false;
  }

  void grouped_matmul_impl(const Tensor& a, const std::vector<Tensor>& b, bool trans_b, Tensor& y,
                           const std::vector<int64_t>& offsets, float beta) override {
    std::vector<GroupGemm> ps;
    const size_t ea = dtype_size(a.dtype()), ey = dtype_size(y.dtype());
    for (size_t g = 0; g < b.size(); ++g)
      if (offsets[g + 1] > offsets[g])
        ps.push_back({static_cast<const std::byte*>(a.raw()) + size_t(offsets[g] * a.size(1)) * ea, b[g].raw(),
                      static_cast<std::byte*>(y.raw()) + size_t(offsets[g] * y.size(1)) * ey, false, trans_b,
                      offsets[g + 1] - offsets[g], y.size(1), a.size(1), a.size(1), b[g].size(1), y.size(1)});
    // Empty sums (k == 0) and empty outputs go through matmul_impl's own cases.
    if (a.size(1) > 0 && y.size(1) > 0 && run_grouped(ps, a.dtype(), y.dtype(), beta)) return;
    for (size_t g = 0; g < b.size(); ++g)
      if (offsets[g + 1] > offsets[g]) {
        Tensor yg = y.rows(offsets[g], offsets[g + 1] - offsets[g]);  // (m_g, n)
        matmul_impl(a.rows(offsets[g], offsets[g + 1] - offsets[g]), false, b[g], trans_b, yg, 1.f, beta);
      }
  }

  void grouped_matmul_weight_impl(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                                  const std::vector<Tensor>& dw, float beta) override {
    std::vector<GroupGemm> ps;
    const size_t e = dtype_size(dy.dtype());
    for (size_t g = 0; g < dw.size(); ++g) {
      const int64_t rows = offsets[g + 1] - offsets[g];
      Tensor w = dw[g];  // (n, k) written through its handle
      if (rows == 0) {   // an empty sum: dw[g] = beta dw[g], matmul_impl's k == 0 case
        if (beta != 1.f) matmul_impl(dy.rows(offsets[g], 0), true, x.rows(offsets[g], 0), false, w, 1.f, beta);
        continue;
      }
      ps.push_back({static_cast<const std::byte*>(dy.raw()) + size_t(offsets[g] * dy.size(1)) * e,
                    static_cast<const std::byte*>(x.raw()) + size_t(offsets[g] * x.size(1)) * e, w.raw(), true,
                    false, dy.size(1), x.size(1), rows, dy.size(1), x.size(1), x.size(1)});
    }
    const bool one_dtype =
        std::all_of(dw.begin(), dw.end(), [&](const Tensor& w) { return w.dtype() == dw.front().dtype(); });
    if (ps.empty() || (one_dtype && run_grouped(ps, dy.dtype(), dw.front().dtype(), beta))) return;
    for (size_t g = 0; g < dw.size(); ++g) {
      const int64_t rows = offsets[g + 1] - offsets[g];
      Tensor w = dw[g];
      if (rows > 0) matmul_impl(dy.rows(offsets[g], rows), true, x.rows(offsets[g], rows), false, w, 1.f, beta);
    }
  }

  // One cuBLASLt GEMM: bias (CUBLASLT_EPILOGUE_BIAS) or bias then GELU with the pre-activation written to
  // pre_act (GELU_AUX_BIAS) in its epilogue. Unfused (GEMM, add_bias, GELU kernel) when cuBLASLt has no
  // algorithm for it, or pre_act's row length is not a multiple of 8 (cuBLASLt's rule for its aux matrix).
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, LinearAct act,
                   Tensor* pre_act) override {
    bind();
    const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
    if (n == 0 || out == 0) return;
    RELAY_ASSERT(n <= INT_MAX && in <= INT_MAX && out <= INT_MAX,
                 "linear: dimensions (" << n << ", " << in << ", " << out << ") exceed cuBLAS's int range");
    const bool gelu = act == LinearAct::gelu_tanh;
    if (in > 0) {
      cuda::LtMatmul lt;
      lt.trans_b = true;
      lt.m = n;
      lt.n = out;
      lt.k = in;
      lt.lda = lt.ldb = in;
      lt.ldc = out;
      lt.ab_type = lt.c_type = cuda_type(x.dtype());
      lt.compute = compute_type(x.dtype());
      lt.a = x.raw();
      lt.b = w.raw();
      lt.c = y.raw();
      lt.bias = bias.defined() ? bias.raw() : nullptr;
      lt.gelu = gelu;
      lt.aux = pre_act ? pre_act->raw() : nullptr;
      if (label_gemm(lt), lt_->run(lt, stream_)) return;
    }
    Tensor& z = pre_act ? *pre_act : y;  // (n, out) the GEMM's output; the GELU runs in place without pre_act
    matmul_impl(x, false, w, true, z, 1.f, 0.f);
    if (bias.defined()) add_bias_impl(z, bias);
    if (gelu) activation_forward_impl(Activation::gelu_tanh, z, y);
  }

  void add_bias_impl(Tensor& y, const Tensor& bias) override {
    bind();
    by_dtype(y, [&](auto* t) {
      cuda::add_bias(ptr<X_OF(t)>(y), ptr<X_OF(t)>(bias), rows_of(y), cols_of(y), stream_);
    });
  }

  void bias_grad_impl(const Tensor& dy, Tensor& db, float beta) override {
    bind();
    const std::shared_ptr<std::byte> scratch = column_scratch(rows_of(dy), cols_of(dy), 1);
    by_dtype(dy, [&](auto* t) {
      cuda::bias_grad(ptr<X_OF(t)>(dy), db.f32(), rows_of(dy), cols_of(dy), beta, as_f32(scratch), stream_);
    });
  }

  // One cuBLASLt GEMM with the DGELU epilogue (the GELU's derivative at act_in applied to the product);
  // unfused (GEMM, then the GELU-backward kernel) when cuBLASLt has no algorithm for it or in % 8 != 0.
  void linear_backward_input_impl(const Tensor& dy, const Tensor& w, Tensor& dx, LinearAct act,
                                  const Tensor& act_in) override {
    bind();
    const int64_t n = dy.size(0), out = dy.size(1), in = w.size(1);
    if (act == LinearAct::gelu_tanh && n > 0 && in > 0 && out > 0) {
      cuda::LtMatmul lt;
      lt.m = n;
      lt.n = in;
      lt.k = out;
      lt.lda = out;
      lt.ldb = lt.ldc = in;
      lt.ab_type = lt.c_type = cuda_type(dy.dtype());
      lt.compute = compute_type(dy.dtype());
      lt.a = dy.raw();
      lt.b = w.raw();
      lt.c = dx.raw();
      lt.dgelu_in = act_in.raw();
      if (label_gemm(lt), lt_->run(lt, stream_)) return;
    }
    matmul_impl(dy, false, w, false, dx, 1.f, 0.f);  // (n, out) @ (out, in)
    if (act == LinearAct::gelu_tanh) activation_backward_impl(Activation::gelu_tanh, act_in, dx, dx);
  }

  // --- elementwise ----------------------------------------------------------------------------

  void activation_forward_impl(Activation act, const Tensor& x, Tensor& y) override {
    bind();
    by_dtype(x, [&](auto* t) {
      cuda::activation_forward(kernel_act(act), ptr<X_OF(t)>(x), ptr<X_OF(t)>(y), x.numel(), stream_);
    });
  }

  void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::activation_backward(kernel_act(act), ptr<X>(x), ptr<X>(dy), ptr<X>(dx), x.numel(), stream_);
    });
  }

  void add_impl(const Tensor& a, const Tensor& b, Tensor& y) override {
    bind();
    by_dtype(a, [&](auto* t) {
      using X = X_OF(t);
      cuda::add(ptr<X>(a), ptr<X>(b), ptr<X>(y), a.numel(), stream_);
    });
  }

  void scale_impl(Tensor& x, float s) override {
    bind();
    by_dtype(x, [&](auto* t) { cuda::scale(ptr<X_OF(t)>(x), s, x.numel(), stream_); });
  }

  double sum_squares_impl(const Tensor& x) override {
    bind();
    double* partial = reinterpret_cast<double*>(reduce_scratch_.get());  // (kSumSquaresMaxBlocks)
    double* total = partial + cuda::kSumSquaresMaxBlocks;                   // (1)
    cuda::sum_squares(x.f32(), x.numel(), partial, total, stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_scalar_.get(), total, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    double result = 0.0;
    std::memcpy(&result, host_scalar_.get(), sizeof(double));
    return result;
  }

  // --- layernorm ------------------------------------------------------------------------------

  void layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                              Tensor& mean, Tensor& rstd) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::layernorm_forward(ptr<X>(x), ptr<X>(gamma), ptr<X>(beta), eps, ptr<X>(y), mean.f32(), rstd.f32(),
                              rows_of(x), cols_of(x), stream_);
    });
  }

  void layernorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, Tensor& dx) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::layernorm_backward_input(ptr<X>(dy), ptr<X>(x), ptr<X>(gamma), mean.f32(), rstd.f32(), ptr<X>(dx),
                                     rows_of(x), cols_of(x), stream_);
    });
  }

  void layernorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                      Tensor& dgamma, Tensor& dbeta) override {
    bind();
    const std::shared_ptr<std::byte> scratch = column_scratch(rows_of(x), cols_of(x), 2);
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::layernorm_backward_weight(ptr<X>(dy), ptr<X>(x), mean.f32(), rstd.f32(), dgamma.f32(), dbeta.f32(),
                                      rows_of(x), cols_of(x), as_f32(scratch), stream_);
    });
  }

  // --- FP8: the amax pass alone (no fp8 dtype involved; the codes and FP8 GEMMs are issue 43's CUDA part) ---------
  void fp8_amax_impl(const Tensor& x, Fp8Tiling tiling, Tensor& amax) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::fp8_amax(ptr<X>(x), rows_of(x), cols_of(x), tiling, reinterpret_cast<uint32_t*>(amax.i32()), stream_);
    });
  }

  // q's format from its dtype; scales and codes as the CPU's kernels/cpu/fp8_quantize.cpp, bit for bit.
  void fp8_quantize_impl(const Tensor& x, Fp8Tiling tiling, Tensor& q, Tensor& scales) override {
    bind();
    const Fp8Grid g = fp8_grid(tiling, rows_of(x), cols_of(x));
    Tensor amax(*this, {g.rows, g.cols}, DType::i32);  // (grid rows, grid cols) |x|'s max as float bits
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::fp8_quantize(ptr<X>(x), rows_of(x), cols_of(x), tiling, fp8_format(q.dtype()),
                         reinterpret_cast<uint32_t*>(amax.i32()), q.fp8(), scales.f32(), stream_);
    });
  }

  void fp8_quantize_amax_impl(const Tensor& x, Fp8Tiling tiling, const Tensor& amax, Tensor& q,
                              Tensor& scales) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::fp8_quantize_amax(ptr<X>(x), rows_of(x), cols_of(x), tiling, fp8_format(q.dtype()),
                              reinterpret_cast<const uint32_t*>(amax.i32()), q.fp8(), scales.f32(), stream_);
    });
  }

  // FP8 GEMMs on cuBLASLt's tensor cores where kernels/fp8_lt_layout.hpp's plan allows it: tensorwise scales on sm_89+
  // (cuBLASLt's per-tensor scale pointers), DeepSeek-V3's 1 x 128 / 128 x 128 blocks on sm_90 (Hopper's VEC128 /
  // BLK128x128 scale modes), m, n, k multiples of 16 and 16-byte aligned pointers. cuBLASLt reads both operands with
  // k along their stored rows ("TN"), so the GEMMs of model/fp8_linear.cpp run as follows:
  //   forward          x (n, in) @ W^T           no copy
  //   input gradient   dy (n, out) @ W           W copied transposed (in, out) (fp8_transpose)
  //   weight gradient  dy^T @ x, dy and x (n, .) both copied transposed (out, n), (in, n)
  // and the block scales are relaid into cuBLASLt's layouts (1 x 128 tiles of x, dy: transposed; 128 x 128 blocks of
  // W: k blocks padded to 4, transposed with W^T; the weight gradient's 128 x 1 tiles are already cuBLASLt's layout
  // for dy^T and x^T). Anything else, or a GEMM cuBLASLt refuses, runs on the plain Relay kernel
  // (kernels/cuda/fp8_quantize.cu: any shape, the CPU's order of scaling, no tensor cores). RELAY_FP8_GEMM=plain
  // runs every FP8 GEMM on the plain kernel (a comparison, a suspect cuBLASLt result); RELAY_FP8_GEMM=lt makes a GEMM
  // that the plan gives to cuBLASLt and cuBLASLt refuses an error (relay::Error) instead of a fallback
  // (test_backend_ops' rows: a row cannot pass on the plain kernel unnoticed).
  void fp8_matmul_impl(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a, const Tensor& b,
                       const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y, float beta) override {
    bind();
    const char* env = std::getenv("RELAY_FP8_GEMM");
    const std::string mode = env ? env : "";
    if (mode != "plain" &&
        fp8_matmul_lt(a, a_scales, a_tiling, trans_a, b, b_scales, b_tiling, trans_b, y, beta, mode == "lt"))
      return;
    const Fp8Matrix am{a.fp8(), a_scales.f32(), a.size(0), a.size(1), fp8_format(a.dtype()), a_tiling};
    const Fp8Matrix bm{b.fp8(), b_scales.f32(), b.size(0), b.size(1), fp8_format(b.dtype()), b_tiling};
    by_dtype(y, [&](auto* t) {
      using Y = X_OF(t);
      cuda::fp8_gemm(am, trans_a, bm, trans_b, ptr<Y>(y), beta, stream_);
    });
  }

  // The cuBLASLt path of fp8_matmul_impl; false, with nothing queued but possibly the copies, when it does not apply.
  // required: a GEMM the plan gives to cuBLASLt that cuBLASLt then refuses is a fatal error.
  bool fp8_matmul_lt(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a, const Tensor& b,
                     const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y, float beta, bool required) {
    Fp8LtProblem prob;
    prob.m = trans_a ? a.size(1) : a.size(0);
    prob.k = trans_a ? a.size(0) : a.size(1);
    prob.n = trans_b ? b.size(0) : b.size(1);
    prob.a_format = fp8_format(a.dtype());
    prob.b_format = fp8_format(b.dtype());
    prob.a_tiling = a_tiling;
    prob.b_tiling = b_tiling;
    prob.trans_a = trans_a;
    prob.trans_b = trans_b;
    prob.sm = prop_.major * 10 + prop_.minor;
    prob.alignment = alignment_of({a.raw(), b.raw(), a_scales.raw(), b_scales.raw(), y.raw()});
    const Fp8LtPlan plan = fp8_lt_plan(prob);
    if (!plan.lt || prob.m > INT_MAX || prob.n > INT_MAX || prob.k > INT_MAX) return false;
    // Each operand as cuBLASLt reads it, k along its rows: a' (m, k) and b' (n, k) codes, and their scales.
    Tensor a_copy, b_copy, a_scales_copy, b_scales_copy;
    auto as_read = [&](const Tensor& q, const Tensor& s, const Fp8LtOperand& op, Tensor& q_copy, Tensor& s_copy,
                       const void*& q_ptr, const float*& s_ptr) {
      q_ptr = q.raw();
      s_ptr = s.f32();
      if (op.transpose) {
        q_copy = Tensor(*this, {q.size(1), q.size(0)}, q.dtype());  // (cols, rows) codes
        cuda::fp8_transpose(q.fp8(), q.size(0), q.size(1), q_copy.fp8(), stream_);
        q_ptr = q_copy.raw();
      }
      if (op.scales_copy) {
        s_copy = Tensor(*this, {op.scales_rows, op.scales_ld});  // (rows, ld) f32 in cuBLASLt's layout
        cuda::fp8_scales_relayout(s.f32(), s.size(0), s.size(1), op.scales_transpose, op.scales_ld, s_copy.f32(),
                                  stream_);
        s_ptr = s_copy.f32();
      }
    };
    auto mode = [](Fp8LtScale s) {
      return int(s == Fp8LtScale::scalar   ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
                 : s == Fp8LtScale::vec128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                           : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
    };
    cuda::LtMatmul lt;
    as_read(a, a_scales, plan.a, a_copy, a_scales_copy, lt.a, lt.a_scale);
    as_read(b, b_scales, plan.b, b_copy, b_scales_copy, lt.b, lt.b_scale);
    lt.trans_a = false;  // a' (m, k)
    lt.trans_b = true;   // b' stored (n, k)
    lt.m = prob.m;
    lt.n = prob.n;
    lt.k = prob.k;
    lt.lda = lt.ldb = prob.k;
    lt.ldc = prob.n;
    lt.ab_type = fp8_cuda_type(a.dtype());
    lt.b_type = int(fp8_cuda_type(b.dtype()));
    lt.c_type = cuda_type(y.dtype());
    lt.compute = CUBLAS_COMPUTE_32F;
    lt.beta = beta;
    lt.c = y.raw();
    lt.a_scale_mode = mode(plan.a.scale);
    lt.b_scale_mode = mode(plan.b.scale);
    label_gemm(lt);
    if (lt_->run(lt, stream_)) return true;
    // An exception, not fatal(): test_backend_ops reports the row and goes on to the next (a GPU window is short).
    if (required)
      throw Error(cat("fp8_matmul: RELAY_FP8_GEMM=lt, but cuBLASLt has no algorithm for this FP8 GEMM (m ", prob.m,
                      ", n ", prob.n, ", k ", prob.k, ", ", fp8_tiling_name(a_tiling), " x ", fp8_tiling_name(b_tiling),
                      ", y ", dtype_name(y.dtype()), ") on ", prop_.name));
    return false;
  }

  // --- RMSNorm, SwiGLU, rotary embeddings (Llama) -------------------------------------------------

  void rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::rmsnorm_forward(ptr<X>(x), ptr<X>(gamma), eps, ptr<X>(y), rstd.f32(), rows_of(x), cols_of(x), stream_);
    });
  }

  void rmsnorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                   Tensor& dx) override {
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::rmsnorm_backward_input(ptr<X>(dy), ptr<X>(x), ptr<X>(gamma), rstd.f32(), ptr<X>(dx), rows_of(x),
                                   cols_of(x), stream_);
    });
  }

  void rmsnorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dgamma) override {
    bind();
    const std::shared_ptr<std::byte> scratch = column_scratch(rows_of(x), cols_of(x), 1);
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::rmsnorm_backward_weight(ptr<X>(dy), ptr<X>(x), rstd.f32(), dgamma.f32(), rows_of(x), cols_of(x),
                                    as_f32(scratch), stream_);
    });
  }

  void swiglu_forward_impl(const Tensor& gate, const Tensor& up, Tensor& h) override {
    bind();
    by_dtype(gate, [&](auto* t) {
      using X = X_OF(t);
      cuda::swiglu_forward(ptr<X>(gate), ptr<X>(up), ptr<X>(h), h.numel(), stream_);
    });
  }

  void swiglu_backward_impl(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate,
                            Tensor& dup) override {
    bind();
    by_dtype(gate, [&](auto* t) {
      using X = X_OF(t);
      cuda::swiglu_backward(ptr<X>(dh), ptr<X>(gate), ptr<X>(up), ptr<X>(dgate), ptr<X>(dup), gate.numel(), stream_);
    });
  }

  void rotary_columns_impl(const Tensor& src, Tensor& dst, int64_t head_width, int64_t off, bool interleaved,
                           bool gather) override {
    bind();
    const Tensor& x = gather ? src : dst;
    const Tensor& pe = gather ? dst : src;
    const int64_t heads = cols_of(x) / head_width;
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::rotary_columns(ptr<X>(src), ptr<X>(dst), rows_of(x), heads, head_width, off, cols_of(pe) / heads,
                           interleaved, gather, stream_);
    });
  }

  void rope_impl(const Tensor& x, int64_t T, int64_t head_dim, double theta, int64_t pos0, bool inverse,
                 Tensor& y, const Tensor& positions, const RopeScaling& scaling) override {
    // The angles, YaRN's included, are computed on the device from the host's formulas (kernels/rope_angles.hpp).
    bind();
    by_dtype(x, [&](auto* t) {
      using X = X_OF(t);
      cuda::rope(ptr<X>(x), ptr<X>(y), rows_of(x), T, cols_of(x) / head_dim, head_dim, theta, pos0, inverse,
                 i32_or_null(positions), scaling, stream_);
    });
  }

  // --- losses ---------------------------------------------------------------------------------

  void cross_entropy_impl(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                          Tensor* dlogits) override {
    bind();
    by_dtype(logits, [&](auto* t) {
      using X = X_OF(t);
      cuda::cross_entropy(ptr<X>(logits), targets.i32(), grad_scale, losses.f32(), ptr_or_null<X>(dlogits),
                          rows_of(logits), cols_of(logits), stream_);
    });
  }

  void mse_impl(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred) override {
    bind();
    by_dtype(pred, [&](auto* t) {
      using X = X_OF(t);
      cuda::mse(ptr<X>(pred), ptr<X>(target), grad_scale, losses.f32(), ptr_or_null<X>(dpred), rows_of(pred),
                cols_of(pred), stream_);
    });
  }

  void argmax_impl(const Tensor& logits, Tensor& out) override {
    bind();
    by_dtype(logits, [&](auto* t) {
      cuda::argmax(ptr<X_OF(t)>(logits), out.i32(), rows_of(logits), cols_of(logits), stream_);
    });
  }

  void row_max_impl(const Tensor& x, Tensor& out) override {
    bind();
    by_dtype(x, [&](auto* t) { cuda::row_max(ptr<X_OF(t)>(x), out.f32(), rows_of(x), cols_of(x), stream_); });
  }

  void cross_entropy_partial_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  const Tensor& row_max, Tensor& partial) override {
    bind();
    by_dtype(logits, [&](auto* t) {
      cuda::cross_entropy_partial(ptr<X_OF(t)>(logits), targets.i32(), vocab_start, row_max.f32(), partial.f32(),
                                  rows_of(logits), cols_of(logits), stream_);
    });
  }

  void cross_entropy_finish_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                 const Tensor& row_max, const Tensor& total, float grad_scale, Tensor& losses,
                                 Tensor* dlogits) override {
    bind();
    by_dtype(logits, [&](auto* t) {
      using X = X_OF(t);
      cuda::cross_entropy_finish(ptr<X>(logits), targets.i32(), vocab_start, row_max.f32(), total.f32(), grad_scale,
                                 losses.f32(), ptr_or_null<X>(dlogits), rows_of(logits), cols_of(logits), stream_);
    });
  }

  // --- language models (GPT-2) ---------------------------------------------------------------

  void embedding_forward_impl(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T, Tensor& out,
                              int64_t vocab_start, const Tensor& positions) override {
    bind();
    by_dtype(wte, [&](auto* t) {
      using X = X_OF(t);
      cuda::embedding_forward(tokens.i32(), ptr<X>(wte), ptr_or_null<X>(wpe), ptr<X>(out), tokens.numel(),
                              cols_of(wte), T, vocab_start, rows_of(wte), i32_or_null(positions), stream_);
    });
  }

  void embedding_backward_impl(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte, Tensor& dwpe,
                               int64_t vocab_start, const Tensor& positions) override {
    bind();
    // The token sort's scratch; the pool hands it to later work on this stream only.
    const std::shared_ptr<std::byte> scratch = pool_->allocate(cuda::embedding_backward_scratch_bytes(tokens.numel()));
    by_dtype(dout, [&](auto* t) {
      cuda::embedding_backward(tokens.i32(), ptr<X_OF(t)>(dout), dwte.f32(), dwpe.defined() ? dwpe.f32() : nullptr,
                               tokens.numel(), cols_of(dwte), T, vocab_start, rows_of(dwte), i32_or_null(positions),
                               scratch.get(), stream_);
    });
  }

  void attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) override {
    bind();
    cuda::attention_forward(qkv.f32(), att.f32(), out.f32(), B, T, cols_of(qkv) / 3, H, stream_);
  }

  void attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T,
                               int64_t H, Tensor& dqkv) override {
    bind();
    // (B, H, T, T) pre-softmax gradient; the pool hands it to later work on this stream only.
    Tensor scratch(*this, {B, H, T, T});
    cuda::attention_backward(dout.f32(), qkv.f32(), att.f32(), dqkv.f32(), scratch.f32(), B, T, cols_of(qkv) / 3, H,
                             stream_);
  }

  void flash_attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& out,
                                    Tensor& lse, const Tensor& doc_start) override {
    bind();
    const int64_t C = cols_of(qkv) / 3;
    check_flash_head_dim("flash_attention_forward", C, H);
    by_dtype(qkv, [&](auto* t) {
      using X = X_OF(t);
      cuda::flash_attention_forward(ptr<X>(qkv), ptr<X>(out), lse.f32(), B, T, C, H, i32_or_null(doc_start), stream_);
    });
  }

  void flash_attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     int64_t B, int64_t T, int64_t H, Tensor& dqkv, const Tensor& doc_start) override {
    bind();
    const int64_t C = cols_of(qkv) / 3;
    check_flash_head_dim("flash_attention_backward", C, H);
    // (B, H, T) row dots D = rowsum(dout * out); the pool hands it to later work on this stream only.
    Tensor scratch(*this, {B, H, T});
    by_dtype(qkv, [&](auto* t) {
      using X = X_OF(t);
      cuda::flash_attention_backward(ptr<X>(dout), ptr<X>(qkv), ptr<X>(out), lse.f32(), ptr<X>(dqkv), scratch.f32(),
                                     B, T, C, H, i32_or_null(doc_start), stream_);
    });
  }

  void attention_decode_impl(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H,
                             Tensor& out) override {
    bind();
    by_dtype(qkv, [&](auto* p) {
      using X = X_OF(p);
      cuda::attention_decode(ptr<X>(qkv), ptr<X>(kcache), ptr<X>(vcache), ptr<X>(out), rows_of(qkv), t,
                             kcache.size(1), cols_of(qkv) / 3, H, stream_);
    });
  }

  void flash_attention_gqa_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t T,
                                        int64_t H, int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start) override {
    bind();
    const int64_t hd = cols_of(q) / H, hd_v = check_gqa_head_dim("flash_attention_gqa_forward", hd, H, v, KV);
    by_dtype(q, [&](auto* t) {
      using X = X_OF(t);
      cuda::flash_attention_gqa_forward(ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k), cols_of(v),
                                        ptr<X>(out), lse.f32(), B, T, H, KV, hd, hd_v, i32_or_null(doc_start),
                                        stream_);
    });
  }

  void flash_attention_gqa_backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t H,
                                         int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) override {
    bind();
    const int64_t hd = cols_of(q) / H, hd_v = check_gqa_head_dim("flash_attention_gqa_backward", hd, H, v, KV);
    // (B, H, T) row dots D = rowsum(dout * out); the pool hands it to later work on this stream only.
    Tensor scratch(*this, {B, H, T});
    by_dtype(q, [&](auto* t) {
      using X = X_OF(t);
      cuda::flash_attention_gqa_backward(ptr<X>(dout), ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k),
                                         cols_of(v), ptr<X>(out), lse.f32(), ptr<X>(dq), ptr<X>(dk), ptr<X>(dv),
                                         scratch.f32(), B, T, H, KV, hd, hd_v, i32_or_null(doc_start), stream_);
    });
  }

  // Context parallelism's overlapped attention (parallel.overlap): out (B*T, H*hd) and lse (B, H, T) become the
  // merge of themselves and out2, lse2 (the same shapes), the CPU's rule.
  void attention_merge_impl(Tensor& out, Tensor& lse, const Tensor& out2, const Tensor& lse2, int64_t B, int64_t T,
                            int64_t H) override {
    bind();
    by_dtype(out, [&](auto* t) {
      using X = X_OF(t);
      cuda::attention_merge(ptr<X>(out), lse.f32(), ptr<X>(out2), lse2.f32(), B, T, H, cols_of(out) / H, stream_);
    });
  }

  // Context parallelism: a rank's query rows (B*Tq, H*hd) at positions q_pos (B*Tq) against the sequences' gathered
  // keys and values (B*Tk, KV*hd).
  void flash_attention_gqa_forward_at_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t Tq,
                                           int64_t Tk, const Tensor& q_pos, int64_t H, int64_t KV, Tensor& out,
                                           Tensor& lse, const Tensor& doc_start) override {
    bind();
    const int64_t hd = cols_of(q) / H, hd_v = check_gqa_head_dim("flash_attention_gqa_forward_at", hd, H, v, KV);
    by_dtype(q, [&](auto* t) {
      using X = X_OF(t);
      cuda::flash_attention_gqa_forward_at(ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k), cols_of(v),
                                           ptr<X>(out), lse.f32(), B, Tq, Tk, q_pos.i32(), H, KV, hd, hd_v,
                                           i32_or_null(doc_start), stream_);
    });
  }

  void flash_attention_gqa_backward_at_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk,
                                            const Tensor& q_pos, int64_t H, int64_t KV, Tensor& dq, Tensor& dk,
                                            Tensor& dv, const Tensor& doc_start) override {
    bind();
    const int64_t hd = cols_of(q) / H, hd_v = check_gqa_head_dim("flash_attention_gqa_backward_at", hd, H, v, KV);
    // (B, H, Tq) row dots D = rowsum(dout * out); the pool hands it to later work on this stream only.
    Tensor scratch(*this, {B, H, Tq});
    by_dtype(q, [&](auto* t) {
      using X = X_OF(t);
      cuda::flash_attention_gqa_backward_at(ptr<X>(dout), ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k),
                                            cols_of(v), ptr<X>(out), lse.f32(), ptr<X>(dq), ptr<X>(dk), ptr<X>(dv),
                                            scratch.f32(), B, Tq, Tk, q_pos.i32(), H, KV, hd, hd_v,
                                            i32_or_null(doc_start), stream_);
    });
  }

  void attention_decode_gqa_impl(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kcache, Tensor& vcache,
                                 int64_t t, int64_t H, int64_t KV, Tensor& out) override {
    bind();
    by_dtype(q, [&](auto* p) {
      using X = X_OF(p);
      cuda::attention_decode_gqa(ptr<X>(q), cols_of(q), ptr<X>(k), ptr<X>(v), cols_of(k), ptr<X>(kcache),
                                 ptr<X>(vcache), ptr<X>(out), rows_of(q), t, kcache.size(1), H, KV, cols_of(q) / H,
                                 stream_);
    });
  }

  // Multi-head latent attention's absorbed decode (kernels/cuda/attention_decode_latent.cu): q (n, H*dk), kv (n, dk),
  // cache (n, Tmax, dk), out (n, H*r).
  void attention_decode_latent_impl(const Tensor& q, const Tensor& kv, Tensor& cache, int64_t t, int64_t H,
                                    float scale, Tensor& out) override {
    bind();
    const int64_t n = rows_of(q), dk = cache.size(2);
    if (dk > cuda::kLatentMaxDim)  // a model choice: an Error naming the keys
      throw Error(cat("attention_decode_latent: a cache row of ", dk, " values (model.kv_lora_rank + ",
                      "model.qk_rope_head_dim) is above the CUDA kernel's limit of ", cuda::kLatentMaxDim,
                      "; generate on the CPU (relay generate --device cpu)"));
    // (n, H, t + 1) the scores; the pool hands it to later work on this stream only.
    Tensor scratch(*this, {n, H, t + 1});
    by_dtype(q, [&](auto* p) {
      using X = X_OF(p);
      cuda::attention_decode_latent(ptr<X>(q), ptr<X>(kv), ptr<X>(cache), ptr<X>(out), scratch.f32(), n, t,
                                    cache.size(1), H, dk, cols_of(out) / H, scale, stream_);
    });
  }

  // --- optimizers -----------------------------------------------------------------------------

  void adamw_step_impl(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWArgs& a,
                       Tensor& work) override {
    bind();
    cuda::adamw_step(param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), bf16_work(work),
                     param.numel(), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, stream_);
  }

  // Every slot in a few launches (kernels/cuda/optimizer.cu's multi-tensor kernel), bit for bit adamw_step_impl's.
  void adamw_step_many_impl(const std::vector<AdamWSlot>& slots, const AdamWArgs& a) override {
    bind();
    std::vector<cuda::AdamWTensor> tensors;
    tensors.reserve(slots.size());
    for (const AdamWSlot& t : slots)
      tensors.push_back({t.param->f32(), t.grad->f32(), t.exp_avg->f32(), t.exp_avg_sq->f32(), bf16_work(*t.work),
                         t.param->numel()});
    cuda::adamw_step_many(tensors.data(), int64_t(tensors.size()), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                          a.step, stream_);
  }

  void sgd_step_impl(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& a,
                     Tensor& work) override {
    bind();
    cuda::sgd_step(param.f32(), grad.f32(), a.momentum != 0.0 ? momentum_buffer.f32() : nullptr,
                   bf16_work(work), param.numel(), a.lr, a.momentum, a.weight_decay, a.first_step,
                   stream_);
  }

 private:
  struct Staging {
    std::shared_ptr<std::byte> buffer;  // pinned
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;    // recorded after the copy that last read buffer
    void* landing = nullptr;         // (landing_capacity) device bytes: large uploads arrive here first
    size_t landing_capacity = 0;
    cudaEvent_t consumed = nullptr;  // recorded after the compute stream last read landing
  };

  // RELAY_OP_PROFILE=shapes: the open op's GEMM as " [m x n x k ab->c epilogue]", so the profile sums by shape.
  void label_gemm(const cuda::LtMatmul& p) const {
    if (!profile_shapes_ || op_depth_ != 1) return;
    auto type = [](cudaDataType_t t) {
      return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_8F_E4M3 ? "e4m3" : t == CUDA_R_8F_E5M2 ? "e5m2" : "f32";
    };
    profile_->label(cat(" [", p.m, " x ", p.n, " x ", p.k, p.trans_a ? " aT" : "", p.trans_b ? " bT" : "", " ",
                        type(p.ab_type), "->", type(p.c_type), p.beta != 0.f ? " +=" : "", p.bias ? " bias" : "",
                        p.gelu ? " gelu" : "", p.dgelu_in ? " dgelu" : "", "]"));
  }

  // Uploads of at least this many bytes (a batch of dense features) land in a device buffer on a copy stream, so the
  // transfer overlaps the compute stream's work; token batches stay on the direct path.
  static constexpr size_t kLandedUploadBytes = size_t(4) << 20;

  Staging& next_slot() {
    Staging& slot = staging_[next_staging_];
    next_staging_ = (next_staging_ + 1) % staging_.size();
    return slot;
  }

  // Copies bytes of host_src into the slot's pinned buffer once its last transfer has read it. Large copies are split
  // over host threads: one thread's memcpy of a 256 MiB batch takes tens of milliseconds.
  void stage(Staging& slot, const void* host_src, size_t bytes) {
    CUDA_CHECK(cudaEventSynchronize(slot.copied));  // its last copy has read the buffer (no-op if none)
    if (slot.capacity < bytes) {
      slot.buffer.reset();
      slot.buffer = allocate_host(bytes);
      slot.capacity = bytes;
    }
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t threads = std::min<size_t>({8, hw, std::max<size_t>(1, bytes / (size_t(32) << 20))});
    auto part = [&](size_t i) {
      const size_t begin = bytes * i / threads, end = bytes * (i + 1) / threads;
      std::memcpy(slot.buffer.get() + begin, static_cast<const std::byte*>(host_src) + begin, end - begin);
    };
    std::vector<std::thread> pool;
    for (size_t i = 1; i < threads; ++i) pool.emplace_back(part, i);
    part(0);
    for (std::thread& t : pool) t.join();
  }

  // host_src (bytes) -> pinned staging -> the slot's device landing buffer on copy_stream_ (after the compute stream has
  // consumed the landing buffer's last contents) -> dst on the compute stream: a device copy, or the float32 -> bf16
  // rounding when round_to_bf16.
  void upload_landed(Tensor& dst, const void* host_src, size_t bytes, bool round_to_bf16) {
    if (!copy_stream_) CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    Staging& slot = next_slot();
    stage(slot, host_src, bytes);
    if (slot.landing_capacity < bytes) {
      CUDA_CHECK(cudaEventSynchronize(slot.consumed));
      if (slot.landing) CUDA_CHECK(cudaFree(slot.landing));
      slot.landing = nullptr;
      CUDA_CHECK(cudaMalloc(&slot.landing, bytes));
      slot.landing_capacity = bytes;
    }
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, slot.consumed, 0));
    CUDA_CHECK(cudaMemcpyAsync(slot.landing, slot.buffer.get(), bytes, cudaMemcpyHostToDevice, copy_stream_));
    CUDA_CHECK(cudaEventRecord(slot.copied, copy_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, slot.copied, 0));
    if (round_to_bf16)
      cuda::convert(static_cast<const float*>(slot.landing), ptr<__nv_bfloat16>(dst), dst.numel(), stream_);
    else
      CUDA_CHECK(cudaMemcpyAsync(dst.raw(), slot.landing, bytes, cudaMemcpyDeviceToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(slot.consumed, stream_));
  }

  // The runtime's current device is per host thread; binding on every entry point keeps ops right
  // when a helper thread (a data prefetcher) calls in. Cheap when the device is already current.
  void bind() const { CUDA_CHECK(cudaSetDevice(device_)); }

  // Scratch for a column sum's per-slice partials (column_sum.cuh): the pool hands it to later work on this stream
  // only, so it may be freed as soon as the launches are queued.
  std::shared_ptr<std::byte> column_scratch(int64_t rows, int64_t cols, int outputs) {
    return pool_->allocate(cuda::column_sum_scratch_bytes(rows, cols, outputs));
  }
  static float* as_f32(const std::shared_ptr<std::byte>& p) { return reinterpret_cast<float*>(p.get()); }

  // float32 GEMMs on TF32 tensor cores under train.precision = "tf32"; otherwise full float32 accumulation.
  cublasComputeType_t compute_type(DType inputs) const {
    return inputs == DType::f32 && precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }

  // cuBLASLt's workspace, shared by every GEMM on the stream: 32 MiB, what PyTorch gives cuBLASLt on Hopper.
  static constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

  int device_;
  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // timing marks, the first marks_used_ in use
  size_t marks_used_ = 0;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<std::byte> lt_workspace_;  // (kLtWorkspaceBytes) device bytes
  std::unique_ptr<cuda::LtGemm> lt_;         // cuBLASLt: its handle and the algorithms chosen per shape
  Precision precision_ = Precision::fp32;
  std::shared_ptr<DevicePool> pool_;
  std::shared_ptr<std::byte> reduce_scratch_;  // (kSumSquaresMaxBlocks + 1) doubles
  std::shared_ptr<std::byte> host_scalar_;     // one pinned double for sum_squares
  std::unique_ptr<OpProfile> profile_;         // RELAY_OP_PROFILE=1 or shapes only
  bool profile_shapes_ = false;                // RELAY_OP_PROFILE=shapes: GEMMs summed by shape
  mutable int op_depth_ = 0;                   // nesting of front-door ops: only the outermost is timed
  cudaStream_t copy_stream_ = nullptr;  // large uploads' host-to-device copies (created on the first)
  std::array<Staging, 2> staging_;
  size_t next_staging_ = 0;
};
#undef X_OF

}  // namespace

int cuda_device_count_impl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for a count
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  if (count == 0)
    throw Error(cat("train.device = \"cuda\" but no CUDA device is visible (",
                    err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices",
                    "). Check CUDA_VISIBLE_DEVICES and that the job asked for GPUs (e.g. srun --gpus-per-task=1), "
                    "or set train.device = \"cpu\""));
  if (opts.gpu < 0 || opts.gpu >= count)
    throw Error(cat("train.device = \"cuda\": this rank wants GPU ", opts.gpu, " but ", count,
                    " CUDA device(s) are visible (CUDA_VISIBLE_DEVICES may hide the others)"));
  return std::make_unique<CudaBackend>(opts);
}

}  // namespace relay

// The CUDA backend: every op is a cuBLAS GEMM or a launcher from kernels/cuda, queued on the one
// stream this backend owns, so ops run in program order without host synchronisation. Only
// download, sum_squares and synchronize wait for the GPU.
#include "backend/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/bias.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/loss.cuh"
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

void expect_cuda(const Tensor& t, const char* op, const char* name, DType dtype = DType::f32) {
  RELAY_ASSERT(t.defined(), op << ": " << name << " is undefined");
  RELAY_ASSERT(t.device() == Device::cuda, op << ": " << name << " " << shape_str(t.shape())
                                              << " is not a CUDA tensor");
  RELAY_ASSERT(t.dtype() == dtype, op << ": " << name << " is " << dtype_name(t.dtype()) << ", expected "
                                      << dtype_name(dtype));
}

void expect_numel(const Tensor& t, int64_t numel, const char* op, const char* name) {
  RELAY_ASSERT(t.numel() == numel, op << ": " << name << " " << shape_str(t.shape()) << " has " << t.numel()
                                      << " elements, expected " << numel);
}

// A tensor read as a matrix (rows, cols): the leading dimension is the rows, the rest the columns;
// a vector is one column. The same convention as the CPU reference backend.
int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(0); }
int64_t cols_of(const Tensor& t) {
  int64_t cols = 1;
  for (int d = 1; d < t.ndim(); ++d) cols *= t.size(d);
  return cols;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts) : device_(opts.gpu) {
    bind();
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // Default math: no TF32, so fp32 GEMMs agree with the CPU to ~1e-6 (unless NVIDIA_TF32_OVERRIDE=1).
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    pool_ = std::make_shared<DevicePool>();
    reduce_scratch_ = pool_->allocate((cuda::kSumSquaresMaxBlocks + 1) * sizeof(double));
    host_scalar_ = allocate_host(sizeof(double));
    for (Staging& slot : staging_) CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    set_precision(opts.precision);
  }

  ~CudaBackend() override {
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    // No CHECKs: this may run during shutdown after an error elsewhere.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    bf16_a_.reset();
    bf16_b_.reset();
    reduce_scratch_.reset();
    for (Staging& slot : staging_)
      if (slot.copied) cudaEventDestroy(slot.copied);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda; }

  std::shared_ptr<std::byte> allocate(size_t bytes) override {
    bind();
    return pool_->allocate(bytes);
  }

  std::string describe() const override {
    int cublas_version = 0;
    CUBLAS_CHECK(cublasGetVersion(cublas_, &cublas_version));
    return cat("cuda:", device_, " ", prop_.name, " (sm_", prop_.major, prop_.minor, ", ",
               prop_.multiProcessorCount, " SMs, ", prop_.totalGlobalMem / (1024 * 1024 * 1024), " GiB), cuBLAS ",
               cublas_version, ", precision ", precision_ == Precision::fp32 ? "fp32" : "bf16");
  }

  void set_precision(Precision p) override {
    if (p == Precision::bf16 && prop_.major < 8)
      throw Error(cat("train.precision = \"bf16\" needs a GPU with compute capability 8.0 or newer; cuda:", device_,
                      " (", prop_.name, ") is sm_", prop_.major, prop_.minor, ". Use train.precision = \"fp32\""));
    precision_ = p;
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
    Staging& slot = staging_[next_staging_];
    next_staging_ = (next_staging_ + 1) % staging_.size();
    CUDA_CHECK(cudaEventSynchronize(slot.copied));  // its last copy has read the buffer (no-op if none)
    if (slot.capacity < bytes) {
      slot.buffer.reset();
      slot.buffer = allocate_host(bytes);
      slot.capacity = bytes;
    }
    std::memcpy(slot.buffer.get(), host_src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), slot.buffer.get(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
  }

  void download(void* host_dst, const Tensor& src) override {
    bind();
    RELAY_ASSERT(src.defined() && src.device() == Device::cuda, "download: source is not a CUDA tensor");
    if (src.bytes() == 0) return;
    RELAY_ASSERT(host_dst, "download: null host pointer");
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy(Tensor& dst, const Tensor& src) override {
    bind();
    expect_cuda(src, "copy", "src", src.dtype());
    expect_cuda(dst, "copy", "dst", src.dtype());
    RELAY_ASSERT(dst.numel() == src.numel(),
                 "copy: dst " << shape_str(dst.shape()) << " vs src " << shape_str(src.shape()));
    if (src.bytes() == 0 || dst.raw() == src.raw()) return;
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void fill(Tensor& x, float value) override {
    bind();
    expect_cuda(x, "fill", "x", x.dtype());
    if (x.dtype() == DType::i32)
      cuda::fill(x.i32(), static_cast<int32_t>(value), x.numel(), stream_);
    else
      cuda::fill(x.f32(), value, x.numel(), stream_);
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

  // --- linear algebra -------------------------------------------------------------------------

  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
              float beta) override {
    bind();
    expect_cuda(a, "matmul", "a");
    expect_cuda(b, "matmul", "b");
    expect_cuda(y, "matmul", "y");
    RELAY_ASSERT(a.ndim() == 2 && b.ndim() == 2 && y.ndim() == 2,
                 "matmul: a " << shape_str(a.shape()) << ", b " << shape_str(b.shape()) << ", y "
                              << shape_str(y.shape()) << " must be matrices");
    const int64_t m = trans_a ? a.size(1) : a.size(0);
    const int64_t k = trans_a ? a.size(0) : a.size(1);
    const int64_t kb = trans_b ? b.size(1) : b.size(0);
    const int64_t n = trans_b ? b.size(0) : b.size(1);
    RELAY_ASSERT(k == kb && y.size(0) == m && y.size(1) == n,
                 "matmul: op(a) is (" << m << ", " << k << "), op(b) is (" << kb << ", " << n << "), y is "
                                      << shape_str(y.shape()));
    RELAY_ASSERT(y.raw() != a.raw() && y.raw() != b.raw(), "matmul: y must not alias a or b");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: y = beta * y, and beta == 0 must not read y (BLAS convention)
      if (beta == 0.0f)
        cuda::fill(y.f32(), 0.0f, y.numel(), stream_);
      else
        cuda::scale(y.f32(), beta, y.numel(), stream_);
      return;
    }
    RELAY_ASSERT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && a.size(1) <= INT_MAX && b.size(1) <= INT_MAX,
                 "matmul: dimensions (" << m << ", " << n << ", " << k << ") exceed cuBLAS's int range");

    // Row-major y = op(a) op(b) is column-major y^T = op(b)^T op(a)^T: cuBLAS sees each row-major
    // matrix as its transpose, so b goes first and m, n swap. The leading dimension of each operand
    // is its row length as stored.
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int lda = static_cast<int>(a.size(1)), ldb = static_cast<int>(b.size(1)), ldy = static_cast<int>(n);
    const void* a_ptr = a.raw();
    const void* b_ptr = b.raw();
    cudaDataType_t in_type = CUDA_R_32F;
    if (precision_ == Precision::bf16) {
      a_ptr = to_bf16(a, bf16_a_, bf16_a_bytes_);
      b_ptr = to_bf16(b, bf16_b_, bf16_b_bytes_);
      in_type = CUDA_R_16BF;
    }
    CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                              &alpha, b_ptr, in_type, ldb, a_ptr, in_type, lda, &beta, y.raw(), CUDA_R_32F, ldy,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void add_bias(Tensor& y, const Tensor& bias) override {
    bind();
    expect_cuda(y, "add_bias", "y");
    expect_cuda(bias, "add_bias", "bias");
    const int64_t f = cols_of(y);
    expect_numel(bias, f, "add_bias", "bias");
    cuda::add_bias(y.f32(), bias.f32(), rows_of(y), f, stream_);
  }

  void bias_grad(const Tensor& dy, Tensor& db, float beta) override {
    bind();
    expect_cuda(dy, "bias_grad", "dy");
    expect_cuda(db, "bias_grad", "db");
    const int64_t f = cols_of(dy);
    expect_numel(db, f, "bias_grad", "db");
    cuda::bias_grad(dy.f32(), db.f32(), rows_of(dy), f, beta, stream_);
  }

  // --- elementwise ----------------------------------------------------------------------------

  void activation_forward(Activation act, const Tensor& x, Tensor& y) override {
    bind();
    expect_cuda(x, "activation_forward", "x");
    expect_cuda(y, "activation_forward", "y");
    expect_numel(y, x.numel(), "activation_forward", "y");
    cuda::activation_forward(kernel_act(act), x.f32(), y.f32(), x.numel(), stream_);
  }

  void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) override {
    bind();
    expect_cuda(x, "activation_backward", "x");
    expect_cuda(dy, "activation_backward", "dy");
    expect_cuda(dx, "activation_backward", "dx");
    expect_numel(dy, x.numel(), "activation_backward", "dy");
    expect_numel(dx, x.numel(), "activation_backward", "dx");
    cuda::activation_backward(kernel_act(act), x.f32(), dy.f32(), dx.f32(), x.numel(), stream_);
  }

  void add(const Tensor& a, const Tensor& b, Tensor& y) override {
    bind();
    expect_cuda(a, "add", "a");
    expect_cuda(b, "add", "b");
    expect_cuda(y, "add", "y");
    expect_numel(b, a.numel(), "add", "b");
    expect_numel(y, a.numel(), "add", "y");
    cuda::add(a.f32(), b.f32(), y.f32(), a.numel(), stream_);
  }

  void scale(Tensor& x, float s) override {
    bind();
    expect_cuda(x, "scale", "x");
    cuda::scale(x.f32(), s, x.numel(), stream_);
  }

  double sum_squares(const Tensor& x) override {
    bind();
    expect_cuda(x, "sum_squares", "x");
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

  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                         Tensor& mean, Tensor& rstd) override {
    bind();
    const char* op = "layernorm_forward";
    expect_cuda(x, op, "x");
    expect_cuda(gamma, op, "gamma");
    expect_cuda(beta, op, "beta");
    expect_cuda(y, op, "y");
    expect_cuda(mean, op, "mean");
    expect_cuda(rstd, op, "rstd");
    const int64_t d = cols_of(x), n = rows_of(x);
    expect_numel(gamma, d, op, "gamma");
    expect_numel(beta, d, op, "beta");
    expect_numel(y, x.numel(), op, "y");
    expect_numel(mean, n, op, "mean");
    expect_numel(rstd, n, op, "rstd");
    cuda::layernorm_forward(x.f32(), gamma.f32(), beta.f32(), eps, y.f32(), mean.f32(), rstd.f32(), n, d, stream_);
  }

  void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                const Tensor& rstd, Tensor& dx) override {
    bind();
    const char* op = "layernorm_backward_input";
    expect_cuda(dy, op, "dy");
    expect_cuda(x, op, "x");
    expect_cuda(gamma, op, "gamma");
    expect_cuda(mean, op, "mean");
    expect_cuda(rstd, op, "rstd");
    expect_cuda(dx, op, "dx");
    const int64_t d = cols_of(x), n = rows_of(x);
    expect_numel(dy, x.numel(), op, "dy");
    expect_numel(dx, x.numel(), op, "dx");
    expect_numel(gamma, d, op, "gamma");
    expect_numel(mean, n, op, "mean");
    expect_numel(rstd, n, op, "rstd");
    cuda::layernorm_backward_input(dy.f32(), x.f32(), gamma.f32(), mean.f32(), rstd.f32(), dx.f32(), n, d,
                                   stream_);
  }

  void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                 Tensor& dgamma, Tensor& dbeta) override {
    bind();
    const char* op = "layernorm_backward_weight";
    expect_cuda(dy, op, "dy");
    expect_cuda(x, op, "x");
    expect_cuda(mean, op, "mean");
    expect_cuda(rstd, op, "rstd");
    expect_cuda(dgamma, op, "dgamma");
    expect_cuda(dbeta, op, "dbeta");
    const int64_t d = cols_of(x), n = rows_of(x);
    expect_numel(dy, x.numel(), op, "dy");
    expect_numel(mean, n, op, "mean");
    expect_numel(rstd, n, op, "rstd");
    expect_numel(dgamma, d, op, "dgamma");
    expect_numel(dbeta, d, op, "dbeta");
    cuda::layernorm_backward_weight(dy.f32(), x.f32(), mean.f32(), rstd.f32(), dgamma.f32(), dbeta.f32(), n, d,
                                    stream_);
  }

  // --- losses ---------------------------------------------------------------------------------

  void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                     Tensor* dlogits) override {
    bind();
    const char* op = "cross_entropy";
    expect_cuda(logits, op, "logits");
    expect_cuda(targets, op, "targets", DType::i32);
    expect_cuda(losses, op, "losses");
    const int64_t n = rows_of(logits), c = cols_of(logits);
    expect_numel(targets, n, op, "targets");
    expect_numel(losses, n, op, "losses");
    float* dl = nullptr;
    if (dlogits) {
      expect_cuda(*dlogits, op, "dlogits");
      expect_numel(*dlogits, logits.numel(), op, "dlogits");
      dl = dlogits->f32();
    }
    cuda::cross_entropy(logits.f32(), targets.i32(), grad_scale, losses.f32(), dl, n, c, stream_);
  }

  void mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred) override {
    bind();
    const char* op = "mse";
    expect_cuda(pred, op, "pred");
    expect_cuda(target, op, "target");
    expect_cuda(losses, op, "losses");
    const int64_t k = cols_of(pred), n = rows_of(pred);
    expect_numel(target, pred.numel(), op, "target");
    expect_numel(losses, n, op, "losses");
    float* dp = nullptr;
    if (dpred) {
      expect_cuda(*dpred, op, "dpred");
      expect_numel(*dpred, pred.numel(), op, "dpred");
      dp = dpred->f32();
    }
    cuda::mse(pred.f32(), target.f32(), grad_scale, losses.f32(), dp, n, k, stream_);
  }

  void row_max(const Tensor& x, Tensor& out) override {
    bind();
    expect_cuda(x, "row_max", "x");
    expect_cuda(out, "row_max", "out");
    expect_numel(out, rows_of(x), "row_max", "out");
    cuda::row_max(x.f32(), out.f32(), rows_of(x), cols_of(x), stream_);
  }

  void cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& row_max,
                             Tensor& partial) override {
    bind();
    const char* op = "cross_entropy_partial";
    const int64_t n = rows_of(logits);
    expect_cuda(logits, op, "logits");
    expect_cuda(targets, op, "targets", DType::i32);
    expect_cuda(row_max, op, "row_max");
    expect_cuda(partial, op, "partial");
    expect_numel(targets, n, op, "targets");
    expect_numel(row_max, n, op, "row_max");
    expect_numel(partial, 2 * n, op, "partial");
    cuda::cross_entropy_partial(logits.f32(), targets.i32(), vocab_start, row_max.f32(), partial.f32(), n,
                                cols_of(logits), stream_);
  }

  void cross_entropy_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& row_max,
                            const Tensor& total, float grad_scale, Tensor& losses, Tensor* dlogits) override {
    bind();
    const char* op = "cross_entropy_finish";
    const int64_t n = rows_of(logits);
    expect_cuda(logits, op, "logits");
    expect_cuda(targets, op, "targets", DType::i32);
    expect_cuda(total, op, "total");
    expect_cuda(losses, op, "losses");
    expect_numel(total, 2 * n, op, "total");
    expect_numel(losses, n, op, "losses");
    if (dlogits) {
      expect_cuda(*dlogits, op, "dlogits");
      expect_numel(*dlogits, logits.numel(), op, "dlogits");
    }
    cuda::cross_entropy_finish(logits.f32(), targets.i32(), vocab_start, row_max.f32(), total.f32(), grad_scale,
                               losses.f32(), dlogits ? dlogits->f32() : nullptr, n, cols_of(logits), stream_);
  }

  void argmax(const Tensor& logits, Tensor& out) override {
    bind();
    expect_cuda(logits, "argmax", "logits");
    expect_cuda(out, "argmax", "out", DType::i32);
    expect_numel(out, rows_of(logits), "argmax", "out");
    cuda::argmax(logits.f32(), out.i32(), rows_of(logits), cols_of(logits), stream_);
  }

  // --- language models (GPT-2) ---------------------------------------------------------------

  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T, Tensor& out,
                         int64_t vocab_start = 0) override {
    bind();
    const char* op = "embedding_forward";
    expect_cuda(tokens, op, "tokens", DType::i32);
    expect_cuda(wte, op, "wte");
    if (wpe.defined()) expect_cuda(wpe, op, "wpe");
    expect_cuda(out, op, "out");
    const int64_t n = tokens.numel(), C = cols_of(wte);
    RELAY_ASSERT(!wpe.defined() || (cols_of(wpe) == C && T <= rows_of(wpe)),
                 op << ": wpe " << shape_str(wpe.shape()) << " for T " << T);
    expect_numel(out, n * C, op, "out");
    cuda::embedding_forward(tokens.i32(), wte.f32(), wpe.defined() ? wpe.f32() : nullptr, out.f32(), n, C, T,
                            vocab_start, rows_of(wte), stream_);
  }

  void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte, Tensor& dwpe,
                          int64_t vocab_start = 0) override {
    bind();
    const char* op = "embedding_backward";
    expect_cuda(tokens, op, "tokens", DType::i32);
    expect_cuda(dout, op, "dout");
    expect_cuda(dwte, op, "dwte");
    if (dwpe.defined()) expect_cuda(dwpe, op, "dwpe");
    const int64_t n = tokens.numel(), C = cols_of(dwte);
    expect_numel(dout, n * C, op, "dout");
    RELAY_ASSERT(!dwpe.defined() || (cols_of(dwpe) == C && T <= rows_of(dwpe)),
                 op << ": dwpe " << shape_str(dwpe.shape()) << " for T " << T);
    cuda::embedding_backward(tokens.i32(), dout.f32(), dwte.f32(), dwpe.defined() ? dwpe.f32() : nullptr, n, C, T,
                             vocab_start, rows_of(dwte), stream_);
  }

  void attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) override {
    bind();
    const char* op = "attention_forward";
    expect_cuda(qkv, op, "qkv");
    expect_cuda(att, op, "att");
    expect_cuda(out, op, "out");
    const int64_t C = cols_of(qkv) / 3;
    expect_numel(qkv, B * T * 3 * C, op, "qkv");
    expect_numel(att, B * H * T * T, op, "att");
    expect_numel(out, B * T * C, op, "out");
    cuda::attention_forward(qkv.f32(), att.f32(), out.f32(), B, T, C, H, stream_);
  }

  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T, int64_t H,
                          Tensor& dqkv) override {
    bind();
    const char* op = "attention_backward";
    expect_cuda(dout, op, "dout");
    expect_cuda(qkv, op, "qkv");
    expect_cuda(att, op, "att");
    expect_cuda(dqkv, op, "dqkv");
    const int64_t C = cols_of(qkv) / 3;
    expect_numel(dout, B * T * C, op, "dout");
    expect_numel(att, B * H * T * T, op, "att");
    expect_numel(dqkv, qkv.numel(), op, "dqkv");
    // (B, H, T, T) pre-softmax gradient; the pool hands it to later work on this stream only.
    Tensor scratch(*this, {B, H, T, T});
    cuda::attention_backward(dout.f32(), qkv.f32(), att.f32(), dqkv.f32(), scratch.f32(), B, T, C, H, stream_);
  }

  void attention_decode(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H, Tensor& out) override {
    bind();
    const char* op = "attention_decode";
    expect_cuda(qkv, op, "qkv");
    expect_cuda(kcache, op, "kcache");
    expect_cuda(vcache, op, "vcache");
    expect_cuda(out, op, "out");
    const int64_t n = rows_of(qkv), C = cols_of(qkv) / 3;
    RELAY_ASSERT(kcache.ndim() == 3 && kcache.shape() == vcache.shape() && kcache.size(0) == n && kcache.size(2) == C,
                 op << ": caches " << shape_str(kcache.shape()) << " for qkv " << shape_str(qkv.shape()));
    expect_numel(out, n * C, op, "out");
    cuda::attention_decode(qkv.f32(), kcache.f32(), vcache.f32(), out.f32(), n, t, kcache.size(1), C, H, stream_);
  }

  // --- optimizers -----------------------------------------------------------------------------

  void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const AdamWArgs& args) override {
    bind();
    const char* op = "adamw_step";
    expect_cuda(param, op, "param");
    expect_cuda(grad, op, "grad");
    expect_cuda(exp_avg, op, "exp_avg");
    expect_cuda(exp_avg_sq, op, "exp_avg_sq");
    expect_numel(grad, param.numel(), op, "grad");
    expect_numel(exp_avg, param.numel(), op, "exp_avg");
    expect_numel(exp_avg_sq, param.numel(), op, "exp_avg_sq");
    cuda::adamw_step(param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), param.numel(), args.lr, args.beta1,
                     args.beta2, args.eps, args.weight_decay, args.step, stream_);
  }

  void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& args) override {
    bind();
    expect_cuda(param, "sgd_step", "param");
    expect_cuda(grad, "sgd_step", "grad");
    expect_numel(grad, param.numel(), "sgd_step", "grad");
    float* buf = nullptr;
    if (args.momentum != 0.0f) {
      expect_cuda(momentum_buffer, "sgd_step", "momentum_buffer");
      expect_numel(momentum_buffer, param.numel(), "sgd_step", "momentum_buffer");
      buf = momentum_buffer.f32();
    }
    cuda::sgd_step(param.f32(), grad.f32(), buf, param.numel(), args.lr, args.momentum, args.weight_decay,
                   args.first_step, stream_);
  }

 private:
  // The runtime's current device is per host thread; binding on every entry point keeps ops right
  // when a helper thread (a data prefetcher) calls in. Cheap when the device is already current.
  void bind() const { CUDA_CHECK(cudaSetDevice(device_)); }

  // Rounds t to bf16 in a scratch buffer that is reused and grown as needed. Reuse is safe without
  // events: the previous GEMM that read the buffer is earlier on the same stream.
  const void* to_bf16(const Tensor& t, std::shared_ptr<std::byte>& buffer, size_t& capacity) {
    const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(__nv_bfloat16);
    if (bytes > capacity) {
      buffer = pool_->allocate(bytes);
      capacity = bytes;
    }
    auto* out = reinterpret_cast<__nv_bfloat16*>(buffer.get());
    cuda::cast_to_bf16(t.f32(), out, t.numel(), stream_);
    return out;
  }

  int device_;
  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // timing marks, the first marks_used_ in use
  size_t marks_used_ = 0;
  cublasHandle_t cublas_ = nullptr;
  Precision precision_ = Precision::fp32;
  std::shared_ptr<DevicePool> pool_;
  std::shared_ptr<std::byte> bf16_a_, bf16_b_;  // bf16 copies of the GEMM inputs
  size_t bf16_a_bytes_ = 0, bf16_b_bytes_ = 0;
  std::shared_ptr<std::byte> reduce_scratch_;   // (kSumSquaresMaxBlocks + 1) doubles
  std::shared_ptr<std::byte> host_scalar_;      // one pinned double for sum_squares
  struct Staging {
    std::shared_ptr<std::byte> buffer;  // pinned
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;  // recorded after the copy that last read buffer
  };
  std::array<Staging, 2> staging_;
  size_t next_staging_ = 0;
};

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

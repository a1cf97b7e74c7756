// CPU backend: the kernels in kernels/cpu, chosen by dtype (float or bf16 storage, float math). The
// checks are the front door's (backend.cpp); this file only dispatches.
#include "backend/cpu_backend.hpp"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <vector>

#include "kernels/cpu/attention_merge.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/fp8_gemm.hpp"
#include "kernels/cpu/fp8_quantize.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay {

namespace {
// An optional i32 tensor's data: positions, document starts (undefined: null, the kernel's default).
const int32_t* i32_or_null(const Tensor& t) { return t.defined() ? t.i32() : nullptr; }
}  // namespace


namespace {
// Calls f with a null pointer of the tensor's float storage type: f(static_cast<float*>(nullptr)) or
// f(static_cast<bf16*>(nullptr)); the front door has checked that it is one of the two.
template <typename F>
void by_dtype(const Tensor& t, F&& f) {
  if (t.dtype() == DType::bf16)
    f(static_cast<bf16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}
template <typename X>
X* ptr(Tensor& t) { return t.data<X>(); }
template <typename X>
const X* ptr(const Tensor& t) { return t.data<X>(); }
template <typename X>
X* ptr_or_null(Tensor* t) { return t ? t->data<X>() : nullptr; }
template <typename X>
const X* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<X>() : nullptr; }
}  // namespace

CpuBackend::CpuBackend(int threads, std::string bf16_gemm, bool time_bf16_gemm)
    : threads_(threads < 1 ? 1 : threads), bf16_gemm_(std::move(bf16_gemm)), time_bf16_gemm_(time_bf16_gemm) {
  cpu::set_threads(threads_);
  if (const char* v = std::getenv("RELAY_OP_PROFILE"); v && std::string(v) != "0" && std::string(v) != "")
    profile_ = std::make_unique<CpuOpProfile>();
}
CpuBackend::~CpuBackend() {
  if (profile_) profile_->print(describe());
}

int64_t CpuBackend::available_bytes() const {
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    int64_t kib = 0;
    in >> kib;
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(256, '\n');
  }
  return INT64_MAX;  // unknown: nothing is refused
}
std::string CpuBackend::describe() const {
  return cat("cpu (oneDNN, ", threads_, " thread", threads_ > 1 ? "s" : "", bf16_note_.empty() ? "" : ", ", bf16_note_,
             ")");
}

void CpuBackend::set_precision(Precision p) {
  if (p == Precision::tf32)
    throw Error("train.precision = \"tf32\" is a CUDA mode (TF32 tensor-core GEMMs); the CPU backend has no TF32. "
                "Use train.precision = \"fp32\", \"bf16\" or \"fp8\"");
  if (p != Precision::bf16 && p != Precision::fp8) return;  // fp8's working copies and activations are bf16
  // How bf16 GEMMs run (kernels/cpu/matmul.hpp), decided once: train.cpu_bf16_gemm, or for "auto" widened to f32
  // where oneDNN has no bf16 matmul, or where its primitive takes 1.15x the widened GEMM's time or more on a 1024^3
  // test GEMM (best of 3 each, interleaved, ~0.1 s of CPU time: kernels/cpu/matmul.hpp). The widened one took
  // 0.56-0.76 of the primitive's time on an Intel Xeon with AVX512_BF16 and no AMX, where AMD Zen 4's primitive ran
  // at 1.9x sgemm's rate: far from the line either way. Only world rank 0 of a job times it; every other rank takes
  // its choice (train/setup.cpp: adopt_bf16_gemm), so the ranks multiply alike and a start-up costs one timing, not
  // one per rank. A clear error for "native" on a CPU without it.
  const std::string missing = cpu::native_bf16_missing();
  bool widen = bf16_gemm_ == "widened";
  if (bf16_gemm_ == "native" && !missing.empty()) throw Error(cat(missing, " (train.cpu_bf16_gemm = \"native\")"));
  if (bf16_gemm_ == "auto") {
    if (!missing.empty()) {
      widen = true;
      bf16_note_ = "bf16 GEMMs widened to f32: no oneDNN bf16 matmul on this CPU";
    } else if (auto_widen_ >= 0) {  // timed (or adopted) already: this backend's choice stands (and its note)
      widen = auto_widen_ == 1;
    } else if (!time_bf16_gemm_) {  // another rank times it: widened until its choice is adopted
      widen = true;
      auto_widen_ = 1;
      bf16_note_ = "bf16 GEMMs widened to f32 until world rank 0's choice is adopted";
    } else {
      const cpu::Bf16GemmTiming t = cpu::time_bf16_gemm(3);
      widen = t.native_s >= 1.15 * t.widened_s;
      auto_widen_ = widen ? 1 : 0;
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.2f", t.widened_s / t.native_s);
      bf16_note_ = cat("bf16 GEMMs ", widen ? "widened to f32" : "native", ": oneDNN's bf16 matmul at ", ratio,
                       "x the widened rate");
    }
  } else {
    bf16_note_ = cat("bf16 GEMMs ", bf16_gemm_);
  }
  cpu::set_bf16_gemm(widen ? cpu::Bf16Gemm::widened : cpu::Bf16Gemm::native);
}

void CpuBackend::adopt_bf16_gemm(int widen, const std::string& note) {
  if (auto_widen_ < 0) return;  // not timed here: configured, or no choice to make
  auto_widen_ = widen;
  bf16_note_ = note;
  cpu::set_bf16_gemm(widen ? cpu::Bf16Gemm::widened : cpu::Bf16Gemm::native);
}

std::shared_ptr<std::byte> CpuBackend::allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(cat("out of host memory allocating ", bytes, " bytes"));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

void CpuBackend::upload(Tensor& dst, const void* host_src) { std::memcpy(dst.raw(), host_src, dst.bytes()); }
void CpuBackend::download(void* host_dst, const Tensor& src) { std::memcpy(host_dst, src.raw(), src.bytes()); }
void CpuBackend::copy_impl(Tensor& dst, const Tensor& src) {
  if (dst.raw() == src.raw()) return;
  // Large copies in one slice per thread (a bf16 add's parallel threshold in bytes: cpu::kParallelElems x 4).
  const int64_t bytes = int64_t(src.bytes()), slices = bytes > 4 * cpu::kParallelElems ? omp_get_max_threads() : 1;
  const auto* s = static_cast<const std::byte*>(src.raw());
  auto* d = static_cast<std::byte*>(dst.raw());
#pragma omp parallel for schedule(static) if (slices > 1)
  for (int64_t i = 0; i < slices; ++i) {
    const int64_t a = bytes * i / slices, e = bytes * (i + 1) / slices;
    std::memcpy(d + a, s + a, size_t(e - a));
  }
}
void CpuBackend::fill_impl(Tensor& x, float value) {
  if (x.dtype() == DType::i32) return cpu::fill_i32(x.i32(), static_cast<int32_t>(value), x.numel());
  by_dtype(x, [&](auto* X) { cpu::fill(ptr<std::remove_pointer_t<decltype(X)>>(x), value, x.numel()); });
}
void CpuBackend::convert_impl(const Tensor& src, Tensor& dst) {
  by_dtype(src, [&](auto* s) {
    using S = std::remove_pointer_t<decltype(s)>;
    by_dtype(dst, [&](auto* d) {
      using D = std::remove_pointer_t<decltype(d)>;
      cpu::convert(ptr<S>(src), ptr<D>(dst), src.numel());
    });
  });
}

namespace {
// cpu::matmul's description of y (m, n) = alpha op(a) op(b) + beta y on row-major tensors.
cpu::MatmulArgs matmul_args(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& y,
                            float alpha, float beta) {
  cpu::MatmulArgs m;
  m.trans_a = trans_a;
  m.trans_b = trans_b;
  m.m = y.size(0);
  m.n = y.size(1);
  m.k = trans_a ? a.size(0) : a.size(1);
  m.lda = a.size(1);
  m.ldb = b.size(1);
  m.ldc = y.size(1);
  m.ab_type = a.dtype();
  m.c_type = y.dtype();
  m.alpha = alpha;
  m.beta = beta;
  return m;
}
}  // namespace

void CpuBackend::matmul_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                             float beta) {
  const cpu::MatmulArgs m = matmul_args(a, trans_a, b, trans_b, y, alpha, beta);
  if (a.dtype() == DType::f32)  // oneDNN's sgemm or its matmul primitive, whichever cpu::gemm finds faster
    cpu::gemm(trans_a, trans_b, m.m, m.n, m.k, alpha, a.f32(), m.lda, b.f32(), m.ldb, beta, y.f32(), m.ldc);
  else
    cpu::matmul(m, a.raw(), b.raw(), y.raw());
}

void CpuBackend::fp8_quantize_impl(const Tensor& x, Fp8Tiling tiling, Tensor& q, Tensor& scales) {
  const Fp8Format fmt = fp8_format(q.dtype());
  if (x.dtype() == DType::f32)
    cpu::fp8_quantize(x.f32(), x.size(0), x.size(1), tiling, fmt, q.fp8(), scales.f32());
  else
    cpu::fp8_quantize(x.b16(), x.size(0), x.size(1), tiling, fmt, q.fp8(), scales.f32());
}

void CpuBackend::fp8_amax_impl(const Tensor& x, Fp8Tiling tiling, Tensor& amax) {
  auto* bits = reinterpret_cast<uint32_t*>(amax.i32());  // non-negative: the same values as int32 and uint32
  if (x.dtype() == DType::f32)
    cpu::fp8_amax(x.f32(), x.size(0), x.size(1), tiling, bits);
  else
    cpu::fp8_amax(x.b16(), x.size(0), x.size(1), tiling, bits);
}

void CpuBackend::fp8_quantize_amax_impl(const Tensor& x, Fp8Tiling tiling, const Tensor& amax, Tensor& q,
                                        Tensor& scales) {
  const Fp8Format fmt = fp8_format(q.dtype());
  const auto* bits = reinterpret_cast<const uint32_t*>(amax.i32());
  if (x.dtype() == DType::f32)
    cpu::fp8_quantize_amax(x.f32(), x.size(0), x.size(1), tiling, fmt, bits, q.fp8(), scales.f32());
  else
    cpu::fp8_quantize_amax(x.b16(), x.size(0), x.size(1), tiling, fmt, bits, q.fp8(), scales.f32());
}

void CpuBackend::fp8_matmul_impl(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a,
                                 const Tensor& b, const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y,
                                 float beta) {
  const Fp8Matrix am{a.fp8(), a_scales.f32(), a.size(0), a.size(1), fp8_format(a.dtype()), a_tiling};
  const Fp8Matrix bm{b.fp8(), b_scales.f32(), b.size(0), b.size(1), fp8_format(b.dtype()), b_tiling};
  if (y.dtype() == DType::f32)
    cpu::fp8_gemm(am, trans_a, bm, trans_b, y.f32(), beta);
  else
    cpu::fp8_gemm(am, trans_a, bm, trans_b, y.b16(), beta);
}

namespace {
// A group's rows [0, count) in pieces that keep the bf16 primitives few, in shapes and in calls: oneDNN caches a
// primitive per GEMM shape and creating one costs milliseconds, while the experts' row counts change every
// micro-batch; and each call costs ~5 us beside the GEMM (the lookup, the execution's set-up), as much as a
// 64 x 48 x 64 GEMM. So: pieces of whole multiples of q rows, q = 64 below 1024 rows and an eighth of the largest
// power of two in the rest above (8 shapes an octave), then the last < 64 rows as one piece of kTail rows, copied
// into zeroed scratch (padded). 250 rows: 192 + 58 padded; 300: 256 + 44 padded; 1500: 1408 + 64 + 28 padded. Up
// to 15 + 8 log2(rows / 1024) shapes plus kTail's instead of one a row count; two calls a group where they were
// about five (count's binary digits down to 16 rows). f32 GEMMs run through dnnl_sgemm (cpu::gemm), which caches
// nothing per shape, and so do widened bf16 GEMMs (cpu::Bf16Gemm::widened): one piece of count rows.
constexpr int64_t kTail = 64;
bool in_pieces(DType t) { return t != DType::f32 && cpu::bf16_gemm() == cpu::Bf16Gemm::native; }
// f(at, len, padded) for each piece in order.
template <typename F>
void by_pieces(DType t, int64_t count, F&& f) {
  if (!in_pieces(t)) {
    if (count > 0) f(int64_t(0), count, false);
    return;
  }
  int64_t at = 0;
  while (count - at >= kTail) {
    const int64_t rest = count - at;
    int64_t top = kTail;  // the largest power of two <= rest
    while (top * 2 <= rest) top *= 2;
    const int64_t q = std::max(kTail, top / 8), len = rest / q * q;
    f(at, len, false);
    at += len;
  }
  if (count > at) f(at, count - at, true);
}
// Whether by_pieces cuts count into more than one piece (a bf16 sum over the rows then accumulates in float).
bool several_pieces(DType t, int64_t count) {
  int pieces = 0;
  by_pieces(t, count, [&](int64_t, int64_t, bool) { ++pieces; });
  return pieces > 1;
}
// The scratch of a padded piece: kTail rows of each operand, the rows past the piece's zero. Per thread (the groups
// may run on every thread at once); grown, never shrunk.
struct PadScratch {
  std::vector<std::byte> a, b, c;
};
thread_local PadScratch pad_scratch;
// dst (kTail rows of row_bytes) = src's rows [0, rows) then zeros.
void* padded_rows(std::vector<std::byte>& dst, const void* src, int64_t rows, size_t row_bytes) {
  dst.resize(size_t(kTail) * row_bytes);
  if (rows > 0) std::memcpy(dst.data(), src, size_t(rows) * row_bytes);
  std::memset(dst.data() + size_t(rows) * row_bytes, 0, size_t(kTail - rows) * row_bytes);
  return dst.data();
}

// Whether a grouped GEMM spreads its groups over the threads, each group's GEMMs on one, so that it forks and joins
// once instead of once a group and piece: two or more groups a thread, and none with more than a thread's share of
// the rows (skewed routing would run that one on one thread). Otherwise one group after another, each GEMM threaded.
bool across_groups(const std::vector<int64_t>& offsets) {
  const int64_t threads = cpu::threads(), groups = int64_t(offsets.size()) - 1;
  if (threads < 2 || groups < 2 * threads) return false;
  int64_t largest = 0;
  for (int64_t g = 0; g < groups; ++g) largest = std::max(largest, offsets[size_t(g) + 1] - offsets[size_t(g)]);
  return largest * threads <= offsets.back() - offsets.front();
}
// f(g) for every group, across the threads or one after another. Across, each thread of the region sets its own
// thread count to 1 (as the CPU flash attention does): dnnl_sgemm then runs on the calling thread, and a bf16
// primitive made there is made, cached (cpu::matmul keys it by omp_get_max_threads()) and run for one thread.
// Which thread takes a group changes no bit.
template <typename F>
void for_groups(bool across, size_t groups, F&& f) {
  if (!across) {
    for (size_t g = 0; g < groups; ++g) f(g);
    return;
  }
  std::exception_ptr failed;  // an exception must not leave the parallel region; the first is rethrown after it
  std::mutex m;
#pragma omp parallel
  {
    omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < int64_t(groups); ++g) {
      try {
        f(size_t(g));
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!failed) failed = std::current_exception();
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
}
}  // namespace

// The groups with the cached oneDNN GEMMs, in row pieces. A padded piece's output rows past its own are dropped.
void CpuBackend::grouped_matmul_impl(const Tensor& a, const std::vector<Tensor>& b, bool trans_b, Tensor& y,
                                     const std::vector<int64_t>& offsets, float beta) {
  for_groups(across_groups(offsets), b.size(), [&](size_t g) {
    by_pieces(a.dtype(), offsets[g + 1] - offsets[g], [&](int64_t at, int64_t len, bool padded) {
      const Tensor ag = a.rows(offsets[g] + at, len);                           // (len, k)
      Tensor yg = y.rows(offsets[g] + at, len);                                 // (len, n)
      if (!padded) return matmul_impl(ag, false, b[g], trans_b, yg, 1.f, beta);
      cpu::MatmulArgs m = matmul_args(ag, false, b[g], trans_b, yg, 1.f, beta);
      const size_t a_row = size_t(m.k) * dtype_size(a.dtype()), y_row = size_t(m.n) * dtype_size(y.dtype());
      m.m = kTail;
      PadScratch& ps = pad_scratch;
      const void* pa = padded_rows(ps.a, ag.raw(), len, a_row);                 // (kTail, k)
      void* py = padded_rows(ps.c, beta != 0.f ? yg.raw() : nullptr, beta != 0.f ? len : 0, y_row);  // (kTail, n)
      cpu::matmul(m, pa, b[g].raw(), py);
      std::memcpy(yg.raw(), py, size_t(len) * y_row);
    });
  });
}

void CpuBackend::grouped_matmul_weight_impl(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                                            const std::vector<Tensor>& dw, float beta) {
  // A bf16 dw summed in more than one piece accumulates in float and is rounded once, as one GEMM (and CUDA's
  // grouped GEMM) rounds it: rounding every piece's partial sum cost up to one bf16 ulp (seen on an AVX512 host).
  // Tensors are made on the calling thread (its memory scope counts them): across the threads, every group's
  // accumulator before the loop; one after another, each in its turn. A padded piece's zero rows add exact zeros.
  auto widened = [&](size_t g) {
    const bool widen = dw[g].dtype() == DType::bf16 && several_pieces(dy.dtype(), offsets[g + 1] - offsets[g]);
    return widen ? Tensor(*this, dw[g].shape(), DType::f32) : dw[g];  // (n, k)
  };
  const bool across = across_groups(offsets);
  std::vector<Tensor> acc(dw.size());
  if (across)
    for (size_t g = 0; g < dw.size(); ++g) acc[g] = widened(g);
  for_groups(across, dw.size(), [&](size_t g) {
    Tensor w = dw[g];  // (n, k)
    if (offsets[g + 1] == offsets[g]) {  // no rows: an empty sum, dw[g] = beta dw[g] (matmul_impl's k == 0)
      if (beta != 1.f) matmul_impl(dy.rows(offsets[g], 0), true, x.rows(offsets[g], 0), false, w, 1.f, beta);
      return;
    }
    Tensor sum = acc[g].defined() ? acc[g] : widened(g);  // (n, k)
    if (sum.dtype() != w.dtype() && beta != 0.f) convert_impl(w, sum);
    float b = beta;  // the first piece scales dw[g] by beta, the others add to it
    by_pieces(dy.dtype(), offsets[g + 1] - offsets[g], [&](int64_t at, int64_t len, bool padded) {
      const Tensor dyg = dy.rows(offsets[g] + at, len), xg = x.rows(offsets[g] + at, len);  // (len, n), (len, k)
      if (!padded) {
        matmul_impl(dyg, true, xg, false, sum, 1.f, b);
      } else {
        cpu::MatmulArgs m = matmul_args(dyg, true, xg, false, sum, 1.f, b);
        m.k = kTail;
        PadScratch& ps = pad_scratch;
        const void* pdy = padded_rows(ps.a, dyg.raw(), len, size_t(m.m) * dtype_size(dy.dtype()));  // (kTail, n)
        const void* px = padded_rows(ps.b, xg.raw(), len, size_t(m.n) * dtype_size(x.dtype()));     // (kTail, k)
        cpu::matmul(m, pdy, px, sum.raw());
      }
      b = 1.f;
    });
    if (sum.dtype() != w.dtype()) convert_impl(sum, w);
  });
}

#define X_OF(t) std::remove_pointer_t<decltype(t)>
void CpuBackend::add_bias_impl(Tensor& y, const Tensor& bias) {
  by_dtype(y, [&](auto* t) { cpu::add_bias(ptr<X_OF(t)>(y), ptr<X_OF(t)>(bias), rows_of(y), cols_of(y)); });
}
// f32: dnnl_sgemm then add_bias, the same bits as the unfused layers; bench_matmul (bench/RESULTS.md) had
// it 3-6% faster than the matmul primitive with a fused bias on three of GPT-2's four forward shapes, 3%
// slower on the fourth. bf16: the primitive with the bias fused, so the output is rounded to bf16 once.
// The GELU is a second pass (the pre-activation is stored for the backward anyway), in place without
// pre_act.
void CpuBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, LinearAct act,
                             Tensor* pre_act) {
  Tensor& z = pre_act ? *pre_act : y;  // (n, out) the GEMM's output
  if (x.dtype() == DType::f32) {
    matmul_impl(x, false, w, true, z, 1.f, 0.f);
    if (bias.defined()) add_bias_impl(z, bias);
  } else {
    cpu::MatmulArgs m = matmul_args(x, false, w, true, z, 1.f, 0.f);
    m.bias_type = DType::bf16;
    cpu::matmul(m, x.raw(), w.raw(), z.raw(), bias.defined() ? bias.raw() : nullptr);
  }
  if (act == LinearAct::gelu_tanh) activation_forward_impl(Activation::gelu_tanh, z, y);
}
// The GEMM, then the activation's backward in place: what the unfused layers ran.
void CpuBackend::linear_backward_input_impl(const Tensor& dy, const Tensor& w, Tensor& dx, LinearAct act,
                                            const Tensor& act_in) {
  matmul_impl(dy, false, w, false, dx, 1.f, 0.f);  // (n, out) @ (out, in)
  if (act == LinearAct::gelu_tanh) activation_backward_impl(Activation::gelu_tanh, act_in, dx, dx);
}
void CpuBackend::bias_grad_impl(const Tensor& dy, Tensor& db, float beta) {
  by_dtype(dy, [&](auto* t) { cpu::bias_grad(ptr<X_OF(t)>(dy), db.f32(), rows_of(dy), cols_of(dy), beta); });
}

void CpuBackend::activation_forward_impl(Activation act, const Tensor& x, Tensor& y) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    const X* in = ptr<X>(x);
    X* out = ptr<X>(y);
    switch (act) {
      case Activation::relu: cpu::relu_forward(in, out, x.numel()); break;
      case Activation::gelu: cpu::gelu_forward(in, out, x.numel()); break;
      case Activation::tanh: cpu::tanh_forward(in, out, x.numel()); break;
      case Activation::gelu_tanh: cpu::gelu_tanh_forward(in, out, x.numel()); break;
    }
  });
}
void CpuBackend::activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    const X *in = ptr<X>(x), *g = ptr<X>(dy);
    X* out = ptr<X>(dx);
    switch (act) {
      case Activation::relu: cpu::relu_backward(in, g, out, x.numel()); break;
      case Activation::gelu: cpu::gelu_backward(in, g, out, x.numel()); break;
      case Activation::tanh: cpu::tanh_backward(in, g, out, x.numel()); break;
      case Activation::gelu_tanh: cpu::gelu_tanh_backward(in, g, out, x.numel()); break;
    }
  });
}
void CpuBackend::add_impl(const Tensor& a, const Tensor& b, Tensor& y) {
  by_dtype(a, [&](auto* t) { cpu::add(ptr<X_OF(t)>(a), ptr<X_OF(t)>(b), ptr<X_OF(t)>(y), a.numel()); });
}
void CpuBackend::scale_impl(Tensor& x, float s) {
  by_dtype(x, [&](auto* t) { cpu::scale(ptr<X_OF(t)>(x), s, x.numel()); });
}
double CpuBackend::sum_squares_impl(const Tensor& x) { return cpu::sum_squares(x.f32(), x.numel()); }

void CpuBackend::layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                        Tensor& mean, Tensor& rstd) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::layernorm_forward(ptr<X>(x), ptr<X>(gamma), ptr<X>(beta), eps, ptr<X>(y), mean.f32(), rstd.f32(), rows_of(x),
                           cols_of(x));
  });
}
void CpuBackend::layernorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                               const Tensor& mean, const Tensor& rstd, Tensor& dx) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::layernorm_backward_input(ptr<X>(dy), ptr<X>(x), ptr<X>(gamma), mean.f32(), rstd.f32(), ptr<X>(dx),
                                  rows_of(x), cols_of(x));
  });
}
void CpuBackend::layernorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                                const Tensor& rstd, Tensor& dgamma, Tensor& dbeta) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::layernorm_backward_weight(ptr<X>(dy), ptr<X>(x), mean.f32(), rstd.f32(), dgamma.f32(), dbeta.f32(),
                                   rows_of(x), cols_of(x));
  });
}

void CpuBackend::rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::rmsnorm_forward(ptr<X>(x), ptr<X>(gamma), eps, ptr<X>(y), rstd.f32(), rows_of(x), cols_of(x));
  });
}
void CpuBackend::rmsnorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                             const Tensor& rstd, Tensor& dx) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::rmsnorm_backward_input(ptr<X>(dy), ptr<X>(x), ptr<X>(gamma), rstd.f32(), ptr<X>(dx), rows_of(x), cols_of(x));
  });
}
void CpuBackend::rmsnorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dgamma) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::rmsnorm_backward_weight(ptr<X>(dy), ptr<X>(x), rstd.f32(), dgamma.f32(), rows_of(x), cols_of(x));
  });
}
void CpuBackend::moe_router_forward_impl(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs,
                                         Tensor& lse, Tensor& experts, Tensor& weights, const Tensor& bias) {
  by_dtype(logits, [&](auto* t) {
    cpu::moe_router_forward(ptr<X_OF(t)>(logits), probs.f32(), lse.f32(), experts.i32(), weights.f32(),
                            rows_of(logits), cols_of(logits), k, renormalize, bias.defined() ? bias.f32() : nullptr);
  });
}
void CpuBackend::moe_router_backward_impl(const Tensor& probs, const Tensor& lse, const Tensor& experts,
                                          const Tensor& dweights, bool renormalize, const Tensor& seq_grad, int64_t T,
                                          float z_scale, Tensor& dlogits) {
  by_dtype(dlogits, [&](auto* t) {
    cpu::moe_router_backward(probs.f32(), lse.f32(), experts.i32(), dweights.f32(), renormalize,
                             seq_grad.defined() ? seq_grad.f32() : nullptr, T, z_scale, ptr<X_OF(t)>(dlogits),
                             rows_of(probs), cols_of(probs), cols_of(experts));
  });
}
void CpuBackend::moe_group_router_forward_impl(const Tensor& logits, const GroupRouting& r, Tensor& probs,
                                               Tensor& experts, Tensor& weights, const Tensor& bias) {
  by_dtype(logits, [&](auto* t) {
    cpu::moe_group_router_forward(ptr<X_OF(t)>(logits), probs.f32(), experts.i32(), weights.f32(), rows_of(logits),
                                  cols_of(logits), r.k, r.n_group, r.topk_group, r.renormalize, r.scale,
                                  bias.defined() ? bias.f32() : nullptr);
  });
}
void CpuBackend::moe_group_router_backward_impl(const Tensor& probs, const Tensor& experts, const Tensor& dweights,
                                                const GroupRouting& r, const Tensor& seq_grad, int64_t T,
                                                Tensor& dlogits) {
  by_dtype(dlogits, [&](auto* t) {
    cpu::moe_group_router_backward(probs.f32(), experts.i32(), dweights.f32(), r.renormalize, r.scale,
                                   seq_grad.defined() ? seq_grad.f32() : nullptr, T, ptr<X_OF(t)>(dlogits),
                                   rows_of(probs), cols_of(probs), r.k);
  });
}
void CpuBackend::moe_combine_impl(const Tensor& rows, const Tensor& pos, const Tensor& weights, Tensor& y) {
  by_dtype(y, [&](auto* t) {
    cpu::moe_combine(ptr<X_OF(t)>(rows), pos.i32(), weights.defined() ? weights.f32() : nullptr, ptr<X_OF(t)>(y),
                     rows_of(y), cols_of(pos), cols_of(y));
  });
}
void CpuBackend::moe_combine_backward_impl(const Tensor& dy, const Tensor& rows, const Tensor& pos,
                                           const Tensor& weights, Tensor& drows, Tensor& dweights) {
  by_dtype(dy, [&](auto* t) {
    cpu::moe_combine_backward(ptr<X_OF(t)>(dy), ptr<X_OF(t)>(rows), pos.i32(), weights.f32(), ptr<X_OF(t)>(drows),
                              dweights.f32(), rows_of(dy), cols_of(pos), cols_of(dy));
  });
}
void CpuBackend::swiglu_forward_impl(const Tensor& gate, const Tensor& up, Tensor& h) {
  by_dtype(gate, [&](auto* t) { cpu::swiglu_forward(ptr<X_OF(t)>(gate), ptr<X_OF(t)>(up), ptr<X_OF(t)>(h), h.numel()); });
}
void CpuBackend::swiglu_backward_impl(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate,
                                      Tensor& dup) {
  by_dtype(gate, [&](auto* t) {
    using X = X_OF(t);
    cpu::swiglu_backward(ptr<X>(dh), ptr<X>(gate), ptr<X>(up), ptr<X>(dgate), ptr<X>(dup), gate.numel());
  });
}
void CpuBackend::rotary_columns_impl(const Tensor& src, Tensor& dst, int64_t head_width, int64_t off,
                                     bool interleaved, bool gather) {
  const Tensor& x = gather ? src : dst;
  const Tensor& pe = gather ? dst : src;
  const int64_t heads = cols_of(x) / head_width;
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::rotary_columns(ptr<X>(src), ptr<X>(dst), rows_of(x), heads, head_width, off, cols_of(pe) / heads,
                        interleaved, gather);
  });
}
void CpuBackend::rope_impl(const Tensor& x, int64_t T, int64_t head_dim, double theta, int64_t pos0, bool inverse,
                           Tensor& y, const Tensor& positions, const RopeScaling& scaling) {
  by_dtype(x, [&](auto* t) {
    using X = X_OF(t);
    cpu::rope(ptr<X>(x), ptr<X>(y), rows_of(x), T, cols_of(x) / head_dim, head_dim, theta, pos0, inverse,
              i32_or_null(positions), scaling);
  });
}

void CpuBackend::cross_entropy_impl(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                                    Tensor* dlogits) {
  by_dtype(logits, [&](auto* t) {
    using X = X_OF(t);
    cpu::cross_entropy(ptr<X>(logits), targets.i32(), grad_scale, losses.f32(), ptr_or_null<X>(dlogits),
                       rows_of(logits), cols_of(logits));
  });
}
void CpuBackend::mse_impl(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred) {
  by_dtype(pred, [&](auto* t) {
    using X = X_OF(t);
    cpu::mse(ptr<X>(pred), ptr<X>(target), grad_scale, losses.f32(), ptr_or_null<X>(dpred), rows_of(pred),
             cols_of(pred));
  });
}
void CpuBackend::argmax_impl(const Tensor& logits, Tensor& out) {
  by_dtype(logits, [&](auto* t) { cpu::argmax(ptr<X_OF(t)>(logits), out.i32(), rows_of(logits), cols_of(logits)); });
}
void CpuBackend::row_max_impl(const Tensor& x, Tensor& out) {
  by_dtype(x, [&](auto* t) { cpu::row_max(ptr<X_OF(t)>(x), out.f32(), rows_of(x), cols_of(x)); });
}
void CpuBackend::cross_entropy_partial_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                            const Tensor& row_max, Tensor& partial) {
  by_dtype(logits, [&](auto* t) {
    cpu::cross_entropy_partial(ptr<X_OF(t)>(logits), targets.i32(), vocab_start, row_max.f32(), partial.f32(),
                               rows_of(logits), cols_of(logits));
  });
}
void CpuBackend::cross_entropy_finish_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                           const Tensor& row_max, const Tensor& total, float grad_scale,
                                           Tensor& losses, Tensor* dlogits) {
  by_dtype(logits, [&](auto* t) {
    using X = X_OF(t);
    cpu::cross_entropy_finish(ptr<X>(logits), targets.i32(), vocab_start, row_max.f32(), total.f32(), grad_scale,
                              losses.f32(), ptr_or_null<X>(dlogits), rows_of(logits), cols_of(logits));
  });
}

void CpuBackend::embedding_forward_impl(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T,
                                        Tensor& out, int64_t vocab_start, const Tensor& positions) {
  by_dtype(wte, [&](auto* t) {
    using X = X_OF(t);
    cpu::embedding_forward(tokens.i32(), ptr<X>(wte), ptr_or_null<X>(wpe), ptr<X>(out), tokens.numel(), cols_of(wte),
                           T, vocab_start, rows_of(wte), i32_or_null(positions));
  });
}
void CpuBackend::embedding_backward_impl(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte,
                                         Tensor& dwpe, int64_t vocab_start, const Tensor& positions) {
  by_dtype(dout, [&](auto* t) {
    cpu::embedding_backward(tokens.i32(), ptr<X_OF(t)>(dout), dwte.f32(), dwpe.defined() ? dwpe.f32() : nullptr,
                            tokens.numel(), cols_of(dwte), T, vocab_start, rows_of(dwte), i32_or_null(positions));
  });
}
void CpuBackend::attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) {
  cpu::attention_forward(qkv.f32(), att.f32(), out.f32(), B, T, cols_of(qkv) / 3, H);
}
void CpuBackend::attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B,
                                         int64_t T, int64_t H, Tensor& dqkv) {
  cpu::attention_backward(dout.f32(), qkv.f32(), att.f32(), dqkv.f32(), B, T, cols_of(qkv) / 3, H);
}
void CpuBackend::flash_attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& out,
                                              Tensor& lse, const Tensor& doc_start) {
  by_dtype(qkv, [&](auto* t) {
    using X = X_OF(t);
    cpu::flash_attention_forward(ptr<X>(qkv), ptr<X>(out), lse.f32(), B, T, cols_of(qkv) / 3, H,
                                 i32_or_null(doc_start));
  });
}
void CpuBackend::flash_attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                               const Tensor& lse, int64_t B, int64_t T, int64_t H, Tensor& dqkv, const Tensor& doc_start) {
  by_dtype(qkv, [&](auto* t) {
    using X = X_OF(t);
    cpu::flash_attention_backward(ptr<X>(dout), ptr<X>(qkv), ptr<X>(out), lse.f32(), ptr<X>(dqkv), B, T,
                                  cols_of(qkv) / 3, H, i32_or_null(doc_start));
  });
}
void CpuBackend::attention_decode_impl(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H,
                                       Tensor& out) {
  by_dtype(qkv, [&](auto* p) {
    using X = X_OF(p);
    cpu::attention_decode(ptr<X>(qkv), ptr<X>(kcache), ptr<X>(vcache), ptr<X>(out), rows_of(qkv), t, kcache.size(1),
                          cols_of(qkv) / 3, H);
  });
}
void CpuBackend::flash_attention_gqa_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                                                  int64_t T, int64_t H, int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start) {
  by_dtype(q, [&](auto* t) {
    using X = X_OF(t);
    cpu::flash_attention_gqa_forward(ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k), ptr<X>(out), lse.f32(),
                                     B, T, H, KV, cols_of(q) / H, i32_or_null(doc_start), cols_of(v) / KV, cols_of(v));
  });
}
void CpuBackend::flash_attention_gqa_backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                   const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                                                   int64_t T, int64_t H, int64_t KV, Tensor& dq, Tensor& dk,
                                                   Tensor& dv, const Tensor& doc_start) {
  by_dtype(q, [&](auto* t) {
    using X = X_OF(t);
    cpu::flash_attention_gqa_backward(ptr<X>(dout), ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k),
                                      ptr<X>(out), lse.f32(), ptr<X>(dq), ptr<X>(dk), ptr<X>(dv), B, T, H, KV,
                                      cols_of(q) / H, i32_or_null(doc_start), cols_of(v) / KV, cols_of(v));
  });
}
void CpuBackend::gather_rows_impl(const Tensor& src, const Tensor& index, Tensor& dst) {
  const int64_t n = rows_of(dst), w = cols_of(dst), elem = int64_t(dtype_size(dst.dtype()));
  const int32_t* idx = index.i32();
  const auto* s = static_cast<const std::byte*>(src.raw());
  auto* d = static_cast<std::byte*>(dst.raw());
#pragma omp parallel for schedule(static) if (n * w > cpu::kParallelElems)
  for (int64_t r = 0; r < n; ++r) std::memcpy(d + r * w * elem, s + int64_t(idx[r]) * w * elem, size_t(w * elem));
}
void CpuBackend::copy_columns_impl(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  const int64_t n = rows_of(dst), sw = cols_of(src), dw = cols_of(dst), elem = int64_t(dtype_size(dst.dtype()));
  const auto* s = static_cast<const std::byte*>(src.raw());
  auto* d = static_cast<std::byte*>(dst.raw());
#pragma omp parallel for schedule(static) if (n * width > cpu::kParallelElems)
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(d + (r * dw + dst_col) * elem, s + (r * sw + src_col) * elem, size_t(width * elem));
}
void CpuBackend::attention_merge_impl(Tensor& out, Tensor& lse, const Tensor& out2, const Tensor& lse2, int64_t B,
                                      int64_t T, int64_t H) {
  by_dtype(out, [&](auto* t) {
    using X = X_OF(t);
    cpu::attention_merge(ptr<X>(out), lse.f32(), ptr<X>(out2), lse2.f32(), B, T, H, cols_of(out) / H);
  });
}
void CpuBackend::flash_attention_gqa_forward_at_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                                                     int64_t Tq, int64_t Tk, const Tensor& q_pos, int64_t H,
                                                     int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start) {
  by_dtype(q, [&](auto* t) {
    using X = X_OF(t);
    cpu::flash_attention_gqa_forward_at(ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k), ptr<X>(out),
                                        lse.f32(), B, Tq, Tk, q_pos.i32(), H, KV, cols_of(q) / H,
                                        i32_or_null(doc_start), cols_of(v) / KV, cols_of(v));
  });
}
void CpuBackend::flash_attention_gqa_backward_at_impl(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                                                      int64_t Tq, int64_t Tk, const Tensor& q_pos, int64_t H,
                                                      int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv,
                                                      const Tensor& doc_start) {
  by_dtype(q, [&](auto* t) {
    using X = X_OF(t);
    cpu::flash_attention_gqa_backward_at(ptr<X>(dout), ptr<X>(q), ptr<X>(k), ptr<X>(v), cols_of(q), cols_of(k),
                                         ptr<X>(out), lse.f32(), ptr<X>(dq), ptr<X>(dk), ptr<X>(dv), B, Tq, Tk,
                                         q_pos.i32(), H, KV, cols_of(q) / H, i32_or_null(doc_start), cols_of(v) / KV,
                                         cols_of(v));
  });
}
void CpuBackend::attention_decode_gqa_impl(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kcache,
                                           Tensor& vcache, int64_t t, int64_t H, int64_t KV, Tensor& out) {
  by_dtype(q, [&](auto* p) {
    using X = X_OF(p);
    cpu::attention_decode_gqa(ptr<X>(q), cols_of(q), ptr<X>(k), ptr<X>(v), cols_of(k), ptr<X>(kcache),
                              ptr<X>(vcache), ptr<X>(out), rows_of(q), t, kcache.size(1), H, KV, cols_of(q) / H);
  });
}
void CpuBackend::attention_decode_latent_impl(const Tensor& q, const Tensor& kv, Tensor& cache, int64_t t, int64_t H,
                                              float scale, Tensor& out) {
  by_dtype(q, [&](auto* p) {
    using X = X_OF(p);
    cpu::attention_decode_latent(ptr<X>(q), ptr<X>(kv), ptr<X>(cache), ptr<X>(out), rows_of(q), t, cache.size(1), H,
                                 cache.size(2), cols_of(out) / H, scale);
  });
}
#undef X_OF

void CpuBackend::adamw_step_impl(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                                 const AdamWArgs& a, Tensor& work) {
  cpu::adamw_step(param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), work.defined() ? work.b16() : nullptr,
                  param.numel(), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
}
void CpuBackend::adamw_step_many_impl(const std::vector<AdamWSlot>& slots, const AdamWArgs& a) {
  std::vector<cpu::AdamWTensor> ts;
  ts.reserve(slots.size());
  for (const AdamWSlot& t : slots)
    ts.push_back({t.param->f32(), t.grad->f32(), t.exp_avg->f32(), t.exp_avg_sq->f32(),
                  t.work->defined() ? t.work->b16() : nullptr, t.param->numel()});
  cpu::adamw_step_many(ts.data(), int64_t(ts.size()), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
}
void CpuBackend::sgd_step_impl(Tensor& param, const Tensor& grad, Tensor& buf, const SgdArgs& a, Tensor& work) {
  cpu::sgd_step(param.f32(), grad.f32(), a.momentum != 0.0 ? buf.f32() : nullptr,
                work.defined() ? work.b16() : nullptr, param.numel(), a.lr, a.momentum, a.weight_decay, a.first_step);
}

}  // namespace relay

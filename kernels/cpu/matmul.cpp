// cpu::matmul: oneDNN 2.x matmul primitives (dev_guide_matmul) built from strided memory descriptors,
// so transposes and leading dimensions cost no copies; alpha is the output scale, beta the sum post-op.
// Created once per call signature under a mutex and run with a per-thread stream and scratchpad.
// bf16 inputs may instead be widened to f32 and multiplied by dnnl_sgemm (Bf16Gemm::widened).
#include "kernels/cpu/matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

namespace {

using dt = dnnl::memory::data_type;

dt dnnl_type(DType t) { return t == DType::bf16 ? dt::bf16 : dt::f32; }

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Everything that changes the primitive. The thread count is part of it because oneDNN fixes its
// work split when the primitive is created; cpu::set_threads later must not reuse that split.
struct Key {
  bool trans_a, trans_b, has_bias;
  int64_t m, n, k, lda, ldb, ldc;
  DType ab_type, c_type, bias_type;
  uint32_t alpha_bits, beta_bits;
  int threads;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ull + (h >> 29); };
    mix(uint64_t(key.trans_a) | uint64_t(key.trans_b) << 1 | uint64_t(key.has_bias) << 2 | uint64_t(key.ab_type) << 8 |
        uint64_t(key.c_type) << 16 | uint64_t(key.bias_type) << 24);
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(uint64_t(v));
    mix(uint64_t(key.alpha_bits) << 32 | key.beta_bits);
    mix(uint64_t(key.threads));
    return size_t(h);
  }
};

// How one call signature runs: its primitive plus the few cases oneDNN 2.6 has no primitive for.
struct Plan {
  dnnl::matmul primitive;
  dnnl::memory::desc a_md, b_md, dst_md, bias_md, scratch_md;
  size_t scratch_bytes = 0;
  // alpha != 1 with a bias: output scales would scale a fused bias too (dst = alpha (ab + bias)),
  // so the bias is a binary-add post-op after the scale instead.
  bool bias_post_op = false;
  // f32 inputs with a bf16 bias: no such primitive; the n bias values are widened to f32 per call.
  bool widen_bias = false;
  // f32 inputs with a bf16 c: no such primitive; the primitive writes t = alpha ab + bias to an f32
  // (m, n) staging buffer and c = round(t + beta c) follows, so c is still rounded once.
  bool stage_output = false;
  int bias_arg = 0;  // the execution argument that takes the bias; 0 without one
  std::string impl;
};

// Intentionally never destroyed: OpenMP worker threads may still hold primitives at exit.
dnnl::engine& cpu_engine() {
  static auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

std::string describe(const MatmulArgs& p, bool has_bias) {
  auto stored = [](int64_t rows, int64_t cols, bool trans) {
    return trans ? cat("(", cols, ",", rows, ")^T") : cat("(", rows, ",", cols, ")");
  };
  return cat("matmul ", p.m, "x", p.n, "x", p.k, " (a ", stored(p.m, p.k, p.trans_a), " @ b ",
             stored(p.k, p.n, p.trans_b), ", inputs ", dtype_name(p.ab_type), ", c ", dtype_name(p.c_type),
             has_bias ? cat(", bias ", dtype_name(p.bias_type)) : std::string(", no bias"), ", alpha ", p.alpha,
             ", beta ", p.beta, ")");
}

std::unique_ptr<Plan> make_plan(const MatmulArgs& p, bool has_bias) {
  using dims = dnnl::memory::dims;
  auto plan = std::make_unique<Plan>();
  const bool f32_inputs = p.ab_type == DType::f32;
  plan->stage_output = f32_inputs && p.c_type == DType::bf16;
  plan->widen_bias = f32_inputs && has_bias && p.bias_type == DType::bf16;
  plan->bias_post_op = has_bias && p.alpha != 1.f;
  const dt ab = dnnl_type(p.ab_type);
  const dt dst = plan->stage_output ? dt::f32 : dnnl_type(p.c_type);
  const dt bias = plan->widen_bias ? dt::f32 : dnnl_type(p.bias_type);
  // A stored (k, m) and read as (m, k) is the same memory with the strides swapped; likewise b.
  plan->a_md = dnnl::memory::desc({p.m, p.k}, ab, p.trans_a ? dims{1, p.lda} : dims{p.lda, 1});
  plan->b_md = dnnl::memory::desc({p.k, p.n}, ab, p.trans_b ? dims{1, p.ldb} : dims{p.ldb, 1});
  plan->dst_md = dnnl::memory::desc({p.m, p.n}, dst, plan->stage_output ? dims{p.n, 1} : dims{p.ldc, 1});
  if (has_bias) {
    plan->bias_md = dnnl::memory::desc({1, p.n}, bias, dims{p.n, 1});
    plan->bias_arg = plan->bias_post_op ? (DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1) : DNNL_ARG_BIAS;
  }

  dnnl::primitive_attr attr;
  // A user scratchpad (per thread, see Workspace) lets threads run one cached primitive at once.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.alpha != 1.f) attr.set_output_scales(0, {p.alpha});
  dnnl::post_ops ops;
  if (plan->bias_post_op) ops.append_binary(dnnl::algorithm::binary_add, plan->bias_md);
  // Staged output: beta * c is added when rounding into c, where c's bf16 values are read.
  if (p.beta != 0.f && !plan->stage_output) ops.append_sum(p.beta);
  attr.set_post_ops(ops);

  try {
    auto desc = has_bias && !plan->bias_post_op
                    ? dnnl::matmul::desc(plan->a_md, plan->b_md, plan->bias_md, plan->dst_md)
                    : dnnl::matmul::desc(plan->a_md, plan->b_md, plan->dst_md);
    dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    plan->scratch_md = pd.scratchpad_desc();
    plan->scratch_bytes = plan->scratch_md.get_size();
    plan->impl = pd.impl_info_str();
    plan->primitive = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    const bool any_bf16 =
        p.ab_type == DType::bf16 || p.c_type == DType::bf16 || (has_bias && p.bias_type == DType::bf16);
    if (any_bf16 && e.status == dnnl_unimplemented)
      throw Error(cat(describe(p, has_bias),
                      ": oneDNN has no bf16 matmul for this CPU; the CPU lacks bf16 support (oneDNN needs AVX512, "
                      "natively AVX512_BF16 or AMX). hint: set train.precision = \"fp32\""));
    fatal(cat("creating the oneDNN primitive for ", describe(p, has_bias), " failed: ", e.what(), " (status ",
              int(e.status), ")"),
          __FILE__, __LINE__);
  }
  return plan;
}

struct Cache {
  std::mutex mutex;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
};
Cache& cache() {
  static auto* c = new Cache;  // never destroyed, like the engine
  return *c;
}

// Plans are never evicted, so the reference stays valid after the lock is released.
const Plan& plan_for(const MatmulArgs& p, bool has_bias) {
  const Key key{p.trans_a, p.trans_b, has_bias, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.ab_type, p.c_type,
                has_bias ? p.bias_type : DType::f32, float_bits(p.alpha), float_bits(p.beta), omp_get_max_threads()};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.plans.find(key);
  // Created under the lock: two threads asking for one new shape build it once.
  if (it == c.plans.end()) it = c.plans.emplace(key, make_plan(p, has_bias)).first;
  return *it->second;
}

// A growable 64-byte aligned host buffer (oneDNN's kernels prefer cache-line aligned scratch).
class Buffer {
 public:
  ~Buffer() { std::free(data_); }
  void* get(size_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, size_);
      if (!data_) throw Error(cat("out of host memory allocating ", size_, " bytes of matmul workspace"));
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// What a thread needs to run primitives: its own stream, scratchpad and staging buffers.
// Each plan's execution arguments are bound once per thread and each call only swaps their data
// handles: making the memory objects anew cost about 2 us a call, as much as a 64^3 GEMM.
struct Workspace {
  dnnl::stream stream{cpu_engine()};
  Buffer scratch, staging, bias;
  std::unordered_map<const Plan*, std::unordered_map<int, dnnl::memory>> bound;

  std::unordered_map<int, dnnl::memory>& args_for(const Plan& plan) {
    auto it = bound.find(&plan);
    if (it != bound.end()) return it->second;
    dnnl::engine& eng = cpu_engine();
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(plan.a_md, eng, nullptr)},
                                               {DNNL_ARG_WEIGHTS, dnnl::memory(plan.b_md, eng, nullptr)},
                                               {DNNL_ARG_DST, dnnl::memory(plan.dst_md, eng, nullptr)}};
    if (plan.bias_arg) args.emplace(plan.bias_arg, dnnl::memory(plan.bias_md, eng, nullptr));
    if (plan.scratch_bytes) args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(plan.scratch_md, eng, nullptr));
    return bound.emplace(&plan, std::move(args)).first->second;
  }
};

float load_as_f32(const void* p, DType t, int64_t i) {
  return t == DType::bf16 ? bf16_to_f32(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// row(r) for r in [0, rows), threaded when the rows hold more than 64 Ki values and the caller is not already inside a
// parallel region: a parallel construct there, even one that runs on one thread, makes (and mallocs) a team a call.
template <typename F>
void for_rows(int64_t rows, int64_t values, F&& row) {
  if (values > 65536 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row(r);
  } else {
    for (int64_t r = 0; r < rows; ++r) row(r);
  }
}

// c (m, n) = t (m, n) [or 0 when t is null] + bias (n) [or 0] + beta * c, rounded once to C.
// beta == 0 never reads c (it may hold NaN, as with BLAS).
// Threaded by for_rows. The two common cases (no bias; beta 0 or 1) are loops of their own, which vectorise.
template <typename C>
RELAY_CPU_CLONES void finish_rows(C* c, int64_t ldc, const float* t, const void* bias, DType bias_type, float beta,
                                  int64_t m, int64_t n) {
  auto row = [&](int64_t i) {
    C* ci = c + i * ldc;
    const float* ti = t ? t + i * n : nullptr;
    if (ti && !bias && beta == 0.f) {
      for (int64_t j = 0; j < n; ++j) store(ci[j], ti[j]);
    } else if (ti && !bias && beta == 1.f) {
      for (int64_t j = 0; j < n; ++j) store(ci[j], ti[j] + load(ci[j]));
    } else {
      for (int64_t j = 0; j < n; ++j) {
        float v = ti ? ti[j] : 0.f;
        if (bias) v += load_as_f32(bias, bias_type, j);
        if (beta != 0.f) v += beta * load(ci[j]);
        store(ci[j], v);
      }
    }
  };
  for_rows(m, m * n, row);
}

void finish(const MatmulArgs& p, void* c, const float* t, const void* bias) {
  if (p.c_type == DType::bf16)
    finish_rows(static_cast<bf16*>(c), p.ldc, t, bias, p.bias_type, p.beta, p.m, p.n);
  else
    finish_rows(static_cast<float*>(c), p.ldc, t, bias, p.bias_type, p.beta, p.m, p.n);
}

void check_args(const MatmulArgs& p) {
  auto real = [](DType t) { return t == DType::f32 || t == DType::bf16; };
  RELAY_ASSERT(real(p.ab_type) && real(p.c_type) && real(p.bias_type),
               "matmul types: inputs " << dtype_name(p.ab_type) << ", c " << dtype_name(p.c_type) << ", bias "
                                       << dtype_name(p.bias_type));
  RELAY_ASSERT(p.m >= 0 && p.n >= 0 && p.k >= 0, "matmul " << p.m << "x" << p.n << "x" << p.k);
  // BLAS's rule: a leading dimension covers the stored row, and is at least 1.
  const int64_t a_cols = p.trans_a ? p.m : p.k, b_cols = p.trans_b ? p.k : p.n;
  RELAY_ASSERT(p.lda >= std::max<int64_t>(1, a_cols) && p.ldb >= std::max<int64_t>(1, b_cols) &&
                   p.ldc >= std::max<int64_t>(1, p.n),
               "matmul " << p.m << "x" << p.n << "x" << p.k << " leading dimensions lda " << p.lda << " ldb " << p.ldb
                         << " ldc " << p.ldc);
}

std::atomic<Bf16Gemm> g_bf16_gemm{Bf16Gemm::native};

// Bf16Gemm::widened. The GEMM runs in blocks of at most kBlock rows, columns and summed terms, so that the f32
// copies stay small (3 x 16 MiB a thread at most) whatever the shape (GPT-2's vocabulary GEMMs would need
// 150-400 MiB whole); one block for every GEMM up to 2048 in each dimension, which is all of an MoE expert's.
// Within a block sgemm sums over k; blocks of k are summed into an f32 block of c (or of the staging buffer) in
// order, so the bits depend on the shape alone. A bf16 c, or a bias, goes through the f32 staging block and is
// rounded once at the end, after bias and beta c, as the primitive rounds it.
constexpr int64_t kBlock = 2048;

// out (rows, cols) = the bf16 rows at in (row stride ld), widened (threaded by for_rows).
RELAY_CPU_CLONES void widen_rows(const bf16* in, int64_t ld, float* out, int64_t rows, int64_t cols) {
  for_rows(rows, rows * cols, [&](int64_t r) {
    for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = bf16_to_f32(in[r * ld + j]);
  });
}

// The (rows, cols) block at (r0, c0) of a bf16 matrix stored with row stride ld, as a compact f32 (rows, cols).
const float* widen_block(Buffer& buf, const void* p, int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
  auto* out = static_cast<float*>(buf.get(size_t(rows * cols) * sizeof(float)));
  widen_rows(static_cast<const bf16*>(p) + r0 * ld + c0, ld, out, rows, cols);
  return out;
}

struct WideBuffers {
  Buffer a, b, t;
};

void matmul_widened(const MatmulArgs& p, const void* a, const void* b, void* c, const void* bias) {
  thread_local WideBuffers w;
  const bool direct = p.c_type == DType::f32 && !bias;  // sgemm writes c itself
  const size_t bias_size = p.bias_type == DType::bf16 ? sizeof(bf16) : sizeof(float);
  const size_t c_size = p.c_type == DType::bf16 ? sizeof(bf16) : sizeof(float);
  for (int64_t j0 = 0; j0 < p.n; j0 += kBlock)
    for (int64_t i0 = 0; i0 < p.m; i0 += kBlock) {
      const int64_t nb = std::min(kBlock, p.n - j0), mb = std::min(kBlock, p.m - i0);
      float* t = direct ? static_cast<float*>(c) + i0 * p.ldc + j0
                        : static_cast<float*>(w.t.get(size_t(mb * nb) * sizeof(float)));  // (mb, nb)
      const int64_t ldt = direct ? p.ldc : nb;
      for (int64_t l0 = 0; l0 < p.k; l0 += kBlock) {
        const int64_t kb = std::min(kBlock, p.k - l0);
        // op(a)'s block (mb, kb) and op(b)'s (kb, nb), as stored: a (k, m) when trans_a, b (n, k) when trans_b.
        const float* wa = p.trans_a ? widen_block(w.a, a, p.lda, l0, i0, kb, mb)   // (kb, mb)
                                    : widen_block(w.a, a, p.lda, i0, l0, mb, kb);  // (mb, kb)
        const float* wb = p.trans_b ? widen_block(w.b, b, p.ldb, j0, l0, nb, kb)   // (nb, kb)
                                    : widen_block(w.b, b, p.ldb, l0, j0, kb, nb);  // (kb, nb)
        const float beta = l0 > 0 ? 1.f : direct ? p.beta : 0.f;
        gemm(p.trans_a, p.trans_b, mb, nb, kb, p.alpha, wa, p.trans_a ? mb : kb, wb, p.trans_b ? kb : nb, beta, t, ldt);
      }
      if (direct) continue;
      MatmulArgs block = p;
      block.m = mb, block.n = nb;
      const void* block_bias = bias ? static_cast<const char*>(bias) + size_t(j0) * bias_size : nullptr;
      finish(block, static_cast<char*>(c) + size_t(i0 * p.ldc + j0) * c_size, t, block_bias);
    }
}

// The oneDNN primitive's run (below matmul, which checks the arguments and takes the empty cases first).
void matmul_primitive(const MatmulArgs& args, const void* a, const void* b, void* c, const void* bias);
}  // namespace

void set_bf16_gemm(Bf16Gemm mode) { g_bf16_gemm = mode; }
Bf16Gemm bf16_gemm() { return g_bf16_gemm; }

std::string native_bf16_missing() {
  static const std::string why = [] {
    MatmulArgs probe;
    probe.m = probe.n = probe.k = probe.lda = probe.ldb = probe.ldc = 16;
    probe.ab_type = DType::bf16;
    try {
      plan_for(probe, false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  return why;
}

Bf16GemmTiming time_bf16_gemm(int trials) {
  constexpr int64_t n = 1024;
  MatmulArgs p;
  p.m = p.n = p.k = p.lda = p.ldb = p.ldc = n;
  p.trans_b = true;  // x W^T, a linear layer's forward
  p.ab_type = p.c_type = DType::bf16;
  std::vector<bf16> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = f32_to_bf16(float(i % 7) * 0.25f - 0.75f);
    b[i] = f32_to_bf16(float(i % 5) * 0.125f - 0.25f);
  }
  // The process's CPU time, not the wall clock: a trial this process spent descheduled (other ranks, other jobs on
  // the cores) costs it nothing, so the choice does not flip with load (it did on the wall clock: one rank of a job
  // on an oversubscribed machine timed the primitive at 0.58x the widened rate where its neighbours saw 1.9-2.9x).
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  auto seconds = [&](bool native) {
    const double start = cpu_now();
    if (native)
      matmul_primitive(p, a.data(), b.data(), c.data(), nullptr);
    else
      matmul_widened(p, a.data(), b.data(), c.data(), nullptr);
    return cpu_now() - start;
  };
  seconds(true), seconds(false);  // warm-up: the primitive's creation, the buffers, oneDNN's threads
  Bf16GemmTiming best{1e30, 1e30};
  for (int i = 0; i < trials; ++i) {
    best.native_s = std::min(best.native_s, seconds(true));
    best.widened_s = std::min(best.widened_s, seconds(false));
  }
  return best;
}

void matmul(const MatmulArgs& args, const void* a, const void* b, void* c, const void* bias) {
  check_args(args);
  if (args.m == 0 || args.n == 0) return;
  if (args.k == 0) {  // an empty sum: oneDNN would reject the zero-sized inputs
    finish(args, c, nullptr, bias);
    return;
  }
  if (args.ab_type == DType::bf16 && g_bf16_gemm == Bf16Gemm::widened)
    matmul_widened(args, a, b, c, bias);
  else
    matmul_primitive(args, a, b, c, bias);
}

namespace {
void matmul_primitive(const MatmulArgs& args, const void* a, const void* b, void* c, const void* bias) {
  const Plan& plan = plan_for(args, bias != nullptr);
  thread_local Workspace ws;

  const void* bias_in = bias;
  if (plan.widen_bias) {
    auto* wide = static_cast<float*>(ws.bias.get(size_t(args.n) * sizeof(float)));
    for (int64_t j = 0; j < args.n; ++j) wide[j] = bf16_to_f32(static_cast<const bf16*>(bias)[j]);
    bias_in = wide;
  }
  void* dst = plan.stage_output ? ws.staging.get(size_t(args.m * args.n) * sizeof(float)) : c;

  // oneDNN takes non-const handles for inputs too; it does not write them.
  auto& exec = ws.args_for(plan);
  exec.at(DNNL_ARG_SRC).set_data_handle(const_cast<void*>(a));
  exec.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<void*>(b));
  exec.at(DNNL_ARG_DST).set_data_handle(dst);
  if (plan.bias_arg) exec.at(plan.bias_arg).set_data_handle(const_cast<void*>(bias_in));
  if (plan.scratch_bytes) exec.at(DNNL_ARG_SCRATCHPAD).set_data_handle(ws.scratch.get(plan.scratch_bytes));
  plan.primitive.execute(ws.stream, exec);
  ws.stream.wait();
  if (plan.stage_output) finish(args, c, static_cast<const float*>(dst), nullptr);
}
}  // namespace

std::string matmul_impl(const MatmulArgs& args, bool has_bias) {
  check_args(args);
  if (args.m == 0 || args.n == 0 || args.k == 0) return "none";
  if (args.ab_type == DType::bf16 && g_bf16_gemm == Bf16Gemm::widened) return "widened to f32:dnnl_sgemm";
  return plan_for(args, has_bias).impl;
}

size_t matmul_cache_size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.plans.size();
}

}  // namespace relay::cpu

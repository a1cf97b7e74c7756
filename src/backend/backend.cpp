// The backend's front door (every op's checks, once, naming the op and the tensor) and the factory,
// the only place that knows which backends were compiled in.
#include "backend/backend.hpp"

#include "backend/cpu_backend.hpp"
#ifdef RELAY_HAVE_CUDA
#include "backend/cuda_backend.hpp"
#endif

#include <chrono>
#include <type_traits>
#include <initializer_list>
#include <tuple>
#include <vector>

namespace relay {

namespace detail {
struct HostMarks {
  std::vector<double> t;  // seconds on the steady clock
};
}  // namespace detail

Backend::Backend() : host_marks_(std::make_unique<detail::HostMarks>()) {}
Backend::~Backend() = default;

int64_t Backend::timing_mark() {
  host_marks_->t.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return static_cast<int64_t>(host_marks_->t.size()) - 1;
}
double Backend::mark_seconds(int64_t mark) {
  const auto& t = host_marks_->t;
  RELAY_ASSERT(mark >= 0 && static_cast<size_t>(mark) < t.size(), "timing mark " << mark << " of " << t.size());
  return t[static_cast<size_t>(mark)] - t.front();
}
void Backend::clear_marks() { host_marks_->t.clear(); }

int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(0); }
int64_t cols_of(const Tensor& t) {
  int64_t cols = 1;
  for (int d = 1; d < t.ndim(); ++d) cols *= t.size(d);
  return cols;
}

namespace {

enum DTypes : unsigned { kF32 = 1, kBf16 = 2, kI32 = 4, kFp8 = 8, kFloat = kF32 | kBf16 };
bool allows(unsigned set, DType dt) {
  return (dt == DType::f32 && (set & kF32)) || (dt == DType::bf16 && (set & kBf16)) ||
         (dt == DType::i32 && (set & kI32)) || (is_fp8(dt) && (set & kFp8));
}
std::string set_name(unsigned set) {
  std::string r;
  for (auto [bit, name] : {std::pair{kF32, "float32"}, {kBf16, "bfloat16"}, {kI32, "int32"}, {kFp8, "float8"}})
    if (set & bit) r += (r.empty() ? "" : " or ") + std::string(name);
  return r;
}

// One op's checks: every failure is a relay assertion naming the op, the tensor and what was expected.
class Check {
 public:
  // Also the op's span for RELAY_OP_PROFILE: from here to the end of the op's scope (Backend::op_begin/op_end).
  Check(const Backend& be, const char* op) : be_(be), op_(op) { be_.op_begin(op_); }
  ~Check() { be_.op_end(); }
  Check(const Check&) = delete;
  Check& operator=(const Check&) = delete;
  // t is defined, on this backend's device, of a dtype in `set` that this backend computes on.
  const Check& tensor(const Tensor& t, const char* name, unsigned set) const {
    RELAY_ASSERT(t.defined(), op_ << ": " << name << " is undefined");
    RELAY_ASSERT(t.device() == be_.device(), op_ << ": " << name << " " << shape_str(t.shape()) << " is on "
                                                 << (t.device() == Device::cpu ? "the CPU" : "a CUDA device")
                                                 << ", not this backend's device");
    RELAY_ASSERT(allows(set, t.dtype()), op_ << ": " << name << " " << shape_str(t.shape()) << " is "
                                             << dtype_name(t.dtype()) << ", expected " << set_name(set));
    RELAY_ASSERT(be_.supports(t.dtype()), op_ << ": " << name << " is " << dtype_name(t.dtype()) << ", which the "
                                              << be_.describe() << " backend does not compute on");
    return *this;
  }
  const Check& numel(const Tensor& t, const char* name, int64_t n) const {
    RELAY_ASSERT(t.numel() == n, op_ << ": " << name << " " << shape_str(t.shape()) << " has " << t.numel()
                                     << " elements, expected " << n);
    return *this;
  }
  const Check& same_dtype(const Tensor& a, const char* an, const Tensor& b, const char* bn) const {
    RELAY_ASSERT(a.dtype() == b.dtype(), op_ << ": " << an << " is " << dtype_name(a.dtype()) << " but " << bn
                                             << " is " << dtype_name(b.dtype()) << " (they must match)");
    return *this;
  }
  const Check& same_shape(const Tensor& a, const char* an, const Tensor& b, const char* bn) const {
    RELAY_ASSERT(a.numel() == b.numel() && rows_of(a) == rows_of(b),
                 op_ << ": " << an << " " << shape_str(a.shape()) << " vs " << bn << " " << shape_str(b.shape()));
    return *this;
  }
  // A tensor of x's dtype and shape (gradients, outputs of elementwise ops).
  const Check& like(const Tensor& t, const char* name, const Tensor& x, const char* xn) const {
    tensor(t, name, kFloat);
    return same_dtype(t, name, x, xn).same_shape(t, name, x, xn);
  }
  // what: the message, or a callable making it (called only on failure: the checks run on every op, the messages'
  // formatting of shapes would cost more than the small ops themselves).
  template <typename Msg>
  const Check& that(bool ok, const Msg& what) const {
    if constexpr (std::is_invocable_v<const Msg&>) RELAY_ASSERT(ok, op_ << ": " << what());
    else RELAY_ASSERT(ok, op_ << ": " << what);
    return *this;
  }

 private:
  const Backend& be_;
  const char* op_;
};

// The GEMM shape rule shared by matmul and fp8_matmul: a, b, y matrices with op(a) (m, k) x op(b) (k, n) = y (m, n).
// Returns k.
int64_t check_gemm_shapes(const Check& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                          const Tensor& y) {
  c.that(a.ndim() == 2 && b.ndim() == 2 && y.ndim() == 2,
         [&] { return cat("a ", shape_str(a.shape()), ", b ", shape_str(b.shape()), ", y ", shape_str(y.shape()),
                          " must be matrices"); });
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  c.that(k == kb && y.size(0) == m && y.size(1) == n,
         [&] { return cat("op(a) is (", m, ", ", k, "), op(b) is (", kb, ", ", n, "), y is ", shape_str(y.shape())); });
  return k;
}

}  // namespace

void Backend::upload_f32(Tensor& dst, const float* host_src) {
  Check c(*this, "upload_f32");
  c.tensor(dst, "dst", kFloat);
  if (dst.dtype() == DType::f32) return upload(dst, host_src);
  upload_f32_bf16_impl(dst, host_src);
}
void Backend::upload_f32_bf16_impl(Tensor& dst, const float* host_src) {
  std::vector<bf16> rounded(static_cast<size_t>(dst.numel()));
  for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = f32_to_bf16(host_src[i]);
  upload(dst, rounded.data());
}

void Backend::copy(Tensor& dst, const Tensor& src) {
  Check c(*this, "copy");
  c.tensor(src, "src", kFloat | kI32).tensor(dst, "dst", kFloat | kI32).same_dtype(dst, "dst", src, "src");
  c.numel(dst, "dst", src.numel());
  copy_impl(dst, src);
}
void Backend::gather_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  Check c(*this, "gather_rows");
  c.tensor(src, "src", kFloat).tensor(dst, "dst", kFloat).same_dtype(dst, "dst", src, "src");
  c.tensor(index, "index", kI32).numel(index, "index", rows_of(dst));
  c.that(cols_of(dst) == cols_of(src),
         [&] { return cat("dst ", shape_str(dst.shape()), " and src ", shape_str(src.shape()),
                          " must have rows of one width"); });
  c.that(dst.raw() != src.raw(), "dst must not alias src");
  gather_rows_impl(src, index, dst);
}
void Backend::copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  Check c(*this, "copy_columns");
  c.tensor(src, "src", kFloat).tensor(dst, "dst", kFloat).same_dtype(dst, "dst", src, "src");
  c.that(rows_of(src) == rows_of(dst) && width >= 0 && src_col >= 0 && dst_col >= 0 &&
             src_col + width <= cols_of(src) && dst_col + width <= cols_of(dst),
         [&] { return cat("columns [", src_col, ", ", src_col + width, ") of src ", shape_str(src.shape()), " into [",
                          dst_col, ", ", dst_col + width, ") of dst ", shape_str(dst.shape())); });
  copy_columns_impl(src, src_col, dst, dst_col, width);
}
void Backend::fill(Tensor& x, float value) {
  Check c(*this, "fill");
  c.tensor(x, "x", kFloat | kI32);
  fill_impl(x, value);
}
void Backend::convert(const Tensor& src, Tensor& dst) {
  Check c(*this, "convert");
  c.tensor(src, "src", kFloat).tensor(dst, "dst", kFloat).numel(dst, "dst", src.numel());
  convert_impl(src, dst);
}

void Backend::matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                     float beta) {
  Check c(*this, "matmul");
  c.tensor(a, "a", kFloat).tensor(b, "b", kFloat).tensor(y, "y", kFloat).same_dtype(a, "a", b, "b");
  c.that(a.dtype() == DType::bf16 || y.dtype() == DType::f32, "float32 inputs need a float32 y");
  check_gemm_shapes(c, a, trans_a, b, trans_b, y);
  c.that(y.raw() != a.raw() && y.raw() != b.raw(), "y must not alias a or b");
  matmul_impl(a, trans_a, b, trans_b, y, alpha, beta);
}
namespace {
// fp8_quantize's and fp8_quantize_amax's operands: x (rows, cols) float, q its shape in an fp8 dtype, scales f32 in
// fp8_grid(tiling)'s shape.
void check_fp8_quantize(Check& c, const Tensor& x, Fp8Tiling tiling, const Tensor& q, const Tensor& scales) {
  c.tensor(x, "x", kFloat).tensor(q, "q", kFp8).tensor(scales, "scales", kF32);
  c.that(x.ndim() == 2 && q.shape() == x.shape(),
         [&] { return cat("x ", shape_str(x.shape()), " must be a matrix and q ", shape_str(q.shape()),
                          " its shape"); });
  const Fp8Grid g = fp8_grid(tiling, x.size(0), x.size(1));
  c.that(scales.shape() == Shape{g.rows, g.cols},
         [&] { return cat("scales ", shape_str(scales.shape()), " for ", fp8_tiling_name(tiling), " of x ",
                          shape_str(x.shape()), ", expected ", shape_str({g.rows, g.cols})); });
}
}  // namespace

void Backend::fp8_quantize(const Tensor& x, Fp8Tiling tiling, Tensor& q, Tensor& scales) {
  Check c(*this, "fp8_quantize");
  check_fp8_quantize(c, x, tiling, q, scales);
  fp8_quantize_impl(x, tiling, q, scales);
}
void Backend::fp8_amax(const Tensor& x, Fp8Tiling tiling, Tensor& amax) {
  Check c(*this, "fp8_amax");
  c.tensor(x, "x", kFloat).tensor(amax, "amax", kI32);
  c.that(x.ndim() == 2, [&] { return cat("x ", shape_str(x.shape()), " must be a matrix"); });
  const Fp8Grid g = fp8_grid(tiling, x.size(0), x.size(1));
  c.that(amax.shape() == Shape{g.rows, g.cols},
         [&] { return cat("amax ", shape_str(amax.shape()), " for ", fp8_tiling_name(tiling), " of x ",
                          shape_str(x.shape()), ", expected ", shape_str({g.rows, g.cols})); });
  fp8_amax_impl(x, tiling, amax);
}
void Backend::fp8_quantize_amax(const Tensor& x, Fp8Tiling tiling, const Tensor& amax, Tensor& q, Tensor& scales) {
  Check c(*this, "fp8_quantize_amax");
  check_fp8_quantize(c, x, tiling, q, scales);
  c.tensor(amax, "amax", kI32);
  c.that(amax.shape() == scales.shape(),
         [&] { return cat("amax ", shape_str(amax.shape()), " must have the scales' shape ",
                          shape_str(scales.shape())); });
  fp8_quantize_amax_impl(x, tiling, amax, q, scales);
}
void Backend::fp8_matmul(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a, const Tensor& b,
                         const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y, float beta) {
  Check c(*this, "fp8_matmul");
  c.tensor(a, "a", kFp8).tensor(b, "b", kFp8).tensor(y, "y", kFloat);
  c.tensor(a_scales, "a_scales", kF32).tensor(b_scales, "b_scales", kF32);
  const int64_t k = check_gemm_shapes(c, a, trans_a, b, trans_b, y);
  for (auto [t, s, tiling, name] : {std::tuple{&a, &a_scales, a_tiling, "a"}, {&b, &b_scales, b_tiling, "b"}}) {
    const Fp8Grid g = fp8_grid(tiling, t->size(0), t->size(1));
    c.that(s->shape() == Shape{g.rows, g.cols},
           [&] { return cat(name, "_scales ", shape_str(s->shape()), " for ", fp8_tiling_name(tiling), " of ", name,
                            " ", shape_str(t->shape()), ", expected ", shape_str({g.rows, g.cols})); });
  }
  c.that(fp8_k_block(k, fp8_k_tile(a_tiling, a.size(0), a.size(1), trans_a),
                     fp8_k_tile(b_tiling, b.size(0), b.size(1), !trans_b)) > 0,
         [&] { return cat("a's scales (", fp8_tiling_name(a_tiling), trans_a ? ", transposed" : "", ") and b's (",
                          fp8_tiling_name(b_tiling), trans_b ? ", transposed" : "", ") do not share blocks along k = ",
                          k, ": both must be one block along k, or both 128 along it"); });
  c.that(y.raw() != a.raw() && y.raw() != b.raw(), "y must not alias a or b");
  fp8_matmul_impl(a, a_scales, a_tiling, trans_a, b, b_scales, b_tiling, trans_b, y, beta);
}
void Backend::fp8_quantize_impl(const Tensor&, Fp8Tiling, Tensor&, Tensor&) {
  fatal(cat("fp8_quantize: the ", describe(), " backend has no FP8 kernels"), __FILE__, __LINE__);
}
void Backend::fp8_amax_impl(const Tensor&, Fp8Tiling, Tensor&) {
  fatal(cat("fp8_amax: the ", describe(), " backend has no FP8 kernels"), __FILE__, __LINE__);
}
void Backend::fp8_quantize_amax_impl(const Tensor&, Fp8Tiling, const Tensor&, Tensor&, Tensor&) {
  fatal(cat("fp8_quantize_amax: the ", describe(), " backend has no FP8 kernels"), __FILE__, __LINE__);
}
void Backend::fp8_matmul_impl(const Tensor&, const Tensor&, Fp8Tiling, bool, const Tensor&, const Tensor&, Fp8Tiling,
                              bool, Tensor&, float) {
  fatal(cat("fp8_matmul: the ", describe(), " backend has no FP8 kernels"), __FILE__, __LINE__);
}
// The row groups of a grouped GEMM: ascending, within `rows` (messages built only on failure: per expert, per call).
static void check_groups(const Check& c, const std::vector<int64_t>& offsets, size_t groups, int64_t rows) {
  if (offsets.size() != groups + 1)
    c.that(false, cat(offsets.size(), " offsets for ", groups, " groups (expected groups + 1)"));
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    if (offsets[g] < 0 || offsets[g] > offsets[g + 1])
      c.that(false,
             [&] { return cat("offsets[", g, "] = ", offsets[g], ", offsets[", g + 1, "] = ", offsets[g + 1],
                              " (the groups are ascending row ranges)"); });
  if (offsets.back() > rows) c.that(false, [&] { return cat("the groups end at row ", offsets.back(), " of ", rows); });
}
void Backend::grouped_matmul(const Tensor& a, const std::vector<Tensor>& b, bool trans_b, Tensor& y,
                             const std::vector<int64_t>& offsets, float beta) {
  Check c(*this, "grouped_matmul");
  c.tensor(a, "a", kFloat).tensor(y, "y", kFloat).same_dtype(y, "y", a, "a");
  if (a.ndim() != 2 || y.ndim() != 2 || a.size(0) != y.size(0))
    c.that(false,
           [&] { return cat("a ", shape_str(a.shape()), " and y ", shape_str(y.shape()),
                            " must be matrices of the same rows"); });
  c.that(y.raw() != a.raw(), "y must not alias a");
  check_groups(c, offsets, b.size(), a.size(0));
  for (const Tensor& w : b) {
    c.tensor(w, "b[g]", kFloat).same_dtype(w, "b[g]", a, "a");
    const bool fits = w.ndim() == 2 && (trans_b ? w.size(1) : w.size(0)) == a.size(1) &&
                      (trans_b ? w.size(0) : w.size(1)) == y.size(1);
    if (!fits)
      c.that(false,
             [&] { return cat("op(b[g]) of b[g] ", shape_str(w.shape()), trans_b ? " transposed" : "", " for a ",
                              shape_str(a.shape()), " and y ", shape_str(y.shape())); });
    c.that(y.raw() != w.raw(), "y must not alias b[g]");
  }
  grouped_matmul_impl(a, b, trans_b, y, offsets, beta);
}
void Backend::grouped_matmul_weight(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                                    const std::vector<Tensor>& dw, float beta) {
  Check c(*this, "grouped_matmul_weight");
  c.tensor(dy, "dy", kFloat).tensor(x, "x", kFloat).same_dtype(x, "x", dy, "dy");
  if (dy.ndim() != 2 || x.ndim() != 2 || dy.size(0) != x.size(0))
    c.that(false,
           [&] { return cat("dy ", shape_str(dy.shape()), " and x ", shape_str(x.shape()),
                            " must be matrices of the same rows"); });
  check_groups(c, offsets, dw.size(), dy.size(0));
  for (const Tensor& w : dw) {
    c.tensor(w, "dw[g]", kFloat);
    c.that(dy.dtype() == DType::bf16 || w.dtype() == DType::f32, "float32 inputs need float32 dw[g]");
    if (w.ndim() != 2 || w.size(0) != dy.size(1) || w.size(1) != x.size(1))
      c.that(false,
             [&] { return cat("dw[g] ", shape_str(w.shape()), " for dy ", shape_str(dy.shape()), " and x ",
                              shape_str(x.shape())); });
    c.that(w.raw() != dy.raw() && w.raw() != x.raw(), "dw[g] must not alias dy or x");
  }
  grouped_matmul_weight_impl(dy, x, offsets, dw, beta);
}
void Backend::add_bias(Tensor& y, const Tensor& bias) {
  Check c(*this, "add_bias");
  c.tensor(y, "y", kFloat).tensor(bias, "bias", kFloat).same_dtype(bias, "bias", y, "y").numel(bias, "bias", cols_of(y));
  add_bias_impl(y, bias);
}
void Backend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, LinearAct act,
                     Tensor* pre_act) {
  Check c(*this, "linear");
  c.tensor(x, "x", kFloat).tensor(w, "w", kFloat).tensor(y, "y", kFloat);
  c.same_dtype(w, "w", x, "x").same_dtype(y, "y", x, "x");
  c.that(x.ndim() == 2 && w.ndim() == 2 && y.ndim() == 2,
         [&] { return cat("x ", shape_str(x.shape()), ", w ", shape_str(w.shape()), ", y ", shape_str(y.shape()),
                          " must be matrices"); });
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  c.that(w.size(1) == in && y.size(0) == n && y.size(1) == out,
         [&] { return cat("x ", shape_str(x.shape()), " @ w ", shape_str(w.shape()), "^T does not give y ",
                          shape_str(y.shape())); });
  if (bias.defined()) c.tensor(bias, "bias", kFloat).same_dtype(bias, "bias", x, "x").numel(bias, "bias", out);
  c.that(y.raw() != x.raw() && y.raw() != w.raw(), "y must not alias x or w");
  if (pre_act && act != LinearAct::none) {
    c.like(*pre_act, "pre_act", y, "y").that(pre_act->ndim() == 2, "pre_act must be a matrix");
    c.that(pre_act->raw() != x.raw() && pre_act->raw() != w.raw() && pre_act->raw() != y.raw(),
           "pre_act must not alias x, w or y");
  }
  linear_impl(x, w, bias, y, act, act == LinearAct::none ? nullptr : pre_act);
}
void Backend::linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, LinearAct act,
                                    const Tensor& act_in) {
  Check c(*this, "linear_backward_input");
  c.tensor(dy, "dy", kFloat).tensor(w, "w", kFloat).tensor(dx, "dx", kFloat);
  c.same_dtype(w, "w", dy, "dy").same_dtype(dx, "dx", dy, "dy");
  c.that(dy.ndim() == 2 && w.ndim() == 2 && dx.ndim() == 2,
         [&] { return cat("dy ", shape_str(dy.shape()), ", w ", shape_str(w.shape()), ", dx ", shape_str(dx.shape()),
                          " must be matrices"); });
  c.that(w.size(0) == dy.size(1) && dx.size(0) == dy.size(0) && dx.size(1) == w.size(1),
         [&] { return cat("dy ", shape_str(dy.shape()), " @ w ", shape_str(w.shape()), " does not give dx ",
                          shape_str(dx.shape())); });
  c.that(dx.raw() != dy.raw() && dx.raw() != w.raw(), "dx must not alias dy or w");
  if (act != LinearAct::none) {
    c.like(act_in, "act_in", dx, "dx").that(act_in.ndim() == 2, "act_in must be a matrix");
    c.that(dx.raw() != act_in.raw(), "dx must not alias act_in");
  }
  linear_backward_input_impl(dy, w, dx, act, act_in);
}
void Backend::bias_grad(const Tensor& dy, Tensor& db, float beta) {
  Check c(*this, "bias_grad");
  c.tensor(dy, "dy", kFloat).tensor(db, "db", kF32).numel(db, "db", cols_of(dy));
  bias_grad_impl(dy, db, beta);
}

void Backend::activation_forward(Activation act, const Tensor& x, Tensor& y) {
  Check c(*this, "activation_forward");
  c.tensor(x, "x", kFloat).like(y, "y", x, "x");
  activation_forward_impl(act, x, y);
}
void Backend::activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  Check c(*this, "activation_backward");
  c.tensor(x, "x", kFloat).like(dy, "dy", x, "x").like(dx, "dx", x, "x");
  activation_backward_impl(act, x, dy, dx);
}
void Backend::scale(Tensor& x, float s) {
  Check c(*this, "scale");
  c.tensor(x, "x", kFloat);
  scale_impl(x, s);
}
void Backend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  Check c(*this, "add");
  c.tensor(a, "a", kFloat).like(b, "b", a, "a").like(y, "y", a, "a");
  add_impl(a, b, y);
}
double Backend::sum_squares(const Tensor& x) {
  Check c(*this, "sum_squares");
  c.tensor(x, "x", kF32);
  return sum_squares_impl(x);
}

void Backend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                Tensor& mean, Tensor& rstd) {
  const int64_t n = rows_of(x), d = cols_of(x);
  Check c(*this, "layernorm_forward");
  c.tensor(x, "x", kFloat).like(y, "y", x, "x").tensor(gamma, "gamma", kFloat).tensor(beta, "beta", kFloat);
  c.same_dtype(gamma, "gamma", x, "x").same_dtype(beta, "beta", x, "x").numel(gamma, "gamma", d).numel(beta, "beta", d);
  c.tensor(mean, "mean", kF32).tensor(rstd, "rstd", kF32).numel(mean, "mean", n).numel(rstd, "rstd", n);
  layernorm_forward_impl(x, gamma, beta, eps, y, mean, rstd);
}
void Backend::layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                       const Tensor& rstd, Tensor& dx) {
  const int64_t n = rows_of(x), d = cols_of(x);
  Check c(*this, "layernorm_backward_input");
  c.tensor(x, "x", kFloat).like(dy, "dy", x, "x").like(dx, "dx", x, "x").tensor(gamma, "gamma", kFloat);
  c.same_dtype(gamma, "gamma", x, "x").numel(gamma, "gamma", d).tensor(mean, "mean", kF32).tensor(rstd, "rstd", kF32);
  c.numel(mean, "mean", n).numel(rstd, "rstd", n);
  layernorm_backward_input_impl(dy, x, gamma, mean, rstd, dx);
}
void Backend::layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                        Tensor& dgamma, Tensor& dbeta) {
  const int64_t n = rows_of(x), d = cols_of(x);
  Check c(*this, "layernorm_backward_weight");
  c.tensor(x, "x", kFloat).like(dy, "dy", x, "x").tensor(mean, "mean", kF32).tensor(rstd, "rstd", kF32);
  c.numel(mean, "mean", n).numel(rstd, "rstd", n);
  c.tensor(dgamma, "dgamma", kF32).tensor(dbeta, "dbeta", kF32).numel(dgamma, "dgamma", d).numel(dbeta, "dbeta", d);
  layernorm_backward_weight_impl(dy, x, mean, rstd, dgamma, dbeta);
}

void Backend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd) {
  const int64_t n = rows_of(x), d = cols_of(x);
  Check c(*this, "rmsnorm_forward");
  c.tensor(x, "x", kFloat).like(y, "y", x, "x").tensor(gamma, "gamma", kFloat);
  c.same_dtype(gamma, "gamma", x, "x").numel(gamma, "gamma", d).tensor(rstd, "rstd", kF32).numel(rstd, "rstd", n);
  rmsnorm_forward_impl(x, gamma, eps, y, rstd);
}
void Backend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                     Tensor& dx) {
  const int64_t n = rows_of(x), d = cols_of(x);
  Check c(*this, "rmsnorm_backward_input");
  c.tensor(x, "x", kFloat).like(dy, "dy", x, "x").like(dx, "dx", x, "x").tensor(gamma, "gamma", kFloat);
  c.same_dtype(gamma, "gamma", x, "x").numel(gamma, "gamma", d).tensor(rstd, "rstd", kF32).numel(rstd, "rstd", n);
  rmsnorm_backward_input_impl(dy, x, gamma, rstd, dx);
}
void Backend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dgamma) {
  const int64_t n = rows_of(x), d = cols_of(x);
  Check c(*this, "rmsnorm_backward_weight");
  c.tensor(x, "x", kFloat).like(dy, "dy", x, "x").tensor(rstd, "rstd", kF32).numel(rstd, "rstd", n);
  c.tensor(dgamma, "dgamma", kF32).numel(dgamma, "dgamma", d);
  rmsnorm_backward_weight_impl(dy, x, rstd, dgamma);
}

void Backend::moe_router_forward(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse,
                                 Tensor& experts, Tensor& weights, const Tensor& bias) {
  const int64_t n = rows_of(logits), E = cols_of(logits);
  Check c(*this, "moe_router_forward");
  c.tensor(logits, "logits", kFloat).that(k >= 1 && k <= E, cat("k = ", k, " must be in [1, E = ", E, "]"));
  c.tensor(probs, "probs", kF32).numel(probs, "probs", n * E).tensor(lse, "lse", kF32).numel(lse, "lse", n);
  c.tensor(experts, "experts", kI32).numel(experts, "experts", n * k);
  c.tensor(weights, "weights", kF32).numel(weights, "weights", n * k);
  if (bias.defined()) c.tensor(bias, "bias", kF32).numel(bias, "bias", E);
  moe_router_forward_impl(logits, k, renormalize, probs, lse, experts, weights, bias);
}
void Backend::moe_router_backward(const Tensor& probs, const Tensor& lse, const Tensor& experts, const Tensor& dweights,
                                  bool renormalize, const Tensor& seq_grad, int64_t T, float z_scale, Tensor& dlogits) {
  const int64_t n = rows_of(probs), E = cols_of(probs), k = cols_of(experts);
  Check c(*this, "moe_router_backward");
  c.tensor(probs, "probs", kF32).tensor(lse, "lse", kF32).numel(lse, "lse", n);
  c.tensor(experts, "experts", kI32).numel(experts, "experts", n * k);
  c.tensor(dweights, "dweights", kF32).numel(dweights, "dweights", n * k);
  c.tensor(dlogits, "dlogits", kFloat).numel(dlogits, "dlogits", n * E);
  if (seq_grad.defined()) {
    c.that(T >= 1 && n % T == 0, [&] { return cat("T = ", T, " must divide the ", n, " rows"); });
    c.tensor(seq_grad, "seq_grad", kF32).numel(seq_grad, "seq_grad", n / T * E);
  }
  moe_router_backward_impl(probs, lse, experts, dweights, renormalize, seq_grad, T, z_scale, dlogits);
}
void Backend::moe_group_router_forward(const Tensor& logits, const GroupRouting& r, Tensor& probs, Tensor& experts,
                                       Tensor& weights, const Tensor& bias) {
  const int64_t n = rows_of(logits), E = cols_of(logits);
  Check c(*this, "moe_group_router_forward");
  c.tensor(logits, "logits", kFloat).that(r.n_group >= 1 && E % r.n_group == 0,
                                          cat("n_group = ", r.n_group, " must divide E = ", E));
  c.that(r.topk_group >= 1 && r.topk_group <= r.n_group,
         [&] { return cat("topk_group = ", r.topk_group, " must be in [1, n_group = ", r.n_group, "]"); });
  c.that(r.k >= 1 && r.k <= r.topk_group * (E / r.n_group),
         [&] { return cat("k = ", r.k, " must be in [1, topk_group x E / n_group = ", r.topk_group * (E / r.n_group),
                          "]"); });
  c.tensor(probs, "probs", kF32).numel(probs, "probs", n * E);
  c.tensor(experts, "experts", kI32).numel(experts, "experts", n * r.k);
  c.tensor(weights, "weights", kF32).numel(weights, "weights", n * r.k);
  if (bias.defined()) c.tensor(bias, "bias", kF32).numel(bias, "bias", E);
  moe_group_router_forward_impl(logits, r, probs, experts, weights, bias);
}
void Backend::moe_group_router_backward(const Tensor& probs, const Tensor& experts, const Tensor& dweights,
                                        const GroupRouting& r, const Tensor& seq_grad, int64_t T, Tensor& dlogits) {
  const int64_t n = rows_of(probs), E = cols_of(probs);
  Check c(*this, "moe_group_router_backward");
  c.tensor(probs, "probs", kF32).tensor(experts, "experts", kI32).numel(experts, "experts", n * r.k);
  c.tensor(dweights, "dweights", kF32).numel(dweights, "dweights", n * r.k);
  c.tensor(dlogits, "dlogits", kFloat).numel(dlogits, "dlogits", n * E);
  if (seq_grad.defined()) {
    c.that(T >= 1 && n % T == 0, [&] { return cat("T = ", T, " must divide the ", n, " rows"); });
    c.tensor(seq_grad, "seq_grad", kF32).numel(seq_grad, "seq_grad", n / T * E);
  }
  moe_group_router_backward_impl(probs, experts, dweights, r, seq_grad, T, dlogits);
}
void Backend::moe_group_router_forward_impl(const Tensor&, const GroupRouting&, Tensor&, Tensor&, Tensor&,
                                            const Tensor&) {
  fatal(cat("moe_group_router_forward: the ", describe(), " backend has no sigmoid (DeepSeek-V3) router kernel"),
        __FILE__, __LINE__, "run MoE layers with sigmoid scores on the CPU backend (train.device = \"cpu\")");
}
void Backend::moe_group_router_backward_impl(const Tensor&, const Tensor&, const Tensor&, const GroupRouting&,
                                             const Tensor&, int64_t, Tensor&) {
  fatal(cat("moe_group_router_backward: the ", describe(), " backend has no sigmoid (DeepSeek-V3) router kernel"),
        __FILE__, __LINE__, "run MoE layers with sigmoid scores on the CPU backend (train.device = \"cpu\")");
}
void Backend::moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weights, Tensor& y) {
  const int64_t n = rows_of(y), k = cols_of(pos);
  Check c(*this, "moe_combine");
  c.tensor(rows, "rows", kFloat).tensor(y, "y", kFloat).same_dtype(y, "y", rows, "rows");
  c.that(cols_of(y) == cols_of(rows),
         [&] { return cat("y ", shape_str(y.shape()), " and rows ", shape_str(rows.shape()),
                          " must have rows of one width"); });
  c.tensor(pos, "pos", kI32).numel(pos, "pos", n * k);
  if (weights.defined()) c.tensor(weights, "weights", kF32).numel(weights, "weights", n * k);
  c.that(y.raw() != rows.raw(), "y must not alias rows");
  moe_combine_impl(rows, pos, weights, y);
}
void Backend::moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& pos, const Tensor& weights,
                                   Tensor& drows, Tensor& dweights) {
  const int64_t n = rows_of(dy), k = cols_of(pos);
  Check c(*this, "moe_combine_backward");
  c.tensor(rows, "rows", kFloat).like(drows, "drows", rows, "rows").tensor(dy, "dy", kFloat);
  c.same_dtype(dy, "dy", rows, "rows").numel(rows, "rows", n * k * cols_of(dy));
  c.tensor(pos, "pos", kI32).numel(pos, "pos", n * k).tensor(weights, "weights", kF32).numel(weights, "weights", n * k);
  c.tensor(dweights, "dweights", kF32).numel(dweights, "dweights", n * k);
  c.that(drows.raw() != dy.raw() && drows.raw() != rows.raw(), "drows must not alias dy or rows");
  moe_combine_backward_impl(dy, rows, pos, weights, drows, dweights);
}

void Backend::swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& h) {
  Check c(*this, "swiglu_forward");
  c.tensor(gate, "gate", kFloat).like(up, "up", gate, "gate").like(h, "h", gate, "gate");
  swiglu_forward_impl(gate, up, h);
}
void Backend::swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  Check c(*this, "swiglu_backward");
  c.tensor(gate, "gate", kFloat).like(up, "up", gate, "gate").like(dh, "dh", gate, "gate");
  c.like(dgate, "dgate", gate, "gate").like(dup, "dup", gate, "gate");
  c.that(dgate.raw() != dup.raw(), "dgate and dup must be different tensors");
  swiglu_backward_impl(dh, gate, up, dgate, dup);
}

void Backend::rope(const Tensor& x, int64_t T, int64_t head_dim, double theta, int64_t pos0, bool inverse, Tensor& y,
                   const Tensor& positions, const RopeScaling& scaling) {
  Check c(*this, "rope");
  c.tensor(x, "x", kFloat).like(y, "y", x, "x");
  c.that(head_dim > 0 && head_dim % 2 == 0 && cols_of(x) % head_dim == 0,
         [&] { return cat("x ", shape_str(x.shape()),
                          " must be (n, heads * head_dim) with an even head_dim, got head_dim ", head_dim); });
  c.that(T > 0 && pos0 >= 0 && theta > 0,
         [&] { return cat("T ", T, ", pos0 ", pos0, " and theta ", theta, " must be positive"); });
  if (positions.defined()) c.tensor(positions, "positions", kI32).numel(positions, "positions", rows_of(x));
  rope_impl(x, T, head_dim, theta, pos0, inverse, y, positions, scaling);
}

namespace {
// gather_rotary's and scatter_rotary's shapes: x (n, heads * head_width), pe (n, heads * dr), off + dr <= head_width.
void check_rotary(const Check& c, const Tensor& x, int64_t head_width, int64_t off, bool interleaved,
                  const Tensor& pe) {
  c.tensor(x, "x", kFloat).tensor(pe, "pe", kFloat).same_dtype(pe, "pe", x, "x");
  c.that(head_width > 0 && cols_of(x) % head_width == 0 && rows_of(pe) == rows_of(x),
         [&] { return cat("x ", shape_str(x.shape()), " must be (n, heads * ", head_width, ") and pe ",
                          shape_str(pe.shape()), " have its n rows"); });
  const int64_t heads = cols_of(x) / head_width, dr = heads > 0 ? cols_of(pe) / heads : 0;
  c.that(heads > 0 && cols_of(pe) == heads * dr && dr > 0 && off >= 0 && off + dr <= head_width &&
             (!interleaved || dr % 2 == 0),
         [&] { return cat("pe ", shape_str(pe.shape()), " must be (n, ", heads, " heads * dr) with columns [", off,
                          ", ", off, " + dr) inside each head of ", head_width, interleaved ? " and dr even" : ""); });
  c.that(x.raw() != pe.raw(), "pe must not alias x");
}
}  // namespace

void Backend::gather_rotary(const Tensor& x, int64_t head_width, int64_t off, bool interleaved, Tensor& pe) {
  Check c(*this, "gather_rotary");
  check_rotary(c, x, head_width, off, interleaved, pe);
  rotary_columns_impl(x, pe, head_width, off, interleaved, /*gather=*/true);
}
void Backend::scatter_rotary(const Tensor& pe, int64_t head_width, int64_t off, bool interleaved, Tensor& x) {
  Check c(*this, "scatter_rotary");
  check_rotary(c, x, head_width, off, interleaved, pe);
  rotary_columns_impl(pe, x, head_width, off, interleaved, /*gather=*/false);
}

void Backend::cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                            Tensor* dlogits) {
  const int64_t n = rows_of(logits);
  Check c(*this, "cross_entropy");
  c.tensor(logits, "logits", kFloat).tensor(targets, "targets", kI32).numel(targets, "targets", n);
  c.tensor(losses, "losses", kF32).numel(losses, "losses", n);
  if (dlogits) c.like(*dlogits, "dlogits", logits, "logits");
  cross_entropy_impl(logits, targets, grad_scale, losses, dlogits);
}
void Backend::mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred) {
  Check c(*this, "mse");
  c.tensor(pred, "pred", kFloat).like(target, "target", pred, "pred");
  c.tensor(losses, "losses", kF32).numel(losses, "losses", rows_of(pred));
  if (dpred) c.like(*dpred, "dpred", pred, "pred");
  mse_impl(pred, target, grad_scale, losses, dpred);
}
void Backend::argmax(const Tensor& logits, Tensor& out) {
  Check c(*this, "argmax");
  c.tensor(logits, "logits", kFloat).tensor(out, "out", kI32).numel(out, "out", rows_of(logits));
  argmax_impl(logits, out);
}
void Backend::row_max(const Tensor& x, Tensor& out) {
  Check c(*this, "row_max");
  c.tensor(x, "x", kFloat).tensor(out, "out", kF32).numel(out, "out", rows_of(x));
  row_max_impl(x, out);
}
void Backend::cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const Tensor& row_max, Tensor& partial) {
  const int64_t n = rows_of(logits);
  Check c(*this, "cross_entropy_partial");
  c.tensor(logits, "logits", kFloat).tensor(targets, "targets", kI32).numel(targets, "targets", n);
  c.tensor(row_max, "row_max", kF32).numel(row_max, "row_max", n);
  c.tensor(partial, "partial", kF32).numel(partial, "partial", 2 * n);
  cross_entropy_partial_impl(logits, targets, vocab_start, row_max, partial);
}
void Backend::cross_entropy_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                   const Tensor& row_max, const Tensor& total, float grad_scale, Tensor& losses,
                                   Tensor* dlogits) {
  const int64_t n = rows_of(logits);
  Check c(*this, "cross_entropy_finish");
  c.tensor(logits, "logits", kFloat).tensor(targets, "targets", kI32).numel(targets, "targets", n);
  c.tensor(row_max, "row_max", kF32).numel(row_max, "row_max", n);
  c.tensor(total, "total", kF32).numel(total, "total", 2 * n);
  c.tensor(losses, "losses", kF32).numel(losses, "losses", n);
  if (dlogits) c.like(*dlogits, "dlogits", logits, "logits");
  cross_entropy_finish_impl(logits, targets, vocab_start, row_max, total, grad_scale, losses, dlogits);
}

void Backend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T, Tensor& out,
                                int64_t vocab_start, const Tensor& positions) {
  Check c(*this, "embedding_forward");
  c.tensor(tokens, "tokens", kI32).tensor(wte, "wte", kFloat).tensor(out, "out", kFloat);
  c.same_dtype(out, "out", wte, "wte").numel(out, "out", tokens.numel() * cols_of(wte));
  if (wpe.defined()) {
    c.tensor(wpe, "wpe", kFloat).same_dtype(wpe, "wpe", wte, "wte");
    c.that(cols_of(wpe) == cols_of(wte) && T <= rows_of(wpe),
           [&] { return cat("wpe ", shape_str(wpe.shape()), " for T ", T, " and wte ", shape_str(wte.shape())); });
  }
  if (positions.defined()) c.tensor(positions, "positions", kI32).numel(positions, "positions", tokens.numel());
  embedding_forward_impl(tokens, wte, wpe, T, out, vocab_start, positions);
}
void Backend::embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte, Tensor& dwpe,
                                 int64_t vocab_start, const Tensor& positions) {
  Check c(*this, "embedding_backward");
  c.tensor(tokens, "tokens", kI32).tensor(dout, "dout", kFloat).tensor(dwte, "dwte", kF32);
  c.numel(dout, "dout", tokens.numel() * cols_of(dwte));
  if (dwpe.defined()) {
    c.tensor(dwpe, "dwpe", kF32);
    c.that(cols_of(dwpe) == cols_of(dwte) && T <= rows_of(dwpe),
           [&] { return cat("dwpe ", shape_str(dwpe.shape()), " for T ", T); });
  }
  if (positions.defined()) c.tensor(positions, "positions", kI32).numel(positions, "positions", tokens.numel());
  embedding_backward_impl(tokens, dout, T, dwte, dwpe, vocab_start, positions);
}

namespace {
// qkv (B*T, 3C) with C % H == 0; returns C.
int64_t attention_width(const Check& c, const Tensor& qkv, int64_t B, int64_t T, int64_t H) {
  const int64_t C = cols_of(qkv) / 3;
  c.tensor(qkv, "qkv", kFloat).numel(qkv, "qkv", B * T * 3 * C);
  c.that(H > 0 && C % H == 0 && cols_of(qkv) == 3 * C,
         [&] { return cat("qkv ", shape_str(qkv.shape()), " must be (B*T, 3C) with C divisible by H = ", H); });
  return C;
}
}  // namespace

void Backend::attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) {
  Check c(*this, "attention_forward");
  const int64_t C = attention_width(c, qkv, B, T, H);
  c.tensor(qkv, "qkv", kF32).tensor(att, "att", kF32).numel(att, "att", B * H * T * T);
  c.tensor(out, "out", kF32).numel(out, "out", B * T * C);
  attention_forward_impl(qkv, B, T, H, att, out);
}
void Backend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T,
                                 int64_t H, Tensor& dqkv) {
  Check c(*this, "attention_backward");
  const int64_t C = attention_width(c, qkv, B, T, H);
  c.tensor(qkv, "qkv", kF32).tensor(dout, "dout", kF32).numel(dout, "dout", B * T * C);
  c.tensor(att, "att", kF32).numel(att, "att", B * H * T * T).like(dqkv, "dqkv", qkv, "qkv");
  attention_backward_impl(dout, qkv, att, B, T, H, dqkv);
}
void Backend::flash_attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& out, Tensor& lse,
                                      const Tensor& doc_start) {
  Check c(*this, "flash_attention_forward");
  const int64_t C = attention_width(c, qkv, B, T, H);
  c.tensor(out, "out", kFloat).same_dtype(out, "out", qkv, "qkv").numel(out, "out", B * T * C);
  c.tensor(lse, "lse", kF32).numel(lse, "lse", B * H * T);
  if (doc_start.defined()) c.tensor(doc_start, "doc_start", kI32).numel(doc_start, "doc_start", B * T);
  flash_attention_forward_impl(qkv, B, T, H, out, lse, doc_start);
}
void Backend::flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                       int64_t B, int64_t T, int64_t H, Tensor& dqkv, const Tensor& doc_start) {
  Check c(*this, "flash_attention_backward");
  const int64_t C = attention_width(c, qkv, B, T, H);
  c.tensor(out, "out", kFloat).same_dtype(out, "out", qkv, "qkv").numel(out, "out", B * T * C);
  c.like(dout, "dout", out, "out").tensor(lse, "lse", kF32).numel(lse, "lse", B * H * T);
  c.like(dqkv, "dqkv", qkv, "qkv");
  if (doc_start.defined()) c.tensor(doc_start, "doc_start", kI32).numel(doc_start, "doc_start", B * T);
  flash_attention_backward_impl(dout, qkv, out, lse, B, T, H, dqkv, doc_start);
}
void Backend::attention_decode(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H, Tensor& out) {
  Check c(*this, "attention_decode");
  const int64_t n = rows_of(qkv), C = cols_of(qkv) / 3;
  c.tensor(qkv, "qkv", kFloat).tensor(kcache, "kcache", kFloat).tensor(vcache, "vcache", kFloat);
  c.same_dtype(kcache, "kcache", qkv, "qkv").same_dtype(vcache, "vcache", qkv, "qkv");
  c.that(kcache.ndim() == 3 && kcache.shape() == vcache.shape() && kcache.size(0) == n && kcache.size(2) == C &&
             t >= 0 && t < kcache.size(1) && C % H == 0,
         [&] { return cat("caches ", shape_str(kcache.shape()), " for qkv ", shape_str(qkv.shape()), ", t ", t, ", H ",
                          H); });
  c.tensor(out, "out", kFloat).same_dtype(out, "out", qkv, "qkv").numel(out, "out", n * C);
  attention_decode_impl(qkv, kcache, vcache, t, H, out);
}

namespace {
// q (B*T, H*hd), k (B*T, KV*hd) and v (B*T, KV*hd_v) of one dtype, KV dividing H; returns hd. hd_v == hd unless
// value_dim_free (the flash kernels, whose value heads may be wider or narrower: DeepSeek-V3's MLA).
int64_t gqa_head_dim(const Check& c, const Tensor& q, const Tensor& k, const Tensor& v, int64_t rows, int64_t H,
                     int64_t KV, bool value_dim_free = false) {
  c.tensor(q, "q", kFloat).tensor(k, "k", kFloat).same_dtype(k, "k", q, "q");
  if (value_dim_free)
    c.tensor(v, "v", kFloat).same_dtype(v, "v", q, "q").that(
        rows_of(v) == rows && KV > 0 && cols_of(v) % KV == 0 && cols_of(v) > 0,
        cat("v ", shape_str(v.shape()), " must be (", rows, ", ", KV, "*hd_v)"));
  else
    c.like(v, "v", k, "k");
  c.that(H > 0 && KV > 0 && H % KV == 0 && cols_of(q) % H == 0 && cols_of(q) > 0,
         [&] { return cat("q ", shape_str(q.shape()), " must be (rows, H*hd) with H = ", H, " a multiple of KV = ",
                          KV); });
  const int64_t hd = cols_of(q) / H;
  c.that(rows_of(q) == rows && rows_of(k) == rows && cols_of(k) == KV * hd,
         [&] { return cat("q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), " must be (", rows, ", ", H, "*",
                          hd, ") and (", rows, ", ", KV, "*", hd, ")"); });
  return hd;
}
}  // namespace

void Backend::flash_attention_gqa_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t T,
                                          int64_t H, int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start) {
  Check c(*this, "flash_attention_gqa_forward");
  c.that(B > 0 && T > 0, [&] { return cat("B ", B, " and T ", T, " must be positive"); });
  gqa_head_dim(c, q, k, v, B * T, H, KV, true);
  c.tensor(out, "out", kFloat).same_dtype(out, "out", q, "q").numel(out, "out", B * T * H * (cols_of(v) / KV));
  c.tensor(lse, "lse", kF32).numel(lse, "lse", B * H * T);
  if (doc_start.defined()) c.tensor(doc_start, "doc_start", kI32).numel(doc_start, "doc_start", B * T);
  flash_attention_gqa_forward_impl(q, k, v, B, T, H, KV, out, lse, doc_start);
}
void Backend::flash_attention_gqa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t H,
                                           int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) {
  Check c(*this, "flash_attention_gqa_backward");
  c.that(B > 0 && T > 0, [&] { return cat("B ", B, " and T ", T, " must be positive"); });
  gqa_head_dim(c, q, k, v, B * T, H, KV, true);
  c.tensor(out, "out", kFloat).same_dtype(out, "out", q, "q").numel(out, "out", B * T * H * (cols_of(v) / KV));
  c.like(dout, "dout", out, "out");
  c.tensor(lse, "lse", kF32).numel(lse, "lse", B * H * T);
  c.like(dq, "dq", q, "q").like(dk, "dk", k, "k").like(dv, "dv", v, "v");
  if (doc_start.defined()) c.tensor(doc_start, "doc_start", kI32).numel(doc_start, "doc_start", B * T);
  flash_attention_gqa_backward_impl(dout, q, k, v, out, lse, B, T, H, KV, dq, dk, dv, doc_start);
}
namespace {
// The positioned attention's shapes: q (B*Tq, H*hd), k (B*Tk, KV*hd), v (B*Tk, KV*hd_v), q_pos (B*Tq) i32; returns
// hd.
int64_t attention_at_head_dim(const Check& c, const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t Tq,
                              int64_t Tk, const Tensor& q_pos, int64_t H, int64_t KV) {
  c.that(B > 0 && Tq > 0 && Tk >= Tq && H > 0 && KV > 0 && H % KV == 0,
         [&] { return cat("B ", B, ", Tq ", Tq, ", Tk ", Tk, ", H ", H, ", KV ", KV,
                          ": need Tk >= Tq and KV dividing H"); });
  c.tensor(q, "q", kFloat).numel(q, "q", B * Tq * cols_of(q)).tensor(k, "k", kFloat).same_dtype(k, "k", q, "q");
  c.tensor(v, "v", kFloat).same_dtype(v, "v", q, "q").numel(k, "k", B * Tk * cols_of(k));
  c.that(cols_of(v) % KV == 0 && cols_of(v) > 0,
         [&] { return cat("v ", shape_str(v.shape()), " must be (rows, KV*hd_v)"); });
  c.numel(v, "v", B * Tk * cols_of(v));
  c.that(cols_of(q) % H == 0 && cols_of(k) == cols_of(q) / H * KV,
         [&] { return cat("q ", shape_str(q.shape()), " and k ", shape_str(k.shape()), " for H ", H, ", KV ", KV); });
  c.tensor(q_pos, "q_pos", kI32).numel(q_pos, "q_pos", B * Tq);
  return cols_of(q) / H;
}
}  // namespace

void Backend::flash_attention_gqa_forward_at(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t Tq,
                                             int64_t Tk, const Tensor& q_pos, int64_t H, int64_t KV, Tensor& out,
                                             Tensor& lse, const Tensor& doc_start) {
  Check c(*this, "flash_attention_gqa_forward_at");
  attention_at_head_dim(c, q, k, v, B, Tq, Tk, q_pos, H, KV);
  c.tensor(out, "out", kFloat).same_dtype(out, "out", q, "q").numel(out, "out", B * Tq * H * (cols_of(v) / KV));
  c.tensor(lse, "lse", kF32).numel(lse, "lse", B * H * Tq);
  if (doc_start.defined()) c.tensor(doc_start, "doc_start", kI32).numel(doc_start, "doc_start", B * Tq);
  flash_attention_gqa_forward_at_impl(q, k, v, B, Tq, Tk, q_pos, H, KV, out, lse, doc_start);
}
void Backend::attention_merge(Tensor& out, Tensor& lse, const Tensor& out2, const Tensor& lse2, int64_t B, int64_t T,
                              int64_t H) {
  Check c(*this, "attention_merge");
  c.tensor(out, "out", kFloat).like(out2, "out2", out, "out");
  c.that(rows_of(out) == B * T && cols_of(out) % H == 0,
         [&] { return cat("out ", shape_str(out.shape()), " for B ", B, ", T ", T, ", H ", H); });
  c.tensor(lse, "lse", kF32).numel(lse, "lse", B * H * T).tensor(lse2, "lse2", kF32).numel(lse2, "lse2", B * H * T);
  attention_merge_impl(out, lse, out2, lse2, B, T, H);
}
void Backend::flash_attention_gqa_backward_at(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& out, const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk,
                                              const Tensor& q_pos, int64_t H, int64_t KV, Tensor& dq, Tensor& dk,
                                              Tensor& dv, const Tensor& doc_start) {
  Check c(*this, "flash_attention_gqa_backward_at");
  attention_at_head_dim(c, q, k, v, B, Tq, Tk, q_pos, H, KV);
  c.tensor(out, "out", kFloat).same_dtype(out, "out", q, "q").numel(out, "out", B * Tq * H * (cols_of(v) / KV));
  c.like(dout, "dout", out, "out");
  c.tensor(lse, "lse", kF32).numel(lse, "lse", B * H * Tq);
  c.like(dq, "dq", q, "q").like(dk, "dk", k, "k").like(dv, "dv", v, "v");
  if (doc_start.defined()) c.tensor(doc_start, "doc_start", kI32).numel(doc_start, "doc_start", B * Tq);
  flash_attention_gqa_backward_at_impl(dout, q, k, v, out, lse, B, Tq, Tk, q_pos, H, KV, dq, dk, dv, doc_start);
}
void Backend::attention_decode_gqa(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kcache, Tensor& vcache,
                                   int64_t t, int64_t H, int64_t KV, Tensor& out) {
  Check c(*this, "attention_decode_gqa");
  const int64_t n = rows_of(q);
  const int64_t hd = gqa_head_dim(c, q, k, v, n, H, KV);
  c.tensor(kcache, "kcache", kFloat).tensor(vcache, "vcache", kFloat);
  c.same_dtype(kcache, "kcache", q, "q").same_dtype(vcache, "vcache", q, "q");
  c.that(kcache.ndim() == 3 && kcache.shape() == vcache.shape() && kcache.size(0) == n && kcache.size(2) == KV * hd &&
             t >= 0 && t < kcache.size(1),
         [&] { return cat("caches ", shape_str(kcache.shape()), " for k ", shape_str(k.shape()), ", t ", t, ", KV ",
                          KV); });
  c.like(out, "out", q, "q");
  attention_decode_gqa_impl(q, k, v, kcache, vcache, t, H, KV, out);
}
void Backend::attention_decode_latent(const Tensor& q, const Tensor& kv, Tensor& cache, int64_t t, int64_t H,
                                      float scale, Tensor& out) {
  Check c(*this, "attention_decode_latent");
  const int64_t n = rows_of(q);
  c.tensor(q, "q", kFloat).tensor(kv, "kv", kFloat).tensor(cache, "cache", kFloat).tensor(out, "out", kFloat);
  c.same_dtype(kv, "kv", q, "q").same_dtype(cache, "cache", q, "q").same_dtype(out, "out", q, "q");
  c.that(cache.ndim() == 3 && cache.size(0) == n && t >= 0 && t < cache.size(1),
         [&] { return cat("cache ", shape_str(cache.shape()), " must be (", n, ", Tmax > t = ", t, ", r + dr)"); });
  const int64_t dk = cache.ndim() == 3 ? cache.size(2) : 0;
  c.that(rows_of(kv) == n && cols_of(kv) == dk,
         [&] { return cat("kv ", shape_str(kv.shape()), " must be (", n, ", ", dk, ")"); });
  c.that(H > 0 && cols_of(q) == H * dk,
         [&] { return cat("q ", shape_str(q.shape()), " must be (", n, ", H*(r + dr)) with H = ", H, " and r + dr = ",
                          dk); });
  c.that(rows_of(out) == n && cols_of(out) % H == 0 && cols_of(out) / H > 0 && cols_of(out) / H < dk,
         [&] { return cat("out ", shape_str(out.shape()), " must be (", n, ", H*r) with H = ", H, " and 0 < r < ",
                          dk); });
  attention_decode_latent_impl(q, kv, cache, t, H, scale, out);
}
void Backend::attention_decode_latent_impl(const Tensor&, const Tensor&, Tensor&, int64_t, int64_t, float, Tensor&) {
  fatal(cat("attention_decode_latent: the ", describe(), " backend has no latent-attention decode kernel"), __FILE__,
        __LINE__, "generate from a deepseek_v3 checkpoint on the CPU (relay generate --device cpu)");
}

namespace {
void check_work(const Check& c, const Tensor& work, const Tensor& param) {
  if (work.defined()) c.tensor(work, "work", kBf16).numel(work, "work", param.numel());
}
// One AdamW update's tensors: f32 param, grad and state of param's size, and its optional bf16 working copy.
void check_adamw(const Check& c, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& work) {
  c.tensor(param, "param", kF32).tensor(grad, "grad", kF32).numel(grad, "grad", param.numel());
  c.tensor(exp_avg, "exp_avg", kF32).numel(exp_avg, "exp_avg", param.numel());
  c.tensor(exp_avg_sq, "exp_avg_sq", kF32).numel(exp_avg_sq, "exp_avg_sq", param.numel());
  check_work(c, work, param);
}
}  // namespace

void Backend::adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWArgs& args,
                         Tensor& work) {
  Check c(*this, "adamw_step");
  check_adamw(c, param, grad, exp_avg, exp_avg_sq, work);
  adamw_step_impl(param, grad, exp_avg, exp_avg_sq, args, work);
}
void Backend::adamw_step_many(const std::vector<AdamWSlot>& slots, const AdamWArgs& args) {
  Check c(*this, "adamw_step_many");
  for (const AdamWSlot& t : slots) check_adamw(c, *t.param, *t.grad, *t.exp_avg, *t.exp_avg_sq, *t.work);
  adamw_step_many_impl(slots, args);
}
void Backend::adamw_step_many_impl(const std::vector<AdamWSlot>& slots, const AdamWArgs& args) {
  for (const AdamWSlot& t : slots) adamw_step_impl(*t.param, *t.grad, *t.exp_avg, *t.exp_avg_sq, args, *t.work);
}
void Backend::sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& args, Tensor& work) {
  Check c(*this, "sgd_step");
  c.tensor(param, "param", kF32).tensor(grad, "grad", kF32).numel(grad, "grad", param.numel());
  if (args.momentum != 0.0)
    c.tensor(momentum_buffer, "momentum_buffer", kF32).numel(momentum_buffer, "momentum_buffer", param.numel());
  check_work(c, work, param);
  sgd_step_impl(param, grad, momentum_buffer, args, work);
}

int cuda_device_count() {
#ifdef RELAY_HAVE_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

Device resolve_device(const std::string& setting) {
  if (setting == "cpu") return Device::cpu;
  if (setting == "cuda") return Device::cuda;
  return cuda_device_count() > 0 ? Device::cuda : Device::cpu;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
  std::unique_ptr<Backend> b;
  if (opts.device == Device::cpu) {
    b = std::make_unique<CpuBackend>(opts.threads, opts.cpu_bf16_gemm, opts.time_bf16_gemm);
  } else {
#ifdef RELAY_HAVE_CUDA
    b = make_cuda_backend(opts);
#else
    throw Error("train.device = \"cuda\" but this relay was built without the CUDA backend "
                "(hint: rebuild with -DRELAY_CUDA=ON on a machine with the CUDA toolkit and NCCL)");
#endif
  }
  b->set_precision(opts.precision);
  return b;
}

}  // namespace relay

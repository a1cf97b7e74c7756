#include "model/loss.hpp"

#include <vector>

#include "core/memory.hpp"

namespace relay {

LossKind parse_loss(const std::string& name) {
  if (name == "cross_entropy") return LossKind::cross_entropy;
  if (name == "mse") return LossKind::mse;
  throw Error(cat("model.loss: unknown loss \"", name, "\" (cross_entropy or mse)"));
}

Loss::Slot& Loss::slot(int s, int64_t rows) {
  if (static_cast<size_t>(s) >= slots_.size()) slots_.resize(static_cast<size_t>(s) + 1);
  Slot& sl = slots_[static_cast<size_t>(s)];
  if (sl.capacity < rows) {
    MemoryScope scope(MemKind::activations);
    sl.capacity = rows;
    sl.targets = kind_ == LossKind::cross_entropy ? Tensor(be_, {rows}, DType::i32) : Tensor(be_, {rows, width_}, dtype_);
    sl.losses = Tensor(be_, {rows});
    sl.predictions = Tensor(be_, {rows}, DType::i32);
    if (tp_.on()) {
      sl.row_max = Tensor(be_, {rows});
      sl.partial = Tensor(be_, {rows, 2});
    }
  }
  return sl;
}

Tensor Loss::targets(int s, int64_t rows) { return slot(s, rows).targets.rows(0, rows); }

double Loss::sum_losses(const Tensor& losses) {
  host_losses_.resize(static_cast<size_t>(losses.numel()));
  be_.download(host_losses_.data(), losses);
  double sum = 0;
  for (float l : host_losses_) sum += l;
  return sum;
}

double Loss::forward_backward(int s, const Tensor& out, Tensor& dout, float grad_scale) {
  int64_t rows = out.size(0);
  Slot& sl = slot(s, rows);
  Tensor losses = sl.losses.rows(0, rows);
  if (kind_ == LossKind::cross_entropy && tp_.on())
    parallel_cross_entropy(sl, out, rows, grad_scale, losses, &dout);
  else if (kind_ == LossKind::cross_entropy)
    be_.cross_entropy(out, sl.targets.rows(0, rows), grad_scale, losses, &dout);
  else
    be_.mse(out, sl.targets.rows(0, rows), grad_scale, losses, &dout);
  return sum_losses(losses);
}

void Loss::evaluate(int s, const Tensor& out, double& loss_sum, int64_t& correct) {
  int64_t rows = out.size(0);
  Slot& sl = slot(s, rows);
  Tensor losses = sl.losses.rows(0, rows), targets = sl.targets.rows(0, rows);
  correct = 0;
  if (kind_ == LossKind::cross_entropy && tp_.on()) {
    parallel_cross_entropy(sl, out, rows, 1.f, losses, nullptr);
    correct = parallel_correct(sl, out, rows);
  } else if (kind_ == LossKind::cross_entropy) {
    be_.cross_entropy(out, targets, 1.f, losses, nullptr);
    Tensor pred = sl.predictions.rows(0, rows);
    be_.argmax(out, pred);
    std::vector<int32_t> p(static_cast<size_t>(rows)), t(static_cast<size_t>(rows));
    be_.download(p.data(), pred);
    be_.download(t.data(), targets);
    for (int64_t i = 0; i < rows; ++i) correct += p[static_cast<size_t>(i)] == t[static_cast<size_t>(i)];
  } else {
    be_.mse(out, targets, 1.f, losses, nullptr);
  }
  loss_sum = sum_losses(losses);
}

void Loss::parallel_cross_entropy(Slot& sl, const Tensor& out, int64_t rows, float grad_scale, Tensor& losses,
                                  Tensor* dout) {
  Tensor targets = sl.targets.rows(0, rows), mx = sl.row_max.rows(0, rows), partial = sl.partial.rows(0, rows);
  be_.row_max(out, mx);                                                // (rows) over this rank's columns
  tp_.allreduce_max(mx, "the vocabulary-parallel loss's row maxima");  // (rows) over every column
  be_.cross_entropy_partial(out, targets, vocab_start_, mx, partial);  // (rows, 2)
  tp_.allreduce_sum(partial, "the vocabulary-parallel loss's sums");   // (rows, 2)
  be_.cross_entropy_finish(out, targets, vocab_start_, mx, partial, grad_scale, losses, dout);
}

int64_t Loss::parallel_correct(Slot& sl, const Tensor& out, int64_t rows) {
  // Evaluation only, rows host doubles per reduction: the global maximum, then the lowest column holding it.
  Tensor mx = sl.row_max.rows(0, rows), pred = sl.predictions.rows(0, rows);
  be_.row_max(out, mx);
  be_.argmax(out, pred);
  std::vector<float> m(static_cast<size_t>(rows));
  std::vector<int32_t> p(static_cast<size_t>(rows)), t(static_cast<size_t>(rows));
  be_.download(m.data(), mx);
  be_.download(p.data(), pred);
  be_.download(t.data(), sl.targets.rows(0, rows));
  std::vector<double> best(m.begin(), m.end());
  tp_.comm->allreduce_host(best.data(), static_cast<int>(rows), ReduceOp::max, "the vocabulary-parallel argmax");
  std::vector<double> col(static_cast<size_t>(rows));
  for (size_t i = 0; i < col.size(); ++i)
    col[i] = double(m[i]) == best[i] ? double(p[i] + vocab_start_) : 1e18;
  tp_.comm->allreduce_host(col.data(), static_cast<int>(rows), ReduceOp::min, "the vocabulary-parallel argmax");
  int64_t correct = 0;
  for (size_t i = 0; i < col.size(); ++i) correct += col[i] == double(t[i]);
  return correct;
}

}  // namespace relay

#include "model/loss.hpp"

#include <vector>

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
    sl.capacity = rows;
    sl.targets = kind_ == LossKind::cross_entropy ? Tensor(be_, {rows}, DType::i32) : Tensor(be_, {rows, width_});
    sl.losses = Tensor(be_, {rows});
    sl.predictions = Tensor(be_, {rows}, DType::i32);
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
  if (kind_ == LossKind::cross_entropy)
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
  if (kind_ == LossKind::cross_entropy) {
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

}  // namespace relay

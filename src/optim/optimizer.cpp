#include "optim/optimizer.hpp"

#include <cmath>

#include "core/memory.hpp"

namespace relay {

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const Config::Optimizer& c, Backend& be, std::vector<OptimSlice> params) : cfg_(c), be_(be), params_(std::move(params)) {
    for (const OptimSlice& p : params_) {
      m_.emplace_back(be, p.value.shape());
      v_.emplace_back(be, p.value.shape());
      be.fill(m_.back(), 0.f);
      be.fill(v_.back(), 0.f);
    }
  }
  std::string name() const override { return "adamw"; }
  void step(double lr, const UpdateGroups* groups) override {
    ++step_;
    AdamWArgs a{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, step_};
    if (slots_.empty())
      for (size_t i = 0; i < params_.size(); ++i)
        slots_.push_back({&params_[i].value, &params_[i].grad, &m_[i], &v_[i], &params_[i].work});
    if (!groups) {
      be_.adamw_step_many(slots_, a);
      return;
    }
    std::vector<Backend::AdamWSlot> group;
    for (size_t g = 0; g < groups->slices.size(); ++g) {
      group.clear();
      for (size_t i : groups->slices[g]) group.push_back(slots_[i]);
      if (!group.empty()) be_.adamw_step_many(group, a);
      groups->after(g);
    }
  }
  std::vector<OptimizerState> state() override {
    std::vector<OptimizerState> s;
    for (size_t i = 0; i < params_.size(); ++i) {
      s.push_back({"exp_avg", params_[i].param->name, &m_[i], params_[i].offset});
      s.push_back({"exp_avg_sq", params_[i].param->name, &v_[i], params_[i].offset});
    }
    return s;
  }

 private:
  Config::Optimizer cfg_;
  Backend& be_;
  std::vector<OptimSlice> params_;
  std::vector<Tensor> m_, v_;  // same shapes as the parameters
  std::vector<Backend::AdamWSlot> slots_;  // every parameter's tensors, for one adamw_step_many a step
};

class Sgd final : public Optimizer {
 public:
  Sgd(const Config::Optimizer& c, Backend& be, std::vector<OptimSlice> params) : cfg_(c), be_(be), params_(std::move(params)) {
    for (const OptimSlice& p : params_) {
      buf_.emplace_back();
      if (cfg_.momentum != 0) {
        buf_.back() = Tensor(be, p.value.shape());
        be.fill(buf_.back(), 0.f);
      }
    }
  }
  std::string name() const override { return "sgd"; }
  void step(double lr, const UpdateGroups* groups) override {
    SgdArgs a{lr, cfg_.momentum, cfg_.weight_decay, step_ == 0};
    auto update = [&](size_t i) { be_.sgd_step(params_[i].value, params_[i].grad, buf_[i], a, params_[i].work); };
    if (!groups) {
      for (size_t i = 0; i < params_.size(); ++i) update(i);
    } else {
      for (size_t g = 0; g < groups->slices.size(); ++g) {
        for (size_t i : groups->slices[g]) update(i);
        groups->after(g);
      }
    }
    ++step_;
  }
  std::vector<OptimizerState> state() override {
    std::vector<OptimizerState> s;
    if (cfg_.momentum != 0)
      for (size_t i = 0; i < params_.size(); ++i) s.push_back({"momentum_buffer", params_[i].param->name, &buf_[i], params_[i].offset});
    return s;
  }

 private:
  Config::Optimizer cfg_;
  Backend& be_;
  std::vector<OptimSlice> params_;
  std::vector<Tensor> buf_;  // momentum buffers; undefined when momentum == 0
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const Config::Optimizer& cfg, Backend& be, std::vector<OptimSlice> params) {
  MemoryScope scope(MemKind::optimizer);
  if (cfg.name == "adamw") return std::make_unique<AdamW>(cfg, be, std::move(params));
  if (cfg.name == "sgd") return std::make_unique<Sgd>(cfg, be, std::move(params));
  throw Error(cat("optimizer.name: unknown optimizer \"", cfg.name, "\""));
}

double learning_rate(const Config::LrSchedule& s, double base_lr, int64_t step, int64_t total) {
  if (s.name == "constant") return base_lr;
  if (s.warmup_steps > 0 && step <= s.warmup_steps) return base_lr * double(step) / double(s.warmup_steps);
  if (total <= s.warmup_steps) return base_lr;
  double progress = double(step - s.warmup_steps) / double(total - s.warmup_steps);
  progress = std::min(1.0, std::max(0.0, progress));
  return s.min_lr + 0.5 * (base_lr - s.min_lr) * (1.0 + std::cos(M_PI * progress));
}

double clip_factor(double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace relay

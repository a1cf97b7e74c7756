#include "train/metrics.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/tfevents.hpp"

namespace relay {

namespace {
// JSON numbers through the library; a non-finite value (a diverged loss) is null, as JSON has no NaN.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
std::string fixed2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}
int64_t record_step(const std::string& line) {
  try {
    return nlohmann::json::parse(line).value("step", int64_t(-1));
  } catch (const nlohmann::json::exception&) {
    return -1;  // a line cut short by a crash: dropped
  }
}
}  // namespace

double peak_resident_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib / 1024.0;
}

double resident_mib() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? double(resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0) : 0;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[64];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm%02ds", int(s) / 3600, (int(s) / 60) % 60, int(s) % 60);
  return buf;
}

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step, int64_t tokens_per_sample)
    : path_(path), tokens_per_sample_(tokens_per_sample) {
  std::vector<std::string> keep;
  if (resume_step >= 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty() && record_step(line) <= resume_step) keep.push_back(line);
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream o(tmp, std::ios::trunc);
    if (!o) throw Error(cat("run.dir: cannot write ", tmp));
    for (auto& l : keep) o << l << "\n";
  }
  std::filesystem::rename(tmp, path);
  out_.open(path, std::ios::app);
  if (!out_) throw Error(cat("run.dir: cannot append to ", path));
}

void MetricsLog::append(const std::string& json) {
  out_ << json << "\n";
  out_.flush();
}

namespace {
std::string fixed6(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6f", v);
  return b;
}
}  // namespace

void MetricsLog::train(const StepRecord& r) {
  const double tokens_per_s = r.samples_per_s * double(tokens_per_sample_);
  const std::string rate = tokens_per_sample_ > 0 ? cat(static_cast<long long>(tokens_per_s), " tokens/s")
                                                  : cat(static_cast<long long>(r.samples_per_s * 10) / 10.0, " samples/s");
  const std::string slowest = r.slowest_rank < 0 ? std::string()
                                                 : cat(" | slowest rank ", r.slowest_rank, " ", fixed2(1e3 * r.slowest_compute_s),
                                                       " ms (median ", fixed2(1e3 * r.median_compute_s), ")");
  const std::string skipped = r.skipped_steps > 0 ? cat(" | skipped ", r.skipped_steps) : std::string();
  const std::string mtp = r.mtp_losses.empty() ? std::string() : cat(" | mtp loss ", fixed6(r.mtp_loss));
  std::printf("step %6lld | loss %.6f%s | lr %.3e | grad norm %.4f | %s%s | elapsed %s | ETA %s%s\n",
              static_cast<long long>(r.step), r.loss, mtp.c_str(), r.lr, r.grad_norm, rate.c_str(), slowest.c_str(),
              format_duration(r.elapsed_s).c_str(), format_duration(r.eta_s).c_str(), skipped.c_str());
  std::fflush(stdout);
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = number(r.loss);
  j["lr"] = number(r.lr);
  j["grad_norm"] = number(r.grad_norm);
  j["samples_per_s"] = number(r.samples_per_s);
  j["step_time_s"] = number(r.step_time_s);
  if (tokens_per_sample_ > 0) j["tokens_per_s"] = number(tokens_per_s);
  j["flops_per_s"] = number(r.flops_per_s);
  if (r.mfu >= 0) j["mfu"] = number(r.mfu);
  j["input_wait_s"] = number(r.input_wait_s);
  j["pipeline_wait_s"] = number(r.pipeline_wait_s);
  j["allreduce_wait_s"] = number(r.allreduce_wait_s);
  j["exposed_comm_s"] = number(r.exposed_comm_s);
  if (r.slowest_rank >= 0) {
    j["slowest_rank"] = r.slowest_rank;
    j["slowest_compute_s"] = number(r.slowest_compute_s);
    j["median_compute_s"] = number(r.median_compute_s);
  }
  if (r.restarts > 0) j["restarts"] = r.restarts;
  j["skipped_steps"] = r.skipped_steps;
  if (r.moe) {
    j["aux_loss"] = number(r.aux_loss);
    j["z_loss"] = number(r.z_loss);
    j["expert_load_max"] = r.expert_load_max;
    j["expert_load_mean"] = r.expert_load_mean;
    if (std::isfinite(r.router_margin)) j["router_margin_min"] = number(r.router_margin);
  }
  if (!r.mtp_losses.empty()) {
    j["mtp_loss"] = number(r.mtp_loss);
    j["mtp_losses"] = r.mtp_losses;
  }
  if (r.ep_alltoall_s >= 0) {
    j["ep_alltoall_s"] = number(r.ep_alltoall_s);
    j["ep_rows_sent"] = number(r.ep_rows_sent);
  }
  j["rss_mib"] = number(r.rss_mib);
  j["rss_max_mib"] = number(r.rss_max_mib);
  j["peak_rss_max_mib"] = number(r.peak_rss_max_mib);
  j["peak_rss_mib_per_rank"] = r.peak_rss_mib_per_rank;
  append(j.dump());
  if (tb_) {
    std::vector<std::pair<std::string, double>> v = {
        {"train/loss", r.loss}, {"train/lr", r.lr}, {"train/grad_norm", r.grad_norm},
        {"train/samples_per_s", r.samples_per_s}, {"train/flops_per_s", r.flops_per_s},
        {"train/rss_mib", r.rss_mib}, {"train/rss_max_mib", r.rss_max_mib},
        {"train/skipped_steps", double(r.skipped_steps)}};
    if (tokens_per_sample_ > 0) v.emplace_back("train/tokens_per_s", tokens_per_s);
    if (r.mfu >= 0) v.emplace_back("train/mfu", r.mfu);
    if (!r.mtp_losses.empty()) v.emplace_back("train/mtp_loss", r.mtp_loss);
    if (r.moe) {
      v.emplace_back("train/aux_loss", r.aux_loss);
      v.emplace_back("train/z_loss", r.z_loss);
      for (size_t l = 0; l < r.expert_load_max.size(); ++l) {
        v.emplace_back(cat("train/expert_load_max/layer_", l), r.expert_load_max[l]);
        v.emplace_back(cat("train/expert_load_mean/layer_", l), r.expert_load_mean[l]);
      }
    }
    tensorboard(r.step, v);
  }
}

void MetricsLog::eval(int64_t step, double loss, double accuracy, bool has_accuracy) {
  if (has_accuracy)
    std::printf("eval step %6lld | eval loss %.6f | eval accuracy %.4f\n", static_cast<long long>(step), loss, accuracy);
  else
    std::printf("eval step %6lld | eval loss %.6f\n", static_cast<long long>(step), loss);
  std::fflush(stdout);
  nlohmann::ordered_json j;
  j["step"] = step;
  j["eval_loss"] = number(loss);
  j["eval_accuracy"] = has_accuracy ? number(accuracy) : nlohmann::json(nullptr);
  append(j.dump());
  if (has_accuracy) tensorboard(step, {{"eval/loss", loss}, {"eval/accuracy", accuracy}});
  else tensorboard(step, {{"eval/loss", loss}});
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::enable_tensorboard(const std::string& dir) {
  tb_ = std::make_unique<EventFileWriter>(dir);
  std::printf("relay: TensorBoard events in %s (tensorboard --logdir %s)\n", tb_->path().c_str(), dir.c_str());
  std::fflush(stdout);
}

// A failed write (a full disk) costs the TensorBoard view, not the run: warn once and stop writing.
void MetricsLog::tensorboard(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (!tb_) return;
  try {
    tb_->scalars(step, values);
  } catch (const Error& e) {
    std::fprintf(stderr, "relay: warning: %s; no more TensorBoard events this run\n", e.what());
    tb_.reset();
  }
}

void MetricsLog::restart(int64_t step, int64_t count, const std::string& cause, int64_t failed_after_step) {
  std::printf("relay: restart %lld in this allocation (%s): resumed at step %lld; the failed run had logged step %lld\n",
              static_cast<long long>(count), cause.empty() ? "cause unknown" : cause.c_str(),
              static_cast<long long>(step), static_cast<long long>(failed_after_step));
  std::fflush(stdout);
  nlohmann::ordered_json j;
  j["step"] = step;
  j["restart"] = count;
  j["cause"] = cause;
  j["failed_after_step"] = failed_after_step;
  append(j.dump());
}

void MetricsLog::plan(const std::string& plan_json) {
  append(cat("{\"plan\": ", plan_json, "}"));
}

void MetricsLog::note(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace relay

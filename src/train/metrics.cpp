#include "train/metrics.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "core/error.hpp"

namespace relay {

namespace {
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
int64_t record_step(const std::string& line) {
  auto at = line.find("\"step\":");
  if (at == std::string::npos) return -1;
  return std::atoll(line.c_str() + at + 7);
}
}  // namespace

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

void MetricsLog::train(const StepRecord& r) {
  const double tokens_per_s = r.samples_per_s * double(tokens_per_sample_);
  const std::string rate = tokens_per_sample_ > 0 ? cat(static_cast<long long>(tokens_per_s), " tokens/s")
                                                  : cat(static_cast<long long>(r.samples_per_s * 10) / 10.0, " samples/s");
  std::printf("step %6lld | loss %.6f | lr %.3e | grad norm %.4f | %s | elapsed %s | ETA %s\n",
              static_cast<long long>(r.step), r.loss, r.lr, r.grad_norm, rate.c_str(),
              format_duration(r.elapsed_s).c_str(), format_duration(r.eta_s).c_str());
  std::fflush(stdout);
  append(cat("{\"step\": ", r.step, ", \"loss\": ", json_number(r.loss), ", \"lr\": ", json_number(r.lr),
             ", \"grad_norm\": ", json_number(r.grad_norm), ", \"samples_per_s\": ", json_number(r.samples_per_s),
             tokens_per_sample_ > 0 ? cat(", \"tokens_per_s\": ", json_number(tokens_per_s)) : std::string(),
             ", \"rss_mib\": ", json_number(r.rss_mib), ", \"rss_max_mib\": ", json_number(r.rss_max_mib), "}"));
}

void MetricsLog::eval(int64_t step, double loss, double accuracy, bool has_accuracy) {
  if (has_accuracy)
    std::printf("eval step %6lld | eval loss %.6f | eval accuracy %.4f\n", static_cast<long long>(step), loss, accuracy);
  else
    std::printf("eval step %6lld | eval loss %.6f\n", static_cast<long long>(step), loss);
  std::fflush(stdout);
  append(cat("{\"step\": ", step, ", \"eval_loss\": ", json_number(loss),
             ", \"eval_accuracy\": ", has_accuracy ? json_number(accuracy) : std::string("null"), "}"));
}

void MetricsLog::note(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace relay

// judge_restart (src/train/restarts.cpp): when an in-job restart would only repeat the failure before
// it, over real metrics.jsonl files as a failed run leaves them (restart records, a line cut short).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/restarts.hpp"

namespace relay {
namespace {

// metrics.jsonl with training records for steps 1..last (every 10), then `extra` lines.
std::string write_metrics(const std::string& name, int64_t last, const std::string& extra) {
  const std::string path = (std::filesystem::temp_directory_path() / ("relay_test_restarts_" + name)).string();
  std::ofstream f(path, std::ios::trunc);
  for (int64_t s = 10; s <= last; s += 10) {
    f << "{\"step\":" << s << ",\"loss\":0.5}\n";
    if (s == 100) f << extra;  // a restart record sits after its resume step's record
  }
  f << "{\"step\":" << last + 1 << ",\"lo";  // cut short by the crash
  return path;
}

struct Case {
  const char* name;
  int64_t count;        // RELAY_RESTART_COUNT of the run judging
  const char* record;   // the previous restart record ("" for none)
  int64_t resume_step;  // the newest checkpoint now
  int64_t last_logged;  // the failed run's last training record
  bool repeats;         // expected: no progress
};

TEST(Restarts, JudgeRestart) {
  const Case cases[] = {
      {"first restart, always allowed", 1, "", 100, 120, false},
      {"same checkpoint, same last step", 2, R"({"step":100,"restart":1,"cause":"x","failed_after_step":120})", 100, 120, true},
      {"same checkpoint, earlier last step", 2, R"({"step":100,"restart":1,"cause":"x","failed_after_step":150})", 100, 120, true},
      {"same checkpoint, later step", 2, R"({"step":100,"restart":1,"cause":"x","failed_after_step":120})", 100, 140, false},
      {"newer checkpoint", 2, R"({"step":100,"restart":1,"cause":"x","failed_after_step":120})", 150, 120, false},
      {"record of another allocation", 3, R"({"step":100,"restart":1,"cause":"x","failed_after_step":120})", 100, 120, false},
      {"no record", 2, "", 100, 120, false},
  };
  for (const Case& c : cases) {
    const std::string extra = *c.record ? std::string(c.record) + "\n" : std::string();
    const std::string path = write_metrics(std::to_string(&c - cases), c.last_logged, extra);
    const RestartVerdict v = judge_restart(path, c.resume_step, {c.count, "a rank was lost: exit 137, SIGKILL"});
    EXPECT_EQ(v.failed_after_step, c.last_logged) << c.name;
    EXPECT_EQ(!v.no_progress.empty(), c.repeats) << c.name << ": " << v.no_progress;
    if (c.repeats) {
      EXPECT_NE(v.no_progress.find("stopping with exit code 76"), std::string::npos) << v.no_progress;
      EXPECT_NE(v.no_progress.find("a rank was lost: exit 137, SIGKILL"), std::string::npos) << v.no_progress;
    }
    std::remove(path.c_str());
  }
}

TEST(Restarts, NoMetricsFile) {
  const RestartVerdict v = judge_restart("/nonexistent/metrics.jsonl", 0, {2, ""});
  EXPECT_EQ(v.failed_after_step, -1);
  EXPECT_TRUE(v.no_progress.empty());
}

}  // namespace
}  // namespace relay

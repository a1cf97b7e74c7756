#include "train/restarts.hpp"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/exit_codes.hpp"

namespace relay {

RestartInfo restart_from_env() {
  RestartInfo info;
  if (const char* c = std::getenv("RELAY_RESTART_COUNT")) info.count = std::atoll(c);
  if (const char* c = std::getenv("RELAY_RESTART_CAUSE")) info.cause = c;
  return info;
}

RestartVerdict judge_restart(const std::string& metrics_path, int64_t resume_step, const RestartInfo& info) {
  RestartVerdict v;
  nlohmann::json previous;  // the newest restart record
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;  // a line cut short by the crash
    if (j.contains("loss")) v.failed_after_step = std::max(v.failed_after_step, j.value("step", int64_t(-1)));
    if (j.contains("restart")) previous = j;
  }
  // Progress is a newer checkpoint or a later step than the run before this one reached; the record
  // must be this allocation's previous restart (an older allocation's count starts again at 1).
  if (info.count < 2 || previous.is_null() || previous.value("restart", int64_t(0)) != info.count - 1) return v;
  const int64_t before = previous.value("failed_after_step", int64_t(-1));
  if (previous.value("step", int64_t(-1)) == resume_step && v.failed_after_step <= before)
    v.no_progress = cat("restart ", info.count, " would repeat restart ", info.count - 1, ": that run failed (",
                        info.cause.empty() ? "cause unknown" : info.cause, ") after logging step ",
                        v.failed_after_step, ", no further than the run before it (step ", before,
                        "), and the newest checkpoint is still step ", resume_step, "; stopping with exit code ",
                        kExitNoProgress, " so that neither a restart nor a requeue repeats it (hint: a fault that "
                        "recurs at one step is in the run, its data or one node: read the first failure above)");
  return v;
}

bool test_kill_in_gather() {
  const char* where = std::getenv("RELAY_TEST_KILL_WHERE");
  return where && std::string(where) == "zero3-gather";
}

int64_t test_kill_step(int world_rank) {
  const char* rank = std::getenv("RELAY_TEST_KILL_RANK");
  const char* step = std::getenv("RELAY_TEST_KILL_STEP");
  if (!rank || !step || std::atoi(rank) != world_rank) return -1;
  return std::atoll(step);
}

}  // namespace relay

// Helpers shared by the tests: temporary directories, running the real binary, reading files.
#pragma once
#include <string>
#include <vector>

namespace relay::test {

// A fresh directory under $TMPDIR (or /tmp), removed when the object dies unless RELAY_KEEP_TMP is set.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;  // the process's exit status; 128+N if killed by signal N
  std::string output;  // stdout and stderr together
};

// Runs a shell command line with a timeout (seconds); output is captured.
RunResult run_command(const std::string& cmd, int timeout_s = 600);
// "OMPI_ALLOW_RUN_AS_ROOT=1 ... mpirun --oversubscribe -np N --bind-to none -x OMP_NUM_THREADS=1 <relay>"
std::string mpirun_relay(int ranks);
std::string relay_binary();
std::string source_dir();

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& text);
bool contains(const std::string& haystack, const std::string& needle);

}  // namespace relay::test

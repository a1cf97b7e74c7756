// Helpers shared by the tests: temporary directories, running the real binary, reading files.
#pragma once
#include <map>
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

// Whether oneDNN runs bf16 GEMMs on this CPU (AVX512 or newer); why: the error that says it does not.
// Machines of the same kind differ, so CPU bf16 tests skip, with the reason, where it is missing.
bool cpu_bf16_available(std::string* why = nullptr);
#define RELAY_SKIP_WITHOUT_CPU_BF16()                                              \
  do {                                                                             \
    std::string relay_bf16_why_;                                                   \
    if (!::relay::test::cpu_bf16_available(&relay_bf16_why_)) GTEST_SKIP() << relay_bf16_why_; \
  } while (0)

}  // namespace relay::test

namespace relay::test {

// A small training problem on real files: a synthetic dataset made by `relay data synth` and a
// config whose model has 8 linear layers (enough for pp = 4 x v = 2 chunks).
struct Problem {
  std::string dir, data, eval, config;
};
Problem make_problem(const std::string& dir, int64_t samples = 512, int64_t features = 16, int64_t classes = 5);

// A small GPT problem: token files written by relay::write_token_file (io/token_dataset.hpp), byte-like text of `tokens` tokens below `vocab`, and a config of a 4-layer GPT
// (6 blocks: embedding, 4 transformer blocks, head; tied embeddings) training 6 steps.
Problem make_gpt_problem(const std::string& dir, int64_t tokens = 4097, int64_t vocab = 96, int64_t block_size = 16);
// A token file of the GPT problem's vocabulary (96) whose documents (1 to 40 tokens) end at token 0 (its eot_id).
void write_documents(const std::string& path, uint64_t seed = 7, size_t n = 4097);

// Runs `relay train` on `ranks` ranks (1 = no mpirun) with --set overrides; returns exit code and output.
RunResult train(int ranks, const std::string& config, const std::vector<std::string>& overrides, int timeout_s = 300);

// Per-step training losses from <run_dir>/metrics.jsonl (index = step - 1).
std::vector<double> read_losses(const std::string& run_dir);
// Every step's gradient norm from <run_dir>/metrics.jsonl (index = step - 1).
std::vector<double> read_grad_norms(const std::string& run_dir);
// Mean over steps [from, to) of |a - b| / b: how far a run's losses a stay from a reference run's b.
double mean_relative_difference(const std::vector<double>& a, const std::vector<double>& b, size_t from, size_t to);
// Every tensor of a checkpoint by name.
std::map<std::string, std::vector<float>> read_checkpoint(const std::string& path);
// gtest assertion that every tensor of `got` is within |a - b| <= abs_tol + rel_tol |b| of `ref`
// (same names and sizes), naming the worst element when not.
void expect_tensors_within(const std::map<std::string, std::vector<float>>& got,
                           const std::map<std::string, std::vector<float>>& ref, double rel_tol, double abs_tol,
                           const std::string& what);
// A run as a layout suite compares it: its per-step losses and every tensor of one of its checkpoints.
struct RunRecord {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> tensors;
};
// Trains on `ranks` ranks with run.dir = run_dir added to the overrides, then reads its losses and
// <run_dir>/checkpoints/<checkpoint>. A failed run is a gtest failure showing its output (the record is then empty);
// result, when given, receives the run's exit code and output.
RunRecord train_and_record(int ranks, const std::string& config, std::vector<std::string> overrides,
                           const std::string& run_dir, const std::string& checkpoint = "step_00000006.h5",
                           RunResult* result = nullptr);
// gtest assertions that `got` tracks the reference `ref`: as many losses, each within abs_tol + rel_tol |ref|, and
// every tensor within expect_tensors_within's bound. `what` labels failures.
void expect_run_matches(const RunRecord& got, const RunRecord& ref, double rel_tol, double abs_tol,
                        const std::string& what);
// bf16 (train.precision = "bf16") on dp 2 x tp 2 x pp 2 (8 ranks, 2 micro-batches) with ZeRO-1 and recomputation
// against the bf16 serial run of the same model (`model`: its overrides), runs in dir: every loss within 1e-2
// relative, every tensor of the step-6 checkpoint within 2e-2 relative + 2e-3.
void expect_bf16_layout_tracks_serial(const std::string& config, const std::vector<std::string>& model,
                                      const TempDir& dir);
// Runs `relay train` (mpirun_relay(ranks) with these --set overrides) in the background, waits until
// run_dir/metrics.jsonl holds `after_lines` lines, sends `signal` to world rank `rank` only, waits for
// the job; the output ends with "exit=<code>" and holds "signalled <pid>".
RunResult signal_rank_midrun(int ranks, const std::string& config, const std::vector<std::string>& overrides,
                             const std::string& run_dir, int after_lines, int rank, const std::string& signal);
// "\"s\"" for TOML strings in --set overrides; how often `needle` occurs in `s`.
std::string quoted(const std::string& s);
size_t count_of(const std::string& s, const std::string& needle);
// gtest assertions that a and b hold the same tensors: bitwise when rel == 0, else
// |a - b| <= 1e-6 + rel |b|. `what` labels failures.
void expect_same_tensors(const std::map<std::string, std::vector<float>>& a,
                         const std::map<std::string, std::vector<float>>& b, double rel, const std::string& what);

}  // namespace relay::test

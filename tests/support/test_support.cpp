#include "support/test_support.hpp"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace relay::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/relay-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (std::getenv("RELAY_KEEP_TMP")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

RunResult run_command(const std::string& cmd, int timeout_s) {
  std::string full = "timeout -k 10 " + std::to_string(timeout_s) + " bash -c '" ;
  for (char c : cmd) full += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  full += "' 2>&1";
  RunResult r;
  FILE* p = popen(full.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  return r;
}

std::string relay_binary() { return RELAY_BINARY; }
std::string source_dir() { return RELAY_SOURCE_DIR; }

std::string mpirun_relay(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 " +
         std::string(RELAY_MPIEXEC) + " --oversubscribe --bind-to none -np " + std::to_string(ranks) +
         " -x OMP_NUM_THREADS=1 " + (std::getenv("RELAY_VERIFY_TIED") ? "-x RELAY_VERIFY_TIED " : "") + relay_binary();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << text;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace relay::test

#include <gtest/gtest.h>

#include <cmath>

#include "io/checkpoint.hpp"
#include "core/bf16.hpp"
#include "kernels/cpu/matmul.hpp"
#include "io/token_dataset.hpp"
#include "core/rng.hpp"

#include <nlohmann/json.hpp>

namespace relay::test {

Problem make_problem(const std::string& dir, int64_t samples, int64_t features, int64_t classes) {
  Problem p{dir, dir + "/train.h5", dir + "/eval.h5", dir + "/config.toml"};
  std::filesystem::create_directories(dir);
  auto synth = [&](const std::string& out, int64_t n, int seed) {
    RunResult r = run_command(relay_binary() + " data synth --out " + out + " --samples " + std::to_string(n) +
                              " --features " + std::to_string(features) + " --classes " + std::to_string(classes) +
                              " --seed " + std::to_string(seed));
    if (r.exit_code != 0) throw std::runtime_error("relay data synth failed: " + r.output);
  };
  synth(p.data, samples, 11);
  synth(p.eval, samples / 4, 12);
  write_file(p.config, R"([run]
dir = ")" + dir + R"(/run"
[model]
seed = 3
loss = "cross_entropy"
layers = [
  { type = "linear", out = 24 }, { type = "gelu" },
  { type = "linear", out = 24 }, { type = "tanh" },
  { type = "linear", out = 24 }, { type = "layernorm" },
  { type = "linear", out = 24 }, { type = "relu" },
  { type = "linear", out = 24 }, { type = "gelu" },
  { type = "linear", out = 24 }, { type = "gelu" },
  { type = "linear", out = 24 }, { type = "tanh" },
  { type = ")" + std::string("linear\", out = ") + std::to_string(classes) + R"( },
]
[data]
train = ")" + p.data + R"("
shuffle = true
seed = 5
[train]
steps = 6
batch_size = 64
micro_batches = 1
log_every = 1
clip_grad_norm = 0.5
[optimizer]
name = "adamw"
lr = 0.01
weight_decay = 0.01
[lr_schedule]
name = "cosine"
warmup_steps = 2
min_lr = 0.001
)");
  return p;
}

void write_documents(const std::string& path, uint64_t seed, size_t n) {
  relay::Rng rng(seed, 3);
  std::vector<int32_t> tokens(n);
  int64_t next_end = 1 + int64_t(rng.below(40));
  for (int64_t i = 0; i < int64_t(tokens.size()); ++i) {
    tokens[size_t(i)] = 1 + int32_t(rng.below(95));
    if (i == next_end) tokens[size_t(i)] = 0, next_end += 1 + int64_t(rng.below(40));
  }
  relay::write_token_file(path, tokens, 96, "bytes", {{"eot_id", 0}});
}

std::vector<double> read_grad_norms(const std::string& run_dir) {
  std::vector<double> out;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("grad_norm") && j.contains("loss")) out.push_back(j.at("grad_norm").get<double>());
  }
  return out;
}

Problem make_gpt_problem(const std::string& dir, int64_t tokens, int64_t vocab, int64_t block_size) {
  Problem p{dir, dir + "/tokens.h5", dir + "/tokens_eval.h5", dir + "/gpt.toml"};
  std::filesystem::create_directories(dir);  // callers may name a subdirectory of their TempDir
  // Learnable data: each token is the previous one plus 1, 2 or 3 (mod vocab), so a model can get
  // from ln(vocab) towards ln(3).
  auto text = [&](int64_t n, uint64_t seed) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    uint64_t x = seed;
    int64_t prev = 0;
    for (auto& v : t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      prev = (prev + 1 + static_cast<int64_t>((x >> 33) % 3)) % vocab;
      v = static_cast<int32_t>(prev);
    }
    return t;
  };
  write_token_file(p.data, text(tokens, 7), vocab, "bytes");
  write_token_file(p.eval, text(tokens / 4, 8), vocab, "bytes");
  write_file(p.config, R"([run]
dir = ")" + dir + R"(/run"
[model]
type = "gpt"
seed = 3
vocab_size = )" + std::to_string(vocab) + R"(
block_size = )" + std::to_string(block_size) + R"(
n_layer = 4
n_head = 2
n_embd = 16
[data]
train = ")" + p.data + R"("
eval = ")" + p.eval + R"("
shuffle = true
seed = 5
[train]
steps = 6
batch_size = 8
micro_batches = 1
log_every = 1
clip_grad_norm = 1.0
[optimizer]
name = "adamw"
# Adam's step is about lr for every element whose gradient is consistent, however small; elements
# whose gradient is near zero move by lr x (rounding noise). lr = 0.002 keeps those moves of
# summation-order noise below the tests' 1e-6 absolute tolerance.
lr = 0.002
weight_decay = 0.1
# Not 1e-8: the key bias's gradient is zero up to rounding (softmax ignores a constant added to every
# score), and Adam with a tiny eps turns that rounding into steps of size lr, so its values would
# depend on the summation order. With 1e-5 they stay at rounding size, as in tests/torch.
eps = 1e-5
[lr_schedule]
name = "cosine"
warmup_steps = 2
min_lr = 0.0002
)");
  return p;
}

RunResult train(int ranks, const std::string& config, const std::vector<std::string>& overrides, int timeout_s) {
  std::string cmd = (ranks == 1 ? relay_binary() : mpirun_relay(ranks)) + " train --config " + config;
  for (auto& o : overrides) cmd += " --set '" + o + "'";
  return run_command(cmd, timeout_s);
}

std::vector<double> read_losses(const std::string& run_dir) {
  std::vector<double> out;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto at = line.find("\"loss\":");
    if (at == std::string::npos) continue;
    out.push_back(std::stod(line.substr(at + 7)));  // stod skips the space, if any
  }
  return out;
}

double mean_relative_difference(const std::vector<double>& a, const std::vector<double>& b, size_t from, size_t to) {
  double mean = 0;
  for (size_t i = from; i < to; ++i) mean += std::abs(a.at(i) - b.at(i)) / b.at(i) / double(to - from);
  return mean;
}

std::map<std::string, std::vector<float>> read_checkpoint(const std::string& path) {
  CheckpointReader r(path);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, shape] : r.tensors()) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    r.read(name, shape, v.data());
    out[name] = std::move(v);
  }
  return out;
}

void expect_tensors_within(const std::map<std::string, std::vector<float>>& got,
                           const std::map<std::string, std::vector<float>>& ref, double rel_tol, double abs_tol,
                           const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  std::string worst_at;
  for (auto& [name, v] : ref) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    const auto& g = got.at(name);
    ASSERT_EQ(g.size(), v.size()) << what << ": " << name;
    for (size_t i = 0; i < v.size(); ++i) {
      const double excess = std::abs(double(g[i]) - v[i]) - (abs_tol + rel_tol * std::abs(v[i]));
      if (excess > worst) {
        worst = excess;
        worst_at = name + "[" + std::to_string(i) + "]";
      }
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": tensor " << worst_at << " differs beyond tolerance";
}

RunRecord train_and_record(int ranks, const std::string& config, std::vector<std::string> overrides,
                           const std::string& run_dir, const std::string& checkpoint, RunResult* result) {
  overrides.push_back("run.dir=" + quoted(run_dir));
  RunResult r = train(ranks, config, overrides);
  if (result) *result = r;
  RunRecord out;
  if (r.exit_code != 0) {
    ADD_FAILURE() << run_dir << ": exit " << r.exit_code << "\n" << r.output;
    return out;
  }
  out.losses = read_losses(run_dir);
  out.tensors = read_checkpoint(run_dir + "/checkpoints/" + checkpoint);
  return out;
}

void expect_run_matches(const RunRecord& got, const RunRecord& ref, double rel_tol, double abs_tol,
                        const std::string& what) {
  ASSERT_FALSE(ref.losses.empty()) << what << ": the reference run has no losses";
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], abs_tol + rel_tol * std::abs(ref.losses[i]))
        << what << ": loss at step " << i + 1;
  expect_tensors_within(got.tensors, ref.tensors, rel_tol, abs_tol, what);
}

void expect_bf16_layout_tracks_serial(const std::string& config, const std::vector<std::string>& model,
                                      const TempDir& dir) {
  auto run = [&](const std::string& name, int ranks, const std::vector<std::string>& layout) {
    std::vector<std::string> ov = model;
    ov.push_back("train.precision=\"bf16\"");
    ov.insert(ov.end(), layout.begin(), layout.end());
    return train_and_record(ranks, config, ov, dir.file(name));
  };
  const RunRecord serial = run("bf16_serial", 1, {});
  const RunRecord layout = run("bf16_dp2_tp2_pp2", 8, {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2",
                                                       "train.micro_batches=2", "optimizer.zero=true",
                                                       "train.recompute=\"blocks\""});
  ASSERT_EQ(layout.losses.size(), serial.losses.size());
  for (size_t i = 0; i < serial.losses.size(); ++i)
    EXPECT_NEAR(layout.losses[i], serial.losses[i], 1e-2 * serial.losses[i]) << "bf16 loss at step " << i + 1;
  expect_tensors_within(layout.tensors, serial.tensors, 2e-2, 2e-3, "bf16 dp2 x tp2 x pp2 against the bf16 serial run");
}

RunResult signal_rank_midrun(int ranks, const std::string& config, const std::vector<std::string>& overrides,
                             const std::string& run_dir, int after_lines, int rank, const std::string& signal) {
  std::string cmd = mpirun_relay(ranks) + " train --config " + config;
  for (auto& o : overrides) cmd += " --set '" + o + "'";
  const std::string metrics = run_dir + "/metrics.jsonl";
  std::string script = cmd + " & MP=$!\n"
      "for i in $(seq 1 600); do [ -f " + metrics + " ] && [ $(wc -l < " + metrics + ") -ge " +
      std::to_string(after_lines) + " ] && break; sleep 0.05; done\n"
      "for p in $(pgrep -x relay); do if tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=" +
      std::to_string(rank) + " && tr '\\0' ' ' < /proc/$p/cmdline | grep -q '" + run_dir + "'; then kill -" + signal +
      " $p; echo signalled $p; fi; done\n"
      "wait $MP; echo exit=$?\n";
  return run_command(script, 600);
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

size_t count_of(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

void expect_same_tensors(const std::map<std::string, std::vector<float>>& a,
                         const std::map<std::string, std::vector<float>>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (auto& [name, v] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    const auto& w = b.at(name);
    ASSERT_EQ(v.size(), w.size()) << name;
    for (size_t i = 0; i < v.size(); ++i) {
      if (rel == 0) ASSERT_EQ(v[i], w[i]) << what << ": " << name << "[" << i << "]";
      else ASSERT_NEAR(v[i], w[i], 1e-6 + rel * std::abs(w[i])) << what << ": " << name << "[" << i << "]";
    }
  }
}

bool cpu_bf16_available(std::string* why) {
  const std::string error = cpu::native_bf16_missing();
  if (why) *why = error;
  return error.empty();
}

}  // namespace relay::test


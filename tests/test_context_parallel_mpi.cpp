// Context parallelism (parallel.cp, model/context_parallel.hpp) keeps Relay's guarantee: every layout gives the
// serial run's result up to floating-point reordering. The real binary trains the GPT problem's 4-layer GPT and
// its Llama twin (8 query heads, 4 key/value heads) for 6 steps under mpirun, with each sequence of 16 tokens cut
// over cp 2 or 4 ranks, alone and with dp, tp, pp (1F1B, interleaved, ZB-H1), ZeRO-1 and recomputation, with and
// without document masks (data.document_mask on a token file whose documents end at token 0). Every step's loss and
// every final tensor (parameters and AdamW state) is compared with the serial run; a cp run is bitwise the same
// twice (once traced: the trace holds every rank's cp exchanges); a cp 4 checkpoint resumes on cp 1; the bad
// settings are named.
//
// Tolerance: |a - b| <= 1e-6 + 1e-5 |b|, as for the other equivalence tests.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/rng.hpp"
#include "io/token_dataset.hpp"
#include "model/family.hpp"
#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Case {
  std::string model;  // "gpt" or "llama"
  bool docs = false;  // data.document_mask
  int dp = 1, cp = 2, tp = 1, pp = 1;
  std::string schedule = "1f1b";
  int m = 1;
  bool zero = false, recompute = false;
  bool overlap = true;  // parallel.overlap: the key/value gathers travel while the own rows' attention runs
  int ranks() const { return dp * cp * tp * pp; }
  std::string key() const { return model + (docs ? "_docs" : ""); }
  std::string name() const {
    std::string s = key() + "_dp" + std::to_string(dp) + "_cp" + std::to_string(cp) + "_tp" + std::to_string(tp) +
                    "_pp" + std::to_string(pp) + "_" + schedule + "_m" + std::to_string(m) + (zero ? "_zero" : "") +
                    (recompute ? "_recompute" : "") + (overlap ? "" : "_no_overlap");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<std::string> model_overrides(const std::string& model) {
  if (model == "gpt") return {};
  return {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8", "model.n_kv_head=4", "model.ffn_hidden=48",
          "model.rope_theta=500.0", "model.norm_eps=1e-6"};
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  auto add = [&](std::string model, bool docs, int dp, int cp, int tp, int pp, std::string sched, int m,
                 bool zero = false, bool rec = false) {
    out.push_back({std::move(model), docs, dp, cp, tp, pp, std::move(sched), m, zero, rec});
  };
  add("gpt", false, 1, 2, 1, 1, "1f1b", 1);
  add("gpt", false, 1, 4, 1, 1, "1f1b", 2);
  add("gpt", false, 2, 2, 1, 1, "1f1b", 2, /*zero=*/true);
  add("gpt", false, 1, 2, 2, 1, "1f1b", 1, false, /*recompute=*/true);
  add("gpt", false, 1, 2, 1, 2, "interleaved", 4);
  add("gpt", true, 1, 4, 1, 1, "1f1b", 1);
  add("gpt", true, 2, 2, 1, 2, "1f1b", 2);  // dp x cp x pp
  add("llama", false, 1, 2, 1, 2, "zb-h1", 4);
  add("llama", true, 1, 2, 1, 1, "1f1b", 2);
  out.push_back(out.back());  // the same with parallel.overlap = false: gather first, then all keys at once
  out.back().overlap = false;
  add("llama", true, 1, 2, 2, 1, "1f1b", 1, true, true);  // tp x cp, ZeRO-1 over the dp x cp replicas, recompute
  return out;
}

class ContextParallel : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path());
    write_documents(dir_->file("docs.h5"));
    write_documents(dir_->file("docs_eval.h5"), 8, 1025);
    for (std::string model : {"gpt", "llama"})
      for (bool docs : {false, true}) {
        const std::string key = model + (docs ? "_docs" : ""), run = dir_->file("serial_" + key);
        RunResult r = train(1, problem_.config, overrides(model, docs, run));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        serial_losses_[key] = read_losses(run);
        serial_tensors_[key] = read_checkpoint(run + "/checkpoints/step_00000006.h5");
      }
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::vector<std::string> overrides(const std::string& model, bool docs, const std::string& run) {
    auto ov = model_overrides(model);
    ov.push_back("run.dir=" + quoted(run));
    if (docs)
      ov.insert(ov.end(), {"data.train=" + quoted(dir_->file("docs.h5")),
                           "data.eval=" + quoted(dir_->file("docs_eval.h5")), "data.document_mask=true"});
    return ov;
  }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::string, std::vector<double>> serial_losses_;
  static std::map<std::string, std::map<std::string, std::vector<float>>> serial_tensors_;
};
std::unique_ptr<TempDir> ContextParallel::dir_;
Problem ContextParallel::problem_;
std::map<std::string, std::vector<double>> ContextParallel::serial_losses_;
std::map<std::string, std::map<std::string, std::vector<float>>> ContextParallel::serial_tensors_;

TEST_P(ContextParallel, MatchesSerialRun) {
  const Case& c = GetParam();
  ASSERT_EQ(serial_losses_[c.key()].size(), 6u);
  const std::string run = dir_->file(c.name());
  auto ov = overrides(c.model, c.docs, run);
  ov.insert(ov.end(), {"parallel.dp=" + std::to_string(c.dp), "parallel.cp=" + std::to_string(c.cp),
                       "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
                       "parallel.schedule=" + quoted(c.schedule), "train.micro_batches=" + std::to_string(c.m),
                       "parallel.virtual_stages=" + std::to_string(c.schedule == "interleaved" ? 2 : 1),
                       std::string("optimizer.zero=") + (c.zero ? "true" : "false"),
                       std::string("train.recompute=") + (c.recompute ? "\"blocks\"" : "\"none\""),
                       std::string("parallel.overlap=") + (c.overlap ? "true" : "false")});
  RunResult r = train(c.ranks(), problem_.config, ov);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "context parallelism: each sequence of 16 tokens is cut into " +
                                     std::to_string(2 * c.cp) + " chunks"))
      << r.output;
  auto losses = read_losses(run);
  const auto& ref = serial_losses_[c.key()];
  ASSERT_EQ(losses.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(losses[i], ref[i], kAbs + kRel * std::abs(ref[i])) << "loss at step " << i + 1;
  expect_tensors_within(read_checkpoint(run + "/checkpoints/step_00000006.h5"), serial_tensors_[c.key()], kRel, kAbs,
                        "against the serial run");
  if (!c.overlap) {  // and against the same layout with overlap (the case before it): not bitwise, the softmax merge
    Case on = c;     // sums the own and the other ranks' keys in another order
    on.overlap = true;
    const std::string twin = dir_->file(on.name()) + "/checkpoints/step_00000006.h5";
    ASSERT_TRUE(std::filesystem::exists(twin)) << twin;
    expect_tensors_within(read_checkpoint(run + "/checkpoints/step_00000006.h5"), read_checkpoint(twin), kRel, kAbs,
                          "overlap off against on");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallel, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });

// The same cp run twice gives the same bits; a cp 4 checkpoint resumes on cp 1 (and the resumed steps equal the
// cp 4 run's).
TEST(ContextParallelRuns, BitwiseTwiceAndResumesOnAnotherCp) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  write_documents(dir.file("docs.h5"));
  write_documents(dir.file("docs_eval.h5"), 8, 1025);
  auto run_of = [&](const std::string& name, int ranks, std::vector<std::string> extra) {
    auto ov = model_overrides("llama");
    ov.insert(ov.end(), {"run.dir=" + quoted(dir.file(name)), "checkpoint.every=3", "data.document_mask=true",
                         "data.train=" + quoted(dir.file("docs.h5")), "data.eval=" + quoted(dir.file("docs_eval.h5"))});
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, p.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir.file(name);
  };
  const std::string a = run_of("a", 4, {"parallel.cp=4", "train.micro_batches=2", "trace.steps=[2, 3]"});
  // The trace shows every rank's cp exchanges: per traced step (2), micro-batch (2) and attention block (4), the forward's
  // key and value all-gathers, the backward's again, and the key- and value-gradient reduce-scatters.
  auto trace = nlohmann::json::parse(read_file(a + "/trace.json"));
  std::map<std::string, std::map<int, int>> count;  // name -> pid -> spans
  for (auto& e : trace.at("traceEvents"))
    if (e.value("ph", "") == "X" && e.value("name", "").rfind("cp ", 0) == 0)
      ++count[e.at("name").get<std::string>()][e.at("pid").get<int>()];
  for (const char* name : {"cp all-gather k", "cp all-gather v", "cp all-gather k (backward)",
                           "cp all-gather v (backward)", "cp reduce-scatter dk", "cp reduce-scatter dv"}) {
    EXPECT_EQ(count[name].size(), 4u) << name;
    for (auto& [pid, n] : count[name]) EXPECT_EQ(n, 2 * 2 * 4) << name << " on pid " << pid;
  }
  const std::string b = run_of("b", 4, {"parallel.cp=4", "train.micro_batches=2"});
  expect_same_tensors(read_checkpoint(a + "/checkpoints/step_00000006.h5"),
                      read_checkpoint(b + "/checkpoints/step_00000006.h5"), 0.0, "two cp 4 runs");
  const std::string c = run_of("c", 1, {"checkpoint.resume=" + quoted(a + "/checkpoints/step_00000003.h5")});
  const auto la = read_losses(a), lc = read_losses(c);  // c's metrics hold steps 4-6
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lc.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(lc[i], la[i + 3], kAbs + kRel * std::abs(la[i + 3])) << "step " << i + 4;
  expect_tensors_within(read_checkpoint(c + "/checkpoints/step_00000006.h5"),
                        read_checkpoint(a + "/checkpoints/step_00000006.h5"), kRel, kAbs, "cp 4 resumed on cp 1");
}

// Bad settings: one line naming the key, exit 1 on every rank.
TEST(ContextParallelRuns, BadSettingsAreNamed) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  RunResult r = train(3, p.config, {"run.dir=" + quoted(dir.file("a")), "parallel.cp=3"}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "parallel.cp: = 3: model.block_size = 16 must be divisible by 2 x cp = 6")) << r.output;
  EXPECT_EQ(count_of(r.output, "error:"), 1u) << r.output;
  Problem mlp = make_problem(dir.file("mlp"));
  RunResult m = train(2, mlp.config, {"run.dir=" + quoted(dir.file("b")), "parallel.cp=2"}, 60);
  EXPECT_EQ(m.exit_code, 1) << m.output;
  // Every language model, as the registry lists them (the message once said "gpt" or "llama" only).
  EXPECT_TRUE(contains(m.output, relay::cat("parallel.cp: = 2 needs model.type = ",
                                            relay::family_names(&relay::ModelKeys::language_model),
                                            " (context parallelism"))) << m.output;
  EXPECT_TRUE(contains(m.output, "\"deepseek_v3\" (context parallelism")) << m.output;
  RunResult w = train(2, p.config, {"run.dir=" + quoted(dir.file("c")), "parallel.cp=2", "parallel.dp=2"}, 60);
  EXPECT_EQ(w.exit_code, 1) << w.output;
  EXPECT_TRUE(contains(w.output, "the job has 2 ranks but parallel.dp x parallel.cp x parallel.pp = 2 x 2 x 1 = 4"))
      << w.output;
}

// Activation memory per rank falls with cp (each rank keeps T / cp rows of every sequence, plus the gathered keys and
// values of one block at a time), and every rank's measured bytes equal relay plan's prediction (1%), at T 128 on a
// Llama whose activations the attention's gathered keys and values do not dominate, with a document mask.
TEST(ContextParallelRuns, ActivationMemoryFallsWithCpAsPlanned) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 8193, 96, 128);
  write_documents(dir.file("docs.h5"), 7, 8193);
  std::map<int, double> activations;  // by cp: rank 0's measured activation bytes
  for (int cp : {1, 2, 4}) {
    const std::string run = dir.file("mem_cp" + std::to_string(cp));
    auto ov = model_overrides("llama");
    ov.insert(ov.end(), {"run.dir=" + quoted(run), "parallel.cp=" + std::to_string(cp), "train.steps=2",
                         "lr_schedule.warmup_steps=1", "data.document_mask=true", "data.eval=\"\"",
                         "data.train=" + quoted(dir.file("docs.h5"))});
    RunResult r = train(cp, p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto j = nlohmann::json::parse(read_file(run + "/memory.json"));
    ASSERT_EQ(j.at("bytes_per_rank").size(), size_t(cp));
    for (auto& rank : j.at("bytes_per_rank"))
      for (const char* k : {"params", "grads", "optimizer", "activations"}) {
        const double got = rank.at("measured").at(k).get<double>(), want = rank.at("predicted").at(k).get<double>();
        EXPECT_NEAR(got, want, 0.01 * want + 1024) << "cp " << cp << " rank " << rank.at("rank") << " " << k;
      }
    activations[cp] = j.at("bytes_per_rank")[0].at("measured").at("activations").get<double>();
  }
  std::printf("activation bytes per rank: cp 1 %.0f, cp 2 %.0f (%.2fx), cp 4 %.0f (%.2fx)\n", activations[1],
              activations[2], activations[2] / activations[1], activations[4], activations[4] / activations[1]);
  EXPECT_LT(activations[2], 0.65 * activations[1]);
  EXPECT_LT(activations[4], 0.75 * activations[2]);
}

}  // namespace

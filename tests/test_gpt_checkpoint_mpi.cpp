// GPT models with the real binary: bad inputs give one clear line and a non-zero exit on every rank
// (a token id >= vocab_size, a file shorter than one sequence, n_embd not divisible by n_head, more
// stages than blocks, a tokenizer that does not fit the model), checkpoints resume exactly onto
// other layouts (tied embeddings split across stages or not), and a SIGTERM to one rank mid-run
// stops every rank with a checkpoint from which the run continues the uninterrupted loss curve.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "io/checkpoint.hpp"
#include "io/token_dataset.hpp"
#include "support/test_support.hpp"

using namespace relay::test;
using relay::write_token_file;

namespace {

std::string q(const std::string& s) { return quoted(s); }
size_t count(const std::string& s, const std::string& needle) { return count_of(s, needle); }

class Gpt : public ::testing::Test {
 protected:
  void SetUp() override { p_ = make_gpt_problem(dir_.path()); }
  std::string run(const std::string& name) const { return dir_.file(name); }
  RunResult fail(int ranks, std::vector<std::string> ov) {
    ov.push_back("run.dir=" + q(dir_.file("run")));
    RunResult r = train(ranks, p_.config, ov, 60);
    EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_EQ(count(r.output, "error:"), 1u) << "one line, printed once:\n" << r.output;
    return r;
  }
  TempDir dir_;
  Problem p_;
};

}  // namespace

TEST_F(Gpt, TokenIdBeyondVocabularyNamesFileAndPosition) {
  std::vector<int32_t> t(200, 5);
  t[123] = 96;  // model.vocab_size = 96
  write_token_file(dir_.file("bad.h5"), t, 96, "bytes");
  RunResult r = fail(2, {"parallel.pp=2", "data.train=" + q(dir_.file("bad.h5"))});
  EXPECT_TRUE(contains(r.output, "bad.h5")) << r.output;
  EXPECT_TRUE(contains(r.output, "123")) << r.output;
  EXPECT_TRUE(contains(r.output, "96")) << r.output;
}

TEST_F(Gpt, DatasetShorterThanOneSequence) {
  write_token_file(dir_.file("short.h5"), std::vector<int32_t>(16, 1), 96, "bytes");  // needs 17 tokens
  RunResult r = fail(2, {"parallel.dp=2", "data.train=" + q(dir_.file("short.h5"))});
  EXPECT_TRUE(contains(r.output, "short.h5")) << r.output;
  EXPECT_TRUE(contains(r.output, "block_size")) << r.output;
}

TEST_F(Gpt, TokenizerThatDoesNotFitTheModel) {
  write_token_file(dir_.file("gpt2.h5"), std::vector<int32_t>(400, 1), 50257, "gpt2");
  RunResult r = fail(2, {"parallel.pp=2", "data.train=" + q(dir_.file("gpt2.h5"))});
  EXPECT_TRUE(contains(r.output, "50257")) << r.output;
  EXPECT_TRUE(contains(r.output, "vocab_size")) << r.output;
  // Train and eval tokenized differently.
  write_token_file(dir_.file("eval_gpt2.h5"), std::vector<int32_t>(400, 1), 96, "gpt2");
  RunResult e = fail(2, {"parallel.pp=2", "data.eval=" + q(dir_.file("eval_gpt2.h5"))});
  EXPECT_TRUE(contains(e.output, "data.eval")) << e.output;
  EXPECT_TRUE(contains(e.output, "tokenized with")) << e.output;
}

// data.document_mask needs to know where documents end: a token file without eot_id (made by hand, not by
// relay data tokenize) is one line naming the key and the file, on every rank; train and eval must agree.
TEST_F(Gpt, DocumentMaskNeedsTheEndOfTextToken) {
  RunResult r = fail(2, {"parallel.pp=2", "data.document_mask=true"});
  EXPECT_TRUE(contains(r.output, "data.document_mask: data.train")) << r.output;
  EXPECT_TRUE(contains(r.output, "has no eot_id attribute")) << r.output;
  write_token_file(dir_.file("docs.h5"), std::vector<int32_t>(400, 1), 61, "bytes", {{"eot_id", 0}});
  write_token_file(dir_.file("docs_eval.h5"), std::vector<int32_t>(400, 1), 61, "bytes", {{"eot_id", 3}});
  RunResult e = fail(2, {"parallel.pp=2", "data.document_mask=true", "data.train=" + q(dir_.file("docs.h5")),
                         "data.eval=" + q(dir_.file("docs_eval.h5"))});
  EXPECT_TRUE(contains(e.output, "data.eval")) << e.output;
  EXPECT_TRUE(contains(e.output, "has eot_id 3 but data.train has 0")) << e.output;
}

TEST_F(Gpt, BadModelShapes) {
  RunResult r = fail(2, {"parallel.dp=2", "model.n_head=3"});
  EXPECT_TRUE(contains(r.output, "model.n_embd: = 16 must be divisible by model.n_head = 3")) << r.output;
  RunResult s = fail(7, {"parallel.pp=7"});
  EXPECT_TRUE(contains(s.output, "the model has 6 blocks that can start a stage (embedding + 4 transformer blocks "
                                 "(model.n_layer) + head) but the pipeline has 7 stages")) << s.output;
  RunResult b = fail(2, {"parallel.pp=2", "parallel.balance=[2, 3]"});
  EXPECT_TRUE(contains(b.output, "parallel.balance sums to 5 blocks but the model has 6")) << b.output;
  RunResult k = fail(1, {"model.layers=[{ type = \"relu\" }]"});
  EXPECT_TRUE(contains(k.output, "model.layers: is a key of model.type = \"mlp\"; a model.type = \"gpt\" model is "
                                 "given by vocab_size")) << k.output;
}

TEST_F(Gpt, ResumeOntoOtherLayouts) {
  RunResult full = train(4, p_.config, {"run.dir=" + q(run("full")), "parallel.dp=2", "parallel.pp=2",
                                        "train.micro_batches=2", "checkpoint.every=3"});
  ASSERT_EQ(full.exit_code, 0) << full.output;
  auto ref_losses = read_losses(run("full"));
  auto ref_final = read_checkpoint(run("full") + "/checkpoints/step_00000006.h5");
  EXPECT_EQ(ref_final.count("model/lm_head.weight"), 0u) << "a tied weight is stored once";
  EXPECT_EQ(ref_final.count("model/transformer.wte.weight"), 1u);
  const std::string from = q(run("full") + "/checkpoints/step_00000003.h5");
  struct L { int dp, pp; std::string sched; int m; int v; };
  for (L l : {L{1, 1, "1f1b", 1, 1}, L{1, 4, "zb-h1", 4, 1}, L{4, 1, "gpipe", 2, 1}, L{1, 2, "interleaved", 4, 2}}) {
    std::string name = "to_" + std::to_string(l.dp) + "x" + std::to_string(l.pp) + l.sched;
    RunResult r = train(l.dp * l.pp, p_.config,
                        {"run.dir=" + q(run(name)), "parallel.dp=" + std::to_string(l.dp), "parallel.pp=" + std::to_string(l.pp),
                         "parallel.schedule=" + q(l.sched), "train.micro_batches=" + std::to_string(l.m),
                         "parallel.virtual_stages=" + std::to_string(l.v), "checkpoint.resume=" + from});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    auto losses = read_losses(run(name));
    ASSERT_EQ(losses.size(), 3u) << name;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(losses[i], ref_losses[i + 3], 1e-6 + 1e-5 * ref_losses[i + 3]) << name;
    expect_same_tensors(read_checkpoint(run(name) + "/checkpoints/step_00000006.h5"), ref_final, 1e-5, name);
  }
}

TEST_F(Gpt, ExactResumeIsBitwiseAndSigtermMidRunResumes) {
  auto long_run = [&](const std::string& dir) {
    return std::vector<std::string>{"run.dir=" + q(dir), "parallel.dp=2", "parallel.pp=2", "train.micro_batches=2",
                                    "train.steps=400", "train.log_every=1", "checkpoint.every=100"};
  };
  RunResult ref = train(4, p_.config, long_run(run("ref")), 600);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  RunResult r = signal_rank_midrun(4, p_.config, long_run(run("s")), run("s"), 30, 3, "TERM");
  ASSERT_TRUE(contains(r.output, "signalled")) << r.output;
  ASSERT_TRUE(contains(r.output, "exit=75")) << r.output;
  std::string latest = relay::read_latest(run("s") + "/checkpoints");
  ASSERT_FALSE(latest.empty());
  EXPECT_NE(latest, "step_00000400.h5");
  std::vector<std::string> resume = long_run(run("s"));
  resume.push_back("checkpoint.resume=\"auto\"");
  RunResult res = train(4, p_.config, resume, 600);
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_EQ(read_losses(run("s")), read_losses(run("ref")));  // every step once, the uninterrupted losses
  expect_same_tensors(read_checkpoint(run("s") + "/checkpoints/step_00000400.h5"),
                      read_checkpoint(run("ref") + "/checkpoints/step_00000400.h5"), 0.0, "after SIGTERM and resume");
}

TEST_F(Gpt, GenerateFromACheckpoint) {
  RunResult t = train(1, p_.config, {"run.dir=" + q(run("g")), "model.vocab_size=256"});
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string ck = run("g") + "/checkpoints/step_00000006.h5";
  write_file(run("prompt.txt"), "1 2 3\n4");
  auto gen = [&](const std::string& args) {
    return run_command(relay_binary() + " generate --checkpoint " + ck + " " + args);
  };
  RunResult a = gen("--prompt-tokens " + run("prompt.txt") + " --max-new-tokens 12 --seed 5 --tokens-out " + run("a.ids"));
  RunResult b = gen("--prompt-tokens " + run("prompt.txt") + " --max-new-tokens 12 --seed 5 --tokens-out " + run("b.ids"));
  RunResult c = gen("--prompt-tokens " + run("prompt.txt") + " --max-new-tokens 12 --seed 6 --tokens-out " + run("c.ids"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(read_file(run("a.ids")), read_file(run("b.ids"))) << "same seed, same tokens";
  EXPECT_NE(read_file(run("a.ids")), read_file(run("c.ids"))) << "another seed, other tokens";
  std::istringstream ids(read_file(run("a.ids")));
  std::vector<int> v;
  for (int x; ids >> x;) v.push_back(x);
  ASSERT_EQ(v.size(), 16u);  // 4 prompt tokens + 12
  EXPECT_EQ(std::vector<int>(v.begin(), v.begin() + 4), (std::vector<int>{1, 2, 3, 4}));
  // Greedy is deterministic without a seed, a text prompt works with the byte tokenizer, and a
  // context longer than block_size (16) is cropped as nanoGPT does.
  RunResult g1 = gen("--prompt 'The quick brown fox' --max-new-tokens 30 --temperature 0 --seed 1");
  RunResult g2 = gen("--prompt 'The quick brown fox' --max-new-tokens 30 --temperature 0 --seed 2");
  ASSERT_EQ(g1.exit_code, 0) << g1.output;
  EXPECT_EQ(g1.output, g2.output);
  EXPECT_EQ(g1.output.rfind("The quick brown fox", 0), 0u) << g1.output;
  // Bad input.
  write_file(run("bad.txt"), "1 2 999");
  RunResult e = gen("--prompt-tokens " + run("bad.txt") + " --max-new-tokens 2");
  EXPECT_EQ(e.exit_code, 1) << e.output;
  EXPECT_TRUE(contains(e.output, "bad.txt: token 2 is \"999\"")) << e.output;
  RunResult m = gen("--max-new-tokens 2");
  EXPECT_EQ(m.exit_code, 1) << m.output;
  EXPECT_TRUE(contains(m.output, "--prompt TEXT or --prompt-tokens FILE")) << m.output;
}

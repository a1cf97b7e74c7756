// Training on the GPU with the real binary (issue "CUDA backend"): (dp, pp) = (1, 1) in fp32 matches
// the CPU run (the GPU's inputs preloaded, data.preload = "auto"); dp = 2 and pp = 2 with parallel.comm = "mpi" on one GPU match the serial run (and cp = 2, with and
// without document masks); a checkpoint written on the GPU resumes on the CPU and the other way round; a Mixtral on
// the GPU equals the CPU's run and its dp 2 x ep 2 run on one GPU the serial one; a DeepSeek-V3 (MLA, group-limited
// routing, MTP) equals the CPU's run and generates its tokens, and its cp 2 equals its serial run; the GPT's fp8 runs
// (both recipes) track the CPU's fp8 run and repeat bit for bit. Tolerance (but fp8, bf16) as the equivalence tests: |a - b| <= 1e-6 + 1e-5 |b|. Skipped, with the reason, without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "support/test_support.hpp"

using namespace relay::test;

namespace {

std::string q(const std::string& s) { return "\"" + s + "\""; }

void expect_close(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 + 1e-5 * std::abs(b[i])) << what << " step " << i + 1;
}

class GpuTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (relay::cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: this build or machine has no GPU (relay was built "
#ifdef RELAY_HAVE_CUDA
                      "with the CUDA backend, but no device is visible)";
#else
                      "without the CUDA backend)";
#endif
    p_ = make_problem(dir_.path());
  }
  std::string ckpt(const std::string& run, int step) const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "/checkpoints/step_%08d.h5", step);
    return dir_.file(run) + buf;
  }
  TempDir dir_;
  Problem p_;
};

}  // namespace

TEST_F(GpuTraining, SerialFp32MatchesCpu) {
  RunResult cpu = train(1, p_.config, {"run.dir=" + q(dir_.file("cpu"))});
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  RunResult gpu = train(1, p_.config, {"run.dir=" + q(dir_.file("gpu")), "train.device=\"cuda\""});
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  // data.preload = "auto": the GPU run gathers its batches from inputs held on the device, the CPU run reads them
  EXPECT_NE(gpu.output.find("relay: data.preload: the "), std::string::npos) << gpu.output;
  EXPECT_EQ(cpu.output.find("relay: data.preload: the "), std::string::npos) << cpu.output;
  expect_close(read_losses(dir_.file("gpu")), read_losses(dir_.file("cpu")), "losses");
  expect_same_tensors(read_checkpoint(ckpt("gpu", 6)), read_checkpoint(ckpt("cpu", 6)), 1e-5, "final tensors");
}

TEST_F(GpuTraining, DataAndPipelineParallelOverMpiOnOneGpuMatchSerial) {
  RunResult serial = train(1, p_.config, {"run.dir=" + q(dir_.file("serial")), "train.device=\"cuda\""});
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  for (std::string layout : {"parallel.dp=2", "parallel.pp=2"}) {
    std::string run = dir_.file(layout.substr(9, 2));
    RunResult r = train(2, p_.config, {"run.dir=" + q(run), "train.device=\"cuda\"", "parallel.comm=\"mpi\"", layout,
                                       "train.micro_batches=2"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_close(read_losses(run), read_losses(dir_.file("serial")), layout);
  }
}

TEST_F(GpuTraining, CheckpointsMoveBetweenGpuAndCpu) {
  RunResult ref = train(1, p_.config, {"run.dir=" + q(dir_.file("ref")), "checkpoint.every=3"});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  RunResult g = train(1, p_.config, {"run.dir=" + q(dir_.file("g")), "train.device=\"cuda\"", "checkpoint.every=3"});
  ASSERT_EQ(g.exit_code, 0) << g.output;
  // GPU checkpoint -> CPU run, and CPU checkpoint -> GPU run.
  RunResult gc = train(1, p_.config, {"run.dir=" + q(dir_.file("gc")), "checkpoint.resume=" + q(ckpt("g", 3))});
  ASSERT_EQ(gc.exit_code, 0) << gc.output;
  RunResult cg = train(1, p_.config, {"run.dir=" + q(dir_.file("cg")), "train.device=\"cuda\"",
                                      "checkpoint.resume=" + q(ckpt("ref", 3))});
  ASSERT_EQ(cg.exit_code, 0) << cg.output;
  expect_same_tensors(read_checkpoint(ckpt("gc", 6)), read_checkpoint(ckpt("ref", 6)), 1e-5, "GPU checkpoint resumed on CPU");
  expect_same_tensors(read_checkpoint(ckpt("cg", 6)), read_checkpoint(ckpt("ref", 6)), 1e-5, "CPU checkpoint resumed on GPU");
}

TEST(GpuDevice, CudaWithoutAGpuIsAClearError) {
  if (relay::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the error path cannot be shown";
  TempDir dir;
  Problem p = make_problem(dir.path());
  RunResult r = train(1, p.config, {"run.dir=" + q(dir.file("x")), "train.device=\"cuda\""}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "train.device = \"cuda\"")) << r.output;
}

// GPT on the GPU: the serial run matches the CPU's, and dp = 2 x pp = 2 over MPI on one GPU (tied
// embeddings split across the stages) matches the GPU's serial run; generation runs on the GPU.
TEST_F(GpuTraining, GptMatchesCpuAndParallelLayouts) {
  Problem g = make_gpt_problem(dir_.path() + "/gpt");
  RunResult cpu = train(1, g.config, {"run.dir=" + q(dir_.file("gcpu"))});
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  RunResult gpu = train(1, g.config, {"run.dir=" + q(dir_.file("ggpu")), "train.device=\"cuda\""});
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  expect_close(read_losses(dir_.file("ggpu")), read_losses(dir_.file("gcpu")), "GPT losses, GPU vs CPU");
  expect_same_tensors(read_checkpoint(ckpt("ggpu", 6)), read_checkpoint(ckpt("gcpu", 6)), 1e-5, "GPT tensors");
  RunResult par = train(4, g.config, {"run.dir=" + q(dir_.file("g22")), "train.device=\"cuda\"", "parallel.comm=\"mpi\"",
                                      "parallel.dp=2", "parallel.pp=2", "train.micro_batches=2"});
  ASSERT_EQ(par.exit_code, 0) << par.output;
  expect_close(read_losses(dir_.file("g22")), read_losses(dir_.file("ggpu")), "GPT dp2 x pp2 on the GPU");
  RunResult gen = run_command("echo 1 2 3 | " + relay_binary() + " generate --device cuda --checkpoint " +
                              ckpt("ggpu", 6) + " --prompt-tokens /dev/stdin --max-new-tokens 8 --temperature 0");
  RunResult gen_cpu = run_command("echo 1 2 3 | " + relay_binary() + " generate --device cpu --checkpoint " +
                                  ckpt("ggpu", 6) + " --prompt-tokens /dev/stdin --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_EQ(gen.output, gen_cpu.output) << "greedy tokens on the GPU and the CPU";
}

// 3D parallelism on the GPU (one GPU, so parallel.comm = "mpi"): tp = 2 x pp = 2 with ZeRO-1 over
// dp = 2 and recomputation, and tp = 2 x pp = 2 with sequence parallelism, match the GPU's serial run: the vocabulary-parallel kernels
// (embedding shard, row max, cross-entropy partial and finish) and the staged reduce-scatter and
// all-gather on device tensors.
TEST_F(GpuTraining, GptTensorParallelZeroRecomputeMatchesSerial) {
  Problem g = make_gpt_problem(dir_.path() + "/gpt3d", 4097, 61);
  RunResult one = train(1, g.config, {"run.dir=" + q(dir_.file("t1")), "train.device=\"cuda\"", "model.n_head=4"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  RunResult par = train(8, g.config, {"run.dir=" + q(dir_.file("t222")), "train.device=\"cuda\"", "parallel.comm=\"mpi\"",
                                      "model.n_head=4", "parallel.dp=2", "parallel.tp=2", "parallel.pp=2",
                                      "train.micro_batches=2", "optimizer.zero=true", "train.recompute=\"blocks\""});
  ASSERT_EQ(par.exit_code, 0) << par.output;
  expect_close(read_losses(dir_.file("t222")), read_losses(dir_.file("t1")), "GPT dp2 x tp2 x pp2 on the GPU");
  expect_same_tensors(read_checkpoint(ckpt("t222", 6)), read_checkpoint(ckpt("t1", 6)), 1e-5, "GPT 3D tensors");
  // Sequence parallelism on device tensors: the row all-gathers and reduce-scatters, the norm-gradient sums.
  RunResult sp = train(4, g.config, {"run.dir=" + q(dir_.file("t_sp")), "train.device=\"cuda\"", "parallel.comm=\"mpi\"",
                                     "model.n_head=4", "parallel.tp=2", "parallel.pp=2", "train.micro_batches=2",
                                     "parallel.sequence_parallel=true"});
  ASSERT_EQ(sp.exit_code, 0) << sp.output;
  expect_close(read_losses(dir_.file("t_sp")), read_losses(dir_.file("t1")), "GPT tp2 x pp2, sequence-parallel, GPU");
  expect_same_tensors(read_checkpoint(ckpt("t_sp", 6)), read_checkpoint(ckpt("t1", 6)), 1e-5, "GPT sequence-parallel tensors");
}

// Llama (grouped-query attention, RoPE, SwiGLU, RMSNorm) on the GPU: fp32 equals the CPU run, dp2 x tp2 x
// pp2 with ZeRO-1 and recomputation equals the GPU serial run, bf16 tracks fp32, and greedy generation
// (the n_kv_head cache) gives the CPU's tokens.
TEST_F(GpuTraining, LlamaMatchesCpuLayoutsAndGeneration) {
  Problem g = make_gpt_problem(dir_.path() + "/llama", 4097, 61);
  const std::vector<std::string> llama = {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8",
                                          "model.n_kv_head=4", "model.ffn_hidden=48"};
  auto run = [&](int ranks, const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> ov = llama;
    ov.push_back("run.dir=" + q(dir_.file(name)));
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, g.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  };
  run(1, "lcpu", {});
  run(1, "lgpu", {"train.device=\"cuda\""});
  expect_close(read_losses(dir_.file("lgpu")), read_losses(dir_.file("lcpu")), "Llama losses, GPU vs CPU");
  expect_same_tensors(read_checkpoint(ckpt("lgpu", 6)), read_checkpoint(ckpt("lcpu", 6)), 1e-5, "Llama tensors");
  run(8, "l222", {"train.device=\"cuda\"", "parallel.comm=\"mpi\"", "parallel.dp=2", "parallel.tp=2", "parallel.pp=2",
                  "train.micro_batches=2", "optimizer.zero=true", "train.recompute=\"blocks\""});
  expect_close(read_losses(dir_.file("l222")), read_losses(dir_.file("lgpu")), "Llama dp2 x tp2 x pp2 on the GPU");
  run(1, "lbf16", {"train.device=\"cuda\"", "train.precision=\"bf16\""});
  const auto b = read_losses(dir_.file("lbf16")), f = read_losses(dir_.file("lgpu"));
  ASSERT_EQ(b.size(), f.size());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], f[i], 1e-2 * f[i]) << "Llama bf16 vs fp32 at step " << i + 1;
  RunResult gen = run_command("echo 1 2 3 | " + relay_binary() + " generate --device cuda --checkpoint " +
                              ckpt("lgpu", 6) + " --prompt-tokens /dev/stdin --max-new-tokens 8 --temperature 0");
  RunResult gen_cpu = run_command("echo 1 2 3 | " + relay_binary() + " generate --device cpu --checkpoint " +
                                  ckpt("lgpu", 6) + " --prompt-tokens /dev/stdin --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_EQ(gen.output, gen_cpu.output) << "Llama greedy tokens on the GPU and the CPU";
}

// data.document_mask on the GPU (the document-start kernels: flash attention forward/backward with document
// starts, positions in rope and the embedding): GPT and Llama equal the CPU's run in fp32; Llama in bf16 tracks fp32.
TEST_F(GpuTraining, DocumentMaskMatchesCpu) {
  Problem g = make_gpt_problem(dir_.path() + "/docs", 4097, 96);
  write_documents(dir_.file("docs.h5"), 7);
  write_documents(dir_.file("docs_eval.h5"), 8, 1025);
  const std::vector<std::string> docs = {"data.train=" + q(dir_.file("docs.h5")), "data.eval=" + q(dir_.file("docs_eval.h5")),
                                         "data.document_mask=true", "model.n_head=4"};
  const std::vector<std::string> llama = {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8",
                                          "model.n_kv_head=4", "model.ffn_hidden=48"};
  auto run = [&](const std::string& name, bool is_llama, std::vector<std::string> extra) {
    std::vector<std::string> ov = docs;
    if (is_llama) ov.insert(ov.end(), llama.begin(), llama.end());
    ov.push_back("run.dir=" + q(dir_.file(name)));
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(1, g.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  };
  for (bool is_llama : {false, true}) {
    const std::string m = is_llama ? "llama" : "gpt";
    run(m + "_cpu", is_llama, {});
    run(m + "_gpu", is_llama, {"train.device=\"cuda\""});
    expect_close(read_losses(dir_.file(m + "_gpu")), read_losses(dir_.file(m + "_cpu")), m + " document-masked losses");
    expect_same_tensors(read_checkpoint(ckpt(m + "_gpu", 6)), read_checkpoint(ckpt(m + "_cpu", 6)), 1e-5,
                        m + " document-masked tensors");
  }
  run("llama_bf16", true, {"train.device=\"cuda\"", "train.precision=\"bf16\""});
  const auto b = read_losses(dir_.file("llama_bf16")), f = read_losses(dir_.file("llama_gpu"));
  ASSERT_EQ(b.size(), f.size());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], f[i], 1e-2 * f[i]) << "document-masked bf16 at step " << i + 1;
}

// ZeRO-2 and ZeRO-3 on device tensors (one GPU, so parallel.comm = "mpi"): per-micro-batch gradient
// reduce-scatters from the pool, per-block parameter gathers with prefetch, and ZeRO-3 under pp = 2, each equal to
// the GPU's serial run in every loss and final tensor; in bf16, equal to ZeRO-1 in bf16.
TEST_F(GpuTraining, Zero2And3MatchSerial) {
  Problem g = make_gpt_problem(dir_.path() + "/zero", 4097, 61);
  RunResult one = train(1, g.config, {"run.dir=" + q(dir_.file("z1")), "train.device=\"cuda\"", "model.n_head=4",
                                      "train.micro_batches=2"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  struct Layout { std::string name; int ranks; std::vector<std::string> set; };
  const std::vector<Layout> layouts = {
      {"zero2_dp2", 2, {"parallel.dp=2", "optimizer.zero=2"}},
      {"zero3_dp2", 2, {"parallel.dp=2", "optimizer.zero=3"}},
      {"zero3_dp2_pp2", 4, {"parallel.dp=2", "parallel.pp=2", "optimizer.zero=3", "train.recompute=\"blocks\""}}};
  for (const Layout& l : layouts) {
    std::vector<std::string> ov = {"run.dir=" + q(dir_.file(l.name)), "train.device=\"cuda\"", "parallel.comm=\"mpi\"",
                                   "model.n_head=4", "train.micro_batches=2"};
    ov.insert(ov.end(), l.set.begin(), l.set.end());
    RunResult r = train(l.ranks, g.config, ov);
    ASSERT_EQ(r.exit_code, 0) << l.name << "\n" << r.output;
    expect_close(read_losses(dir_.file(l.name)), read_losses(dir_.file("z1")), l.name + " on the GPU");
    expect_same_tensors(read_checkpoint(ckpt(l.name, 6)), read_checkpoint(ckpt("z1", 6)), 1e-5, l.name + " tensors");
  }
  // bf16 (gathered in bf16; gradients reduced in fp32, or in bf16 with parallel.grad_reduce = "bf16"): ZeRO-2 and
  // ZeRO-3 equal ZeRO-1 on the same layout and reduction (one micro-batch, so every stage reduces the same sums, and
  // two ranks: a sum of two is the same in any order).
  for (std::string reduce : {"fp32", "bf16"}) {
    auto bf16_run = [&](const std::string& name, const std::string& zero) {
      RunResult r = train(2, g.config, {"run.dir=" + q(dir_.file(name)), "train.device=\"cuda\"", "parallel.comm=\"mpi\"",
                                        "model.n_head=4", "train.micro_batches=1", "parallel.dp=2",
                                        "train.precision=\"bf16\"", "parallel.grad_reduce=" + q(reduce),
                                        "model.tie_embeddings=false", "optimizer.zero=" + zero});
      EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    };
    const std::string z1 = "bf16_" + reduce + "_zero1";
    bf16_run(z1, "1");
    for (std::string zero : {"2", "3"}) {
      const std::string name = "bf16_" + reduce + "_zero" + zero;
      bf16_run(name, zero);
      // fp32 reduction: today's 1e-5. bf16 reduction rounds each gradient to bf16 before the sum, so a last-bit
      // difference of the float32 gradients (cuBLASLt picks kernels by the operands' alignment, and ZeRO-3's gathered
      // weights live elsewhere than ZeRO-1's) can become one bf16 step (2^-8) of that gradient where it meets a
      // rounding boundary, and AdamW then moves that element by up to lr x 2^-8 differently per step: compared at 5
      // steps x lr x 2^-8. Untied embeddings, as in test_zero_mpi: with them tied, ZeRO-3's per-block reduction rounds
      // the embedding's and the head's contributions to bf16 separately, ZeRO-1 their sum once (on an H200 a c_fc
      // weight ended 6.7e-5 apart).
      if (reduce == "fp32") {
        expect_close(read_losses(dir_.file(name)), read_losses(dir_.file(z1)), name + " against ZeRO-1");
        expect_same_tensors(read_checkpoint(ckpt(name, 6)), read_checkpoint(ckpt(z1, 6)), 1e-5, name + " tensors");
        continue;
      }
      const auto a = read_losses(dir_.file(name)), b = read_losses(dir_.file(z1));
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(b[i])) << name << " step " << i + 1;
      const double lr = 0.002;
      expect_tensors_within(read_checkpoint(ckpt(name, 6)), read_checkpoint(ckpt(z1, 6)), 0.0, 5 * lr / 256,
                            name + " tensors");
    }
  }
}

// Context parallelism on device tensors (one GPU, so parallel.comm = "mpi"): cp = 2 cuts each sequence of 16 tokens
// into 4 chunks, each rank attends with its two chunks' queries at their positions to the gathered keys (the CUDA
// positioned attention, flash_attention_gqa_forward_at / _backward_at), and the key gradients are reduce-scattered.
// GPT and its Llama twin (grouped-query attention), with and without data.document_mask, equal the GPU's serial run
// in every loss and final tensor, with parallel.overlap (the default: the own rows' attention while the gathers travel,
// the two parts merged by kernels/cuda/attention_merge.cu) and without it (the gathers first).
TEST_F(GpuTraining, ContextParallelMatchesSerial) {
  Problem g = make_gpt_problem(dir_.path() + "/cp");
  write_documents(dir_.file("cp_docs.h5"));
  write_documents(dir_.file("cp_docs_eval.h5"), 8, 1025);
  const std::vector<std::string> llama = {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8",
                                          "model.n_kv_head=4", "model.ffn_hidden=48"};
  const std::vector<std::string> docs = {"data.train=" + q(dir_.file("cp_docs.h5")),
                                         "data.eval=" + q(dir_.file("cp_docs_eval.h5")), "data.document_mask=true"};
  for (bool is_llama : {false, true})
    for (bool masked : {false, true}) {
      const std::string m = std::string(is_llama ? "llama" : "gpt") + (masked ? "_docs" : "");
      auto run = [&](int ranks, const std::string& name, std::vector<std::string> extra) {
        std::vector<std::string> ov = {"run.dir=" + q(dir_.file(name)), "train.device=\"cuda\""};
        if (is_llama) ov.insert(ov.end(), llama.begin(), llama.end());
        if (masked) ov.insert(ov.end(), docs.begin(), docs.end());
        ov.insert(ov.end(), extra.begin(), extra.end());
        RunResult r = train(ranks, g.config, ov);
        EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
        return r;
      };
      run(1, m + "_serial", {});
      RunResult r = run(2, m + "_cp2", {"parallel.comm=\"mpi\"", "parallel.cp=2"});
      EXPECT_TRUE(contains(r.output, "context parallelism: each sequence of 16 tokens is cut into 4 chunks")) << r.output;
      expect_close(read_losses(dir_.file(m + "_cp2")), read_losses(dir_.file(m + "_serial")), m + " cp2 on the GPU");
      expect_same_tensors(read_checkpoint(ckpt(m + "_cp2", 6)), read_checkpoint(ckpt(m + "_serial", 6)), 1e-5,
                          m + " cp2 tensors");
      run(2, m + "_cp2_no_overlap", {"parallel.comm=\"mpi\"", "parallel.cp=2", "parallel.overlap=false"});
      expect_close(read_losses(dir_.file(m + "_cp2_no_overlap")), read_losses(dir_.file(m + "_serial")),
                   m + " cp2 without overlap on the GPU");
      expect_same_tensors(read_checkpoint(ckpt(m + "_cp2_no_overlap", 6)), read_checkpoint(ckpt(m + "_serial", 6)),
                          1e-5, m + " cp2 tensors without overlap");
      if (!masked) continue;
      // bf16 (the positioned kernels on bf16 tensors, the exchanges in bf16): cp 2 tracks the bf16 serial run and
      // both track fp32 within 1%, as bf16 does elsewhere.
      run(1, m + "_serial_bf16", {"train.precision=\"bf16\""});
      run(2, m + "_cp2_bf16", {"parallel.comm=\"mpi\"", "parallel.cp=2", "train.precision=\"bf16\""});
      const auto f = read_losses(dir_.file(m + "_serial")), sb = read_losses(dir_.file(m + "_serial_bf16")),
                 cb = read_losses(dir_.file(m + "_cp2_bf16"));
      ASSERT_EQ(sb.size(), f.size());
      ASSERT_EQ(cb.size(), f.size());
      for (size_t i = 0; i < f.size(); ++i) {
        EXPECT_NEAR(cb[i], sb[i], 1e-2 * sb[i]) << m << " cp2 bf16 against serial bf16, step " << i + 1;
        EXPECT_NEAR(sb[i], f[i], 1e-2 * f[i]) << m << " serial bf16 against fp32, step " << i + 1;
      }
    }
}

// Mixture of experts on the GPU (kernels/cuda/moe.cu): a 4-layer Mixtral (8 experts, top 2, aux and z losses, the
// equivalence test's seed-2 model) trained 6 steps on the GPU in fp32 equals the CPU's run, with and without the
// aux-loss-free expert bias: every loss within |a - b| <= 1e-6 + 1e-5 |b| (the dense models' bound), every step's tokens
// per expert equal (the same routing), the final tensors within 1e-5. Routing is discontinuous: the CPU run's smallest
// top-k margin (router_margin_min, ~9e-6 measured on the CPU for this seed, some 100 times the GPU-vs-CPU rounding of a
// router probability) is asserted above 1e-6 first, so a failure is never a near-tie. dp 2 x ep 2 with parallel.comm =
// "mpi" (two ranks share the GPU; rows staged through host memory in the all-to-alls) equals the GPU's serial run;
// bf16 tracks fp32 within 1e-2 relative (bf16 router logits and expert rows).
TEST_F(GpuTraining, MixtralMatchesCpuAndExpertParallelOnOneGpu) {
  Problem g = make_gpt_problem(dir_.path() + "/moe");
  const std::vector<std::string> mixtral = {
      "model.type=\"mixtral\"",       "model.seed=2",           "model.n_embd=32",
      "model.n_head=4",               "model.n_kv_head=2",      "model.n_experts=8",
      "model.experts_per_token=2",    "model.moe_ffn_hidden=24", "model.router_aux_loss_coef=0.01",
      "model.router_z_loss_coef=0.001"};
  auto run = [&](int ranks, const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> ov = mixtral;
    ov.push_back("run.dir=" + q(dir_.file(name)));
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, g.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir_.file(name);
  };
  // Each step's tokens per expert (metrics.jsonl's expert_load_max and expert_load_mean per MoE layer), as text to
  // compare exactly; and the run's smallest top-k margin.
  auto routing = [](const std::string& run_dir) {
    std::vector<std::string> steps;
    std::ifstream f(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) steps.push_back(j["expert_load_max"].dump() + " " + j["expert_load_mean"].dump());
    }
    return steps;
  };
  auto margin = [](const std::string& run_dir) {
    double m = INFINITY;
    std::ifstream f(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) m = std::min(m, j.value("router_margin_min", double(INFINITY)));
    }
    return m;
  };
  for (bool bias : {false, true}) {
    const std::string b = bias ? "_bias" : "";
    const std::vector<std::string> extra =
        bias ? std::vector<std::string>{"moe.expert_bias=true", "moe.bias_update_rate=0.005"} : std::vector<std::string>{};
    const std::string cpu = run(1, "moe_cpu" + b, extra);
    std::vector<std::string> on_gpu = extra;
    on_gpu.push_back("train.device=\"cuda\"");
    const std::string gpu = run(1, "moe_gpu" + b, on_gpu);
    if (HasFailure()) return;
    ASSERT_GT(margin(cpu), 1e-6) << "the CPU run routes a token on a near-tie; GPU and CPU may route it differently "
                                    "(choose another model.seed)";
    expect_close(read_losses(gpu), read_losses(cpu), "Mixtral" + b + " losses, GPU vs CPU");
    EXPECT_EQ(routing(gpu), routing(cpu)) << "Mixtral" + b + ": tokens per expert, GPU vs CPU";
    expect_same_tensors(read_checkpoint(ckpt("moe_gpu" + b, 6)), read_checkpoint(ckpt("moe_cpu" + b, 6)), 1e-5,
                        "Mixtral" + b + " tensors, GPU vs CPU");
  }
  const std::string ep = run(2, "moe_dp2_ep2", {"train.device=\"cuda\"", "parallel.comm=\"mpi\"", "parallel.dp=2",
                                                "parallel.ep=2", "train.micro_batches=2"});
  expect_close(read_losses(ep), read_losses(dir_.file("moe_gpu")), "Mixtral dp2 x ep2 on one GPU");
  EXPECT_EQ(routing(ep), routing(dir_.file("moe_gpu"))) << "Mixtral dp2 x ep2: tokens per expert";
  expect_tensors_within(read_checkpoint(ckpt("moe_dp2_ep2", 6)), read_checkpoint(ckpt("moe_gpu", 6)), 1e-5, 1e-6,
                        "Mixtral dp2 x ep2 against the GPU's serial run");
  const std::string bf = run(1, "moe_bf16", {"train.device=\"cuda\"", "train.precision=\"bf16\""});
  const auto lb = read_losses(bf), lf = read_losses(dir_.file("moe_gpu"));
  ASSERT_EQ(lb.size(), lf.size());
  for (size_t i = 0; i < lb.size(); ++i) EXPECT_NEAR(lb[i], lf[i], 1e-2 * lf[i]) << "Mixtral bf16 vs fp32 at step " << i + 1;
}

// DeepSeek-V3 on the GPU (issue 42's CUDA part; written without a GPU, first run by a GPU session): a 4-layer model
// with multi-head latent attention (query/key heads of 8 + 4 columns, value heads of 6: the CUDA FlashAttention with
// hd_v != hd), a dense first layer and three routed-expert layers (sigmoid scores, the correction bias updated every
// step, 8 experts in 4 groups with the best 2 kept, top 2, one shared expert, routed scaling 2.5: the CUDA group
// router), and one multi-token prediction module, trained 6 steps on the GPU in fp32, equals the CPU's run as the
// Mixtral case does (losses, tokens per expert, final tensors; the CPU run's smallest routing margin asserted above
// 1e-6 first, so a failure is never a near-tie: model.seed 6 gives 3.9e-6 on the CPU, seeds 1, 3, 5, 7 less than
// 1e-6, sigmoid scores near 0.5 being close together at initialisation); greedy generation over MLA's latent cache (the CUDA absorbed decode)
// gives the CPU's tokens. With data.document_mask, the GPU's serial run equals the CPU's, and cp 2 on one GPU (the
// positioned attention and the overlap's merge with value heads narrower than the keys) equals the GPU's serial run.
TEST_F(GpuTraining, DeepseekV3MatchesCpuContextParallelAndGeneration) {
  Problem g = make_gpt_problem(dir_.path() + "/deepseek");
  write_documents(dir_.file("ds_docs.h5"));
  write_documents(dir_.file("ds_docs_eval.h5"), 8, 1025);
  const std::vector<std::string> deepseek = {
      "model.type=\"deepseek_v3\"",  "model.seed=6",              "model.n_embd=32",           "model.n_head=4",
      "model.ffn_hidden=48",         "model.q_lora_rank=24",      "model.kv_lora_rank=16",
      "model.qk_nope_head_dim=8",    "model.qk_rope_head_dim=4",  "model.v_head_dim=6",
      "model.rope_theta=500.0",      "model.norm_eps=1e-6",       "model.first_k_dense_replace=1",
      "model.n_routed_experts=8",    "model.num_experts_per_tok=2", "model.n_group=4",
      "model.topk_group=2",          "model.moe_intermediate_size=16", "model.n_shared_experts=1",
      "model.routed_scaling_factor=2.5", "model.router_aux_loss_coef=0.01", "moe.expert_bias=true",
      "moe.bias_update_rate=0.001"};
  const std::vector<std::string> docs = {"data.train=" + q(dir_.file("ds_docs.h5")),
                                         "data.eval=" + q(dir_.file("ds_docs_eval.h5")), "data.document_mask=true"};
  auto run = [&](int ranks, const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> ov = deepseek;
    ov.push_back("run.dir=" + q(dir_.file(name)));
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, g.config, ov);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    return dir_.file(name);
  };
  auto metrics = [](const std::string& run_dir, bool margins) {  // tokens per expert per step, or the smallest margin
    std::vector<std::string> steps;
    double m = INFINITY;
    std::ifstream f(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("loss")) continue;
      steps.push_back(j["expert_load_max"].dump() + " " + j["expert_load_mean"].dump());
      m = std::min(m, j.value("router_margin_min", double(INFINITY)));
    }
    return std::make_pair(steps, m);
  };
  const std::string cpu = run(1, "ds_cpu", {"model.num_mtp_layers=1"});
  const std::string gpu = run(1, "ds_gpu", {"model.num_mtp_layers=1", "train.device=\"cuda\""});
  if (HasFailure()) return;
  ASSERT_GT(metrics(cpu, true).second, 1e-6) << "the CPU run routes a token on a near-tie; GPU and CPU may route it "
                                                "differently (choose another model.seed)";
  expect_close(read_losses(gpu), read_losses(cpu), "DeepSeek-V3 losses, GPU vs CPU");
  EXPECT_EQ(metrics(gpu, false).first, metrics(cpu, false).first) << "DeepSeek-V3: tokens per expert, GPU vs CPU";
  expect_same_tensors(read_checkpoint(ckpt("ds_gpu", 6)), read_checkpoint(ckpt("ds_cpu", 6)), 1e-5,
                      "DeepSeek-V3 tensors, GPU vs CPU");
  RunResult gen = run_command("echo 1 2 3 | " + relay_binary() + " generate --device cuda --checkpoint " +
                              ckpt("ds_gpu", 6) + " --prompt-tokens /dev/stdin --max-new-tokens 8 --temperature 0");
  RunResult gen_cpu = run_command("echo 1 2 3 | " + relay_binary() + " generate --device cpu --checkpoint " +
                                  ckpt("ds_gpu", 6) + " --prompt-tokens /dev/stdin --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_EQ(gen.output, gen_cpu.output) << "DeepSeek-V3 greedy tokens on the GPU and the CPU";

  const std::string cpu_docs = run(1, "ds_cpu_docs", docs);
  std::vector<std::string> on_gpu = docs;
  on_gpu.push_back("train.device=\"cuda\"");
  const std::string gpu_docs = run(1, "ds_gpu_docs", on_gpu);
  on_gpu.insert(on_gpu.end(), {"parallel.comm=\"mpi\"", "parallel.cp=2"});
  const std::string cp2 = run(2, "ds_gpu_docs_cp2", on_gpu);
  if (HasFailure()) return;
  ASSERT_GT(metrics(cpu_docs, true).second, 1e-6) << "the document-masked CPU run routes a token on a near-tie";
  expect_close(read_losses(gpu_docs), read_losses(cpu_docs), "DeepSeek-V3 document-masked losses, GPU vs CPU");
  expect_same_tensors(read_checkpoint(ckpt("ds_gpu_docs", 6)), read_checkpoint(ckpt("ds_cpu_docs", 6)), 1e-5,
                      "DeepSeek-V3 document-masked tensors, GPU vs CPU");
  expect_close(read_losses(cp2), read_losses(gpu_docs), "DeepSeek-V3 cp2 on the GPU");
  expect_same_tensors(read_checkpoint(ckpt("ds_gpu_docs_cp2", 6)), read_checkpoint(ckpt("ds_gpu_docs", 6)), 1e-5,
                      "DeepSeek-V3 cp2 tensors on the GPU");
}

// FP8 training on the GPU (issue 43's CUDA part: cuBLASLt's FP8 GEMMs, the quantisation kernels): the small GPT of
// test_fp8_training_mpi (n_embd 16: every linear width a multiple of 16, 256 tokens a micro-batch, so tensorwise
// GEMMs run on cuBLASLt on sm_89+ and blockwise ones on sm_90) under each recipe tracks the CPU's fp8 run, the exact
// emulation: every step's loss within 1% of the CPU's (the bf16-vs-fp32 bound above: the GPU sums in other orders,
// Hopper's FP8 MMA keeps ~14 bits within a k interval, and a code that rounds the other way moves a product by an
// e4m3 ulp, 2^-3 of it, so the runs drift apart as bf16 runs do). Two GPU runs are bitwise equal (Relay's CUDA
// kernels use no floating-point atomics; the amax is an integer atomicMax; cuBLASLt keeps its algorithm per shape).
TEST_F(GpuTraining, GptFp8MatchesCpuFp8AndIsDeterministic) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  Problem g = make_gpt_problem(dir_.path() + "/gptfp8", 40001, 61, 32);
  for (const std::string recipe : {"tensorwise", "blockwise"}) {
    auto run = [&](const std::string& name, const std::string& device) {
      RunResult r = train(1, g.config, {"run.dir=" + q(dir_.file(name)), "train.device=" + q(device),
                                        "train.precision=\"fp8\"", "train.fp8_recipe=" + q(recipe)});
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return r;
    };
    run(recipe + "_cpu", "cpu");
    const RunResult gpu = run(recipe + "_gpu", "cuda");
    EXPECT_NE(gpu.output.find("relay: note: the CUDA FP8 path"), std::string::npos) << gpu.output;
    run(recipe + "_gpu2", "cuda");
    const auto c = read_losses(dir_.file(recipe + "_cpu")), a = read_losses(dir_.file(recipe + "_gpu")),
               b = read_losses(dir_.file(recipe + "_gpu2"));
    ASSERT_EQ(a.size(), c.size()) << recipe;
    ASSERT_EQ(a.size(), 6u) << recipe;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], c[i], 1e-2 * c[i]) << "GPT fp8 " << recipe << ", GPU vs CPU at step " << i + 1;
      EXPECT_EQ(a[i], b[i]) << "GPT fp8 " << recipe << ", two GPU runs at step " << i + 1;
    }
    std::printf("GPT fp8 %s: last loss GPU %.6f, CPU %.6f (relative %.2e)\n", recipe.c_str(), a.back(), c.back(),
                std::abs(a.back() - c.back()) / c.back());
  }
}

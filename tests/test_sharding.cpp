// Data parallelism's sharding description (parallel/sharding.hpp) over a table of (ZeRO stage, pp, ep, replicas):
// what each gradient group shards and every move it makes (collective, group, when issued, what waits for it, how
// often), the bytes against the elements and dtypes, the ZeRO paper's communication volumes (Rajbhandari et al.,
// arXiv:1910.02054, section 7: stages 1 and 2 move what plain data parallelism does, stage 3 1.5x), and relay plan's
// lines. And the gradient bucket layout (parallel/data_parallel.hpp layout_buckets): reverse block order, a block
// never split, a small first bucket per run (parallel.first_bucket_mb).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/sharding.hpp"

namespace relay {
namespace {

constexpr int kMicroBatches = 4;
constexpr double kDense = 1000, kExpert = 600;  // elements of each group on the rank

struct Expect {
  GradGroup group;
  Moved what;
  Collective collective;
  Issued issued;
  Needed needed;
  int per_step;
  int ranks;
};
struct States {
  bool parameters, gradients, optimizer_state;
};
struct Row {
  const char* why;
  int zero, pp, ep, replicas;
  bool reshard;
  States dense, expert;
  GradHold dense_grads;
  std::vector<Expect> moves;  // in the description's order
};

constexpr GradGroup D = GradGroup::dense, E = GradGroup::expert;
constexpr Moved G = Moved::gradients, P = Moved::parameters;
constexpr Collective AR = Collective::all_reduce, RS = Collective::reduce_scatter, AG = Collective::all_gather;
constexpr States kNone{false, false, false}, kState{false, false, true}, kGrads{false, true, true},
    kAll{true, true, true};
constexpr int m = kMicroBatches;

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {"ZeRO-0 all-reduces the gradients at allreduce_grads, nothing else", 0, 1, 1, 4, true, kNone, kNone,
       GradHold::buckets, {{D, G, AR, Issued::allreduce_grads, Needed::optimizer, 1, 4}}},
      {"one replica moves nothing, whatever the stage", 3, 1, 1, 1, true, kNone, kNone, GradHold::buckets, {}},
      {"ZeRO-0 under pp > 1 as on one stage", 0, 4, 1, 2, true, kNone, kNone, GradHold::buckets,
       {{D, G, AR, Issued::allreduce_grads, Needed::optimizer, 1, 2}}},
      {"ZeRO-1 reduce-scatters the gradients and all-gathers the parameters after the optimizer", 1, 1, 1, 4, true,
       kState, kState, GradHold::buckets,
       {{D, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 4},
        {D, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 4}}},
      {"ZeRO-1 under pp > 1 as on one stage", 1, 2, 1, 8, true, kState, kState, GradHold::buckets,
       {{D, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 8},
        {D, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 8}}},
      {"ZeRO-2 reduce-scatters each bucket in the backward, every micro-batch", 2, 1, 1, 4, true, kGrads, kGrads,
       GradHold::pooled,
       {{D, G, RS, Issued::bucket_done, Needed::optimizer, m, 4},
        {D, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 4}}},
      {"ZeRO-2 under pp > 1 still per bucket and micro-batch", 2, 2, 1, 4, true, kGrads, kGrads, GradHold::pooled,
       {{D, G, RS, Issued::bucket_done, Needed::optimizer, m, 4},
        {D, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 4}}},
      {"ZeRO-3 on one stage gathers before each block's forward and backward", 3, 1, 1, 4, true, kAll, kAll,
       GradHold::pooled,
       {{D, P, AG, Issued::block_run, Needed::block_run, 2 * m, 4},
        {D, G, RS, Issued::bucket_done, Needed::optimizer, m, 4}}},
      {"ZeRO-3 without reshard keeps a block gathered from its first forward", 3, 1, 1, 4, false, kAll, kAll,
       GradHold::pooled,
       {{D, P, AG, Issued::block_first_run, Needed::block_run, 1, 4},
        {D, G, RS, Issued::bucket_done, Needed::optimizer, m, 4}}},
      {"ZeRO-3 under pp > 1 gathers once a step and reduce-scatters whole buckets once", 3, 2, 1, 4, true, kAll, kAll,
       GradHold::step_buckets,
       {{D, P, AG, Issued::block_first_run, Needed::block_run, 1, 4},
        {D, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 4}}},
      {"ep 2 of 4 replicas: the experts over their 2 copies", 1, 1, 2, 4, true, kState, kState, GradHold::buckets,
       {{D, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 4},
        {D, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 4},
        {E, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 2},
        {E, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 2}}},
      {"ep = dp: the experts have no other copy and move nothing", 2, 1, 4, 4, true, kGrads, kNone, GradHold::pooled,
       {{D, G, RS, Issued::bucket_done, Needed::optimizer, m, 4},
        {D, P, AG, Issued::after_optimizer, Needed::next_forward, 1, 4}}},
      {"ep = dp at ZeRO-0: the dense all-reduce only", 0, 1, 4, 4, true, kNone, kNone, GradHold::buckets,
       {{D, G, AR, Issued::allreduce_grads, Needed::optimizer, 1, 4}}},
      {"ZeRO-0 with experts: each group all-reduced over its ranks", 0, 1, 2, 8, true, kNone, kNone,
       GradHold::buckets,
       {{D, G, AR, Issued::allreduce_grads, Needed::optimizer, 1, 8},
        {E, G, AR, Issued::allreduce_grads, Needed::optimizer, 1, 4}}},
      {"ZeRO-3 under pp > 1 with experts over their copies", 3, 2, 2, 4, true, kAll, kAll, GradHold::step_buckets,
       {{D, P, AG, Issued::block_first_run, Needed::block_run, 1, 4},
        {D, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 4},
        {E, P, AG, Issued::block_first_run, Needed::block_run, 1, 2},
        {E, G, RS, Issued::allreduce_grads, Needed::optimizer, 1, 2}}},
  };
  return rows;
}

ShardingInput input(int zero, int pp, int ep, int replicas, bool reshard = true, DType wire = DType::f32,
                    DType work = DType::f32) {
  ShardingInput in;
  in.zero = zero;
  in.pp = pp;
  in.ep = ep;
  in.replicas = replicas;
  in.micro_batches = kMicroBatches;
  in.dense_elements = kDense;
  in.expert_elements = ep > 1 ? kExpert : 0;
  in.wire = wire;
  in.work = work;
  in.reshard_after_forward = reshard;
  return in;
}

void expect_states(const GroupSharding& g, const States& s, const std::string& where) {
  EXPECT_EQ(g.parameters, s.parameters) << where << ": parameters sharded";
  EXPECT_EQ(g.gradients, s.gradients) << where << ": gradients sharded";
  EXPECT_EQ(g.optimizer_state, s.optimizer_state) << where << ": optimizer state sharded";
}

TEST(Sharding, EveryRowOfTheTable) {
  for (const Row& r : table()) {
    SCOPED_TRACE(cat(r.why, " (ZeRO-", r.zero, ", pp ", r.pp, ", ep ", r.ep, ", replicas ", r.replicas, ")"));
    const Sharding s = describe_sharding(input(r.zero, r.pp, r.ep, r.replicas, r.reshard));
    ASSERT_EQ(s.groups.size(), 2u);
    expect_states(s.group(D), r.dense, "dense");
    expect_states(s.group(E), r.expert, "expert");
    EXPECT_EQ(s.group(D).grads, r.dense_grads);
    EXPECT_EQ(s.group(D).ranks, r.replicas);
    EXPECT_EQ(s.group(E).ranks, r.replicas / r.ep);
    ASSERT_EQ(s.moves.size(), r.moves.size());
    for (size_t k = 0; k < r.moves.size(); ++k) {
      const Move& got = s.moves[k];
      const Expect& want = r.moves[k];
      SCOPED_TRACE(cat("move ", k));
      EXPECT_EQ(got.group, want.group);
      EXPECT_EQ(got.what, want.what);
      EXPECT_EQ(got.collective, want.collective);
      EXPECT_EQ(got.issued, want.issued);
      EXPECT_EQ(got.needed, want.needed);
      EXPECT_EQ(got.per_step, want.per_step);
      EXPECT_EQ(got.ranks, want.ranks);
    }
  }
}

// Over every stage, pp, ep and replica count: a move goes over its group's ranks (more than one), a group with no
// other copy is kept whole and moves nothing, the stage's sharding only grows with the stage, and every group's
// gradients are summed exactly once, before the optimizer.
TEST(Sharding, InvariantsOverASweep) {
  for (int zero = 0; zero <= 3; ++zero)
    for (int pp : {1, 2, 4})
      for (int replicas : {1, 2, 4, 8})
        for (int ep : {1, 2, 4, 8}) {
          if (replicas % ep) continue;
          for (bool reshard : {true, false}) {
            SCOPED_TRACE(cat("ZeRO-", zero, ", pp ", pp, ", ep ", ep, ", replicas ", replicas, ", reshard ", reshard));
            const Sharding s = describe_sharding(input(zero, pp, ep, replicas, reshard));
            for (const GroupSharding& g : s.groups) {
              EXPECT_EQ(g.stage, g.ranks > 1 ? zero : 0);
              EXPECT_LE(g.parameters, g.gradients);
              EXPECT_LE(g.gradients, g.optimizer_state);
              EXPECT_EQ(g.shards(), g.optimizer_state ? g.ranks : 1);
              int sums = 0;
              for (const Move& mv : s.moves)
                if (mv.group == g.group && mv.what == Moved::gradients) {
                  ++sums;
                  EXPECT_EQ(mv.needed, Needed::optimizer);
                  EXPECT_NE(mv.collective, Collective::all_gather);
                }
              const bool moves = g.ranks > 1 && (g.group == GradGroup::dense || ep > 1);
              EXPECT_EQ(sums, moves ? 1 : 0) << (g.group == GradGroup::dense ? "dense" : "expert");
            }
            for (const Move& mv : s.moves) {
              EXPECT_GT(mv.ranks, 1);
              EXPECT_EQ(mv.ranks, s.group(mv.group).ranks);
              EXPECT_EQ(mv.what == Moved::parameters, mv.collective == Collective::all_gather);
            }
          }
        }
}

// Bytes: gradients travel in parallel.grad_reduce's dtype, ZeRO-1/2's updated parameters in fp32, ZeRO-3's gathers
// in the working dtype; each the group's elements, the experts' their own.
TEST(Sharding, BytesFollowTheElementsAndDtypes) {
  {
    const Sharding s = describe_sharding(input(1, 1, 2, 4, true, DType::bf16, DType::bf16));
    EXPECT_DOUBLE_EQ(s.find(D, G)->bytes, 2 * kDense);
    EXPECT_EQ(s.find(D, G)->dtype, DType::bf16);
    EXPECT_DOUBLE_EQ(s.find(D, P)->bytes, 4 * kDense);  // the f32 values the optimizer updated
    EXPECT_DOUBLE_EQ(s.find(E, G)->bytes, 2 * kExpert);
    EXPECT_DOUBLE_EQ(s.find(E, P)->bytes, 4 * kExpert);
  }
  {
    const Sharding s = describe_sharding(input(3, 1, 1, 4, true, DType::f32, DType::bf16));
    EXPECT_DOUBLE_EQ(s.find(D, P)->bytes, 2 * kDense);  // gathered in bf16 working copies
    EXPECT_EQ(s.find(D, P)->dtype, DType::bf16);
    EXPECT_DOUBLE_EQ(s.find(D, G)->bytes, 4 * kDense);
    EXPECT_EQ(s.find(E, G), nullptr);  // ep 1: no expert group moves
  }
  {  // parallel.fp8_param_gather: the dense weights' gathers as e4m3 codes, half the bf16 bytes; experts' still bf16
    ShardingInput in = input(3, 1, 2, 4, true, DType::f32, DType::bf16);
    const Sharding bf16 = describe_sharding(in);
    in.fp8_param_gather = true;
    const Sharding s = describe_sharding(in);
    EXPECT_DOUBLE_EQ(s.find(D, P)->bytes, 1 * kDense);
    EXPECT_DOUBLE_EQ(s.find(D, P)->bytes, bf16.find(D, P)->bytes / 2);
    EXPECT_DOUBLE_EQ(s.find(D, P)->sent(), bf16.find(D, P)->sent() / 2);
    EXPECT_EQ(s.find(D, P)->dtype, DType::fp8_e4m3);
    EXPECT_DOUBLE_EQ(s.find(E, P)->bytes, 2 * kExpert);
    EXPECT_DOUBLE_EQ(s.find(D, G)->bytes, bf16.find(D, G)->bytes);  // gradients unchanged
    EXPECT_NE(render_sharding(s).find("(fp8 e4m3 codes, a scale per weight)"), std::string::npos) << render_sharding(s);
  }
}

// Ring volumes: an all-reduce sends 2 (r - 1) / r of its buffer, reduce-scatter and all-gather (r - 1) / r. ZeRO-1 and 2
// (one micro-batch, fp32) send what ZeRO-0's all-reduce does; ZeRO-3 one and a half times that (two gathers and a
// reduce-scatter of every parameter), as the ZeRO paper counts (arXiv:1910.02054, section 7).
TEST(Sharding, CommunicationVolumesMatchTheZeroPaper) {
  auto sent = [](int zero) {
    ShardingInput in = input(zero, 1, 1, 8);
    in.micro_batches = 1;
    double total = 0;
    for (const Move& mv : describe_sharding(in).moves) total += mv.sent();
    return total;
  };
  const double zero0 = 2.0 * 7 / 8 * 4 * kDense;
  EXPECT_DOUBLE_EQ(sent(0), zero0);
  EXPECT_DOUBLE_EQ(sent(1), zero0);
  EXPECT_DOUBLE_EQ(sent(2), zero0);
  EXPECT_DOUBLE_EQ(sent(3), 1.5 * zero0);
  // Per micro-batch moves count each time: ZeRO-2's reduce-scatter m times.
  const Sharding z2 = describe_sharding(input(2, 1, 1, 8));
  EXPECT_DOUBLE_EQ(z2.find(D, G)->sent(), double(kMicroBatches) * 7 / 8 * 4 * kDense);
}

TEST(Sharding, InputFromTheConfig) {
  Config cfg;
  cfg.optimizer.zero = 2;
  cfg.parallel.dp = 4;
  cfg.parallel.cp = 2;
  cfg.parallel.ep = 2;
  cfg.parallel.pp = 3;
  cfg.parallel.grad_reduce = GradReduce::bf16;
  cfg.parallel.reshard_after_forward = false;
  cfg.train.micro_batches = 6;
  cfg.train.precision = Precision::bf16;
  const ShardingInput in = sharding_input(cfg);
  EXPECT_EQ(in.zero, 2);
  EXPECT_EQ(in.replicas, 8);  // dp x cp
  EXPECT_EQ(in.ep, 2);
  EXPECT_EQ(in.pp, 3);
  EXPECT_EQ(in.micro_batches, 6);
  EXPECT_EQ(in.wire, DType::bf16);
  EXPECT_EQ(in.work, DType::bf16);
  EXPECT_FALSE(in.reshard_after_forward);
  EXPECT_EQ(describe_sharding(in).group(GradGroup::expert).ranks, 4);  // dp x cp / ep
}

// relay plan's lines: each group's sharded states and each move with when it is issued and what waits for it.
TEST(Sharding, RenderedAsThePlansLines) {
  const std::string z2 = render_sharding(describe_sharding(input(2, 1, 4, 4)));
  EXPECT_NE(z2.find("dense weights"), std::string::npos) << z2;
  EXPECT_NE(z2.find("ZeRO-2: gradients and optimizer state sharded (1/4 each)"), std::string::npos) << z2;
  EXPECT_NE(z2.find("gradients: reduce-scatter of"), std::string::npos) << z2;
  EXPECT_NE(z2.find(issued_text(Issued::bucket_done)), std::string::npos) << z2;
  EXPECT_NE(z2.find("needed by the optimizer"), std::string::npos) << z2;
  EXPECT_NE(z2.find("parameters: all-gather of"), std::string::npos) << z2;
  EXPECT_NE(z2.find("needed by the next step's first forward"), std::string::npos) << z2;
  EXPECT_NE(z2.find("expert weights: "), std::string::npos) << z2;
  EXPECT_NE(z2.find("no other copy"), std::string::npos) << z2;
  EXPECT_NE(z2.find("in all: "), std::string::npos) << z2;
  const std::string z0 = render_sharding(describe_sharding(input(0, 1, 1, 2)));
  EXPECT_NE(z0.find("ZeRO-0: nothing sharded\n"), std::string::npos) << z0;
  EXPECT_EQ(z0.find("expert"), std::string::npos) << z0;  // ep 1: no expert group to print
  EXPECT_EQ(z0.find("in all"), std::string::npos) << z0;  // one move: its own figure says it
  const std::string z3 = render_sharding(describe_sharding(input(3, 1, 1, 2)));
  EXPECT_NE(z3.find("(8 a step)"), std::string::npos) << z3;  // 2 x 4 micro-batches of gathers
  EXPECT_NE(z3.find("needed by the block's run"), std::string::npos) << z3;
}

// The buckets as lists of block indices (each key here is one block's parameters).
std::vector<std::vector<int>> bucket_blocks(const std::vector<BucketKey>& keys, BucketCaps caps) {
  std::vector<std::vector<int>> out;
  for (const auto& g : layout_buckets(keys, caps, 2).groups) {
    out.emplace_back();
    for (size_t i : g) out.back().push_back(keys[i].block);
  }
  return out;
}

TEST(BucketLayout, FirstBucketIsSmallThenBucketMb) {
  std::vector<BucketKey> keys;
  for (int b = 0; b < 6; ++b) keys.push_back({100000, 0, b});  // 6 blocks of 400 KB, chunk 0
  using B = std::vector<std::vector<int>>;
  // 1 MiB buckets (262144 f32), reverse block order, a bucket closed once it holds 1 MiB or more.
  EXPECT_EQ(bucket_blocks(keys, {1.0}), (B{{5, 4, 3}, {2, 1, 0}}));
  // A 0.2 MiB first bucket: the last block alone (a block is never split), then 1 MiB ones.
  EXPECT_EQ(bucket_blocks(keys, {1.0, 0.2}), (B{{5}, {4, 3, 2}, {1, 0}}));
  // A first bucket larger than the others is capped at bucket_mb; 0 (ZeRO-3): a bucket per block.
  EXPECT_EQ(bucket_blocks(keys, {1.0, 8.0}), (B{{5, 4, 3}, {2, 1, 0}}));
  EXPECT_EQ(bucket_blocks(keys, {0.0, 1.0}), (B{{5}, {4}, {3}, {2}, {1}, {0}}));
  // Each chunk's run starts with its own small bucket.
  for (int b = 0; b < 3; ++b) keys.push_back({100000, 1, 6 + b});
  EXPECT_EQ(bucket_blocks(keys, {1.0, 0.2}), (B{{5}, {4, 3, 2}, {1, 0}, {8}, {7, 6}}));
}

}  // namespace
}  // namespace relay

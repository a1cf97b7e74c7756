// The MPI reduce-scatter's local sum (src/comm/reduce_scatter.hpp): the pieces added in libnbc's binomial grouping,
// round r adding member i + 2^(r-1)'s partial sum into member i's, so that the results are Open MPI's non-blocking
// reduce-scatter's bit for bit. Values are chosen so that another grouping gives other bits.
#include <gtest/gtest.h>

#include <vector>

#include "comm/host_pool.hpp"
#include "comm/reduce_scatter.hpp"
#include "core/bf16.hpp"

using namespace relay;

namespace {
// size pieces of one element each -> their sum as sum_pieces forms it.
float summed(std::vector<float> pieces) {
  float out = 0;
  sum_pieces(pieces.data(), &out, int(pieces.size()), 1, DType::f32);
  return out;
}
}  // namespace

TEST(ReduceScatterSum, FourPiecesPairwise) {
  const float a = 1e8f, b = 1.f, c = -1e8f, d = 1.f;
  const float tree = (a + b) + (c + d), left = ((a + b) + c) + d;
  ASSERT_NE(tree, left);  // the grouping shows in the bits
  EXPECT_EQ(summed({a, b, c, d}), tree);
}

TEST(ReduceScatterSum, ThreeAndFivePieces) {
  const float a = 1e8f, b = 1.f, c = -1e8f, d = 1.f, e = 3.f;
  EXPECT_EQ(summed({a, b, c}), (a + b) + c);
  const float tree5 = ((a + b) + (c + d)) + e;
  EXPECT_EQ(summed({a, b, c, d, e}), tree5);
  EXPECT_EQ(summed({7.f}), 7.f);
}

TEST(ReduceScatterSum, Bf16RoundsAfterEveryAddition) {
  // bf16 values are 2 apart between 256 and 512: 256 + 1 rounds back to 256, so a left-to-right sum of 256, 1, 1, 1
  // stays 256, while the tree's (256 + 1) + (1 + 1) is 258.
  std::vector<bf16> p = {f32_to_bf16(256.f), f32_to_bf16(1.f), f32_to_bf16(1.f), f32_to_bf16(1.f)};
  bf16 out;
  sum_pieces(p.data(), &out, 4, 1, DType::bf16);
  EXPECT_EQ(bf16_to_f32(out), 258.f);
}

TEST(ReduceScatterSum, BlocksOfManyElements) {
  const int size = 3;
  const int64_t n = 5;
  std::vector<float> pieces(size * n), out(n);
  for (int i = 0; i < size; ++i)
    for (int64_t k = 0; k < n; ++k) pieces[size_t(i * n + k)] = float(i * 10 + k);
  sum_pieces(pieces.data(), out.data(), size, n, DType::f32);
  for (int64_t k = 0; k < n; ++k) EXPECT_EQ(out[size_t(k)], float(k) + float(10 + k) + float(20 + k));
}

// The reduce-scatter's pieces come from comm/host_pool.hpp: a returned block of a size is handed out again for that
// size (its pages already faulted in), another size gets a new block, and idle blocks stay under the allowance.
TEST(HostPool, ReturnsTheSameBlockForTheSameSize) {
  const size_t base = HostPool::idle_bytes();
  std::byte* first = nullptr;
  {
    HostPool::Block b = HostPool::take(3 << 20);
    first = b.get();
    first[0] = std::byte{7};
  }
  EXPECT_EQ(HostPool::idle_bytes(), base + (3 << 20));
  HostPool::Block other = HostPool::take(5 << 20);
  EXPECT_NE(other.get(), first);
  HostPool::Block again = HostPool::take(3 << 20);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(again.get()[0], std::byte{7});  // not zeroed: the exchange overwrites it
  EXPECT_EQ(HostPool::idle_bytes(), base);
}

TEST(HostPool, KeepsAtMostItsAllowance) {
  {
    HostPool::Block a = HostPool::take(HostPool::kKeepBytes / 2 + 1);
    HostPool::Block b = HostPool::take(HostPool::kKeepBytes / 2 + 1);
  }  // b, then a returned: a's return frees b (the oldest) to fit
  EXPECT_LE(HostPool::idle_bytes(), HostPool::kKeepBytes);
  { HostPool::Block huge = HostPool::take(HostPool::kKeepBytes + 64); }  // larger than the allowance: freed
  EXPECT_LE(HostPool::idle_bytes(), HostPool::kKeepBytes);
}

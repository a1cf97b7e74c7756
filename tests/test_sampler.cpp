// The sampler (which samples each step uses) and the Prefetcher (which reads them in the background):
// the sampler against its definition, epoch by epoch; the Prefetcher against direct reads of a real
// HDF5 file, including a start in the middle of training and an error raised in its thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "io/dataset.hpp"
#include "io/hdf5_util.hpp"
#include "io/prefetcher.hpp"
#include "io/sampler.hpp"
#include "support/test_support.hpp"

namespace relay {
namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// The stream of sample indices, positions [0, count), straight from the definition.
std::vector<int64_t> reference_stream(const SamplerSpec& s, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < count; ++p) {
    const int64_t e = p / s.samples, o = p % s.samples;
    out.push_back(s.shuffle ? permutation(s.samples, s.seed, static_cast<uint64_t>(e))[o] : o);
  }
  return out;
}

TEST(Sampler, WithoutShuffleBatchesWalkTheFileInOrder) {
  const SamplerSpec s{10, 4, false, 0};
  for (int64_t k = 0; k < 12; ++k) {
    const std::vector<int64_t> batch = batch_samples(s, k, 0, 4);
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(batch[j], (k * 4 + j) % 10) << "step " << k << " j " << j;
  }
}

TEST(Sampler, ShuffledEpochIsAPermutationOfSeedAndEpoch) {
  const SamplerSpec s{37, 5, true, 99};  // B does not divide N: batches straddle epochs
  const int64_t epochs = 4, steps = epochs * 37 / 5;
  std::vector<int64_t> stream;
  for (int64_t k = 0; k < steps; ++k) {
    const std::vector<int64_t> b = batch_samples(s, k, 0, 5);
    stream.insert(stream.end(), b.begin(), b.end());
  }
  std::vector<std::vector<int64_t>> orders;
  for (int64_t e = 0; e < epochs - 1; ++e) {
    std::vector<int64_t> order(stream.begin() + e * 37, stream.begin() + (e + 1) * 37);
    EXPECT_EQ(order, permutation(37, 99, static_cast<uint64_t>(e))) << "epoch " << e;
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, iota(37)) << "epoch " << e << " must visit every sample once";
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  EXPECT_NE(orders[0], iota(37));
  // Another seed, another order; the same seed, the same order (a pure function).
  EXPECT_NE(batch_samples({37, 5, true, 100}, 0, 0, 5), batch_samples(s, 0, 0, 5));
  EXPECT_EQ(batch_samples({37, 5, true, 99}, 3, 0, 5), batch_samples(s, 3, 0, 5));
}

TEST(Sampler, BatchCrossingAnEpochBoundary) {
  const SamplerSpec s{10, 4, true, 3};
  const std::vector<int64_t> e0 = permutation(10, 3, 0), e1 = permutation(10, 3, 1);
  EXPECT_EQ(batch_samples(s, 2, 0, 4), (std::vector<int64_t>{e0[8], e0[9], e1[0], e1[1]}));
  // A batch larger than the data set spans several epochs.
  const SamplerSpec big{3, 8, true, 3};
  const std::vector<int64_t> stream = reference_stream(big, 16);
  EXPECT_EQ(batch_samples(big, 1, 0, 8), std::vector<int64_t>(stream.begin() + 8, stream.end()));
}

TEST(Sampler, ReplicaSlicesConcatenateToTheGlobalBatch) {
  for (bool shuffle : {false, true}) {
    const SamplerSpec s{23, 8, shuffle, 5};
    const std::vector<int64_t> stream = reference_stream(s, 8 * 20);
    for (int64_t k = 0; k < 20; ++k) {
      std::vector<int64_t> joined;
      for (auto [begin, count] : {std::pair{0, 3}, {3, 2}, {5, 3}}) {  // uneven slices, as dp = 3 gives
        const std::vector<int64_t> part = batch_samples(s, k, begin, count);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, batch_samples(s, k, 0, 8));
      EXPECT_EQ(joined, std::vector<int64_t>(stream.begin() + k * 8, stream.begin() + (k + 1) * 8)) << "step " << k;
    }
  }
}

TEST(Sampler, CachedSamplerMatchesThePureFunctionInAnyOrder) {
  const SamplerSpec s{50, 16, true, 8};
  Sampler sampler(s);
  std::vector<int64_t> out;
  for (int64_t k : {100, 0, 57, 3, 3, 4, 99, 1000, 2}) {
    sampler.batch(k, 4, 9, out);
    EXPECT_EQ(out, batch_samples(s, k, 4, 9)) << "step " << k;
  }
}

TEST(Sampler, RejectsBadArguments) {
  EXPECT_THROW(batch_samples({0, 4, false, 0}, 0, 0, 4), Error);
  EXPECT_THROW(batch_samples({10, 0, false, 0}, 0, 0, 0), Error);
  EXPECT_THROW(batch_samples({10, 4, false, 0}, 0, 2, 3), Error);
  EXPECT_THROW(batch_samples({10, 4, false, 0}, -1, 0, 4), Error);
  EXPECT_TRUE(batch_samples({10, 4, false, 0}, 0, 4, 0).empty());
}

// --- Prefetcher --------------------------------------------------------------------------------

// /inputs[i][j] = 10 i + j (N, D); /targets = class i % 4 (N), or dense (N, 2) = (i, -i).
void write_file(const std::string& path, int64_t n, int64_t d, bool dense) {
  Hdf5Lock lock;
  H5File file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(file);
  std::vector<float> x(n * d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) x[i * d + j] = static_cast<float>(10 * i + j);
  const hsize_t xd[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(d)};
  H5Space xs(H5Screate_simple(2, xd, nullptr));
  H5Dataset xset(H5Dcreate2(file.get(), "inputs", H5T_IEEE_F32LE, xs.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_GE(H5Dwrite(xset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), 0);
  if (dense) {
    std::vector<float> y;
    for (int64_t i = 0; i < n; ++i) y.insert(y.end(), {static_cast<float>(i), static_cast<float>(-i)});
    const hsize_t yd[2] = {static_cast<hsize_t>(n), 2};
    H5Space ys(H5Screate_simple(2, yd, nullptr));
    H5Dataset yset(H5Dcreate2(file.get(), "targets", H5T_IEEE_F32LE, ys.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(yset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data()), 0);
  } else {
    std::vector<int64_t> y(n);
    for (int64_t i = 0; i < n; ++i) y[i] = i % 4;
    const hsize_t yd[1] = {static_cast<hsize_t>(n)};
    H5Space ys(H5Screate_simple(1, yd, nullptr));
    H5Dataset yset(H5Dcreate2(file.get(), "targets", H5T_STD_I64LE, ys.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(yset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data()), 0);
  }
}

DatasetSpec spec_for(bool dense) {
  DatasetSpec s;
  s.features = 3;
  s.targets = dense ? TargetKind::dense : TargetKind::class_index;
  if (dense) s.target_dim = 2;
  else s.num_classes = 4;
  return s;
}

// Compares `steps` batches from a Prefetcher with reads done here.
void expect_prefetcher_matches(const Hdf5Dataset& data, const SamplerSpec& s, int64_t first_step, int64_t begin,
                               int64_t count, bool want_inputs, bool want_targets, int64_t steps) {
  Prefetcher prefetcher(data, s, first_step, begin, count, want_inputs, want_targets);
  const bool dense = data.target_kind() == TargetKind::dense;
  for (int64_t k = first_step; k < first_step + steps; ++k) {
    const HostBatch& b = prefetcher.next();
    ASSERT_EQ(b.step, k);
    const std::vector<int64_t> rows = batch_samples(s, k, begin, count);
    std::vector<float> x(count * data.features()), dy(count * data.target_dim());
    std::vector<int32_t> cy(count);
    data.read_inputs(rows, x.data());  // the prefetch thread reads the next step meanwhile
    if (dense) data.read_targets(rows, dy.data());
    else data.read_targets(rows, cy.data());
    EXPECT_EQ(b.inputs, want_inputs ? x : std::vector<float>{}) << "step " << k;
    EXPECT_EQ(b.class_targets, want_targets && !dense ? cy : std::vector<int32_t>{}) << "step " << k;
    EXPECT_EQ(b.dense_targets, want_targets && dense ? dy : std::vector<float>{}) << "step " << k;
  }
}

TEST(Prefetcher, YieldsTheDirectReads) {
  test::TempDir dir;
  for (bool dense : {false, true}) {
    const std::string path = dir.file(dense ? "dense.h5" : "class.h5");
    write_file(path, 23, 3, dense);
    const Hdf5Dataset data(path, spec_for(dense), "data.train");
    const SamplerSpec s{23, 6, true, 17};
    expect_prefetcher_matches(data, s, 0, 0, 6, true, true, 12);
    expect_prefetcher_matches(data, s, 5, 2, 3, true, true, 9);   // resumed at step 5, replica slice
    expect_prefetcher_matches(data, s, 3, 0, 6, true, false, 4);  // first pipeline stage: inputs only
    expect_prefetcher_matches(data, s, 3, 1, 4, false, true, 4);  // last pipeline stage: targets only
    expect_prefetcher_matches(data, {23, 6, false, 0}, 7, 0, 6, true, true, 5);
  }
}

TEST(Prefetcher, ReusesTwoBuffers) {
  test::TempDir dir;
  write_file(dir.file("d.h5"), 40, 3, false);
  const Hdf5Dataset data(dir.file("d.h5"), spec_for(false), "data.train");
  Prefetcher prefetcher(data, {40, 8, true, 1}, 0, 0, 8, true, true);
  std::set<const float*> buffers;
  for (int k = 0; k < 12; ++k) buffers.insert(prefetcher.next().inputs.data());
  EXPECT_EQ(buffers.size(), 2u);
}

TEST(Prefetcher, TwoPrefetchersOnOneFile) {
  test::TempDir dir;
  write_file(dir.file("d.h5"), 101, 3, false);
  const Hdf5Dataset data(dir.file("d.h5"), spec_for(false), "data.train");
  const SamplerSpec s{101, 16, true, 4};
  Prefetcher inputs(data, s, 0, 0, 16, true, false), targets(data, s, 0, 0, 16, false, true);
  for (int64_t k = 0; k < 30; ++k) {
    const HostBatch& x = inputs.next();
    const HostBatch& y = targets.next();
    const std::vector<int64_t> rows = batch_samples(s, k, 0, 16);
    for (int64_t i = 0; i < 16; ++i) {
      ASSERT_EQ(x.inputs[i * 3], 10.0f * rows[i]);
      ASSERT_EQ(y.class_targets[i], rows[i] % 4);
    }
  }
}

TEST(Prefetcher, RethrowsAnErrorFromItsThreadAtTheStepThatFailed) {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_file(path, 23, 3, false);
  const Hdf5Dataset data(path, spec_for(false), "data.train");
  // A sampler that believes in 40 samples: steps 0 and 1 read rows 0..19, step 2 asks for row 23.
  Prefetcher prefetcher(data, {40, 10, false, 0}, 0, 0, 10, true, true);
  EXPECT_EQ(prefetcher.next().step, 0);
  EXPECT_EQ(prefetcher.next().step, 1);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      prefetcher.next();
      ADD_FAILURE() << "expected relay::Error";
    } catch (const Error& e) {
      EXPECT_TRUE(test::contains(e.what(), path)) << e.what();
      EXPECT_TRUE(test::contains(e.what(), "row 23")) << e.what();
    }
  }
}

TEST(Prefetcher, StopsWhileAheadOfTheCaller) {
  test::TempDir dir;
  write_file(dir.file("d.h5"), 23, 3, false);
  const Hdf5Dataset data(dir.file("d.h5"), spec_for(false), "data.train");
  { Prefetcher never_read(data, {23, 4, true, 0}, 0, 0, 4, true, true); }
  {
    Prefetcher read_once(data, {23, 4, true, 0}, 0, 0, 4, true, true);
    read_once.next();
  }
  EXPECT_THROW(Prefetcher(data, {23, 4, true, 0}, 0, 2, 3, true, true), Error);  // slice beyond the batch
}

}  // namespace
}  // namespace relay

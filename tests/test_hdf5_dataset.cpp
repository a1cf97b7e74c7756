// Hdf5Dataset, write_synthetic_classification and inspect_dataset on real HDF5 files in a temporary
// directory: row reads against the values written, one test per way a file can be wrong (each checks
// that the message names the file, the dataset and expected vs actual), synthetic data determinism
// and class balance.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "io/dataset.hpp"
#include "io/hdf5_util.hpp"
#include "io/inspect.hpp"
#include "io/synth.hpp"
#include "support/test_support.hpp"

namespace relay {
namespace {

using test::TempDir;

// One dataset to write: name, HDF5 type (file and memory), shape, values.
struct Array {
  std::string name;
  hid_t type;
  std::vector<hsize_t> dims;
  std::vector<double> values;  // converted to `type` by HDF5 on write
};

void write_h5(const std::string& path, const std::vector<Array>& arrays) {
  Hdf5Lock lock;
  H5File file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(file) << path;
  for (const Array& a : arrays) {
    H5Space space(H5Screate_simple(static_cast<int>(a.dims.size()), a.dims.data(), nullptr));
    H5Dataset d(H5Dcreate2(file.get(), a.name.c_str(), a.type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_TRUE(d) << a.name;
    if (!a.values.empty()) {
      ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.values.data()), 0) << a.name;
    }
  }
}

// inputs[i][j] = 100 i + j, so every value says where it came from.
Array inputs(hsize_t n, hsize_t d, hid_t type = H5T_IEEE_F32LE) {
  Array a{"inputs", type, {n, d}, {}};
  for (hsize_t i = 0; i < n; ++i)
    for (hsize_t j = 0; j < d; ++j) a.values.push_back(100.0 * i + j);
  return a;
}
// targets[i] = i % classes
Array class_targets(hsize_t n, int classes, hid_t type = H5T_STD_I64LE) {
  Array a{"targets", type, {n}, {}};
  for (hsize_t i = 0; i < n; ++i) a.values.push_back(static_cast<double>(i % classes));
  return a;
}
// targets[i][k] = -(10 i + k)
Array dense_targets(hsize_t n, hsize_t k) {
  Array a{"targets", H5T_IEEE_F32LE, {n, k}, {}};
  for (hsize_t i = 0; i < n; ++i)
    for (hsize_t j = 0; j < k; ++j) a.values.push_back(-(10.0 * i + j));
  return a;
}

DatasetSpec class_spec(int64_t features, int64_t classes) {
  DatasetSpec s;
  s.features = features;
  s.targets = TargetKind::class_index;
  s.num_classes = classes;
  return s;
}
DatasetSpec dense_spec(int64_t features, int64_t k) {
  DatasetSpec s;
  s.features = features;
  s.targets = TargetKind::dense;
  s.target_dim = k;
  return s;
}

// Runs f, which must throw relay::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_TRUE(test::contains(msg, p)) << "missing '" << p << "' in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected relay::Error";
}

void expect_open_error(const std::string& path, const DatasetSpec& spec, std::initializer_list<std::string> parts) {
  expect_error([&] { Hdf5Dataset(path, spec, "data.train"); }, parts);
}

// --- reading ------------------------------------------------------------------------------------

TEST(Hdf5Dataset, ReadsArbitraryRowsWithInt64Targets) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(50, 7), class_targets(50, 5)});
  const Hdf5Dataset data(path, class_spec(7, 5), "data.train");
  EXPECT_EQ(data.path(), path);
  EXPECT_EQ(data.samples(), 50);
  EXPECT_EQ(data.features(), 7);
  EXPECT_EQ(data.target_dim(), 1);
  EXPECT_EQ(data.target_kind(), TargetKind::class_index);

  std::vector<int64_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<std::vector<int64_t>> cases = {
      {7, 3, 3, 49, 0, 1, 2, 10, 7},  // unsorted, repeats, runs
      {1, 2, 3, 10, 20, 21, 49},      // sorted with gaps: read in place
      all,                            // one hyperslab
      {42},
      {49, 48, 47, 46, 0},
  };
  for (const auto& rows : cases) {
    std::vector<float> x(rows.size() * 7, -1.0f);  // (n, D)
    std::vector<int32_t> y(rows.size(), -1);        // (n)
    data.read_inputs(rows, x.data());
    data.read_targets(rows, y.data());
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int j = 0; j < 7; ++j) ASSERT_EQ(x[i * 7 + j], 100.0f * rows[i] + j) << "row " << rows[i];
      ASSERT_EQ(y[i], rows[i] % 5) << "row " << rows[i];
    }
  }
}

TEST(Hdf5Dataset, ReadsManyScatteredRows) {
  // Enough runs that the selection is built from several leaves merged by H5Scombine_select.
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(1000, 5), class_targets(1000, 7)});
  const Hdf5Dataset data(path, class_spec(5, 7), "data.train");
  const std::vector<int64_t> shuffled = permutation(1000, 3, 0);
  std::vector<int64_t> rows;
  for (int i = 0; i < 700; ++i) rows.push_back(shuffled[i % 400]);  // 400 distinct rows, 300 repeats
  std::vector<int64_t> sorted_rows(shuffled.begin(), shuffled.begin() + 400);
  std::sort(sorted_rows.begin(), sorted_rows.end());
  for (const auto& request : {rows, sorted_rows}) {
    std::vector<float> x(request.size() * 5);
    std::vector<int32_t> y(request.size());
    data.read_inputs(request, x.data());
    data.read_targets(request, y.data());
    for (size_t i = 0; i < request.size(); ++i) {
      for (int j = 0; j < 5; ++j) ASSERT_EQ(x[i * 5 + j], 100.0f * request[i] + j) << "row " << request[i];
      ASSERT_EQ(y[i], request[i] % 7) << "row " << request[i];
    }
  }
}

TEST(Hdf5Dataset, ReadsInt32Targets) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(20, 2), class_targets(20, 3, H5T_STD_I32LE)});
  const Hdf5Dataset data(path, class_spec(2, 3), "data.train");
  const std::vector<int64_t> rows = {19, 4, 4, 0};
  std::vector<int32_t> y(rows.size());
  data.read_targets(rows, y.data());
  EXPECT_EQ(y, (std::vector<int32_t>{19 % 3, 1, 1, 0}));
}

TEST(Hdf5Dataset, ReadsDenseTargets) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(30, 4), dense_targets(30, 3)});
  const Hdf5Dataset data(path, dense_spec(4, 3), "data.train");
  EXPECT_EQ(data.target_kind(), TargetKind::dense);
  EXPECT_EQ(data.target_dim(), 3);
  const std::vector<int64_t> rows = {29, 5, 6, 5, 0};
  std::vector<float> y(rows.size() * 3);  // (n, K)
  data.read_targets(rows, y.data());
  for (size_t i = 0; i < rows.size(); ++i)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(y[i * 3 + k], -(10.0f * rows[i] + k));
  // Reading them as class indices is a programming error, reported as such.
  std::vector<int32_t> wrong(rows.size());
  expect_error([&] { data.read_targets(rows, wrong.data()); }, {path, "/targets", "dense"});
}

TEST(Hdf5Dataset, AnyWidthWhenSpecSaysMinusOne) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(5, 9), class_targets(5, 2)});
  const Hdf5Dataset data(path, DatasetSpec{}, "data.train");
  EXPECT_EQ(data.features(), 9);
}

TEST(Hdf5Dataset, EmptyReadAndRowOutOfRange) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2), class_targets(10, 2)});
  const Hdf5Dataset data(path, class_spec(2, 2), "data.train");
  data.read_inputs({}, nullptr);  // nothing to read, nothing touched
  std::vector<float> x(4);
  expect_error([&] { data.read_inputs({3, 10}, x.data()); }, {path, "row 10", "[0, 10)"});
  expect_error([&] { data.read_inputs({-1, 0}, x.data()); }, {path, "row -1"});
}

// --- one test per bad file ----------------------------------------------------------------------

TEST(Hdf5DatasetErrors, NonexistentFile) {
  TempDir dir;
  const std::string path = dir.file("missing.h5");
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "not found"});
}

TEST(Hdf5DatasetErrors, NotAnHdf5File) {
  TempDir dir;
  const std::string path = dir.file("notes.txt");
  test::write_file(path, "this is not HDF5\n");
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "not an HDF5 file"});
}

TEST(Hdf5DatasetErrors, MissingInputs) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {class_targets(10, 2)});
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "dataset /inputs is missing", "float32", "/targets"});
}

TEST(Hdf5DatasetErrors, MissingTargets) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2)});
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "dataset /targets is missing", "int32 or int64"});
}

TEST(Hdf5DatasetErrors, InputsWrongRank) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {Array{"inputs", H5T_IEEE_F32LE, {10}, std::vector<double>(10, 0.0)}, class_targets(10, 2)});
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "/inputs", "rank 1", "[10]", "expected rank 2"});
}

TEST(Hdf5DatasetErrors, TargetsWrongRank) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2), Array{"targets", H5T_STD_I64LE, {10, 1}, std::vector<double>(10, 0.0)}});
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "/targets", "rank 2", "[10, 1]", "[N]"});
}

TEST(Hdf5DatasetErrors, Float64Inputs) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2, H5T_IEEE_F64LE), class_targets(10, 2)});
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "/inputs", "float64", "expected float32"});
}

TEST(Hdf5DatasetErrors, FloatTargetsWithCrossEntropy) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2), dense_targets(10, 3)});
  expect_open_error(path, class_spec(2, 3),
                    {"data.train", path, "/targets", "float32 [10, 3]", "cross_entropy", "int32 or int64", "mse"});
}

TEST(Hdf5DatasetErrors, IntegerTargetsWithMse) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2), class_targets(10, 3)});
  expect_open_error(path, dense_spec(2, 3), {"data.train", path, "/targets", "int64 [10]", "mse", "float32"});
}

TEST(Hdf5DatasetErrors, RowCountMismatch) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(999, 2), class_targets(1000, 2)});
  expect_open_error(path, class_spec(2, 2),
                    {"data.train: " + path + ": dataset /targets has 1000 rows but /inputs has 999"});
}

TEST(Hdf5DatasetErrors, FeatureMismatch) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 32), class_targets(10, 2)});
  expect_open_error(path, class_spec(64, 2), {"data.train", path, "/inputs", "32 features", "input width is 64"});
}

TEST(Hdf5DatasetErrors, NegativeClassIndex) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  Array t = class_targets(10, 3);
  t.values[6] = -1;
  write_h5(path, {inputs(10, 2), t});
  expect_open_error(path, class_spec(2, 3), {"data.train", path, "/targets", "class index -1 at row 6", "[0, 3)"});
  // Without a class count the constructor does not scan; inspect still rejects the file.
  EXPECT_NO_THROW(Hdf5Dataset(path, class_spec(2, -1), "data.train"));
  expect_error([&] { inspect_dataset(path); }, {path, "/targets", "class index -1 at row 6"});
}

TEST(Hdf5DatasetErrors, ClassIndexTooLarge) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  Array t = class_targets(10, 3);
  t.values[9] = 3;
  write_h5(path, {inputs(10, 2), t});
  expect_open_error(path, class_spec(2, 3), {"data.train", path, "/targets", "class index 3 at row 9", "[0, 3)"});
  EXPECT_NO_THROW(Hdf5Dataset(path, class_spec(2, 4), "data.train"));
}

TEST(Hdf5DatasetErrors, DenseWidthMismatch) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {inputs(10, 2), dense_targets(10, 3)});
  expect_open_error(path, dense_spec(2, 5), {"data.train", path, "/targets", "3 values per sample", "[10, 3]",
                                             "output width is 5"});
}

TEST(Hdf5DatasetErrors, GroupInsteadOfDataset) {
  TempDir dir;
  const std::string path = dir.file("d.h5");
  write_h5(path, {class_targets(10, 2)});
  {
    Hdf5Lock lock;
    H5File f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Handle<H5Gclose> g(H5Gcreate2(f.get(), "inputs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_TRUE(g);
  }
  expect_open_error(path, class_spec(2, 2), {"data.train", path, "/inputs", "not a readable dataset"});
}

// --- synthetic data and inspection --------------------------------------------------------------

TEST(Synth, WritesAValidFileThatInspectDescribes) {
  TempDir dir;
  const std::string path = dir.file("synth.h5");
  write_synthetic_classification(path, 1000, 16, 4, 7);
  const Hdf5Dataset data(path, class_spec(16, 4), "data.train");
  EXPECT_EQ(data.samples(), 1000);
  EXPECT_EQ(data.features(), 16);

  const std::string text = inspect_dataset(path);
  for (const char* part : {"/inputs", "float32", "[1000, 16]", "/targets", "int64", "[1000]", "generator",
                           "\"relay data synth\"", "seed", "teacher_seed", "1234", "samples (N): 1000",
                           "features (D): 16", "4 classes", "cross_entropy", "ok: valid"})
    EXPECT_TRUE(test::contains(text, part)) << "missing '" << part << "' in:\n" << text;
}

TEST(Synth, SameArgumentsGiveIdenticalBytes) {
  TempDir dir;
  write_synthetic_classification(dir.file("a.h5"), 300, 8, 3, 42);
  write_synthetic_classification(dir.file("b.h5"), 300, 8, 3, 42);
  write_synthetic_classification(dir.file("c.h5"), 300, 8, 3, 43);
  const std::string a = test::read_file(dir.file("a.h5"));
  EXPECT_EQ(a, test::read_file(dir.file("b.h5")));
  EXPECT_NE(a, test::read_file(dir.file("c.h5")));
}

TEST(Synth, TeacherSeedIsRecordedAndChangesTheLabels) {
  TempDir dir;
  write_synthetic_classification(dir.file("a.h5"), 500, 8, 4, 5, 1);
  write_synthetic_classification(dir.file("b.h5"), 500, 8, 4, 5, 2);
  EXPECT_TRUE(test::contains(inspect_dataset(dir.file("b.h5")), "teacher_seed            2"));
  const Hdf5Dataset a(dir.file("a.h5"), class_spec(8, 4), "a"), b(dir.file("b.h5"), class_spec(8, 4), "b");
  std::vector<int64_t> rows(500);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int32_t> ya(500), yb(500);
  a.read_targets(rows, ya.data());
  b.read_targets(rows, yb.data());
  EXPECT_NE(ya, yb);
}

TEST(Synth, ClassesAreBalanced) {
  TempDir dir;
  for (int64_t classes : {2, 3, 10}) {
    const std::string path = dir.file("bal.h5");
    const int64_t n = 5000;
    write_synthetic_classification(path, n, 32, classes, 11);
    const Hdf5Dataset data(path, class_spec(32, classes), "data.train");
    std::vector<int64_t> rows(n);
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<int32_t> y(n);
    data.read_targets(rows, y.data());
    std::vector<int64_t> count(classes, 0);
    for (int32_t c : y) ++count[c];
    for (int64_t c = 0; c < classes; ++c) {  // within half and one and a half times the fair share
      EXPECT_GT(count[c], n / classes / 2) << "class " << c << " of " << classes;
      EXPECT_LT(count[c], 3 * n / classes / 2) << "class " << c << " of " << classes;
      if (classes > 2) {
        EXPECT_LT(count[c], n / 2) << "class " << c << " of " << classes;
      }
    }
  }
}

TEST(Synth, RejectsBadArguments) {
  TempDir dir;
  const std::string path = dir.file("x.h5");
  expect_error([&] { write_synthetic_classification(path, 0, 8, 3, 1); }, {"--samples", "got 0"});
  expect_error([&] { write_synthetic_classification(path, 10, 0, 3, 1); }, {"--features", "got 0"});
  expect_error([&] { write_synthetic_classification(path, 10, 8, 1, 1); }, {"--classes", "got 1"});
  expect_error([&] { write_synthetic_classification(dir.file("no/such/dir/x.h5"), 10, 8, 3, 1); },
               {"no/such/dir/x.h5", "cannot create"});
}

TEST(Inspect, DescribesDenseTargets) {
  TempDir dir;
  const std::string path = dir.file("dense.h5");
  write_h5(path, {inputs(12, 5), dense_targets(12, 3)});
  const std::string text = inspect_dataset(path);
  for (const char* part : {"[12, 5]", "[12, 3]", "samples (N): 12", "features (D): 5", "K = 3", "mse"})
    EXPECT_TRUE(test::contains(text, part)) << "missing '" << part << "' in:\n" << text;
}

TEST(Inspect, ListsClassCounts) {
  TempDir dir;
  const std::string path = dir.file("c.h5");
  write_h5(path, {inputs(10, 2), class_targets(10, 4, H5T_STD_I32LE)});  // classes 0..3: 3, 3, 2, 2
  const std::string text = inspect_dataset(path);
  EXPECT_TRUE(test::contains(text, "4 classes")) << text;
  EXPECT_TRUE(test::contains(text, "3   30.0%")) << text;
  EXPECT_TRUE(test::contains(text, "2   20.0%")) << text;

  write_h5(path, {inputs(4, 2), Array{"targets", H5T_STD_I32LE, {4}, {0, 2, 0, 2}}});  // no class 1
  const std::string gap = inspect_dataset(path);
  EXPECT_TRUE(test::contains(gap, "3 classes")) << gap;
  EXPECT_TRUE(test::contains(gap, "1 of the class indices 0..2 have no samples")) << gap;
}

TEST(Inspect, RejectsInvalidFiles) {
  TempDir dir;
  const std::string path = dir.file("bad.h5");
  write_h5(path, {inputs(10, 2)});
  expect_error([&] { inspect_dataset(path); }, {path, "/targets", "missing"});
  expect_error([&] { inspect_dataset(dir.file("none.h5")); }, {dir.file("none.h5"), "not found"});
  write_h5(path, {inputs(10, 2), Array{"targets", H5T_IEEE_F32LE, {10}, std::vector<double>(10, 0.0)}});
  expect_error([&] { inspect_dataset(path); }, {path, "/targets", "rank 1", "[N, K]"});
}

}  // namespace
}  // namespace relay

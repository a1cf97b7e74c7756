// Hdf5Dataset: opening and validating a training file, and reading arbitrary rows of it by one
// union-of-hyperslabs selection per call (only the requested rows travel from disk).
#include "io/dataset.hpp"

#include <algorithm>
#include <filesystem>
#include <utility>

namespace relay {
namespace {

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(cat("/", name));
  return 0;
}

// "/a, /b" (the root group's members), for messages about a missing dataset.
std::string root_members(hid_t file) {
  std::vector<std::string> names;
  H5Literate(file, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &names);
  H5Eclear2(H5E_DEFAULT);
  if (names.empty()) return "nothing";
  std::string s;
  for (const auto& n : names) s += cat(s.empty() ? "" : ", ", n);
  return s;
}

bool is_float32(hid_t type) { return H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4; }
bool is_int32_or_int64(hid_t type) {
  const size_t bytes = H5Tget_size(type);
  return H5Tget_class(type) == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_2 && (bytes == 4 || bytes == 8);
}

struct Run {
  hsize_t start, count;  // rows [start, start + count)
};

// HDF5 1.10 merges each H5S_SELECT_OR into the whole selection, so n ORs in a row cost O(n^2): 8192
// random rows took 4 s. Runs are ORed in leaves of kLeafRuns, and the leaves merged pairwise with
// H5Scombine_select, O(n log n) overall (8192 rows: ~8 ms).
constexpr size_t kLeafRuns = 32;

template <typename Context>
H5Space select_runs(hid_t space, const Run* runs, size_t n, hsize_t width, const Context& context) {
  if (n <= kLeafRuns) {
    H5Space leaf(RELAY_H5_CHECK(H5Scopy(space), context()));
    for (size_t i = 0; i < n; ++i) {
      const hsize_t start[2] = {runs[i].start, 0}, count[2] = {runs[i].count, width};
      RELAY_H5_CHECK(H5Sselect_hyperslab(leaf.get(), i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr,
                                         count, nullptr),
                     context());
    }
    return leaf;
  }
  const H5Space left = select_runs(space, runs, n / 2, width, context);
  const H5Space right = select_runs(space, runs + n / 2, n - n / 2, width, context);
  return H5Space(RELAY_H5_CHECK(H5Scombine_select(left.get(), H5S_SELECT_OR, right.get()), context()));
}

// Reads `rows` (any order, repeats allowed) of a dataset of rank `rank` whose rows hold `width`
// elements into out (rows.size(), width), converting to mem_type. Rows must be in range.
// `where` and `name` ("/inputs") make the error context, built only on failure.
template <typename T>
void read_rows(hid_t dset, hid_t mem_type, int rank, int64_t width, const std::vector<int64_t>& rows, T* out,
               const std::string& where, const char* name) {
  auto context = [&] { return cat(where, ": dataset ", name); };
  const size_t n = rows.size();
  if (n == 0) return;
  bool increasing = true;
  for (size_t i = 1; i < n && increasing; ++i) increasing = rows[i] > rows[i - 1];

  // Scratch kept per thread so that steady-state reads allocate nothing here.
  thread_local std::vector<std::pair<int64_t, int64_t>> order;  // (row, position in the request), sorted
  thread_local std::vector<Run> runs;                            // maximal runs of consecutive distinct rows
  thread_local std::vector<T> staging;                           // (distinct rows, width)
  runs.clear();
  auto add_row = [&](int64_t row) {  // rows arrive sorted
    const auto r = static_cast<hsize_t>(row);
    const hsize_t end = runs.empty() ? 0 : runs.back().start + runs.back().count;
    if (!runs.empty() && r < end) return;  // a repeat
    if (!runs.empty() && r == end) ++runs.back().count;
    else runs.push_back({r, 1});
  };
  if (increasing) {
    for (int64_t row : rows) add_row(row);
  } else {
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = {rows[i], static_cast<int64_t>(i)};
    std::sort(order.begin(), order.end());
    for (const auto& [row, pos] : order) add_row(row);  // repeats fall into the run already there
  }
  hsize_t distinct = 0;
  for (const Run& r : runs) distinct += r.count;

  H5Space file_space(RELAY_H5_CHECK(H5Dget_space(dset), context()));
  const H5Space selection = select_runs(file_space.get(), runs.data(), runs.size(), width, context);
  const hsize_t mem_dims[2] = {distinct, static_cast<hsize_t>(width)};
  H5Space mem_space(RELAY_H5_CHECK(H5Screate_simple(rank, mem_dims, nullptr), context()));
  T* dst = out;
  if (!increasing) {
    staging.resize(distinct * static_cast<size_t>(width));
    dst = staging.data();
  }
  // The union is read in increasing row order, so distinct row k lands at dst + k * width.
  RELAY_H5_CHECK(H5Dread(dset, mem_type, mem_space.get(), selection.get(), H5P_DEFAULT, dst), context());
  if (increasing) return;

  // Scatter: the k-th distinct row goes to every request position that asked for it.
  int64_t k = -1, previous = -1;
  for (const auto& [row, pos] : order) {
    if (row != previous) ++k, previous = row;
    std::copy_n(staging.data() + k * width, width, out + pos * width);
  }
}

}  // namespace

Hdf5Dataset::Hdf5Dataset(const std::string& path, const DatasetSpec& spec, const std::string& what)
    : path_(path), where_(what.empty() ? path : cat(what, ": ", path)), kind_(spec.targets) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error(cat(where_, ": file not found (hint: `relay data synth` writes a synthetic training set)"));
  if (fs::is_directory(path, ec)) throw Error(cat(where_, ": is a directory, expected an HDF5 file"));
  file_size_ = fs::file_size(path, ec);

  Hdf5Lock lock;
  try {
    const htri_t is_hdf5 = RELAY_H5_CHECK(H5Fis_hdf5(path.c_str()), cat(where_, ": cannot read the file"));
    if (!is_hdf5) throw Error(cat(where_, ": not an HDF5 file (no HDF5 signature found)"));
    // No sieve buffer: it turns every scattered row of a contiguous dataset into a 64 KiB read
    // (8x slower for a batch of random 1 KiB rows); large contiguous reads bypass it anyway.
    H5Plist fapl(RELAY_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), where_));
    RELAY_H5_CHECK(H5Pset_sieve_buf_size(fapl.get(), 0), where_);
    file_ = H5File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
    if (!file_) {
      std::string msg = h5_error_message();
      std::string hint = msg.find("lock") != std::string::npos
                             ? " (hint: on file systems without file locking set HDF5_USE_FILE_LOCKING=FALSE)"
                             : "";
      throw Error(cat(where_, ": cannot open the HDF5 file: ", msg, hint));
    }
    open_datasets(spec);
    if (kind_ == TargetKind::class_index && spec.num_classes >= 0) check_class_range(spec.num_classes);
  } catch (...) {
    targets_.reset();  // close under the lock before it is released
    inputs_.reset();
    file_.reset();
    throw;
  }
}

Hdf5Dataset::~Hdf5Dataset() {
  Hdf5Lock lock;
  targets_.reset();
  inputs_.reset();
  file_.reset();
}

void Hdf5Dataset::open_datasets(const DatasetSpec& spec) {
  const char* loss = kind_ == TargetKind::class_index ? "cross_entropy" : "mse";
  const char* wanted_targets = kind_ == TargetKind::class_index ? "int32 or int64 class indices of shape [N]"
                                                                : "float32 targets of shape [N, K]";
  auto open = [&](const char* name, const std::string& wanted) {
    const htri_t exists = RELAY_H5_CHECK(H5Lexists(file_.get(), name, H5P_DEFAULT), cat(where_, ": ", name));
    if (!exists)
      throw Error(cat(where_, ": dataset ", name, " is missing, expected ", wanted, " (the file has ",
                      root_members(file_.get()), ")"));
    hid_t id = H5Dopen2(file_.get(), name, H5P_DEFAULT);
    if (id < 0) throw Error(cat(where_, ": ", name, " exists but is not a readable dataset: ", h5_error_message()));
    return H5Dataset(id);
  };
  inputs_ = open("/inputs", "float32 inputs of shape [N, D]");
  targets_ = open("/targets", wanted_targets);

  // /inputs: float32 (N, D)
  const std::string in_ctx = cat(where_, ": dataset /inputs");
  H5Type in_type(RELAY_H5_CHECK(H5Dget_type(inputs_.get()), in_ctx));
  H5Space in_space(RELAY_H5_CHECK(H5Dget_space(inputs_.get()), in_ctx));
  const std::vector<int64_t> in_shape = h5_shape(in_space.get());
  if (!is_float32(in_type.get()))
    throw Error(cat(in_ctx, " has dtype ", h5_type_name(in_type.get()), " (shape ", shape_string(in_shape),
                    "), expected float32"));
  if (in_shape.size() != 2)
    throw Error(cat(in_ctx, " has rank ", in_shape.size(), " (shape ", shape_string(in_shape),
                    "), expected rank 2 [N samples, D features]"));
  samples_ = in_shape[0];
  features_ = in_shape[1];
  if (samples_ < 1) throw Error(cat(in_ctx, " has no rows (shape ", shape_string(in_shape), "), expected N >= 1"));
  if (features_ < 1)
    throw Error(cat(in_ctx, " has no columns (shape ", shape_string(in_shape), "), expected D >= 1"));
  if (spec.features >= 0 && features_ != spec.features)
    throw Error(cat(in_ctx, " has ", features_, " features per sample (shape ", shape_string(in_shape),
                    ") but the model's input width is ", spec.features));

  // /targets: int32/int64 (N) or float32 (N, K)
  const std::string t_ctx = cat(where_, ": dataset /targets");
  H5Type t_type(RELAY_H5_CHECK(H5Dget_type(targets_.get()), t_ctx));
  H5Space t_space(RELAY_H5_CHECK(H5Dget_space(targets_.get()), t_ctx));
  const std::vector<int64_t> t_shape = h5_shape(t_space.get());
  const std::string t_desc = cat(h5_type_name(t_type.get()), " ", shape_string(t_shape));
  if (kind_ == TargetKind::class_index) {
    if (!is_int32_or_int64(t_type.get()))
      throw Error(cat(t_ctx, " is ", t_desc, " but loss ", loss, " needs ", wanted_targets,
                      H5Tget_class(t_type.get()) == H5T_FLOAT ? " (hint: float [N, K] targets go with loss mse)" : ""));
    if (t_shape.size() != 1)
      throw Error(cat(t_ctx, " has rank ", t_shape.size(), " (", t_desc, ") but loss ", loss, " needs ",
                      wanted_targets));
    target_dim_ = 1;
  } else {
    if (!is_float32(t_type.get()))
      throw Error(cat(t_ctx, " is ", t_desc, " but loss ", loss, " needs ", wanted_targets,
                      H5Tget_class(t_type.get()) == H5T_INTEGER
                          ? " (hint: integer class indices go with loss cross_entropy)"
                          : ""));
    if (t_shape.size() != 2)
      throw Error(cat(t_ctx, " has rank ", t_shape.size(), " (", t_desc, ") but loss ", loss, " needs ",
                      wanted_targets));
    target_dim_ = t_shape[1];
    if (target_dim_ < 1) throw Error(cat(t_ctx, " has no columns (", t_desc, "), expected K >= 1"));
    if (spec.target_dim >= 0 && target_dim_ != spec.target_dim)
      throw Error(cat(t_ctx, " has ", target_dim_, " values per sample (", t_desc,
                      ") but the model's output width is ", spec.target_dim));
  }
  if (t_shape[0] != samples_)
    throw Error(cat(where_, ": dataset /targets has ", t_shape[0], " rows but /inputs has ", samples_));
}

void Hdf5Dataset::check_class_range(int64_t num_classes) {
  // Class indices are read as int64 in chunks, so that a large file never needs one big buffer.
  const std::string ctx = cat(where_, ": dataset /targets");
  const int64_t chunk = int64_t{1} << 20;
  std::vector<int64_t> buf(static_cast<size_t>(std::min(chunk, samples_)));
  H5Space file_space(RELAY_H5_CHECK(H5Dget_space(targets_.get()), ctx));
  for (int64_t start = 0; start < samples_; start += chunk) {
    const hsize_t off = static_cast<hsize_t>(start);
    const hsize_t cnt = static_cast<hsize_t>(std::min(chunk, samples_ - start));
    RELAY_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &off, nullptr, &cnt, nullptr), ctx);
    H5Space mem_space(RELAY_H5_CHECK(H5Screate_simple(1, &cnt, nullptr), ctx));
    RELAY_H5_CHECK(
        H5Dread(targets_.get(), H5T_NATIVE_INT64, mem_space.get(), file_space.get(), H5P_DEFAULT, buf.data()), ctx);
    for (hsize_t i = 0; i < cnt; ++i)
      if (buf[i] < 0 || buf[i] >= num_classes)
        throw Error(cat(ctx, " has class index ", buf[i], " at row ", start + static_cast<int64_t>(i),
                        ", expected [0, ", num_classes, ") for ", num_classes, " classes (the model's output width)"));
  }
}

void Hdf5Dataset::check_rows(const std::vector<int64_t>& rows) const {
  for (int64_t r : rows)
    if (r < 0 || r >= samples_)
      throw Error(cat(where_, ": row ", r, " requested, but the file has rows [0, ", samples_, ")"));
}

void Hdf5Dataset::read_inputs(const std::vector<int64_t>& rows, float* out) const {
  check_rows(rows);
  Hdf5Lock lock;
  read_rows(inputs_.get(), H5T_NATIVE_FLOAT, 2, features_, rows, out, where_, "/inputs");
  check_file_not_shrunk(path_, file_size_, where_);
}

void Hdf5Dataset::read_targets(const std::vector<int64_t>& rows, int32_t* out) const {
  if (kind_ != TargetKind::class_index)
    throw Error(cat(where_, ": /targets holds dense float targets; read them as float"));
  check_rows(rows);
  Hdf5Lock lock;
  // int64 files are converted by HDF5 (which clips); the constructor range-checked them if asked to.
  read_rows(targets_.get(), H5T_NATIVE_INT32, 1, 1, rows, out, where_, "/targets");
  check_file_not_shrunk(path_, file_size_, where_);
}

void Hdf5Dataset::read_targets(const std::vector<int64_t>& rows, float* out) const {
  if (kind_ != TargetKind::dense) throw Error(cat(where_, ": /targets holds class indices; read them as int32"));
  check_rows(rows);
  Hdf5Lock lock;
  read_rows(targets_.get(), H5T_NATIVE_FLOAT, 2, target_dim_, rows, out, where_, "/targets");
  check_file_not_shrunk(path_, file_size_, where_);
}

}  // namespace relay

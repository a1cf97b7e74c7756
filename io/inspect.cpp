// inspect_dataset: validation through Hdf5Dataset, then a listing of what the file holds.
#include "io/inspect.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <vector>

#include "io/dataset.hpp"
#include "io/hdf5_util.hpp"
#include "io/token_dataset.hpp"

namespace relay {
namespace {

// class_index unless /targets is a float dataset; a file that cannot be read is left to Hdf5Dataset,
// whose messages say why.
TargetKind guess_target_kind(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return TargetKind::class_index;
  Hdf5Lock lock;
  if (H5Fis_hdf5(path.c_str()) <= 0) return TargetKind::class_index;
  H5File file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file || H5Lexists(file.get(), "/targets", H5P_DEFAULT) <= 0) return TargetKind::class_index;
  H5Dataset targets(H5Dopen2(file.get(), "/targets", H5P_DEFAULT));
  if (!targets) return TargetKind::class_index;
  H5Type type(H5Dget_type(targets.get()));
  const bool dense = type && H5Tget_class(type.get()) == H5T_FLOAT;
  H5Eclear2(H5E_DEFAULT);
  return dense ? TargetKind::dense : TargetKind::class_index;
}

using Lines = std::vector<std::string>;

herr_t list_dataset(hid_t root, const char* name, const H5L_info_t*, void* data) {
  H5Object obj(H5Oopen(root, name, H5P_DEFAULT));
  if (!obj || H5Iget_type(obj.get()) != H5I_DATASET) {
    H5Eclear2(H5E_DEFAULT);  // groups, dangling links
    return 0;
  }
  H5Type type(H5Dget_type(obj.get()));
  H5Space space(H5Dget_space(obj.get()));
  char line[512];
  std::snprintf(line, sizeof line, "  /%-22s %-10s %s", name, h5_type_name(type.get()).c_str(),
                shape_string(h5_shape(space.get())).c_str());
  static_cast<Lines*>(data)->push_back(line);
  return 0;
}

// A scalar or short attribute as text: strings quoted, numbers plain, anything else by type and shape.
std::string attribute_value(hid_t attr) {
  H5Type type(H5Aget_type(attr));
  H5Space space(H5Aget_space(attr));
  const std::vector<int64_t> shape = h5_shape(space.get());
  const bool scalar = shape.empty() || (shape.size() == 1 && shape[0] == 1);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (scalar && cls == H5T_STRING) {
    std::string s;
    if (H5Tis_variable_str(type.get()) > 0) {
      H5Type mem(H5Tcopy(H5T_C_S1));
      H5Tset_size(mem.get(), H5T_VARIABLE);
      char* p = nullptr;
      if (H5Aread(attr, mem.get(), &p) >= 0 && p) s = p;
      if (p) H5free_memory(p);
    } else {
      std::vector<char> buf(H5Tget_size(type.get()) + 1, '\0');
      if (H5Aread(attr, type.get(), buf.data()) >= 0) s = buf.data();
    }
    return cat("\"", s, "\"");
  }
  if (scalar && cls == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE) {
    uint64_t v = 0;
    if (H5Aread(attr, H5T_NATIVE_UINT64, &v) >= 0) return cat(v);
  } else if (scalar && cls == H5T_INTEGER) {
    int64_t v = 0;
    if (H5Aread(attr, H5T_NATIVE_INT64, &v) >= 0) return cat(v);
  } else if (scalar && cls == H5T_FLOAT) {
    double v = 0;
    if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) >= 0) return cat(v);
  }
  return cat(h5_type_name(type.get()), " ", shape_string(shape));
}

herr_t list_attribute(hid_t loc, const char* name, const H5A_info_t*, void* data) {
  H5Attr attr(H5Aopen(loc, name, H5P_DEFAULT));
  if (!attr) return 0;
  char line[512];
  std::snprintf(line, sizeof line, "  %-23s %s", name, attribute_value(attr.get()).c_str());
  static_cast<Lines*>(data)->push_back(line);
  return 0;
}

std::string percent(int64_t part, int64_t whole) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return s;
}

// Per-class sample counts, reading /targets in chunks; a negative index is an error for any model.
std::map<int64_t, int64_t> class_counts(const Hdf5Dataset& data) {
  const int64_t chunk = int64_t{1} << 20;
  std::vector<int64_t> rows;
  std::vector<int32_t> labels;
  std::map<int64_t, int64_t> counts;
  for (int64_t start = 0; start < data.samples(); start += chunk) {
    rows.resize(static_cast<size_t>(std::min(chunk, data.samples() - start)));
    std::iota(rows.begin(), rows.end(), start);
    labels.resize(rows.size());
    data.read_targets(rows, labels.data());
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] < 0 || labels[i] == INT32_MAX)  // HDF5 clips int64 indices beyond int32 to INT32_MAX
        throw Error(cat(data.path(), ": dataset /targets has class index ", labels[i] < 0 ? "" : ">= ", labels[i],
                        " at row ", rows[i], ", expected a class index in [0, 2^31 - 1)"));
      ++counts[labels[i]];
    }
  }
  return counts;
}

}  // namespace

namespace {
bool has_tokens(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  Hdf5Lock lock;
  if (H5Fis_hdf5(path.c_str()) <= 0) return false;
  H5File file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  const bool yes = file && H5Lexists(file.get(), "/tokens", H5P_DEFAULT) > 0;
  H5Eclear2(H5E_DEFAULT);
  return yes;
}
}  // namespace

std::string inspect_dataset(const std::string& path) {
  if (has_tokens(path)) return describe_token_file(path);  // a language model's token file
  const TargetKind kind = guess_target_kind(path);
  DatasetSpec spec;
  spec.targets = kind;
  const Hdf5Dataset data(path, spec, "");  // throws if training would reject the file

  Lines datasets, attributes;
  {
    Hdf5Lock lock;
    H5File file(RELAY_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path));
    RELAY_H5_CHECK(H5Lvisit(file.get(), H5_INDEX_NAME, H5_ITER_INC, list_dataset, &datasets), path);
    hsize_t idx = 0;
    RELAY_H5_CHECK(H5Aiterate2(file.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, list_attribute, &attributes), path);
    H5Eclear2(H5E_DEFAULT);
  }

  std::string out = cat("file: ", path, "\ndatasets:\n");
  for (const auto& l : datasets) out += l + "\n";
  if (!attributes.empty()) {
    out += "attributes:\n";
    for (const auto& l : attributes) out += l + "\n";
  }
  out += cat("samples (N): ", data.samples(), "\nfeatures (D): ", data.features(), "\n");
  if (kind == TargetKind::dense) {
    out += cat("targets: dense float32, K = ", data.target_dim(), " values per sample (loss mse)\n");
    out += cat("ok: valid training data for loss mse with model input width ", data.features(),
               " and output width ", data.target_dim(), "\n");
    return out;
  }

  const std::map<int64_t, int64_t> counts = class_counts(data);
  const int64_t classes = counts.rbegin()->first + 1;  // indices 0 .. max
  out += cat("targets: class indices in [0, ", classes - 1, "], ", classes, " classes (loss cross_entropy)\n");
  out += "class counts:\n";
  if (classes <= 32) {
    out += "   class     samples   share\n";
    for (int64_t c = 0; c < classes; ++c) {
      const auto it = counts.find(c);
      const int64_t n = it == counts.end() ? 0 : it->second;
      char line[96];
      std::snprintf(line, sizeof line, "  %6lld  %10lld  %6s\n", static_cast<long long>(c), static_cast<long long>(n),
                    percent(n, data.samples()).c_str());
      out += line;
    }
  } else {
    auto by_count = [](const auto& a, const auto& b) { return a.second < b.second; };
    const auto lo = std::min_element(counts.begin(), counts.end(), by_count);
    const auto hi = std::max_element(counts.begin(), counts.end(), by_count);
    out += cat("  fewest: class ", lo->first, " with ", lo->second, " (", percent(lo->second, data.samples()), ")\n");
    out += cat("  most:   class ", hi->first, " with ", hi->second, " (", percent(hi->second, data.samples()), ")\n");
  }
  const int64_t empty = classes - static_cast<int64_t>(counts.size());
  if (empty > 0) out += cat("note: ", empty, " of the class indices 0..", classes - 1, " have no samples\n");
  out += cat("ok: valid training data for loss cross_entropy with model input width ", data.features(),
             " and output width >= ", classes, "\n");
  return out;
}

}  // namespace relay

// Training data in HDF5: /inputs float32 (N, D) and /targets, either int32/int64 (N) class indices
// (loss cross_entropy) or float32 (N, K) (loss mse). Everything is validated when the file is opened,
// so a bad file fails before the first step with a message naming the file, dataset and mismatch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/hdf5_util.hpp"

namespace relay {

enum class TargetKind { class_index, dense };

// What the model expects of the file.
struct DatasetSpec {
  int64_t features = -1;  // expected D (the model's input width), -1 = any
  TargetKind targets = TargetKind::class_index;
  int64_t num_classes = -1;  // class_index: every target must be in [0, num_classes); -1 = don't check
                             // (the pipeline stages that never read targets skip the scan)
  int64_t target_dim = -1;   // dense: expected K, -1 = any
};

class Hdf5Dataset {
 public:
  // Opens and validates: the file exists and is HDF5; /inputs and /targets exist with the right
  // ranks and dtypes; N is equal for both; D == spec.features; K == spec.target_dim; every class
  // index is in [0, spec.num_classes) (a scan of /targets, skipped when num_classes is -1). Failures
  // are relay::Error, prefixed with `what` (the config key that named the file, e.g. "data.train"):
  //   "data.train: /work/x.h5: dataset /targets has 1000 rows but /inputs has 999"
  Hdf5Dataset(const std::string& path, const DatasetSpec& spec, const std::string& what);
  ~Hdf5Dataset();
  Hdf5Dataset(Hdf5Dataset&&) = default;
  Hdf5Dataset& operator=(Hdf5Dataset&&) = delete;  // would close handles outside the lock

  const std::string& path() const { return path_; }
  int64_t samples() const { return samples_; }         // N
  int64_t features() const { return features_; }       // D
  int64_t target_dim() const { return target_dim_; }   // 1 for class_index, K for dense
  TargetKind target_kind() const { return kind_; }

  // Read exactly these rows, in the order given (unsorted and repeated rows allowed). Only the
  // requested rows are read: they are sorted, merged into runs, selected as one union of
  // hyperslabs, read in one H5Dread and scattered into the requested order.
  void read_inputs(const std::vector<int64_t>& rows, float* out) const;       // out (n, D)
  void read_targets(const std::vector<int64_t>& rows, int32_t* out) const;    // class_index: out (n), as int32
  void read_targets(const std::vector<int64_t>& rows, float* out) const;      // dense: out (n, K)

 private:
  void open_datasets(const DatasetSpec& spec);
  void check_class_range(int64_t num_classes);
  void check_rows(const std::vector<int64_t>& rows) const;

  std::string path_;
  std::string where_;  // message prefix: "data.train: /work/x.h5"
  uint64_t file_size_ = 0;  // at open: reads check the file has not shrunk since
  int64_t samples_ = 0, features_ = 0, target_dim_ = 1;
  TargetKind kind_ = TargetKind::class_index;
  H5File file_;
  H5Dataset inputs_, targets_;
};

}  // namespace relay

#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "io/hdf5_util.hpp"

namespace fs = std::filesystem;

namespace relay {

namespace {

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(cat("checkpoint: cannot open ", path, " to fsync it"));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(cat("checkpoint: fsync of ", path, " failed"));
}

void atomic_replace(const std::string& tmp, const std::string& path) {
  fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error(cat("checkpoint: cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(), true);
}

void put_str_attr(hid_t obj, const char* name, const std::string& value, const std::string& ctx) {
  H5Type t(RELAY_H5_CHECK(H5Tcopy(H5T_C_S1), ctx));
  RELAY_H5_CHECK(H5Tset_size(t.get(), H5T_VARIABLE), ctx);
  RELAY_H5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8), ctx);
  H5Space sp(RELAY_H5_CHECK(H5Screate(H5S_SCALAR), ctx));
  H5Attr a(RELAY_H5_CHECK(H5Acreate2(obj, name, t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT), ctx));
  const char* p = value.c_str();
  RELAY_H5_CHECK(H5Awrite(a.get(), t.get(), &p), ctx);
}

void put_i64_attr(hid_t obj, const char* name, int64_t v, const std::string& ctx) {
  H5Space sp(RELAY_H5_CHECK(H5Screate(H5S_SCALAR), ctx));
  H5Attr a(RELAY_H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT), ctx));
  RELAY_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &v), ctx);
}

// Creates every missing group along "a/b/c" and returns the deepest one.
hid_t ensure_group(hid_t file, const std::string& path, const std::string& ctx) {
  hid_t cur = H5Gopen2(file, "/", H5P_DEFAULT);
  size_t at = 0;
  while (at < path.size()) {
    size_t slash = path.find('/', at);
    std::string part = path.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
    hid_t next = H5Lexists(cur, part.c_str(), H5P_DEFAULT) > 0 ? H5Gopen2(cur, part.c_str(), H5P_DEFAULT)
                                                              : H5Gcreate2(cur, part.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(cur);
    cur = RELAY_H5_CHECK(next, ctx);
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  return cur;
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

namespace {

// The HDF5 part of write_checkpoint_file: everything into `tmp`, closed. Throws Error on failure.
void write_tmp_file(const std::string& tmp, const CheckpointMeta& meta, const std::vector<CheckpointTensor>& tensors,
                    const std::function<void()>& on_tensor) {
  const std::string ctx = cat("checkpoint ", tmp);
  // The file handle, closed under the lock however this function ends.
  struct LockedFile {
    H5File f;
    ~LockedFile() {
      Hdf5Lock lock;
      f.reset();
    }
  } file;
  hid_t root = -1;
  {
    Hdf5Lock lock;
    // Strong close: closing the file closes every object in it, so a failed write leaves nothing open
    // for HDF5's exit handler to flush into a full disk.
    H5Plist fapl(RELAY_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), ctx));
    RELAY_H5_CHECK(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), ctx);
    file.f = H5File(RELAY_H5_CHECK(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), ctx));
    root = file.f.get();
    put_str_attr(root, "format", kCheckpointFormat, ctx);
    put_i64_attr(root, "version", kCheckpointVersion, ctx);
    put_i64_attr(root, "step", meta.step, ctx);
    put_str_attr(root, "config", meta.config_toml, ctx);
    put_i64_attr(root, "dp", meta.dp, ctx);
    put_i64_attr(root, "pp", meta.pp, ctx);
    put_i64_attr(root, "virtual_stages", meta.virtual_stages, ctx);
    put_i64_attr(root, "tp", meta.tp, ctx);
    put_i64_attr(root, "zero", meta.zero, ctx);
    put_str_attr(root, "schedule", meta.schedule, ctx);
    {
      H5Handle<H5Gclose> g(ensure_group(root, "optimizer", ctx));
      put_str_attr(g.get(), "name", meta.optimizer, ctx);
      put_i64_attr(g.get(), "step", meta.optimizer_step, ctx);
    }
    {
      H5Handle<H5Gclose> g(ensure_group(root, "data", ctx));
      put_i64_attr(g.get(), "epoch", meta.epoch, ctx);
      put_i64_attr(g.get(), "position", meta.position, ctx);
      put_i64_attr(g.get(), "batch_size", meta.batch_size, ctx);
      put_i64_attr(g.get(), "samples", meta.samples, ctx);
      put_i64_attr(g.get(), "shuffle", meta.shuffle ? 1 : 0, ctx);
      if (!meta.tokenizer.empty()) put_str_attr(g.get(), "tokenizer", meta.tokenizer, ctx);
    }
    {
      // Relay's random numbers are counter-based: (seed, stream, position) is the whole state.
      H5Handle<H5Gclose> g(ensure_group(root, "rng", ctx));
      put_i64_attr(g.get(), "model_seed", static_cast<int64_t>(meta.model_seed), ctx);
      put_i64_attr(g.get(), "data_seed", static_cast<int64_t>(meta.data_seed), ctx);
      put_i64_attr(g.get(), "data_stream", meta.epoch, ctx);
      put_i64_attr(g.get(), "data_offset", meta.samples ? meta.position % meta.samples : 0, ctx);
    }
  }
  for (const auto& t : tensors) {
    const float* values = t.fetch ? t.fetch() : t.values();
    {
      Hdf5Lock lock;  // per tensor: other threads' HDF5 reads run between tensors
      RELAY_ASSERT(t.fetch || t.view || static_cast<int64_t>(t.data.size()) == shape_numel(t.shape),
                   "tensor " << t.name << " size");
      size_t slash = t.name.rfind('/');
      H5Handle<H5Gclose> g(ensure_group(root, t.name.substr(0, slash), ctx));
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      H5Space sp(RELAY_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), ctx));
      H5Dataset d(RELAY_H5_CHECK(H5Dcreate2(g.get(), t.name.substr(slash + 1).c_str(), H5T_IEEE_F32LE, sp.get(),
                                            H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                 cat(ctx, ": ", t.name)));
      RELAY_H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values),
                     cat(ctx, ": ", t.name));
    }
    if (on_tensor) on_tensor();
  }
  Hdf5Lock lock;
  put_i64_attr(root, "complete", 1, ctx);  // written last: a file without it was cut short
  RELAY_H5_CHECK(H5Fflush(root, H5F_SCOPE_GLOBAL), ctx);
  RELAY_H5_CHECK(H5Fclose(file.f.release()), ctx);
}

}  // namespace

void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta,
                           const std::vector<CheckpointTensor>& tensors, const std::function<void()>& on_tensor) {
  const std::string tmp = cat(path, ".tmp-", ::getpid());
  try {
    write_tmp_file(tmp, meta, tensors, on_tensor);
  } catch (const Error& e) {
    std::error_code ec;
    fs::remove(tmp, ec);  // never leave a partial file behind; the previous checkpoint stays as it was
    const fs::space_info sp = fs::space(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path(), ec);
    throw Error(cat(e.what(), "; the partial file was removed",
                    !ec && sp.available < (64u << 20) ? cat(" (", sp.available >> 20, " MiB free on that filesystem)") : "",
                    "; the previous checkpoint and 'latest' are unchanged"));
  }
  if (const char* crash = std::getenv("RELAY_FAULT_CRASH_BEFORE_RENAME"))
    if (std::atoll(crash) == meta.step) {
      std::fprintf(stderr, "RELAY_FAULT_CRASH_BEFORE_RENAME: exiting after writing %s, before the rename\n",
                   tmp.c_str());
      std::_Exit(86);
    }
  try {
    atomic_replace(tmp, path);
  } catch (const Error&) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  const std::string ctx = cat("checkpoint ", path);
  if (!fs::exists(path)) throw Error(cat(ctx, ": no such file"));
  Hdf5Lock lock;
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) throw Error(cat(ctx, ": not an HDF5 file (truncated or not a checkpoint)"));
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw Error(cat(ctx, ": cannot be opened, the file is truncated or corrupt (", h5_error_message(), ")"));
  hid_t f = static_cast<hid_t>(file_);
  if (H5Aexists(f, "format") <= 0 || h5_read_str_attr(f, "format", ctx) != kCheckpointFormat)
    throw Error(cat(ctx, ": not a Relay checkpoint (root attribute format != \"", kCheckpointFormat, "\")"));
  int64_t version = h5_read_i64_attr(f, "version", ctx);
  if (version > kCheckpointVersion)
    throw Error(cat(ctx, ": format version ", version, " is newer than this relay supports (", kCheckpointVersion,
                    "); hint: resume with a newer relay"));
  if (H5Aexists(f, "complete") <= 0 || h5_read_i64_attr(f, "complete", ctx) != 1)
    throw Error(cat(ctx, ": incomplete checkpoint (it was cut short while being written)"));
  meta_.step = h5_read_i64_attr(f, "step", ctx);
  meta_.config_toml = h5_read_str_attr(f, "config", ctx);
  meta_.dp = h5_read_i64_attr(f, "dp", ctx);
  meta_.pp = h5_read_i64_attr(f, "pp", ctx);
  meta_.virtual_stages = h5_read_i64_attr(f, "virtual_stages", ctx);
  if (H5Aexists(f, "tp") > 0) meta_.tp = h5_read_i64_attr(f, "tp", ctx);
  if (H5Aexists(f, "zero") > 0) meta_.zero = h5_read_i64_attr(f, "zero", ctx);
  meta_.schedule = h5_read_str_attr(f, "schedule", ctx);
  H5Handle<H5Gclose> opt(RELAY_H5_CHECK(H5Gopen2(f, "optimizer", H5P_DEFAULT), ctx + ": group /optimizer"));
  meta_.optimizer = h5_read_str_attr(opt.get(), "name", ctx + ": /optimizer");
  meta_.optimizer_step = h5_read_i64_attr(opt.get(), "step", ctx + ": /optimizer");
  H5Handle<H5Gclose> data(RELAY_H5_CHECK(H5Gopen2(f, "data", H5P_DEFAULT), ctx + ": group /data"));
  meta_.epoch = h5_read_i64_attr(data.get(), "epoch", ctx + ": /data");
  meta_.position = h5_read_i64_attr(data.get(), "position", ctx + ": /data");
  meta_.batch_size = h5_read_i64_attr(data.get(), "batch_size", ctx + ": /data");
  meta_.samples = h5_read_i64_attr(data.get(), "samples", ctx + ": /data");
  meta_.shuffle = h5_read_i64_attr(data.get(), "shuffle", ctx + ": /data") != 0;
  if (H5Aexists(data.get(), "tokenizer") > 0) meta_.tokenizer = h5_read_str_attr(data.get(), "tokenizer", ctx + ": /data");
  H5Handle<H5Gclose> rng(RELAY_H5_CHECK(H5Gopen2(f, "rng", H5P_DEFAULT), ctx + ": group /rng"));
  meta_.model_seed = static_cast<uint64_t>(h5_read_i64_attr(rng.get(), "model_seed", ctx + ": /rng"));
  meta_.data_seed = static_cast<uint64_t>(h5_read_i64_attr(rng.get(), "data_seed", ctx + ": /rng"));
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) {
    Hdf5Lock lock;
    H5Fclose(static_cast<hid_t>(file_));
  }
}

std::vector<std::pair<std::string, Shape>> CheckpointReader::tensors() const {
  std::vector<std::pair<std::string, Shape>> out;
  Hdf5Lock lock;
  struct Ctx { std::vector<std::pair<std::string, Shape>>* out; hid_t file; };
  Ctx c{&out, static_cast<hid_t>(file_)};
  auto visit = [](hid_t obj, const char* name, const H5O_info_t* info, void* op) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    auto* cx = static_cast<Ctx*>(op);
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t sp = H5Dget_space(d);
    auto dims = h5_shape(sp);
    H5Sclose(sp);
    H5Dclose(d);
    cx->out->emplace_back(name, Shape(dims.begin(), dims.end()));
    return 0;
  };
  RELAY_H5_CHECK(H5Ovisit(static_cast<hid_t>(file_), H5_INDEX_NAME, H5_ITER_INC, visit, &c), cat("checkpoint ", path_));
  std::sort(out.begin(), out.end());
  return out;
}

bool CheckpointReader::has(const std::string& name) const {
  Hdf5Lock lock;
  hid_t f = static_cast<hid_t>(file_);
  size_t at = 0;
  while (true) {  // H5Lexists needs every intermediate group to exist
    size_t slash = name.find('/', at);
    std::string prefix = name.substr(0, slash);
    if (H5Lexists(f, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    at = slash + 1;
  }
}

void CheckpointReader::read(const std::string& name, const Shape& expected, float* out) const {
  const std::string ctx = cat("checkpoint ", path_, ": tensor ", name);
  if (!has(name)) throw Error(cat(ctx, " is missing (expected shape ", shape_str(expected), ")"));
  Hdf5Lock lock;
  H5Dataset d(RELAY_H5_CHECK(H5Dopen2(static_cast<hid_t>(file_), name.c_str(), H5P_DEFAULT), ctx));
  H5Space sp(RELAY_H5_CHECK(H5Dget_space(d.get()), ctx));
  auto dims = h5_shape(sp.get());
  Shape got(dims.begin(), dims.end());
  if (got != expected)
    throw Error(cat(ctx, " has shape ", shape_str(got), " in the checkpoint but the model expects ", shape_str(expected)));
  RELAY_H5_CHECK(H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out),
                 cat(ctx, " (the file may be truncated or corrupt)"));
}

void write_latest(const std::string& dir, const std::string& file_name) {
  std::string path = dir + "/latest", tmp = cat(path, ".tmp-", ::getpid());
  try {
    {
      std::ofstream f(tmp, std::ios::trunc);
      if (!f) throw Error(cat("checkpoint: cannot write ", tmp, ": ", std::strerror(errno)));
      f << file_name << "\n";
      f.flush();
      if (!f) throw Error(cat("checkpoint: cannot write ", tmp, ": ", std::strerror(errno)));
    }
    atomic_replace(tmp, path);
  } catch (const Error&) {
    std::error_code ec;
    fs::remove(tmp, ec);  // `latest` still names the previous checkpoint
    throw;
  }
}

std::string read_latest(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  if (!f) return "";
  std::string name;
  std::getline(f, name);
  return name;
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool tmp = name.find(".tmp-") != std::string::npos &&
                     (name.rfind("step_", 0) == 0 || name.rfind("latest", 0) == 0);
    if (tmp && fs::remove(entry.path(), ec)) removed.push_back(name);
  }
  return removed;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep) {
  std::vector<std::string> files, deleted;
  if (keep < 1 || !fs::is_directory(dir)) return deleted;
  for (auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && n.size() > 3 && n.substr(n.size() - 3) == ".h5") files.push_back(n);
  }
  std::sort(files.begin(), files.end());  // zero-padded steps sort by name
  std::string latest = read_latest(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < files.size(); ++i) {
    if (files[i] == latest) continue;  // never delete what latest names
    fs::remove(fs::path(dir) / files[i]);
    deleted.push_back(files[i]);
  }
  return deleted;
}

}  // namespace relay

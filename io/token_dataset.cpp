// TokenDataset: opening and validating a token file, and reading sequences by hyperslab.
#include "io/token_dataset.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace relay {

TokenDataset::TokenDataset(const std::string& path, int64_t block_size, int64_t model_vocab, const std::string& what)
    : path_(path), where_(cat(what, ": ", path)), block_size_(block_size) {
  if (!std::filesystem::exists(path)) throw Error(cat(where_, ": no such file"));
  file_size_ = std::filesystem::file_size(path);
  Hdf5Lock lock;
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw Error(cat(where_, ": not an HDF5 file (hint: make one with relay data tokenize)"));
  file_ = H5File(RELAY_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), where_));
  if (H5Lexists(file_.get(), "tokens", H5P_DEFAULT) <= 0)
    throw Error(cat(where_, ": dataset /tokens is missing (a token file holds /tokens with attributes vocab_size and "
                            "tokenizer; hint: relay data tokenize)"));
  tokens_ = H5Dataset(RELAY_H5_CHECK(H5Dopen2(file_.get(), "tokens", H5P_DEFAULT), where_ + ": dataset /tokens"));
  H5Space space(RELAY_H5_CHECK(H5Dget_space(tokens_.get()), where_));
  const auto shape = h5_shape(space.get());
  H5Type type(RELAY_H5_CHECK(H5Dget_type(tokens_.get()), where_));
  const std::string tn = h5_type_name(type.get());
  if (shape.size() != 1 || (tn != "uint16" && tn != "int32"))
    throw Error(cat(where_, ": dataset /tokens is ", tn, " ", shape_string(shape),
                    "; expected a 1-D uint16 or int32 array of token ids"));
  length_ = shape[0];
  // Attributes on the file (h5py: f.attrs[...]) or on /tokens.
  auto holder = [&](const char* name) { return H5Aexists(file_.get(), name) > 0 ? file_.get() : tokens_.get(); };
  vocab_size_ = h5_read_i64_attr(holder("vocab_size"), "vocab_size", where_);
  tokenizer_ = h5_read_str_attr(holder("tokenizer"), "tokenizer", where_);
  const bool has_eot = H5Aexists(file_.get(), "eot_id") > 0 || H5Aexists(tokens_.get(), "eot_id") > 0;
  eot_id_ = has_eot ? h5_read_i64_attr(holder("eot_id"), "eot_id", where_) : -1;
  if (eot_id_ >= vocab_size_)
    throw Error(cat(where_, ": attribute eot_id is ", eot_id_, ", not below the file's vocab_size ", vocab_size_));
  if (tokenizer_ != "bytes" && tokenizer_ != "gpt2" && tokenizer_ != "hf")
    throw Error(cat(where_, ": attribute tokenizer is \"", tokenizer_, "\"; expected \"bytes\", \"gpt2\" or \"hf\""));
  if (vocab_size_ < 1 || vocab_size_ > model_vocab)
    throw Error(cat(where_, ": the file's vocab_size is ", vocab_size_, " (tokenizer \"", tokenizer_,
                    "\") but model.vocab_size = ", model_vocab,
                    "; the model needs a vocabulary at least as large as the data's (tokenizer mismatch?)"));
  sequences_ = length_ > 0 ? (length_ - 1) / block_size_ : 0;
  if (sequences_ < 1)
    throw Error(cat(where_, ": /tokens holds ", length_, " tokens, fewer than one sequence of model.block_size + 1 = ",
                    block_size_ + 1));
  scan(model_vocab);
}

TokenDataset::~TokenDataset() {
  Hdf5Lock lock;
  tokens_.reset();
  file_.reset();
}

void TokenDataset::scan(int64_t model_vocab) {
  // Called under the lock. Chunks of 1 Mi tokens keep the memory flat for any file size.
  const int64_t chunk = int64_t(1) << 20;
  std::vector<int32_t> buf;
  H5Space file_space(RELAY_H5_CHECK(H5Dget_space(tokens_.get()), where_));
  for (int64_t at = 0; at < length_; at += chunk) {
    const hsize_t start = static_cast<hsize_t>(at), count = static_cast<hsize_t>(std::min(chunk, length_ - at));
    buf.resize(count);
    RELAY_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), where_);
    H5Space mem(RELAY_H5_CHECK(H5Screate_simple(1, &count, nullptr), where_));
    RELAY_H5_CHECK(H5Dread(tokens_.get(), H5T_NATIVE_INT32, mem.get(), file_space.get(), H5P_DEFAULT, buf.data()),
                   where_ + ": dataset /tokens");
    for (hsize_t i = 0; i < count; ++i) {
      min_token_ = std::min(min_token_, buf[i]);
      max_token_ = std::max(max_token_, buf[i]);
      if (buf[i] < 0 || buf[i] >= model_vocab)
        throw Error(cat(where_, ": token ", buf[i], " at position ", at + int64_t(i), " of /tokens is outside [0, ",
                        model_vocab, ") (model.vocab_size)"));
    }
  }
}

void TokenDataset::read(const std::vector<int64_t>& seqs, int32_t* inputs, int32_t* targets) const {
  const int64_t T = block_size_;
  std::vector<int32_t> buf(static_cast<size_t>(T + 1));  // (T + 1) one sequence
  Hdf5Lock lock;
  H5Space file_space(RELAY_H5_CHECK(H5Dget_space(tokens_.get()), where_));
  const hsize_t count = static_cast<hsize_t>(T + 1);
  H5Space mem(RELAY_H5_CHECK(H5Screate_simple(1, &count, nullptr), where_));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t s = seqs[i];
    if (s < 0 || s >= sequences_)
      throw Error(cat(where_, ": sequence ", s, " requested but the file holds ", sequences_));
    const hsize_t start = static_cast<hsize_t>(s * T);
    RELAY_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), where_);
    RELAY_H5_CHECK(H5Dread(tokens_.get(), H5T_NATIVE_INT32, mem.get(), file_space.get(), H5P_DEFAULT, buf.data()),
                   where_ + ": dataset /tokens");
    if (inputs) std::copy(buf.begin(), buf.end() - 1, inputs + i * static_cast<size_t>(T));
    if (targets) std::copy(buf.begin() + 1, buf.end(), targets + i * static_cast<size_t>(T));
  }
  check_file_not_shrunk(path_, file_size_, where_);
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size,
                      const std::string& tokenizer, const std::vector<std::pair<std::string, int64_t>>& attrs) {
  const std::string tmp = cat(path, ".tmp-", ::getpid());
  const std::string ctx = cat("token file ", path);
  const bool u16 = vocab_size <= 65536;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw Error(cat(ctx, ": cannot create its directory ", parent.string(), ": ", ec.message()));
  {
    Hdf5Lock lock;
    H5File f(RELAY_H5_CHECK(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), ctx));
    const hsize_t n = tokens.size();
    H5Space sp(RELAY_H5_CHECK(H5Screate_simple(1, &n, nullptr), ctx));
    H5Dataset d(RELAY_H5_CHECK(H5Dcreate2(f.get(), "tokens", u16 ? H5T_STD_U16LE : H5T_STD_I32LE, sp.get(), H5P_DEFAULT,
                                          H5P_DEFAULT, H5P_DEFAULT),
                               ctx));
    if (n > 0)
      RELAY_H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()), ctx);
    H5Space scalar(RELAY_H5_CHECK(H5Screate(H5S_SCALAR), ctx));
    H5Attr v(RELAY_H5_CHECK(H5Acreate2(f.get(), "vocab_size", H5T_STD_I64LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), ctx));
    RELAY_H5_CHECK(H5Awrite(v.get(), H5T_NATIVE_INT64, &vocab_size), ctx);
    H5Type st(RELAY_H5_CHECK(H5Tcopy(H5T_C_S1), ctx));
    RELAY_H5_CHECK(H5Tset_size(st.get(), H5T_VARIABLE), ctx);
    RELAY_H5_CHECK(H5Tset_cset(st.get(), H5T_CSET_UTF8), ctx);
    H5Attr t(RELAY_H5_CHECK(H5Acreate2(f.get(), "tokenizer", st.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT), ctx));
    const char* name = tokenizer.c_str();
    RELAY_H5_CHECK(H5Awrite(t.get(), st.get(), &name), ctx);
    for (const auto& [key, value] : attrs) {
      H5Attr a(RELAY_H5_CHECK(H5Acreate2(f.get(), key.c_str(), H5T_STD_I64LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), ctx));
      RELAY_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &value), ctx);
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw Error(cat(ctx, ": cannot rename ", tmp, " into place: ", ec.message()));
  }
}

std::string describe_token_file(const std::string& path) {
  // Opening with the largest vocabulary and T = 1 validates the file and scans every token.
  TokenDataset d(path, 1, int64_t(1) << 31, "data inspect");
  std::string dtype;
  int32_t lo = 0, hi = 0;
  {
    Hdf5Lock lock;
    H5File f(RELAY_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path));
    H5Dataset t(RELAY_H5_CHECK(H5Dopen2(f.get(), "tokens", H5P_DEFAULT), path));
    H5Type ty(RELAY_H5_CHECK(H5Dget_type(t.get()), path));
    dtype = h5_type_name(ty.get());
  }
  lo = d.min_token();
  hi = d.max_token();
  std::string s = cat(path, ": token file\n  /tokens ", dtype, " [", d.length(), "]\n  attributes: vocab_size = ",
                      d.vocab_size(), ", tokenizer = \"", d.tokenizer(), "\"\n  token ids in [", lo, ", ", hi, "]\n");
  for (int64_t T : {64, 256, 1024})
    s += cat("  block_size ", T, ": ", d.length() > T ? (d.length() - 1) / T : 0, " sequences\n");
  return s;
}

}  // namespace relay

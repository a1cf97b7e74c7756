// Language-model data in HDF5: /tokens, 1-D uint16 (vocabularies up to 65,536) or int32, with
// attributes vocab_size and tokenizer ("bytes" | "gpt2" | "hf"). A sample is a sequence of block_size + 1
// tokens at stride block_size: sequence s is tokens[s*T, s*T+T] (inputs the first T, targets the
// last T), N = (len - 1) div T of them. Validated when opened, so a bad file fails before the first
// step with a message naming the file, the position and the value.
#pragma once
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/hdf5_util.hpp"

namespace relay {

class TokenDataset {
 public:
  // block_size: model.block_size (T). model_vocab: model.vocab_size; the file's vocab_size attribute
  // must not exceed it and every token must be below it (a chunked scan of the file). `what` (the
  // config key, "data.train") prefixes every message.
  TokenDataset(const std::string& path, int64_t block_size, int64_t model_vocab, const std::string& what);
  ~TokenDataset();
  TokenDataset(TokenDataset&&) = default;
  TokenDataset& operator=(TokenDataset&&) = delete;  // would close handles outside the lock

  const std::string& path() const { return path_; }
  int64_t sequences() const { return sequences_; }   // N
  int64_t block_size() const { return block_size_; }  // T
  int64_t length() const { return length_; }          // tokens in the file
  int64_t vocab_size() const { return vocab_size_; }  // the file's attribute
  const std::string& tokenizer() const { return tokenizer_; }
  int64_t eot_id() const { return eot_id_; }  // the attribute eot_id (relay data tokenize), -1 when absent
  int32_t min_token() const { return min_token_; }  // over the whole file (scanned at open)
  int32_t max_token() const { return max_token_; }

  // For each sequence index in seqs (any order, repeats allowed, each < N): inputs i32 (n, T) =
  // tokens[s*T, s*T+T), targets i32 (n, T) = tokens[s*T+1, s*T+T+1). Either may be null. Reads only
  // the T + 1 tokens of each sequence (one hyperslab per sequence).
  void read(const std::vector<int64_t>& seqs, int32_t* inputs, int32_t* targets) const;

 private:
  void scan(int64_t model_vocab);

  std::string path_, where_;
  uint64_t file_size_ = 0;  // at open: reads check the file has not shrunk since
  int64_t block_size_ = 0, length_ = 0, sequences_ = 0, vocab_size_ = 0, eot_id_ = -1;
  std::string tokenizer_;
  int32_t min_token_ = INT32_MAX, max_token_ = INT32_MIN;
  H5File file_;
  H5Dataset tokens_;
};

// Writes a token file atomically (a temporary file, then a rename): /tokens as uint16 when
// vocab_size <= 65,536, else int32, with the attributes vocab_size and tokenizer on the file.
// attrs: more integer attributes (relay data tokenize: eot_id, the end-of-text token or -1; documents).
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size,
                      const std::string& tokenizer, const std::vector<std::pair<std::string, int64_t>>& attrs = {});

// `relay data inspect` of a token file: length, dtype, attributes, the token range and, for
// block_size > 0, the number of sequences. Validates as training would (without a model vocabulary).
std::string describe_token_file(const std::string& path);

}  // namespace relay

// Byte-level BPE tokenizers in Hugging Face's tokenizer.json format (the `tokenizers` library):
// GPT-2's, and Llama 3's / SmolLM's (a Split by Llama 3's pattern, then ByteLevel without its regex),
// with their added special tokens. Encoding gives exactly the ids of tokenizers' encode(text,
// add_special_tokens=False) (tests/torch/test_hf_tokenizer_equivalence.py); the post-processor
// (a BOS token some tokenizers add) is not applied. Anything else is a named error.
#pragma once
#include <memory>
#include <string>

#include "io/tokenizer.hpp"

namespace relay {

// Reads `path` (a tokenizer.json). Errors start with the path and say what Relay does not read:
// model types other than BPE, normalizers, pre-tokenizer steps and patterns other than the above.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace relay

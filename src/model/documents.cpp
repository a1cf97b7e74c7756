#include "model/documents.hpp"

#include "core/error.hpp"

namespace relay {

void document_layout(const DocumentLayout& d, const int32_t* tokens, int64_t rows, int64_t T, int32_t* doc_start,
                     int32_t* positions) {
  RELAY_ASSERT(T > 0 && rows % T == 0, "document_layout: " << rows << " rows of sequences of " << T);
  for (int64_t s0 = 0; s0 < rows; s0 += T) {
    int32_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      doc_start[s0 + t] = start;
      positions[s0 + t] = d.reset_positions ? int32_t(t) - start : int32_t(t);
      if (tokens[s0 + t] == d.eot) start = int32_t(t + 1);  // the next position starts a document
    }
  }
}

void mask_document_targets(const DocumentLayout& d, const int32_t* tokens, int64_t rows, int32_t* targets) {
  for (int64_t r = 0; r < rows; ++r)
    if (tokens[r] == d.eot) targets[r] = -1;
}

int64_t counted_targets(const DocumentLayout& d, const int32_t* tokens, int64_t rows) {
  int64_t n = rows;
  for (int64_t r = 0; r < rows; ++r) n -= tokens[r] == d.eot;
  return n;
}

}  // namespace relay

#include "model/documents.hpp"

#include <algorithm>
#include <vector>

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

void shift_targets(const int32_t* targets, const int32_t* doc_start, int64_t rows, int64_t T, int64_t k, int32_t* ids,
                   int32_t* targets_k) {
  RELAY_ASSERT(T > 0 && rows % T == 0 && k >= 1,
               "shift_targets: " << rows << " rows of sequences of " << T << ", depth " << k);
  for (int64_t r = 0; r < rows; ++r) {
    const bool kept = r % T + k < T && (!doc_start || doc_start[r + k] == doc_start[r]);  // i + k in i's document
    ids[r] = kept ? targets[r + k - 1] : 0;  // t_{i+k}: target i + k - 1, never masked inside a document
    targets_k[r] = kept ? targets[r + k] : -1;
  }
}

int64_t counted_mtp_targets(const DocumentLayout& d, const int32_t* tokens, int64_t rows, int64_t T, int64_t k) {
  if (!d.on()) return rows / T * std::max<int64_t>(T - k, 0);
  // The same rule as the block's shift: targets -1 at the end-of-text inputs, shifted within the documents.
  const size_t n_rows = static_cast<size_t>(rows);
  std::vector<int32_t> targets(n_rows, 0), doc_start(n_rows), positions(n_rows), ids(n_rows), shifted(n_rows);
  mask_document_targets(d, tokens, rows, targets.data());
  document_layout(d, tokens, rows, T, doc_start.data(), positions.data());
  shift_targets(targets.data(), doc_start.data(), rows, T, k, ids.data(), shifted.data());
  int64_t n = 0;
  for (int32_t t : shifted) n += t >= 0;
  return n;
}

}  // namespace relay

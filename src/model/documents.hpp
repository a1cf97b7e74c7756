// Document masking (data.document_mask): sequences cut from a stream of packed documents, each ended by the
// end-of-text token, train as if every document were alone (Llama 3's intra-document mask; Megatron's
// --reset-attention-mask and --reset-position-ids). A document starts after every end-of-text token; the
// token belongs to the document it ends. Within one sequence of T tokens (inputs x[0..T), targets x[1..T]):
//   doc_start[t]  the first position of t's document in the sequence (0 for a document begun earlier): the
//                 attention of query t sees keys [doc_start[t], t] only;
//   positions[t]  t - doc_start[t] with reset_positions (the learned or rotary position restarts at 0 with each
//                 document), else t;
//   targets       the position whose input is the end-of-text token predicts the next document's first token:
//                 its target becomes -1, ignored by the loss and counted out of its mean.
// Computed on the host from the tokens every rank of a replica reads, so every pipeline stage and tensor-parallel
// rank derives the same layout.
#pragma once
#include <cstdint>
#include <vector>

namespace relay {

struct DocumentLayout {
  int32_t eot = -1;             // the end-of-text token (the token file's eot_id)
  bool reset_positions = true;  // data.reset_positions
  bool on() const { return eot >= 0; }
};

// tokens (rows) = sequences x T inputs -> doc_start, positions (rows each).
void document_layout(const DocumentLayout& d, const int32_t* tokens, int64_t rows, int64_t T, int32_t* doc_start,
                     int32_t* positions);
// targets (rows): set to -1 where the input token is the end-of-text token.
void mask_document_targets(const DocumentLayout& d, const int32_t* tokens, int64_t rows, int32_t* targets);
// Targets the loss counts: rows minus the end-of-text inputs.
int64_t counted_targets(const DocumentLayout& d, const int32_t* tokens, int64_t rows);

// Multi-token prediction's depth k (model/mtp_block.cpp) on whole sequences of T, as Megatron-LM's roll_tensor rolls
// the input ids and labels k times one position left within each packed document and fills the vacated slots: position
// i reads t_{i+k} (ids) and predicts t_{i+k+1} (targets_k) when i + k lies in i's sequence and document, else id 0 and
// target -1 (not counted). targets (rows): the main loss's (target i = t_{i+1}, -1 where it counts none: document
// ends, mask_document_targets); doc_start (rows): document_layout's, or null (no document mask).
void shift_targets(const int32_t* targets, const int32_t* doc_start, int64_t rows, int64_t T, int64_t k, int32_t* ids,
                   int32_t* targets_k);
// The positions depth k counts in tokens (rows) of sequences of T: the targets shift_targets leaves >= 0 (without a
// document mask rows / T x (T - k); with one, those whose inputs i..i+k hold no end-of-text token).
int64_t counted_mtp_targets(const DocumentLayout& d, const int32_t* tokens, int64_t rows, int64_t T, int64_t k);

}  // namespace relay

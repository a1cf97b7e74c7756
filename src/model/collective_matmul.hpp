// Sequence parallelism's collective matmul (Wang et al., "Overlap communication with dependent computation via
// decomposition in large deep learning models", ASPLOS 2023; torchtitan's async TP, Megatron-LM's tp-comm-overlap):
// the all-gather of a micro-batch's rows before a column-parallel GEMM, split into tp steps around the ring, each step
// running the GEMM on the chunk of rows in hand while the next member's chunk travels.
#pragma once
#include <functional>

#include "model/tensor_parallel.hpp"

namespace relay {

// local (m, w), this rank's rows -> the group's rows (tp m, w) in tp's shared buffer, as TensorParallel::gather_rows
// (valid until the buffer's next use). each(row0, chunk) runs once per member's chunk (m, w), rows [row0, row0 + m) of
// the result: this rank's first, then rank - 1's, rank - 2's, ... around the ring, each while the next chunk travels
// (point-to-point through tp.overlap_comm(), handed to the progress thread; every wait watched and named
// `what`, its time counted in tp.waited_s). A GEMM per chunk instead of one over every row: each output row is the
// same dot products, but a GEMM library may block M differently (docs/parallelism.md says what the tests found).
Tensor gather_rows_matmul(Backend& be, const TensorParallel& tp, const Tensor& local, const char* what,
                          const std::function<void(int64_t row0, const Tensor& chunk)>& each);

}  // namespace relay

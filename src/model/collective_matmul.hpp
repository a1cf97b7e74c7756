// Sequence parallelism's collective matmul (Wang et al., "Overlap communication with dependent computation via
// decomposition in large deep learning models", ASPLOS 2023; torchtitan's async TP, Megatron-LM's tp-comm-overlap):
// the all-gather of a micro-batch's rows before a column-parallel GEMM, split into tp steps around the ring, each step
// running the GEMM on the chunk of rows in hand while the next member's chunk travels; and the reduce-scatter after a
// row-parallel GEMM, each step computing the partial sums of the chunk of rows due next while the last travels.
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
// The same with or without the ring: ring (the caller's tp.collective_matmul(gemm)) -> gather_rows_matmul; otherwise
// the group's rows gathered at once (TensorParallel::all_rows) and each(0, every row) run once: one GEMM over all
// rows, the order without overlap. Returns the gathered rows either way. `each` sizes its output by chunk.size(0).
Tensor gather_rows_matmul(Backend& be, const TensorParallel& tp, bool ring, const Tensor& local, const char* what,
                          const std::function<void(int64_t row0, const Tensor& chunk)>& each);

// The group's sum of row-parallel partial sums, reduce-scattered by rows: local (m, w) = this rank's rows of
// sum over the members of their partial(row0, out) (each the member's partial sums of rows [row0, row0 + m) into out
// (m, w)). At step s rank r computes its partial of chunk (r - 1 - s) mod tp, adds the sum of the same chunk's partials
// that rank r - 1 sent (received while the GEMM ran), and sends the sum on to r + 1 (it travels while the next
// step's GEMM runs); at the last step the chunk is its own: local. Chunk c's sum is ((P_{c+1} + P_{c+2}) + ...) + P_c:
// at tp 2 one addition, the same bits as MPI's reduce-scatter; at larger tp another order than MPI's (within fp32
// rounding). Scratch: tp's shared buffer (tp m, w), holding the sums in flight.
void matmul_reduce_scatter(Backend& be, const TensorParallel& tp, Tensor& local, const char* what,
                           const std::function<void(int64_t row0, Tensor& out)>& partial);

}  // namespace relay

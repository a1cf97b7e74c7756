// The MPI communicator's reduce-scatter of a sum as an exchange of pieces (issue 40: the shaped-link overlap bench).
// Open MPI 4.1's non-blocking MPI_Ireduce_scatter_block (libnbc) reduces the whole buffer to rank 0 over a binomial
// tree and then sends each member its piece from there: between two ranks one direction of the link carries the whole
// buffer, then the other direction half of it, 3x the time of a link used both ways at once. Here an all-to-all hands
// every member the other members' copies of its piece (each direction carries (size - 1) / size of the buffer, all at
// once; every ZeRO reduce-scatter, the context-parallel key/value gradients and sequence parallelism's input
// gradients travel so), and the member adds the size copies itself once they are in, grouped as libnbc's tree groups
// them: round r adds member i + 2^(r-1)'s partial sum into member i's for every i divisible by 2^r. IEEE addition is
// commutative, so only the grouping decides the bits, and the sums are libnbc's bit for bit at every size.
#pragma once
#include <cstdint>

#include "core/tensor.hpp"

namespace relay {

// After the exchange (MpiCommunicator::ireduce_scatter_sum: an MPI_Ialltoall of one block per member): pieces
// (size x count, member p's copy of this member's block at p) -> out (count) = their sum in libnbc's binomial
// grouping, in dtype (f32, i32, or bf16 added in float and rounded after every addition: bf16_add). pieces is
// overwritten (the partial sums); out may not overlap it.
void sum_pieces(void* pieces, void* out, int size, int64_t count, DType dtype);

}  // namespace relay

// Pipeline schedules as pure data: per pipeline rank, the ordered list of actions of one training step.
// GPipe (arXiv:1811.06965), 1F1B and interleaved 1F1B (Megatron-LM, arXiv:2104.04473) and ZB-H1
// (Zero Bubble, arXiv:2401.10241). simulator.hpp replays the lists; the executor interprets them.
#pragma once
#include <string>
#include <vector>

#include "core/error.hpp"

namespace relay {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1 };

// "gpipe" | "1f1b" | "interleaved" | "zb-h1"; anything else is an Error naming parallel.schedule.
ScheduleKind parse_schedule_kind(const std::string& s);
const char* schedule_kind_name(ScheduleKind k);  // the inverse of parse_schedule_kind

enum class Op {
  forward,          // run the chunk forward (the last chunk's forward includes the loss)
  backward,         // backward_input then backward_weight, fused
  backward_input,   // gradient w.r.t. the chunk's input: on the critical path (ZB's "B")
  backward_weight,  // gradient w.r.t. the chunk's weights: can wait (ZB's "W")
  send_activation,  // forward(c, mb)'s output to chunk c+1's rank; never blocks (Communicator::isend)
  recv_activation,  // chunk c's input from chunk c-1's rank; blocks until it has arrived
  send_grad,        // chunk c's input gradient to chunk c-1's rank; never blocks
  recv_grad,        // chunk c's output gradient from chunk c+1's rank; blocks
  allreduce_grads,  // data-parallel all-reduce of chunk c's gradients, after its last weight gradient
  reduce_tied_grads,  // sum the gradient of a weight held by two stages (GPT's tied embedding: chunk 0
                      // on the first rank, the last chunk on the last) over the pair; both ranks run it
  optimizer_step,   // the last action of every list
};
const char* op_name(Op op);

// chunk: global model-chunk id in [0, pp*v); chunk c lives on pipeline rank c % pp.
// micro_batch: in [0, m). allreduce_grads and reduce_tied_grads have micro_batch -1; optimizer_step has
// chunk and micro_batch -1.
struct Action {
  Op op;
  int chunk;
  int micro_batch;
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // "forward(chunk 1, mb 3)", "allreduce_grads(chunk 1)"

// v = parallel.virtual_stages, m = train.micro_batches.
struct ScheduleShape {
  ScheduleKind kind;
  int pp;
  int v;
  int m;
  bool tied = false;  // chunk 0 and the last chunk share a weight (tied embeddings); with pp > 1 the
                      // lists of their two ranks end with reduce_tied_grads before optimizer_step
};
inline int num_chunks(const ScheduleShape& s) { return s.pp * s.v; }
inline int chunk_rank(const ScheduleShape& s, int chunk) { return chunk % s.pp; }

// Throws Error naming the config keys (parallel.pp, parallel.virtual_stages, parallel.schedule,
// train.micro_batches) when the shape is one the kind cannot run.
void validate_schedule_shape(const ScheduleShape& s);

// Pure functions of (shape, rank): the same arguments give the same list on every call and every rank.
std::vector<Action> generate_schedule(const ScheduleShape& s, int pp_rank);
std::vector<std::vector<Action>> generate_all(const ScheduleShape& s);  // one list per pp rank

}  // namespace relay

// `relay plan --measure --calibrate OUT`: this machine as a cluster file for the planner (plan/cluster.hpp),
// measured with Relay's own CPU backend at the model's shapes: the GEMM rate over the decoder block's GEMMs
// (forward, backward-input and backward-weight shapes; the rate is the device's peak and gemm_efficiency 1), the
// flash attention's forward and backward rates as efficiencies against that peak, the streaming bandwidth of a
// large copy and the time of an empty operation (the launch term). A device is one rank with `threads` threads.
// The links are not measured through the communicator (plan runs without MPI): they are the copy bandwidth
// halved (MPI's shared-memory transport copies a message twice), and the file says so.
#pragma once
#include <string>

#include "backend/backend.hpp"
#include "train/model_layout.hpp"

namespace relay {

// The cluster file's text for this machine, from measurements at `rows` rows (a micro-batch's tokens).
std::string calibrate_this_machine(Backend& be, const ModelLayout& layout, int64_t rows, int threads,
                                   Precision precision);

}  // namespace relay

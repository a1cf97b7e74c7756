// `relay plan --measure --calibrate OUT`: this machine as a cluster file for the planner (plan/cluster.hpp),
// measured with Relay's own backend (the config's train.device) at the model's shapes: the GEMM rate over the decoder
// block's GEMMs (forward, backward-input and backward-weight shapes; on a CPU the rate is the device's peak and
// gemm_efficiency 1, on a GPU the data sheet's peak stays and gemm_efficiency is the rate over it), the flash
// attention's forward and backward rates as efficiencies against that peak, the streaming bandwidth of a large copy
// and the time of an empty operation (the launch term). A device is one rank: `threads` threads, or one GPU.
// The links: under mpirun, measured through the communicator (plan/link_calibration.hpp: within a node when a node
// has two ranks or more, between nodes when the ranks span several hosts); otherwise, or for the link no run crossed,
// the copy bandwidth halved (MPI's shared-memory transport copies a message twice), and the file says which.
#pragma once
#include <string>

#include "backend/backend.hpp"
#include "plan/link_calibration.hpp"
#include "train/model_layout.hpp"

namespace relay {

// The cluster file's text for this machine, from measurements at `rows` rows (a micro-batch's tokens) and the links
// measured across the launched ranks (null: one process, no link measured).
std::string calibrate_this_machine(Backend& be, const ModelLayout& layout, int64_t rows, int threads,
                                   Precision precision, const LinkCalibration* links);

}  // namespace relay

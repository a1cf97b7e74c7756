// NcclCommunicator: the Communicator for GPU ranks, moving device tensors with NCCL and keeping host
// scalars (losses, norms, flags) and barriers on MPI. Bootstrapped over the MPI communicator it serves.
//
// Streams: communication never runs on the backend's compute stream. Each operation is ordered after
// the compute work queued before it (an event), and Request::wait() orders later compute work after
// the operation (the compute stream waits on its event) without blocking the host.
//
// Point-to-point: NCCL serialises every operation on one communicator, whatever stream it is queued
// on, and a send blocks until the peer's matching receive runs. So that a rank can send an activation
// and then wait for a gradient while its peer first sends that gradient (the pipeline schedules rely
// on non-blocking sends, as MPI_Isend gives), every ordered pair of ranks (sender -> receiver) gets its
// own two-rank NCCL communicator and stream: only messages with the same sender and receiver are
// ordered relative to each other. NCCL has no tags: messages from one rank to another are matched in
// posting order. The tag is checked (through a small MPI message) in builds without NDEBUG or when
// RELAY_NCCL_CHECK_TAGS=1 is set on every rank.
//
// Costs and caveats: the pair communicators are created eagerly and collectively in the constructor
// (2 (size - 1) per rank); pass point_to_point = false for groups that only all-reduce (data parallel).
// CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8); streams that share
// a queue can falsely wait on each other, so leave it unset or raise it (never set it to 1 with NCCL
// point-to-point). Requests must not outlive the backend.
#pragma once
#include <mpi.h>

#include <memory>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"

namespace relay {

// Collective over comm: every member calls it with a CUDA backend (whose device is this rank's GPU).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, Backend& backend, bool point_to_point = true);

}  // namespace relay

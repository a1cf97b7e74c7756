// Rank 0's training log: a line every train.log_every steps (step, loss, lr, grad norm, samples/s,
// elapsed, ETA) and the same records as JSON lines in <run.dir>/metrics.jsonl.
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace relay {

struct StepRecord {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, samples_per_s = 0;
  double elapsed_s = 0, eta_s = 0;
  double step_time_s = 0;               // the mean wall time of a step over the logging window
  double rss_mib = 0, rss_max_mib = 0;  // resident memory: rank 0's, and the largest over all ranks
  double peak_rss_max_mib = 0;          // the largest peak resident memory (VmHWM) over all ranks
  std::vector<double> peak_rss_mib_per_rank;  // every rank's peak resident memory, by world rank
  double flops_per_s = 0;               // achieved training FLOP/s: model_flops_per_row x rows/s (block_cost.hpp)
  double mfu = -1;                      // flops_per_s / (GPU peak x ranks) on a GPU in the peak table; -1 = n/a
  // Rank 0's mean per step over the logging window: waiting for the next batch, for pipeline
  // messages, and for the data-parallel (and tied-weight) all-reduces at the end of the step.
  double input_wait_s = 0, pipeline_wait_s = 0, allreduce_wait_s = 0;
  // Rank 0's mean per step over the window of the time it waited on its data-parallel collectives anywhere in the
  // step (gradient reductions, ZeRO all-gathers): the communication parallel.overlap did not hide.
  double exposed_comm_s = 0;
  // Compute per step over the window: the slowest rank's and the median over all ranks (stragglers.hpp);
  // slowest_rank -1 with one rank.
  int slowest_rank = -1;
  double slowest_compute_s = 0, median_compute_s = 0;
  int64_t restarts = 0;  // in-job restarts of this allocation before this run (RELAY_RESTART_COUNT)
  int64_t skipped_steps = 0;  // steps skipped so far for a non-finite loss or gradient norm (train.skip_nonfinite)
  // MoE models (this step's, not the window's): the mean load-balancing loss and z-loss (loss holds them times
  // their coefficients) and per MoE layer the largest and the mean tokens per expert.
  bool moe = false;
  double aux_loss = 0, z_loss = 0;
  std::vector<double> expert_load_max, expert_load_mean;
  // Multi-token prediction (model.num_mtp_layers = D > 0): each module's CE_k (the mean over the global batch's
  // sequences x (T - k) positions) and their mean, mtp_loss; the optimised objective is loss + mtp_loss_weight x
  // mtp_loss. Empty without MTP.
  std::vector<double> mtp_losses;
  double mtp_loss = 0;
  double router_margin = 0;  // the smallest k-th minus (k+1)-th router probability of any token (model/block.hpp)
  // parallel.ep > 1 (this step's): the most time a rank spent in its MoE all-to-alls (counts and rows, waits for its
  // peers included) and the rows all ranks' dispatches sent to other ranks (ExpertExchangeStats); -1 without ep.
  double ep_alltoall_s = -1, ep_rows_sent = 0;
};

// This process's peak resident set size in MiB (VmHWM in /proc/self/status), 0 where unavailable.
double peak_resident_mib();

// This process's resident set size in MiB (/proc/self/statm), 0 where unavailable.
double resident_mib();

class EventFileWriter;

class MetricsLog {
 public:
  // resume_step >= 0 keeps the records of steps <= resume_step (a resumed run continues the file,
  // and steps after the checkpoint are logged again by the resumed run); -1 starts a fresh file.
  // tokens_per_sample > 0 (a language model's sequence length) adds tokens/s to the log.
  MetricsLog(const std::string& path, int64_t resume_step, int64_t tokens_per_sample = 0);
  void train(const StepRecord& r);
  void eval(int64_t step, double loss, double accuracy, bool has_accuracy);
  // An in-job restart (restarts.hpp): resumed at `step` after a run that logged up to failed_after_step.
  void restart(int64_t step, int64_t count, const std::string& cause, int64_t failed_after_step);
  void note(const std::string& line);  // printed only
  // {"plan": plan_json}: the planner's prediction for this run (relay train --plan-cluster), the file's first record.
  void plan(const std::string& plan_json);
  // log.tensorboard: every train and eval record also goes to TensorBoard event files in dir, as
  // scalars tagged train/<key> and eval/<key> (the metrics.jsonl keys).
  void enable_tensorboard(const std::string& dir);
  ~MetricsLog();

 private:
  void append(const std::string& json);
  void tensorboard(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  std::unique_ptr<EventFileWriter> tb_;
  std::string path_;
  int64_t tokens_per_sample_;
  std::ofstream out_;
};

std::string format_duration(double seconds);  // "1h02m03s", "4m05s", "12.3s"

}  // namespace relay

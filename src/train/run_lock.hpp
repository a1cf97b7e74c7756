// Run-directory ownership: one job at a time per run.dir. Rank 0 holds <run.dir>/relay.lock for the
// whole run: an fcntl lock on the open file (released by the kernel, or by the NFS/Lustre lock
// server, when the process dies) plus a record of the owner with a lease renewed every
// kLeaseRenewS seconds, for filesystems whose locks are not coherent across hosts (Lustre mounted
// with -o localflock, NFS without a lock manager). Slurm's and torchelastic's rendezvous stores use
// the same two ideas: an OS lock where it works, and a heartbeat where it may not.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace relay {

// The owner record, one JSON object in the lock file.
struct LockOwner {
  std::string host, job;      // job: SLURM_JOB_ID, or "" outside Slurm
  long long pid = 0;
  std::string start;          // UTC, ISO 8601 ("2026-11-23T22:57:34Z")
  double lease = 0;           // wall-clock seconds since the epoch at the last renewal
  std::string describe() const;  // "host node1, pid 4242, Slurm job 77, started 2026-11-23T22:57:34Z"
};

inline constexpr double kLeaseRenewS = 10;    // the owner rewrites its lease this often
inline constexpr double kLeaseExpireS = 120;  // a record not renewed for this long is stale

class RunLock {
 public:
  // Takes <run_dir>/relay.lock (creating run_dir), or throws Error naming the owner. A stale record
  // (a dead pid on this host, or a lease older than kLeaseExpireS from another host) is taken over;
  // `note` then says whose and why. Writes nothing into run_dir but the lock file, and that only
  // once the lock is ours.
  static std::unique_ptr<RunLock> acquire(const std::string& run_dir, std::string& note);
  ~RunLock();  // stops the lease thread, empties the record (a clean end) and releases the lock
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  RunLock(int fd, std::string path, LockOwner me);
  void renew_loop();
  bool write_record();

  int fd_;
  std::string path_;
  LockOwner me_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool warned_ = false;
  std::thread lease_;
};

// Collective over MPI_COMM_WORLD, before anything reads or writes the run directory: rank 0 takes the
// lock and every rank learns the outcome (agree_on_errors), so a refused job ends on every rank with
// rank 0's one line. Returns the lock on rank 0, null elsewhere.
std::unique_ptr<RunLock> own_run_dir(const std::string& run_dir);

}  // namespace relay

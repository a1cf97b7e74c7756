#include "train/run_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "comm/agree.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;

namespace relay {

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_iso(double t) {
  const std::time_t s = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// A write lock on the whole file. Open file description locks (Linux >= 3.15) belong to this open
// file, not to the process, so no other descriptor of the file that this process opens and closes can
// drop them (the trap of classic POSIX locks); both kinds go to the NFS and Lustre lock servers.
// Returns 0, or the errno: EAGAIN/EACCES = held by another process.
int try_lock(int fd) {
  struct flock fl{};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
#ifdef F_OFD_SETLK
  if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
  if (errno == EAGAIN || errno == EACCES) return errno;  // held; anything else: try the classic kind
#endif
  return fcntl(fd, F_SETLK, &fl) == 0 ? 0 : errno;
}

std::string read_text(int fd) {
  std::string text;
  char buf[4096];
  for (off_t off = 0;;) {
    const ssize_t n = pread(fd, buf, sizeof buf, off);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    off += n;
  }
  return text;
}

// The record in the file; nullopt when it is empty (a clean end) or unreadable (`bad` = true).
std::optional<LockOwner> read_owner(int fd, bool& bad) {
  bad = false;
  const std::string text = read_text(fd);
  if (text.find_first_not_of(" \n") == std::string::npos) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(text);
    LockOwner o;
    o.host = j.at("host").get<std::string>();
    o.pid = j.at("pid").get<long long>();
    o.job = j.value("job", std::string());
    o.start = j.value("start", std::string("?"));
    o.lease = j.at("lease").get<double>();
    return o;
  } catch (const nlohmann::json::exception&) {
    bad = true;
    return std::nullopt;
  }
}

// A zombie (killed, not yet reaped by its launcher) counts as gone.
bool pid_alive(long long pid) {
  if (pid <= 0 || (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  std::FILE* f = std::fopen(cat("/proc/", pid, "/stat").c_str(), "r");
  if (!f) return true;
  char state = 0;
  const int n = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return !(n == 1 && (state == 'Z' || state == 'X'));
}

[[noreturn]] void refuse(const std::string& run_dir, const LockOwner* o, const std::string& why) {
  throw Error(cat("run.dir ", run_dir, " is in use by another job: ",
                  o ? o->describe() : std::string("owner unknown (its record is not written yet)"), " (", why,
                  "); hint: wait for that job to end, or give this one another run.dir"));
}

}  // namespace

std::string LockOwner::describe() const {
  return cat("host ", host, ", pid ", pid, job.empty() ? std::string() : cat(", Slurm job ", job), ", started ", start);
}

RunLock::RunLock(int fd, std::string path, LockOwner me) : fd_(fd), path_(std::move(path)), me_(std::move(me)) {
  lease_ = std::thread([this] { renew_loop(); });
}

std::unique_ptr<RunLock> RunLock::acquire(const std::string& run_dir, std::string& note) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw Error(cat("run.dir: cannot create ", run_dir, ": ", ec.message()));
  const std::string path = run_dir + "/relay.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(cat("run.dir: cannot open ", path, ": ", std::strerror(errno)));
  struct Closer {
    int fd;
    bool keep = false;
    ~Closer() { if (!keep) close(fd); }
  } closer{fd};

  LockOwner me;
  me.host = host_name();
  me.pid = getpid();
  if (const char* job = std::getenv("SLURM_JOB_ID")) me.job = job;
  me.lease = wall_now();
  me.start = utc_iso(me.lease);

  bool bad = false;
  int err = try_lock(fd);
  // A requeued instance of this same Slurm job may start while the previous one still writes its
  // last checkpoint: wait for it (at most a lease) rather than fail.
  for (double t0 = wall_now(); (err == EAGAIN || err == EACCES) && wall_now() - t0 < kLeaseExpireS;) {
    auto o = read_owner(fd, bad);
    if (!o || me.job.empty() || o->job != me.job) break;
    usleep(500000);
    watchdog_progress();  // the other ranks wait in agree_on_errors: this is work, not a stall
    err = try_lock(fd);
  }
  if (err == EAGAIN || err == EACCES) {
    std::optional<LockOwner> o;
    for (int i = 0; i < 20 && !(o = read_owner(fd, bad)); ++i) usleep(50000);  // it may be writing its record
    refuse(run_dir, o ? &*o : nullptr, cat(path, " is locked"));
  }
  if (err != 0)  // ENOLCK: a filesystem without a lock manager; the lease alone guards it
    note = cat("warning: cannot lock ", path, " (", std::strerror(err), "); relying on its lease alone. ");

  const auto old = read_owner(fd, bad);
  if (bad) note += cat("taking over ", path, ": its record is unreadable");
  if (old) {
    const double age = me.lease - old->lease;
    const bool here = old->host == me.host;
    const bool same_job = !me.job.empty() && old->job == me.job;  // an earlier run of this Slurm job, now gone
    const bool running = here && pid_alive(old->pid);
    // On this host a free lock settles it (same kernel); only without locks does a running pid count.
    if (age < kLeaseExpireS && !same_job && (here ? running && err != 0 : true))
      refuse(run_dir, &*old, here ? cat("its pid is running and its lease is ", static_cast<long long>(age), " s old")
                                  : cat("its lease was renewed ", static_cast<long long>(age), " s ago, less than ",
                                        kLeaseExpireS, " s"));
    note += cat("taking over ", path, " from ", old->describe(), ": ",
                here && !running ? cat("pid ", old->pid, " is not running on this host")
                : here ? cat("pid ", old->pid, " no longer holds the lock")
                : age >= kLeaseExpireS ? cat("its lease was last renewed ", static_cast<long long>(age),
                                             " s ago, more than ", kLeaseExpireS, " s")
                                       : std::string("an earlier run of this Slurm job, no longer holding the lock"));
  }
  std::unique_ptr<RunLock> lock(new RunLock(fd, path, me));
  closer.keep = true;
  if (!lock->write_record()) throw Error(cat("run.dir: cannot write ", path, ": ", std::strerror(errno)));
  return lock;
}

// The record, rewritten in place with one write of a fixed length (padded with spaces), so a reader
// never sees it empty or half old; fsync so that another host reading through NFS or Lustre sees it.
bool RunLock::write_record() {
  nlohmann::ordered_json j;
  j["host"] = me_.host;
  j["pid"] = me_.pid;
  j["job"] = me_.job;
  j["start"] = me_.start;
  j["lease"] = me_.lease;
  j["lease_renewed_every_s"] = kLeaseRenewS;
  j["stale_after_s"] = kLeaseExpireS;
  std::string text = j.dump();
  text.resize(std::max<size_t>(text.size(), 511), ' ');
  text += "\n";
  if (pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) return false;
  if (ftruncate(fd_, static_cast<off_t>(text.size())) != 0) return false;  // a longer old record's tail
  return fsync(fd_) == 0;
}

void RunLock::renew_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::duration<double>(kLeaseRenewS), [this] { return stopping_; })) {
    // Another job took the directory over: our lease expired (a hung filesystem, a suspended job).
    bool bad = false;
    const auto o = read_owner(fd_, bad);
    if (o && (o->host != me_.host || o->pid != me_.pid) && !warned_) {
      std::fprintf(stderr, "relay: warning: %s now names another owner (%s); this job's lease had expired\n",
                   path_.c_str(), o->describe().c_str());
      warned_ = true;
    }
    if (warned_) continue;
    me_.lease = wall_now();
    if (!write_record() && !warned_) {
      std::fprintf(stderr, "relay: warning: cannot renew the lease in %s: %s\n", path_.c_str(), std::strerror(errno));
      warned_ = true;
    }
  }
}

RunLock::~RunLock() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  lease_.join();
  // Empty, not removed: a job blocked on the old file would otherwise lock an unlinked inode while a
  // third one creates a new file, and both would own the directory.
  if (!warned_ && ftruncate(fd_, 0) == 0) fsync(fd_);
  close(fd_);
}

std::unique_ptr<RunLock> own_run_dir(const std::string& run_dir) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::unique_ptr<RunLock> lock;
  std::string note;
  agree_on_errors(MPI_COMM_WORLD, [&] {
    if (rank == 0) lock = RunLock::acquire(run_dir, note);
  });
  if (!note.empty()) {
    std::printf("relay: %s\n", note.c_str());
    std::fflush(stdout);
  }
  return lock;
}

}  // namespace relay

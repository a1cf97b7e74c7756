# shellcheck shell=bash
# tests/slurm/harness.sh: a private, single-node Slurm built from Debian's packages (munge, slurmctld,
# slurmd 22.05) for the job-script tests. Sourced by tests/slurm/test_*.sh, which call slurm_start.
# Every file (munge key and socket, slurm.conf, state, spool, logs, pids) lives in one temporary
# directory; the daemons, and any job still running, are stopped when the test exits, and also by a
# watchdog if the test itself is killed (ctest's timeout sends SIGKILL, which runs no trap).
# Where the daemons cannot be started the test prints "SKIPPED: <reason>" and exits 77, which ctest
# reports as skipped; RELAY_SLURM_REQUIRED=1 turns that into a failure (for CI that must run them).
# RELAY_SLURM_KEEP=1 keeps the temporary directory for a post-mortem; RELAY_SLURM_CONF_EXTRA holds
# extra slurm.conf lines (a later line overrides an earlier one).

HARNESS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HARNESS_DIR/../.." && pwd)

# --- test outcome ---------------------------------------------------------------------------------
t0_harness=$(date +%s.%N)
elapsed() { awk -v a="$t0_harness" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "[$(elapsed)s] $*"; }
skip() {
  if [[ ${RELAY_SLURM_REQUIRED:-0} == 1 ]]; then
    echo "FAIL: $* (RELAY_SLURM_REQUIRED=1 forbids skipping)"; slurm_dump_logs; exit 1
  fi
  echo "SKIPPED: $*"; exit 77
}
fail() { echo "FAIL: $*"; slurm_dump_logs; exit 1; }

# wait_until TIMEOUT_S CMD...: polls CMD every 0.2 s; returns 1 when TIMEOUT_S passes first.
wait_until() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@"; do
    (( $(date +%s) < deadline )) || return 1
    sleep 0.2
  done
}

# --- starting and stopping ------------------------------------------------------------------------
SLURM_HARNESS_DIR=""

# A port no socket uses, in any state, below Linux's ephemeral range (32768-60999) so that no
# outgoing connection takes it between the check and the bind; not $1 (the other daemon's port).
# A site's own Slurm (6817/6818) or a second harness can run beside this one.
_free_port() {
  local p
  for _ in $(seq 50); do
    p=$(( 20000 + RANDOM % 12000 ))
    [[ $p != "${1:-}" && -z $(ss -Hant "( sport = :$p )" 2>/dev/null) ]] && { echo "$p"; return 0; }
  done
  return 1
}

# Writes $dir/stop.sh, which stops everything this harness started. It is a file rather than a
# function so that the watchdog (a separate session that outlives the test) can run it too.
_write_stop_script() {
  local d=$SLURM_HARNESS_DIR
  cat >"$d/stop.sh" <<EOF
#!/usr/bin/env bash
# Stops the Slurm started in $d. Idempotent; safe to run twice.
exec 9>"$d/stop.lock"; flock 9
[[ -e "$d/stopped" ]] && exit 0
export SLURM_CONF="$d/slurm.conf"
# Jobs first, while slurmctld can still cancel them; a KillWait later they should be gone.
if kill -0 \$(cat "$d/run/slurmctld.pid" 2>/dev/null) 2>/dev/null; then
  timeout 10 scancel --quiet --full \$(timeout 10 squeue -h -o %i 2>/dev/null) 2>/dev/null
  for _ in \$(seq 50); do [[ -z \$(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.2; done
fi
# Daemons we started, by the pids we recorded.
pids=""
for f in "$d"/run/slurmd.pid "$d"/run/slurmctld.pid; do pids+=" \$(cat "\$f" 2>/dev/null)"; done
[[ -n \${pids// } ]] && kill -TERM \$pids 2>/dev/null
for _ in \$(seq 50); do kill -0 \$pids 2>/dev/null || break; sleep 0.2; done
[[ -n \${pids// } ]] && kill -KILL \$pids 2>/dev/null
# slurmstepd processes outlive slurmd; ours hold this harness's slurmd.log open. Kill each with
# every process below it (the job's tasks).
steps=""
for p in \$(pgrep -x slurmstepd); do
  ls -l "/proc/\$p/fd" 2>/dev/null | grep -qF "$d/log/slurmd.log" && steps+=" \$p"
done
if [[ -n \$steps ]]; then
  tree=\$steps; frontier=\$steps
  while [[ -n \$frontier ]]; do
    next=""
    for p in \$frontier; do next+=" \$(pgrep -P \$p)"; done
    frontier=\${next// / }; [[ -z \${frontier// } ]] && frontier=""
    tree+=" \$frontier"
  done
  kill -KILL \$tree 2>/dev/null
fi
munged --socket="$d/run/munge.socket" --stop >/dev/null 2>&1 || kill \$(cat "$d/run/munged.pid" 2>/dev/null) 2>/dev/null
touch "$d/stopped"
# Only ever delete a directory this harness made (mktemp's relay-slurm.XXXXXX).
if [[ \${RELAY_SLURM_KEEP:-0} == 1 ]]; then echo "harness: kept $d" >&2
elif [[ \$(basename "$d") == relay-slurm.?????? && -e "$d/slurm.conf" ]]; then rm -rf "$d"; fi
EOF
}

slurm_stop() {
  [[ -n $SLURM_HARNESS_DIR && -e $SLURM_HARNESS_DIR/stop.sh ]] || return 0
  bash "$SLURM_HARNESS_DIR/stop.sh"
}

slurm_dump_logs() {
  local d=$SLURM_HARNESS_DIR f
  [[ -n $d && -d $d ]] || return 0
  for f in "$d"/log/slurmctld.log "$d"/log/slurmd.log; do
    [[ -s $f ]] || continue
    echo "----- last lines of $f"; tail -n 15 "$f"
  done
}

# wait_daemon NAME TIMEOUT_S CHECK...: waits until CHECK succeeds; gives up at once when the daemon
# we started has exited (its fatal error is then the last thing in its log).
wait_daemon() {
  local name=$1 deadline=$(( $(date +%s) + $2 )); shift 2
  until "$@"; do
    kill -0 "$(cat "$SLURM_HARNESS_DIR/run/$name.pid" 2>/dev/null)" 2>/dev/null \
      || { _why="$name exited"; return 1; }
    (( $(date +%s) < deadline )) || { _why="$name did not get ready in time"; return 1; }
    sleep 0.2
  done
}
# _last_words DAEMON: its errors, else the end of its log, on one line.
_last_words() {
  local f=$SLURM_HARNESS_DIR/log/$1
  { grep -hiE 'error|fatal' "$f.log" "$f.stderr" || tail -q -n 3 "$f.log" "$f.stderr"; } 2>/dev/null | tail -n 4 | tr '\n' ' '
}

# slurm_start [CPUS]: starts munged, slurmctld and slurmd; returns when the node is idle.
# The node advertises max(CPUS, nproc) CPUs (default 8) so that dp=2 x pp=2 = 4 tasks fit on two
# cores: Slurm then allocates them without --overcommit, and the tasks share the real cores.
slurm_start() {
  local cpus=${1:-8} b
  [[ $(id -u) == 0 ]] || skip "the private Slurm runs its daemons and jobs as root (SlurmUser=root); run as root"
  for b in munged munge unmunge slurmctld slurmd sbatch srun scontrol squeue scancel sinfo ss flock; do
    command -v "$b" >/dev/null || skip "'$b' not found (install with: scripts/setup.sh --with-slurm)"
  done
  (( cpus >= $(nproc) )) || cpus=$(nproc)

  local d; d=$(mktemp -d "${TMPDIR:-/tmp}/relay-slurm.XXXXXX") || skip "cannot create a temporary directory"
  SLURM_HARNESS_DIR=$d
  # munged refuses a socket directory that others cannot traverse, and a key readable by others.
  chmod 755 "$d"
  mkdir -p "$d"/{munge,run,state,spool,log,tmp,work}
  chmod 700 "$d/munge"; chmod 755 "$d/run"
  _write_stop_script
  trap 'rc=$?; slurm_stop; exit $rc' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # The watchdog stops everything if this test is killed without running its EXIT trap.
  setsid bash -c 'while kill -0 '"$$"' 2>/dev/null && [[ ! -e "$1/stopped" ]]; do sleep 2; done
                  [[ -e "$1/stop.sh" ]] && bash "$1/stop.sh"' watchdog "$d" </dev/null >/dev/null 2>&1 &

  local t_start; t_start=$(date +%s.%N)
  head -c 1024 /dev/urandom >"$d/munge/munge.key"; chmod 400 "$d/munge/munge.key"
  munged --key-file="$d/munge/munge.key" --socket="$d/run/munge.socket" --pid-file="$d/run/munged.pid" \
         --log-file="$d/log/munged.log" --seed-file="$d/munge/munged.seed" >>"$d/log/munged.log" 2>&1 \
    || skip "munged did not start: $(tail -n 1 "$d/log/munged.log")"
  munge -n -S "$d/run/munge.socket" | unmunge -S "$d/run/munge.socket" >/dev/null 2>&1 \
    || skip "munged started but a credential does not round-trip through it"

  local ctld_port slurmd_port
  ctld_port=$(_free_port) && slurmd_port=$(_free_port "$ctld_port") || skip "no free TCP port for slurmctld/slurmd"
  SLURM_NODE=$(hostname -s)
  local mem_mb; mem_mb=$(free -m | awk '/^Mem:/ { print int($2 * 0.9) }')
  cat >"$d/slurm.conf" <<EOF
# Generated by tests/slurm/harness.sh for a private single-node test Slurm; not for production.
ClusterName=relaytest
SlurmctldHost=$SLURM_NODE(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$d/run/munge.socket,cred_expire=${RELAY_SLURM_CRED_EXPIRE:-5}
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$d/tmp
PlugStackConfig=$d/plugstack.conf
# No cgroups in containers: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobRequeue=1
ReturnToService=2
SlurmdParameters=config_overrides
# Short timeouts keep the tests quick; sched_interval=1 starts a requeued job as soon as its
# begin time passes instead of at the next 60 s scheduling pass.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=900
KillWait=5
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Four pretend GPUs (gres.conf names four stand-in device files): enough for Slurm to schedule
# relay-gpu.sbatch's --gpus-per-node and set CUDA_VISIBLE_DEVICES; there is no device behind them.
GresTypes=gpu
NodeName=$SLURM_NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=$SLURM_NODE Default=YES MaxTime=INFINITE State=UP
${RELAY_SLURM_CONF_EXTRA:-}
EOF
  : >"$d/plugstack.conf"
  # slurmd wants character devices; copies of /dev/null where mknod is allowed, else plain files
  # (slurmd then logs "not a valid character or block device" and carries on).
  mkdir -p "$d/dev"
  for g in 0 1 2 3; do mknod "$d/dev/gpu$g" c 1 3 2>/dev/null || touch "$d/dev/gpu$g"; done
  echo "Name=gpu File=$d/dev/gpu[0-3]" >"$d/gres.conf"
  export SLURM_CONF=$d/slurm.conf

  # -D keeps the daemons in the foreground so that $! is their pid.
  slurmctld -D -i -f "$d/slurm.conf" </dev/null >>"$d/log/slurmctld.stderr" 2>&1 &
  echo $! >"$d/run/slurmctld.pid"
  _ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
  wait_daemon slurmctld 30 _ctld_up \
    || skip "slurmctld did not start ($_why): $(_last_words slurmctld)"
  slurmd -D -N "$SLURM_NODE" -f "$d/slurm.conf" </dev/null >>"$d/log/slurmd.stderr" 2>&1 &
  echo $! >"$d/run/slurmd.pid"
  _node_idle() { sinfo -h -n "$SLURM_NODE" -o %T 2>/dev/null | grep -qx idle; }
  wait_daemon slurmd 30 _node_idle \
    || skip "slurmd did not bring the node up ($_why; node state: $(sinfo -h -o %T 2>/dev/null)): $(_last_words slurmd)"
  SLURM_START_SECONDS=$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  log "harness: Slurm up in ${SLURM_START_SECONDS}s (node $SLURM_NODE, $cpus CPUs, ports $ctld_port/$slurmd_port, dir $d)"

  # Jobs inherit this environment (sbatch's default --export=ALL). Four ranks share two cores:
  # Open MPI must yield while it waits, or a spinning rank starves the one it waits for.
  export OMPI_MCA_mpi_yield_when_idle=1
  # Scratch space for the test's data, configs and job output; removed with the rest.
  WORK_DIR=$d/work
}

# --- jobs -----------------------------------------------------------------------------------------
# slurm_submit SBATCH_ARGS...: submits, prints the job id.
slurm_submit() { sbatch --parsable "$@" | cut -d';' -f1; }

# job_field ID FIELD: one field of `scontrol show job` (JobState, Restarts, ExitCode, ...).
job_field() {
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | awk -F= -v k="$2" '$1 == k { sub(/^[^=]*=/, ""); print; exit }'
}

_job_in_state() { [[ $(job_field "$1" JobState) =~ ^($2)$ ]]; }

# wait_job_state ID TIMEOUT_S REGEX: waits until the job's state matches REGEX (e.g. RUNNING).
wait_job_state() { wait_until "$2" _job_in_state "$1" "$3"; }

# wait_job_done ID TIMEOUT_S: waits for a final state and sets JOB_STATE; fails the test on timeout.
# (Not in $(...): a failure there would end only the subshell.)
wait_job_done() {
  local final='COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED'
  wait_job_state "$1" "$2" "$final" \
    || fail "job $1 not done after $2 s (state $(job_field "$1" JobState), reason $(job_field "$1" Reason))"
  JOB_STATE=$(job_field "$1" JobState)
}

#!/usr/bin/env bash
# The private Slurm itself, without Relay: four tasks on this machine's cores, an MPI program under
# srun --mpi=pmix and under mpirun inside an allocation, and a batch job that takes SIGUSR1, exits 75
# and requeues itself (the primitives jobscripts/ builds on). When this fails, the other tests' failures
# are the harness's, not Relay's. Prints the harness's start time and the requeue delay.
#   bash tests/slurm/test_harness.sh [ignored]     exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
source "$(dirname "$0")/harness.sh"
command -v mpicc >/dev/null || skip "mpicc not found (install libopenmpi-dev)"

slurm_start
cd "$WORK_DIR" || fail "no work directory"

# 1. Four tasks on however many cores there are (the node claims at least 8 CPUs).
n=$(timeout 60 srun --ntasks=4 hostname | wc -l)
[[ $n == 4 ]] || fail "srun --ntasks=4 hostname printed $n lines, expected 4"
log "srun: 4 tasks ran"

# 2. MPI: a ring exchange of 8 MiB and an all-reduce, so that wire-up and shared memory both work.
cat >hello.c <<'EOF'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n = 1 << 20;
  double *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);  // (n,)
  for (int i = 0; i < n; i++) out[i] = rank;
  MPI_Sendrecv(out, n, MPI_DOUBLE, (rank + 1) % size, 0, in, n, MPI_DOUBLE, (rank + size - 1) % size, 0,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  int sum = 0;
  MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int ok = in[n - 1] == (rank + size - 1) % size && sum == size * (size - 1) / 2;
  printf("hello from rank %d of %d: %s\n", rank, size, ok ? "ok" : "WRONG");
  MPI_Finalize();
  return ok ? 0 : 1;
}
EOF
mpicc -O2 -o hello hello.c || fail "mpicc failed"
out=$(timeout 60 srun --ntasks=4 --mpi=pmix ./hello 2>&1)
[[ $(grep -c 'of 4: ok' <<<"$out") == 4 ]] || { echo "$out"; fail "srun --mpi=pmix: MPI hello did not run on 4 ranks"; }
log "srun --mpi=pmix: MPI hello ok on 4 ranks"

cat >mpirun-job.sh <<'EOF'
#!/usr/bin/env bash
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np "$SLURM_NTASKS" --bind-to none ./hello
EOF
id=$(slurm_submit --ntasks=4 --output=mpirun.out mpirun-job.sh) || fail "sbatch failed"
wait_job_done "$id" 120
[[ $JOB_STATE == COMPLETED && $(grep -c 'of 4: ok' mpirun.out) == 4 ]] \
  || { cat mpirun.out; fail "mpirun inside sbatch: job $id $JOB_STATE"; }
log "mpirun inside an allocation: MPI hello ok on 4 ranks"

# 3. SIGUSR1 -> srun -> tasks that exit 75 -> scontrol requeue -> the job runs again and finishes.
cat >requeue-job.sh <<'EOF'
#!/usr/bin/env bash
echo "run $SLURM_RESTART_COUNT started $(date +%s.%N)"
if [[ ${SLURM_RESTART_COUNT:-0} == 0 ]]; then
  srun --ntasks=4 bash -c 'trap "echo task \$SLURM_PROCID got USR1; exit 75" USR1; touch ready.$SLURM_PROCID
                          for i in $(seq 600); do sleep 0.1; done' &
  pid=$!
  trap 'signalled=1; kill -USR1 $pid' USR1
  while :; do signalled=0; wait $pid; rc=$?; (( signalled )) || break; done
  echo "srun exit $rc; requeue at $(date +%s.%N)"
  [[ $rc == 75 ]] && scontrol requeue "$SLURM_JOB_ID"
  exit 1
fi
EOF
rm -f ready.*
id=$(slurm_submit --ntasks=4 --requeue --open-mode=append --output=requeue.out requeue-job.sh) || fail "sbatch failed"
_tasks_ready() { [[ $(ls ready.* 2>/dev/null | wc -l) == 4 ]]; }
wait_until 60 _tasks_ready || { cat requeue.out; fail "the tasks of job $id did not start"; }
scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 $id failed"
wait_job_done "$id" 120
[[ $JOB_STATE == COMPLETED && $(job_field "$id" Restarts) == 1 ]] \
  || { cat requeue.out; fail "requeue job $id: $JOB_STATE after $(job_field "$id" Restarts) restarts, expected COMPLETED after 1"; }
[[ $(grep -c 'got USR1' requeue.out) == 4 ]] || { cat requeue.out; fail "SIGUSR1 did not reach each of the 4 tasks once"; }
grep -q 'srun exit 75' requeue.out || { cat requeue.out; fail "srun did not return the tasks' exit code 75"; }
t_requeue=$(sed -n 's/.*requeue at \([0-9.]*\)/\1/p' requeue.out)
t_restart=$(sed -n 's/^run 1 started \([0-9.]*\)/\1/p' requeue.out)
log "requeue: USR1 reached 4 tasks, srun exited 75, the job restarted $(awk -v a="$t_requeue" -v b="$t_restart" 'BEGIN { printf "%.1f", b - a }') s after scontrol requeue"
log "PASS: private Slurm up in ${SLURM_START_SECONDS}s; srun, MPI under srun and mpirun, USR1 and requeue work"

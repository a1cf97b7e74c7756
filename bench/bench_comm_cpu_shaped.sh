#!/usr/bin/env bash
# What communication alone costs in CPU over the shaped link (issue 40; measures, never fails): the two namespace
# nodes of tests/multinode/namespaces.sh, their link capped by tc tbf at RATE, one rank on each, bench_comm_cpu's
# all-reduces (MIB MiB, REPS of them, advanced by Relay's progress thread while the rank's thread sleeps) under
# variations of libnbc's all-reduce algorithm, the packet path (veth MTU, TSO/GSO), Open MPI's TCP transport (socket
# buffers, fragment sizes, its own progress thread) and the progress thread's poll interval (first-max: its back-off, comm/progress.hpp). Per GB of gradient all-reduced: both ranks' user
# and system CPU seconds, the machine's softirq seconds (/proc/stat: system wide; on a machine where nothing else
# uses the network they are this benchmark's), their total, and the NET_RX / NET_TX softirqs raised. CPU seconds
# hold on a loaded machine; the wall time and GB/s do not. Root only.
# Usage: bench/bench_comm_cpu_shaped.sh [bench_comm_cpu (build/bench/bench_comm_cpu)] [RATE (1gbit)] [MIB (64)] [REPS (4)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source tests/multinode/namespaces.sh
BENCH=$(realpath "${1:-build/bench/bench_comm_cpu}")
RATE=${2:-1gbit} MIB=${3:-64} REPS=${4:-4}
work=$(mktemp -d /tmp/relay-bench-commcpu-XXXXXX)
trap 'remove_two_nodes; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_two_nodes "$work"
shape_link "$RATE"
printf "# communication alone, CPU cost: all-reduce of %s MiB x %s on 2 ranks over two namespace nodes, link %s (tc tbf)\n" "$MIB" "$REPS" "$RATE"
cpu_info
printf "%-34s %8s %5s %10s %8s %8s %8s %8s %8s %10s %10s %10s\n" variation MiB reps poll_us wall_s GB/s \
  user/GB sys/GB sirq/GB cpu_s/GB NET_RX/GB NET_TX/GB
one() {  # label "first_poll_us max_poll_us" [mpirun options...]
  local label=$1 poll=$2
  shift 2
  printf "%-34s " "$label"
  on_node1 timeout 300 mpirun --host "${SUB}1:1,${SUB}2:1" "${MCA_BASE[@]}" "${ALG[@]}" "$@" -np 2 --bind-to none -x OMP_NUM_THREADS=1 \
    "$BENCH" "$MIB" "$REPS" $poll 2>"$work/err" | tail -1 || { echo "failed:"; tail -3 "$work/err"; }
}
set_mtu() {  # the veth pairs, the bridge and the nodes' eth0
  local n
  for n in p1 p2; do ip -n "$NS0" link set "$n" mtu "$1"; done
  ip -n "$NS0" link set br0 mtu "$1"
  ip -n "$NS1" link set eth0 mtu "$1"
  ip -n "$NS2" link set eth0 mtu "$1"
}
offloads() {  # on|off: TSO and GSO on the nodes' eth0
  if command -v ethtool >/dev/null; then
    ip netns exec "$NS1" ethtool -K eth0 tso "$1" gso "$1" && ip netns exec "$NS2" ethtool -K eth0 tso "$1" gso "$1"
  else
    echo "(no ethtool)" >&2
  fi
}
ALG=()  # Open MPI's own choice of libnbc's all-reduce: binomial for 2 ranks
one "libnbc binomial (Open MPI's choice)" "50 1000"
ALG=(--mca coll_libnbc_iallreduce_algorithm 1)
one "libnbc ring" "50 1000"
ALG=(--mca coll_libnbc_iallreduce_algorithm 4)
one "libnbc recursive doubling" "50 1000"
ALG=(--mca coll_libnbc_iallreduce_algorithm 3)  # namespaces.sh's choice for the rows below
one "default (back-off 50-1000 us)" "50 1000"
one "poll 20 us fixed" "20 20"
one "poll 50 us fixed (before)" "50 50"
one "poll 200 us fixed" "200 200"
one "poll 1000 us fixed" "1000 1000"
offloads off && one "TSO/GSO off" "50 1000"
offloads on
one "sndbuf/rcvbuf 4 MiB" "50 1000" --mca btl_tcp_sndbuf 4194304 --mca btl_tcp_rcvbuf 4194304
one "max_send_size/pipeline 1 MiB" "50 1000" --mca btl_tcp_max_send_size 1048576 --mca btl_tcp_rdma_pipeline_send_length 1048576
one "eager_limit 1 MiB" "50 1000" --mca btl_tcp_eager_limit 1048576 --mca btl_tcp_max_send_size 1048576
one "Open MPI tcp progress thread" "50 1000" --mca btl_tcp_progress_thread 1
set_mtu 1500 && one "MTU 1500" "50 1000"
set_mtu 9000 && one "MTU 9000" "50 1000"
set_mtu 65535 2>/dev/null && one "MTU 65535" "50 1000" || echo "MTU 65535: not allowed"
one "poll 50 us fixed (before), again" "50 50"
one "default (back-off 50-1000 us), again" "50 1000"
load_at_end

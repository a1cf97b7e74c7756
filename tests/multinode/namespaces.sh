# Two "nodes" of this machine, for tests/multinode and bench/ (sourced, not run): two network namespaces, each with
# its own host name (a UTS namespace: node1, node2) and its own address on a private bridge (10.77.x.1 and .2, the
# bridge in a third namespace), and plm_rsh_agent = a script that runs a command on a node with `ip netns exec`
# instead of ssh, so that mpirun started on node1 reaches node2 through Open MPI's TCP transport.
#   make_two_nodes WORK   makes them (WORK: a directory for the agent script); sets NS0 NS1 NS2 SUB MCA (and
#                         MCA_BASE: MCA without the all-reduce algorithm's choice, for benchmarks of it); on failure
#                         returns non-zero with the reason on stderr (callers skip). The caller's EXIT trap should
#                         call remove_two_nodes.
#   on_node1 CMD...       runs CMD on node1 (mpirun from there reaches both nodes with "${MCA[@]}").
#   shape_link RATE       caps each node's outgoing traffic to the other at RATE (tc tbf, e.g. 1gbit): the link
#                         between the nodes, both ways. (This kernel has tbf but no netem: no added delay.)
#   remove_two_nodes      deletes the namespaces.
make_two_nodes() {
  local work=$1 id=$$ n ns
  NS0=relay-br-$id NS1=relay-n1-$id NS2=relay-n2-$id
  SUB=10.77.$((id % 250)).
  ip netns add "$NS0" 2>/dev/null || { echo "cannot create a network namespace (ip netns add failed)" >&2; return 1; }
  ip netns add "$NS1" && ip netns add "$NS2" || { echo "cannot create network namespaces" >&2; return 1; }
  ip -n "$NS0" link add br0 type bridge || { echo "cannot create a bridge" >&2; return 1; }
  for n in 1 2; do
    ns=relay-n$n-$id
    ip link add "v$n-$id" netns "$ns" type veth peer name "p$n" netns "$NS0" || { echo "cannot create veth pairs" >&2; return 1; }
    ip -n "$ns" link set "v$n-$id" name eth0
    ip -n "$ns" addr add "${SUB}$n/24" dev eth0
    # MTU 65535 (the veth maximum) where allowed: the kernel's per-packet work for this machine's emulated link is
    # the ranks' CPU, not a NIC's; it halves the NET_RX/NET_TX softirqs per GB (bench/bench_comm_cpu_shaped.sh).
    ip -n "$ns" link set eth0 mtu 65535 2>/dev/null && ip -n "$NS0" link set "p$n" mtu 65535 2>/dev/null || true
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$NS0" link set "p$n" master br0
    ip -n "$NS0" link set "p$n" up
  done
  ip -n "$NS0" link set br0 up
  # ssh stand-in: "agent HOST COMMAND..." runs COMMAND on that "node" (its namespaces), as ssh would.
  cat > "$work/agent.sh" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
case \$host in
  ${SUB}1|node1) ns=$NS1; name=node1 ;;
  ${SUB}2|node2) ns=$NS2; name=node2 ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts bash -c "hostname \$name; \$*"
AGENT
  chmod +x "$work/agent.sh"
  MCA_BASE=(--mca plm_rsh_agent "$work/agent.sh" --mca btl tcp,self --mca btl_tcp_if_include "${SUB}0/24"
            --mca oob_tcp_if_include "${SUB}0/24" --mca plm_rsh_no_tree_spawn 1)
  # Open MPI's non-blocking all-reduce (libnbc) picks the binomial tree for fewer than 4 ranks: a reduce to rank 0,
  # then a broadcast, each moving the whole buffer over one direction of the link while the other idles. Rabenseifner's
  # reduce-scatter + all-gather uses both directions at once: a 64 MiB all-reduce between the nodes at 1 Gbit/s takes
  # 0.61 s instead of 1.37 s and half the CPU per GB (bench/bench_comm_cpu_shaped.sh, bench/RESULTS.md).
  # Two TCP connections a pair (btl_tcp_links 2): one connection does not fill the tbf-shaped link here (a 28 MB
  # all-gather between the nodes at 1 Gbit/s: 72 MB/s sent a rank over one, 125 MB/s over two, the cap; several
  # collectives at once filled it either way), so single collectives (ZeRO-3's block gathers, the lane's first
  # bucket) ran at about half the rate the planner's calibrated all-reduce measured (bench/RESULTS.md, session 19).
  MCA=("${MCA_BASE[@]}" --mca coll_libnbc_iallreduce_algorithm 3 --mca btl_tcp_links 2)
}

on_node1() { ip netns exec "$NS1" unshare --uts bash -c 'hostname node1; exec "$@"' _ "$@"; }

shape_link() {
  local ns
  for ns in "$NS1" "$NS2"; do
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$1" burst 256kb latency 400ms ||
      { echo "cannot shape $ns's eth0 with tc tbf" >&2; return 1; }
  done
}

remove_two_nodes() { ip netns del "$NS1" 2>/dev/null; ip netns del "$NS2" 2>/dev/null; ip netns del "$NS0" 2>/dev/null; }

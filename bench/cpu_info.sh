# Sourced by the CPU benchmarks: one header line naming the CPU and what it offers for bf16
# (avx512_bf16: VDPBF16PS dot products; amx_bf16: AMX tiles), the cores and the load when the run began;
# load_at_end: the last line (figures taken on a loaded machine are slower and noisier).
cpu_info() {
  local flags; flags=$(lscpu | sed -n 's/^Flags: *//p')
  has() { [[ " $flags " == *" $1 "* ]] && echo yes || echo no; }
  printf "# lscpu: %s, %d cores, avx512_bf16 %s, amx_bf16 %s; load average at start %s\n" \
    "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" "$(has avx512_bf16)" "$(has amx_bf16)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
}
load_at_end() { printf "# load average at end %s\n" "$(cut -d' ' -f1-3 /proc/loadavg)"; }

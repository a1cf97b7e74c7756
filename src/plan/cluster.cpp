#include "plan/cluster.hpp"

#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.hpp"

namespace relay {

namespace {

// One section of the file: every read names "FILE: section.key" when it fails.
struct Reader {
  const toml::table& root;
  const std::string& source;

  const toml::node& node(const std::string& section, const std::string& key) const {
    const toml::node* sec = section.empty() ? &static_cast<const toml::node&>(root) : root.get(section);
    const std::string name = section.empty() ? key : section + "." + key;
    if (!sec) throw Error(cat(source, ": ", name, ": required key is missing (no [", section, "] section)"));
    if (!sec->is_table()) throw Error(cat(source, ": ", section, " must be a table [", section, "]"));
    const toml::node* n = sec->as_table()->get(key);
    if (!n) throw Error(cat(source, ": ", name, ": required key is missing"));
    return *n;
  }
  bool has(const std::string& section, const std::string& key) const {
    const toml::node* sec = root.get(section);
    return sec && sec->is_table() && sec->as_table()->get(key);
  }
  double number(const std::string& section, const std::string& key, double lo, double hi) const {
    const toml::node& n = node(section, key);
    const std::string name = section + "." + key;
    if (!n.is_number()) throw Error(cat(source, ": ", name, ": expected a number"));
    const double v = n.is_integer() ? double(n.value<int64_t>().value()) : n.value<double>().value();
    if (!(v >= lo && v <= hi)) throw Error(cat(source, ": ", name, " = ", v, ": must be in [", lo, ", ", hi, "]"));
    return v;
  }
  bool flag(const std::string& section, const std::string& key) const {
    const toml::node& n = node(section, key);
    if (!n.is_boolean()) throw Error(cat(source, ": ", section + "." + key, ": expected true or false"));
    return n.value<bool>().value();
  }
  std::string text(const std::string& section, const std::string& key) const {
    const toml::node& n = node(section, key);
    if (!n.is_string()) throw Error(cat(source, ": ", section.empty() ? key : section + "." + key, ": expected a string"));
    return n.value<std::string>().value();
  }
  Link link(const std::string& section) const {
    Link l;
    l.bandwidth = number(section, "bandwidth", 1, 1e15);
    l.efficiency = number(section, "efficiency", 0.01, 1);
    l.latency = number(section, "latency", 0, 1);
    if (has(section, "reduce_bandwidth")) l.reduce_bandwidth = number(section, "reduce_bandwidth", 1, 1e15);
    auto measured = [&](const char* key, double& v) {
      if (has(section, key)) v = number(section, key, 1, 1e15);
    };
    measured("all_reduce_bandwidth", l.measured.all_reduce);
    measured("all_gather_bandwidth", l.measured.all_gather);
    measured("reduce_scatter_bandwidth", l.measured.reduce_scatter);
    measured("all_to_all_bandwidth", l.measured.all_to_all);
    if (has(section, "overlap_compute_share"))
      l.overlap_compute_share = number(section, "overlap_compute_share", 0, 1);
    return l;
  }
};

}  // namespace

Cluster parse_cluster_text(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(cat(source, ":", e.source().begin.line, ": TOML syntax error: ", e.description()));
  }
  const Reader r{root, source};
  Cluster c;
  c.source = source;
  c.name = r.text("", "name");
  c.devices_per_node = static_cast<int>(r.number("node", "devices", 1, 1024));
  if (r.has("node", "async_progress")) c.async_progress = r.flag("node", "async_progress");
  Cluster::Device& d = c.device;
  d.name = r.text("device", "name");
  if (r.has("device", "backend")) {
    const std::string b = r.text("device", "backend");
    if (b != "cpu" && b != "cuda")
      throw Error(cat(source, ": device.backend = \"", b, "\": must be \"cpu\" or \"cuda\""));
    d.backend = b == "cpu" ? Device::cpu : Device::cuda;
  }
  d.peak_bf16 = r.number("device", "peak_bf16_flops", 1, 1e18);
  d.peak_tf32 = r.number("device", "peak_tf32_flops", 1, 1e18);
  d.peak_fp32 = r.number("device", "peak_fp32_flops", 1, 1e18);
  if (r.has("device", "peak_fp8_flops")) d.peak_fp8 = r.number("device", "peak_fp8_flops", 1, 1e18);
  d.memory_bytes = r.number("device", "memory_bytes", 1, 1e15);
  d.reserved_bytes = r.number("device", "reserved_bytes", 0, d.memory_bytes);
  d.memory_bandwidth = r.number("device", "memory_bandwidth", 1, 1e15);
  d.sms = static_cast<int>(r.number("device", "sms", 1, 1e6));
  d.gemm_efficiency = r.number("device", "gemm_efficiency", 0.01, 1);
  // Attention's rates over the GEMM peak: `relay plan --calibrate` measured 0.005 for the backward on a loaded 2-core
  // CPU (small heads against oneDNN's GEMM rate), so the floor only rules out zero and typos.
  d.attention_forward_efficiency = r.number("device", "attention_forward_efficiency", 1e-4, 1);
  d.attention_backward_efficiency = r.number("device", "attention_backward_efficiency", 1e-4, 1);
  d.memory_efficiency = r.number("device", "memory_efficiency", 0.01, 1);
  d.kernel_launch_s = r.number("device", "kernel_launch_s", 0, 1);
  c.intra_node = r.link("intra_node");
  c.inter_node = r.link("inter_node");
  c.storage_write_bandwidth = r.number("storage", "write_bandwidth", 1, 1e15);
  return c;
}

Cluster load_cluster(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(cat("--cluster ", path, ": cannot open the file (presets: configs/clusters/*.toml)"));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_cluster_text(ss.str(), path);
}

}  // namespace relay

// Tracer: spans as backend marks, resolved to microseconds at the end, gathered to rank 0 and written
// with nlohmann::json in the Chrome trace-event format.
#include "comm/trace.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "comm/mpi_check.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace relay {

std::string compute_span_name(const char* op, int micro_batch, int chunk, bool show_chunk) {
  const std::string o = op;
  const char* letter = o == "forward" ? "F" : o == "backward_weight" ? "W" : "B";
  return show_chunk ? cat(letter, micro_batch, ".", chunk) : cat(letter, micro_batch);
}

Tracer::Tracer(Backend& be, Communicator& world, int64_t first, int64_t last)
    : be_(be), world_(world), first_(first), last_(last) {
  world_.barrier();  // the trace's clock alignment
  be_.synchronize();
  be_.clear_marks();
  be_.timing_mark();  // time 0
}

double Tracer::write(const std::string& path, const std::string& process_name) {
  const int rank = world_.rank(), size = world_.size();
  be_.synchronize();
  nlohmann::json mine = nlohmann::json::array();
  for (const TraceSpan& s : spans_) {
    const double t0 = be_.mark_seconds(s.begin) * 1e6, t1 = be_.mark_seconds(s.end) * 1e6;
    const char* cat_name = s.track == kTrackCompute ? "compute" : s.track == kTrackComm ? "comm" : "input";
    const nlohmann::json args = {{"step", s.step}, {"micro_batch", s.micro_batch}, {"chunk", s.chunk}, {"op", s.op}};
    if (s.async_id >= 0) {  // overlapping in-flight operations: an async pair on the track
      const std::string id = cat(rank, ".", s.step, ".", s.async_id);
      mine.push_back({{"ph", "b"}, {"name", s.name}, {"cat", cat_name}, {"id", id}, {"pid", rank}, {"tid", s.track},
                      {"ts", t0}, {"args", args}});
      mine.push_back({{"ph", "e"}, {"name", s.name}, {"cat", cat_name}, {"id", id}, {"pid", rank}, {"tid", s.track},
                      {"ts", std::max(t0, t1)}});
      continue;
    }
    mine.push_back({{"ph", "X"}, {"name", s.name}, {"cat", cat_name}, {"pid", rank}, {"tid", s.track}, {"ts", t0},
                    {"dur", std::max(0.0, t1 - t0)}, {"args", args}});
  }
  nlohmann::json meta = nlohmann::json::array();
  meta.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", process_name}}}});
  meta.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  const char* tracks[] = {"compute", "communication", "input"};
  for (int t = 0; t < 3; ++t)
    meta.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", tracks[t]}}}});
  const std::string text = nlohmann::json{{"meta", meta}, {"spans", mine}}.dump();
  // Gather the ranks' JSON texts on rank 0.
  std::vector<size_t> sizes;  // (size) bytes of each rank's text, on rank 0
  const std::vector<std::byte> gathered = world_.gather_host(text.data(), text.size(), 0, &sizes, "the trace gather");
  const char* all = reinterpret_cast<const char*>(gathered.data());
  std::vector<size_t> offsets(sizes.size());  // (size)
  for (size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  if (rank != 0) return 0;
  nlohmann::json events = nlohmann::json::array();
  double makespan_begin = 1e300, makespan_end = 0, busy = 0;
  for (int i = 0; i < size; ++i) {
    const auto part = nlohmann::json::parse(all + offsets[static_cast<size_t>(i)],
                                            all + offsets[static_cast<size_t>(i)] + sizes[static_cast<size_t>(i)]);
    for (const auto& e : part["meta"]) events.push_back(e);
    for (const auto& e : part["spans"]) {
      events.push_back(e);
      if (e["ph"] != "X") continue;
      const std::string op = e["args"]["op"];
      if (op == "forward" || op == "backward" || op == "backward_input" || op == "backward_weight" ||
          op == "optimizer_step" || op == "recv_activation" || op == "recv_grad" || op == "allreduce_grads" ||
          op == "reduce_tied_grads") {
        makespan_begin = std::min(makespan_begin, e["ts"].get<double>());
        makespan_end = std::max(makespan_end, e["ts"].get<double>() + e["dur"].get<double>());
      }
      if (op == "forward" || op == "backward" || op == "backward_input" || op == "backward_weight")
        busy += e["dur"].get<double>();
    }
  }
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw Error(cat("trace: cannot write ", path));
  f << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!f) throw Error(cat("trace: writing ", path, " failed"));
  const double span = makespan_end - makespan_begin;
  return span > 0 ? 1.0 - busy / (double(size) * span) : 0.0;
}

}  // namespace relay

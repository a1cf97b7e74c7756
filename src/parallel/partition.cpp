#include "parallel/partition.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"

namespace relay {

namespace {
// "embedding + 4 transformer + head" or "8 layers", for messages.
std::string model_blocks_hint(const std::vector<BlockSpec>& blocks) {
  int layers = 0;
  for (auto& b : blocks) layers += b.recomputable;
  if (!blocks.empty() && blocks.front().in == 0)  // a language model: its first block reads token ids
    return cat("embedding + ", layers, " transformer blocks (model.n_layer) + head");
  return cat(blocks.size(), " entries of model.layers");
}
}  // namespace

std::vector<ChunkRange> partition_blocks(const std::vector<BlockSpec>& blocks, int chunks,
                                         const std::vector<int64_t>& balance,
                                         const std::vector<double>& measured_costs, const StageMemory& memory) {
  const int n = static_cast<int>(blocks.size());
  std::vector<ChunkRange> out;
  if (!balance.empty()) {
    if (static_cast<int>(balance.size()) != chunks)
      throw Error(cat("parallel.balance has ", balance.size(), " entries but the pipeline has ", chunks,
                      " stages (parallel.pp x parallel.virtual_stages); give one block count per stage"));
    int64_t sum = 0;
    for (int64_t b : balance) sum += b;
    if (sum != n)
      throw Error(cat("parallel.balance sums to ", sum, " blocks but the model has ", n,
                      " (every block must belong to exactly one stage; ", n, " = ", model_blocks_hint(blocks), ")"));
    int at = 0;
    for (int64_t b : balance) {
      out.push_back({at, at + static_cast<int>(b)});
      at += static_cast<int>(b);
    }
    return out;
  }
  // Units: a parametrised layer with the parameter-free layers after it (leading ones join the first).
  std::vector<int> unit_start;
  for (int i = 0; i < n; ++i)
    if (blocks[static_cast<size_t>(i)].starts_unit) unit_start.push_back(i);
  if (unit_start.empty()) throw Error("model.layers needs at least one linear layer");
  unit_start[0] = 0;  // leading parameter-free layers join the first unit
  const int u = static_cast<int>(unit_start.size());
  if (u < chunks)
    throw Error(cat("the model has ", u, " blocks that can start a stage (", model_blocks_hint(blocks),
                    ") but the pipeline has ", chunks,
                    " stages (parallel.pp x parallel.virtual_stages); each stage needs at least one "
                    "(hint: lower parallel.pp or parallel.virtual_stages)"));
  std::vector<double> cost(static_cast<size_t>(u), 0.0);
  for (int k = 0; k < u; ++k) {
    int e = k + 1 < u ? unit_start[static_cast<size_t>(k) + 1] : n;
    for (int i = unit_start[static_cast<size_t>(k)]; i < e; ++i)
      cost[static_cast<size_t>(k)] += measured_costs.empty()
                                          ? blocks[static_cast<size_t>(i)].flops
                                          : measured_costs[static_cast<size_t>(i)];
  }
  // Minimise the most expensive chunk (linear partition by dynamic programming over units). With a memory term, only
  // among the cuts whose every stage fits; when none does, by compute alone as without it.
  std::vector<double> prefix(static_cast<size_t>(u) + 1, 0.0);
  for (int k = 0; k < u; ++k) prefix[static_cast<size_t>(k) + 1] = prefix[static_cast<size_t>(k)] + cost[static_cast<size_t>(k)];
  const double inf = std::numeric_limits<double>::infinity();
  auto unit_block = [&](int k) { return k < u ? unit_start[static_cast<size_t>(k)] : n; };
  const bool with_memory = memory.on() && static_cast<int>(memory.slots.size()) == chunks;
  // By units (j, k): the same span on every stage but its slots; asked once each.
  std::vector<StageBytes> spans;
  std::vector<char> known;
  if (with_memory) spans.resize(static_cast<size_t>(u + 1) * static_cast<size_t>(u + 1)), known.resize(spans.size(), 0);
  auto bytes = [&](int c, int j, int k) {
    const size_t at = static_cast<size_t>(j) * static_cast<size_t>(u + 1) + static_cast<size_t>(k);
    if (!known[at]) spans[at] = memory.bytes(unit_block(j), unit_block(k)), known[at] = 1;
    return spans[at].held + memory.slots[static_cast<size_t>(c)] * spans[at].per_slot;
  };
  // best[c][k]: minimal max-cost splitting the first k units into c chunks; cut[c][k] the last cut.
  std::vector<std::vector<double>> best;
  std::vector<std::vector<int>> cut;
  auto solve = [&](auto&& chunk_cost) {
    best.assign(static_cast<size_t>(chunks) + 1, std::vector<double>(static_cast<size_t>(u) + 1, inf));
    cut.assign(static_cast<size_t>(chunks) + 1, std::vector<int>(static_cast<size_t>(u) + 1, 0));
    best[0][0] = 0;
    for (int c = 1; c <= chunks; ++c)
      for (int k = c; k <= u; ++k)
        for (int j = c - 1; j < k; ++j) {
          double v = std::max(best[static_cast<size_t>(c) - 1][static_cast<size_t>(j)], chunk_cost(c - 1, j, k));
          if (v < best[static_cast<size_t>(c)][static_cast<size_t>(k)] - 1e-9) {
            best[static_cast<size_t>(c)][static_cast<size_t>(k)] = v;
            cut[static_cast<size_t>(c)][static_cast<size_t>(k)] = j;
          }
        }
    return best[static_cast<size_t>(chunks)][static_cast<size_t>(u)] < inf;
  };
  auto compute = [&](int, int j, int k) { return prefix[static_cast<size_t>(k)] - prefix[static_cast<size_t>(j)]; };
  const bool fitted = solve([&](int c, int j, int k) {
    return !with_memory || bytes(c, j, k) <= memory.budget ? compute(c, j, k) : inf;
  });
  // Nothing fits: the compute-balanced cut (the layout does not fit the device either way).
  if (!fitted) solve(compute);
  std::vector<int> unit_bounds(static_cast<size_t>(chunks) + 1);
  unit_bounds[static_cast<size_t>(chunks)] = u;
  for (int c = chunks, k = u; c > 0; --c) {
    k = cut[static_cast<size_t>(c)][static_cast<size_t>(k)];
    unit_bounds[static_cast<size_t>(c) - 1] = k;
  }
  for (int c = 0; c < chunks; ++c) {
    int b = unit_start[static_cast<size_t>(unit_bounds[static_cast<size_t>(c)])];
    int e = unit_bounds[static_cast<size_t>(c) + 1] < u ? unit_start[static_cast<size_t>(unit_bounds[static_cast<size_t>(c) + 1])] : n;
    out.push_back({b, e});
  }
  return out;
}

std::string describe_partition(const std::vector<ChunkRange>& parts, const std::vector<BlockSpec>& blocks, int pp) {
  std::string s;
  for (size_t c = 0; c < parts.size(); ++c) {
    s += cat("  stage ", c, " (pp rank ", static_cast<int>(c) % pp, "): blocks ", parts[c].begin, "..",
             parts[c].end - 1, " [");
    for (int i = parts[c].begin; i < parts[c].end; ++i)
      s += cat(i > parts[c].begin ? " " : "", block_kind_name(blocks[static_cast<size_t>(i)].kind));
    s += "]\n";
  }
  return s;
}

}  // namespace relay

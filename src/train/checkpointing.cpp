#include "train/checkpointing.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <functional>
#include <thread>

#include <set>

#include "comm/agree.hpp"
#include "io/safetensors.hpp"
#include "comm/mpi_check.hpp"
#include "comm/watchdog.hpp"

namespace fs = std::filesystem;

namespace relay {

std::vector<ManifestEntry> checkpoint_manifest(const ModelLayout& layout, const Config::Optimizer& opt) {
  std::vector<ManifestEntry> m;
  auto params = layout.params();
  for (auto& p : params) m.push_back({"model/" + p.name, p.shape, p.split, p.pp_ranks});
  std::vector<std::string> kinds;
  if (opt.name == "adamw") kinds = {"exp_avg", "exp_avg_sq"};
  else if (opt.momentum != 0) kinds = {"momentum_buffer"};
  for (auto& k : kinds)
    for (auto& p : params) m.push_back({"optimizer/" + k + "/" + p.name, p.shape, p.split, p.pp_ranks});
  return m;
}

namespace {

// What this rank holds of a manifest entry: its tp shard whole, or (ZeRO-1 optimizer state) the piece
// at `offset` of the shard's flat data; tensor null when it holds nothing of it.
struct LocalPiece {
  Tensor* tensor = nullptr;
  int64_t offset = 0;
};
LocalPiece local_piece(CheckpointContext& ctx, const std::string& name) {
  if (name.rfind("model/", 0) == 0) return {&ctx.params.at(name.substr(6))->value, 0};
  for (auto& st : ctx.optimizer.state())
    if (name == "optimizer/" + st.kind + "/" + st.param) return {st.tensor, st.offset};
  return {};
}

bool split_over_tp(const ManifestEntry& e, const ProcessGrid& g) { return g.tp > 1 && !e.split.replicated(); }
int64_t shard_numel(const ManifestEntry& e, const ProcessGrid& g, int tp_rank) {
  return shape_numel(shard_shape(e.shape, e.split, g.tp, tp_rank));
}
bool zero_sharded(CheckpointContext& ctx, const ManifestEntry& e) {
  return ctx.cfg.optimizer.zero && ctx.grid.dp > 1 && e.name.rfind("optimizer/", 0) == 0;
}

// Collective over this rank's replica group (ranks of the owning stage): this tp rank's shard of the
// entry, on replica 0 (empty elsewhere). ZeRO-1 state comes in pieces, one per replica.
std::vector<float> gather_shard(CheckpointContext& ctx, const ManifestEntry& e, int64_t step) {
  const ProcessGrid& g = ctx.grid;
  std::vector<float> shard;
  LocalPiece mine = local_piece(ctx, e.name);
  if (!zero_sharded(ctx, e)) {
    if (g.dp_rank == 0) {
      shard.resize(static_cast<size_t>(mine.tensor->numel()));
      ctx.be.download(shard.data(), *mine.tensor);
    }
    return shard;
  }
  const int64_t n = mine.tensor ? mine.tensor->numel() : 0;
  std::vector<float> piece(static_cast<size_t>(n));
  if (n) ctx.be.download(piece.data(), *mine.tensor);
  int64_t head[2] = {mine.offset, n};
  std::vector<int64_t> heads(g.dp_rank == 0 ? 2 * static_cast<size_t>(g.dp) : 0);
  MPI_Request req;
  MPI_CHECK(MPI_Igather(head, 2, MPI_INT64_T, heads.data(), 2, MPI_INT64_T, 0, g.dp_comm, &req));
  watchdog_wait(&req, cat("the ZeRO pieces of ", e.name, " for the step-", step, " checkpoint"));
  std::vector<int> counts(static_cast<size_t>(g.dp)), displs(static_cast<size_t>(g.dp));
  std::vector<float> all;
  if (g.dp_rank == 0) {
    int64_t total = 0;
    for (int d = 0; d < g.dp; ++d) {
      counts[static_cast<size_t>(d)] = static_cast<int>(heads[2 * static_cast<size_t>(d) + 1]);
      displs[static_cast<size_t>(d)] = static_cast<int>(total);
      total += counts[static_cast<size_t>(d)];
    }
    all.resize(static_cast<size_t>(total));
  }
  MPI_CHECK(MPI_Igatherv(piece.data(), static_cast<int>(n), MPI_FLOAT, all.data(), counts.data(), displs.data(),
                         MPI_FLOAT, 0, g.dp_comm, &req));
  watchdog_wait(&req, cat("the ZeRO pieces of ", e.name, " for the step-", step, " checkpoint"));
  if (g.dp_rank == 0) {
    shard.assign(static_cast<size_t>(shard_numel(e, g, g.tp_rank)), 0.f);
    for (int d = 0; d < g.dp; ++d) {
      const int64_t off = heads[2 * static_cast<size_t>(d)];
      std::copy_n(all.begin() + displs[static_cast<size_t>(d)], counts[static_cast<size_t>(d)],
                  shard.begin() + off);
    }
  }
  return shard;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

std::string save_checkpoint(CheckpointContext& ctx, int64_t step) {
  const ProcessGrid& g = ctx.grid;
  const double t0 = now_s();
  auto manifest = checkpoint_manifest(ctx.layout, ctx.cfg.optimizer);
  const std::string dir = ctx.cfg.checkpoint.dir;
  const std::string path = dir + "/" + checkpoint_file_name(step);
  std::function<void()> write;  // rank 0's part, run inside the agreement below
  if (g.world_rank == 0) {
    std::vector<CheckpointTensor> tensors;
    tensors.reserve(manifest.size());
    for (auto& e : manifest) {
      CheckpointTensor t{e.name, e.shape, std::vector<float>(static_cast<size_t>(shape_numel(e.shape)))};
      const int shards = split_over_tp(e, g) ? g.tp : 1;
      for (int tr = 0; tr < shards; ++tr) {
        std::vector<float> shard;
        if (e.owner() == 0 && tr == 0) {
          shard = gather_shard(ctx, e, step);
        } else {
          shard.resize(static_cast<size_t>(shard_numel(e, g, tr)));
          const int from = g.world_rank_of(e.owner(), 0, tr);
          MPI_Request req;
          MPI_CHECK(MPI_Irecv(shard.data(), static_cast<int>(shard.size()), MPI_FLOAT, from, 7, MPI_COMM_WORLD, &req));
          watchdog_wait(&req, cat("tensor ", e.name, " of the step-", step, " checkpoint"), from);
        }
        if (shards == 1) t.data = std::move(shard);
        else insert_shard(shard.data(), e.shape, e.split, g.tp, tr, t.data.data());
      }
      watchdog_progress();
      tensors.push_back(std::move(t));
    }
    CheckpointMeta meta;
    meta.step = step;
    meta.config_toml = ctx.cfg.to_toml();
    meta.dp = g.dp;
    meta.pp = g.pp;
    meta.tp = g.tp;
    meta.zero = ctx.cfg.optimizer.zero && g.dp > 1 ? 1 : 0;
    meta.virtual_stages = ctx.cfg.parallel.virtual_stages;
    meta.schedule = ctx.cfg.parallel.schedule;
    meta.optimizer = ctx.optimizer.name();
    meta.optimizer_step = ctx.optimizer.step_count();
    meta.batch_size = ctx.cfg.train.batch_size;
    meta.samples = ctx.samples;
    meta.position = step * ctx.cfg.train.batch_size;
    meta.epoch = ctx.samples ? meta.position / ctx.samples : 0;
    meta.shuffle = ctx.cfg.data.shuffle;
    meta.data_seed = ctx.cfg.data.seed;
    meta.model_seed = ctx.cfg.model.seed;
    meta.tokenizer = ctx.tokenizer;
    write = [&, tensors = std::move(tensors), meta] {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw Error(cat("checkpoint.dir ", dir, ": cannot create the directory: ", ec.message()));
      // RELAY_FAULT_SLOW_CHECKPOINT=S (tests): S seconds per tensor, a slow filesystem that still
      // makes progress (the watchdog must not end the job).
      const char* slow = std::getenv("RELAY_FAULT_SLOW_CHECKPOINT");
      const double per_tensor = slow ? std::atof(slow) : 0.0;
      write_checkpoint_file(path, meta, tensors, [per_tensor] {
        if (per_tensor > 0) std::this_thread::sleep_for(std::chrono::duration<double>(per_tensor));
        watchdog_progress();
      });
      write_latest(dir, checkpoint_file_name(step));
      auto deleted = prune_checkpoints(dir, ctx.cfg.checkpoint.keep);
      double mb = double(fs::file_size(path)) / (1024.0 * 1024.0);
      std::printf("checkpoint step %lld: %s (%.1f MiB in %.2f s)%s\n", static_cast<long long>(step), path.c_str(), mb,
                  now_s() - t0, deleted.empty() ? "" : cat(", pruned ", deleted.size(), " older").c_str());
      std::fflush(stdout);
    };
  } else {
    for (auto& e : manifest) {
      if (e.owner() != g.pp_rank) continue;
      std::vector<float> shard = gather_shard(ctx, e, step);  // collective over the replica group
      if (g.dp_rank != 0 || (g.tp_rank > 0 && !split_over_tp(e, g))) continue;
      MPI_Request req;
      MPI_CHECK(MPI_Isend(shard.data(), static_cast<int>(shard.size()), MPI_FLOAT, 0, 7, MPI_COMM_WORLD, &req));
      watchdog_wait(&req, cat("rank 0 to take tensor ", e.name, " of the step-", step, " checkpoint"), 0);
    }
  }
  // Rank 0 writes; every rank learns the outcome, so a failed write (disk full, permission, quota)
  // ends every rank with rank 0's one-line message and exit code 1, the previous checkpoint and
  // `latest` untouched. Nobody goes on before the file and `latest` are in place.
  agree_on_errors(MPI_COMM_WORLD, [&] {
    if (write) write();
  });
  return path;
}

void load_init_from(CheckpointContext& ctx, const std::string& path) {
  SafetensorsFile file(path);
  const std::string where = cat("model.init_from = \"", path, "\"");
  std::set<std::string> known;
  for (auto& p : ctx.layout.params()) {
    known.insert(p.name);
    const auto* e = file.find(p.name);
    if (!e) throw Error(cat(where, ": tensor ", p.name, " ", shape_str(p.shape), " is missing"));
    if (e->shape != p.shape)
      throw Error(cat(where, ": tensor ", p.name, " has shape ", shape_str(e->shape), " but the model expects ",
                      shape_str(p.shape)));
  }
  for (auto& e : file.entries()) {
    // A tied head saved by a module that keeps the name (nanoGPT's state_dict lists lm_head.weight,
    // the same tensor as transformer.wte.weight) and attention-mask buffers are not parameters.
    const bool tied_alias = e.name == "lm_head.weight" && !known.count("lm_head.weight");
    const bool buffer = e.name.size() > 9 && (e.name.rfind(".attn.bias") == e.name.size() - 10 ||
                                              e.name.rfind(".attn.masked_bias") == e.name.size() - 17);
    if (!known.count(e.name) && !tied_alias && !buffer)
      throw Error(cat(where, ": tensor ", e.name, " ", shape_str(e.shape),
                      " is not a parameter of this model (check the [model] section)"));
  }
  std::vector<float> buf, shard;
  for (auto& [name, param] : ctx.params) {
    buf.resize(static_cast<size_t>(shape_numel(param->full_shape)));
    file.read(name, param->full_shape, buf.data());
    if (param->sharded()) {
      shard.resize(static_cast<size_t>(param->value.numel()));
      extract_shard(buf.data(), param->full_shape, param->split, ctx.grid.tp, ctx.grid.tp_rank, shard.data());
      ctx.be.upload(param->value, shard.data());
    } else {
      ctx.be.upload(param->value, buf.data());
    }
  }
}

std::string resolve_resume_path(const Config& cfg) {
  const std::string& r = cfg.checkpoint.resume;
  if (r == "none") return "";
  if (r == "auto") {
    std::string latest = read_latest(cfg.checkpoint.dir);
    if (latest.empty()) return "";
    std::string p = cfg.checkpoint.dir + "/" + latest;
    if (!fs::exists(p))
      throw Error(cat("checkpoint.resume = \"auto\": ", cfg.checkpoint.dir, "/latest names ", latest,
                      " but that file does not exist"));
    return p;
  }
  if (fs::is_directory(r)) {  // a checkpoint directory: its latest
    std::string latest = read_latest(r);
    if (latest.empty()) throw Error(cat("checkpoint.resume = \"", r, "\": the directory has no 'latest' file"));
    return r + "/" + latest;
  }
  if (!fs::exists(r)) throw Error(cat("checkpoint.resume = \"", r, "\": no such file"));
  return r;
}

int64_t load_checkpoint(CheckpointContext& ctx, const std::string& path) {
  CheckpointReader reader(path);
  const auto& meta = reader.meta();
  const std::string where = cat("checkpoint ", path);
  if (meta.optimizer != ctx.cfg.optimizer.name)
    throw Error(cat(where, " was written with optimizer \"", meta.optimizer, "\" but optimizer.name = \"",
                    ctx.cfg.optimizer.name, "\""));
  if (meta.batch_size != ctx.cfg.train.batch_size)
    throw Error(cat(where, " was written with train.batch_size = ", meta.batch_size, " but this run has ",
                    ctx.cfg.train.batch_size, " (the data order would change)"));
  if (meta.samples != ctx.samples)
    throw Error(cat(where, " was written for a training set of ", meta.samples, " samples but data.train has ",
                    ctx.samples));
  if (meta.step > ctx.cfg.train.steps)
    throw Error(cat(where, " holds step ", meta.step, " but train.steps = ", ctx.cfg.train.steps));
  auto manifest = checkpoint_manifest(ctx.layout, ctx.cfg.optimizer);
  // Check the whole model first, on every rank, so every rank reports the same mismatch.
  std::map<std::string, Shape> in_file;
  for (auto& [n, s] : reader.tensors()) in_file[n] = s;
  for (auto& e : manifest) {
    auto it = in_file.find(e.name);
    if (it == in_file.end())
      throw Error(cat(where, ": tensor ", e.name, " (shape ", shape_str(e.shape),
                      ") is missing; the checkpoint was written for another model or optimizer"));
    if (it->second != e.shape)
      throw Error(cat(where, ": tensor ", e.name, " has shape ", shape_str(it->second), " in the checkpoint but the model expects ",
                      shape_str(e.shape)));
  }
  for (auto& [n, s] : in_file)
    if (n.rfind("model/", 0) == 0) {
      bool known = false;
      for (auto& e : manifest) known |= e.name == n;
      if (!known)
        throw Error(cat(where, ": tensor ", n, " ", shape_str(s), " is not part of this model (the [model] section differs)"));
    }
  std::vector<float> buf, shard;
  const ProcessGrid& g = ctx.grid;
  for (auto& e : manifest) {
    if (!e.held_by(g.pp_rank)) continue;  // a tied weight's two copies both load the one tensor
    LocalPiece lp = local_piece(ctx, e.name);
    if (!lp.tensor) continue;  // ZeRO-1: another replica's piece
    buf.resize(static_cast<size_t>(shape_numel(e.shape)));
    reader.read(e.name, e.shape, buf.data());
    const float* src = buf.data();
    if (split_over_tp(e, g)) {
      shard.resize(static_cast<size_t>(shard_numel(e, g, g.tp_rank)));
      extract_shard(buf.data(), e.shape, e.split, g.tp, g.tp_rank, shard.data());
      src = shard.data();
    }
    ctx.be.upload(*lp.tensor, src + lp.offset);
  }
  ctx.optimizer.set_step_count(meta.optimizer_step);
  return meta.step;
}

}  // namespace relay

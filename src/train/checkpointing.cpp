#include "train/checkpointing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>

#include <set>

#include "comm/agree.hpp"
#include "model/hf_model.hpp"
#include "model/family.hpp"
#include "io/safetensors.hpp"
#include "comm/watchdog.hpp"
#include "parallel/sharding.hpp"

namespace fs = std::filesystem;

namespace relay {

namespace {
// The optimizer state a checkpoint holds of every parameter.
std::vector<std::string> state_kinds(const Config::Optimizer& opt) {
  if (opt.name == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (opt.momentum != 0) return {"momentum_buffer"};
  return {};
}
}  // namespace

std::vector<ManifestEntry> checkpoint_manifest(const ModelLayout& layout, const Config::Optimizer& opt) {
  std::vector<ManifestEntry> m;
  auto params = layout.params();
  for (auto& p : params) m.push_back({"model/" + p.name, p.shape, p.split, p.pp_ranks, p.ep_owner});
  for (auto& k : state_kinds(opt))
    for (auto& p : params) m.push_back({"optimizer/" + k + "/" + p.name, p.shape, p.split, p.pp_ranks, p.ep_owner});
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
  if (name.rfind("model/", 0) == 0 && !ctx.param_pieces.empty()) {  // ZeRO-3: the piece of the masters held here
    for (auto& sl : ctx.param_pieces)
      if (sl.param->name == name.substr(6)) return {&sl.value, sl.offset};
    return {};
  }
  if (name.rfind("model/", 0) == 0) {  // (parallel.ep: another rank's expert is not here)
    auto it = ctx.params.find(name.substr(6));
    return it == ctx.params.end() ? LocalPiece{} : LocalPiece{&it->second->value, 0};
  }
  for (auto& st : ctx.optimizer.state())
    if (name == "optimizer/" + st.kind + "/" + st.param) return {st.tensor, st.offset};
  return {};
}

bool split_over_tp(const ManifestEntry& e, const ProcessGrid& g) { return g.tp > 1 && !e.split.replicated(); }
int64_t shard_numel(const ManifestEntry& e, const ProcessGrid& g, int tp_rank) {
  return shape_numel(shard_shape(e.shape, e.split, g.tp, tp_rank));
}
bool zero_sharded(CheckpointContext& ctx, const ManifestEntry& e) {
  const Sharding sharding = describe_sharding(sharding_input(ctx.cfg));
  const GroupSharding& s = sharding.group(e.ep_owner >= 0 ? GradGroup::expert : GradGroup::dense);
  return (s.optimizer_state && e.name.rfind("optimizer/", 0) == 0) || (s.parameters && e.name.rfind("model/", 0) == 0);
}

// Collective over this rank's replica group (ranks of the owning stage): this tp rank's shard of the
// entry into out (shard_numel floats) when out is set (replica 0's senders; null elsewhere). ZeRO-1
// state comes in pieces, one per replica.
void gather_shard(CheckpointContext& ctx, const ManifestEntry& e, int64_t step, float* out) {
  const ProcessGrid& g = ctx.grid;
  LocalPiece mine = local_piece(ctx, e.name);
  if (!zero_sharded(ctx, e)) {
    if (out) ctx.be.download(out, *mine.tensor);
    return;
  }
  const int64_t n = mine.tensor ? mine.tensor->numel() : 0;
  // This replica's piece, prefixed by its offset in the shard: (2 int64 + n floats) bytes.
  std::vector<std::byte> piece(2 * sizeof(int64_t) + static_cast<size_t>(n) * sizeof(float));
  const int64_t head[2] = {mine.offset, n};
  std::memcpy(piece.data(), head, sizeof head);
  if (n) ctx.be.download(piece.data() + sizeof head, *mine.tensor);
  std::vector<size_t> sizes;
  Communicator& group = e.ep_owner >= 0 ? *ctx.expert_dp : ctx.dp;  // the ranks holding the pieces
  const std::vector<std::byte> all = group.gather_host(
      piece.data(), piece.size(), 0, &sizes, cat("the ZeRO pieces of ", e.name, " for the step-", step, " checkpoint"));
  if (!out) return;  // another replica, or a tp rank whose copy of a replicated tensor is not sent
  std::fill_n(out, shard_numel(e, g, g.tp_rank), 0.f);
  size_t at = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    int64_t h[2];
    std::memcpy(h, all.data() + at, sizeof h);
    std::memcpy(out + h[0], all.data() + at + sizeof h, static_cast<size_t>(h[1]) * sizeof(float));
    at += sizes[d];
  }
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr int kCheckpointTag = 7;  // world point-to-point: a shard on its way to rank 0

}  // namespace

int64_t checkpoint_bytes(const ModelLayout& layout, const Config::Optimizer& opt) {
  // checkpoint_manifest's tensors without their names (the planner's search asks once per layout shape): every
  // parameter, then as many optimizer tensors of each.
  int64_t n = 0;
  for (auto& e : layout.params()) n += shape_numel(e.shape);
  return n * int64_t(1 + state_kinds(opt).size()) * int64_t(sizeof(float));
}

namespace {

// Rank 0: entry e whole into dst (shape_numel floats), from the rank that sends each tp shard (or from its own
// gather); shard: scratch for one tp shard.
void receive_tensor(CheckpointContext& ctx, const ManifestEntry& e, int64_t step, float* dst, std::vector<float>& shard) {
  const ProcessGrid& g = ctx.grid;
  const int shards = split_over_tp(e, g) ? g.tp : 1;
  for (int tr = 0; tr < shards; ++tr) {
    float* into = dst;
    if (shards > 1) {
      shard.resize(static_cast<size_t>(shard_numel(e, g, tr)));
      into = shard.data();
    }
    if (e.owner() == 0 && tr == 0 && e.ep_owner <= 0) {
      gather_shard(ctx, e, step, into);
    } else {  // from the stage's first replica holding it (parallel.ep: replica ep_owner holds expert ep_owner's)
      const int from = g.world_rank_of(e.owner(), std::max(e.ep_owner, 0), tr);
      ctx.world.recv_host(into, static_cast<size_t>(shard_numel(e, g, tr)) * sizeof(float), from, kCheckpointTag,
                          cat("tensor ", e.name, " of the step-", step, " checkpoint"));
    }
    if (shards > 1) insert_shard(shard.data(), e.shape, e.split, g.tp, tr, dst);
  }
  watchdog_progress();
}

// Ranks other than 0: every entry this rank contributes, in manifest order, sent to rank 0.
void send_tensors(CheckpointContext& ctx, const std::vector<ManifestEntry>& manifest, int64_t step) {
  const ProcessGrid& g = ctx.grid;
  std::vector<float> shard;  // (shard_numel) this rank's contribution, in host memory
  for (auto& e : manifest) {
    if (e.owner() != g.pp_rank) continue;
    if (e.ep_owner >= 0 && e.ep_owner != g.ep_rank) continue;  // another rank's expert
    const bool first = e.ep_owner >= 0 ? g.expert_replica_rank() == 0 : g.replica_rank() == 0;
    const bool sender = first && (g.tp_rank == 0 || split_over_tp(e, g));
    shard.resize(sender ? static_cast<size_t>(shard_numel(e, g, g.tp_rank)) : 0);
    gather_shard(ctx, e, step, sender ? shard.data() : nullptr);  // collective over the replica group
    if (!sender) continue;
    ctx.world.send_host(shard.data(), shard.size() * sizeof(float), 0, kCheckpointTag,
                        cat("rank 0 to take tensor ", e.name, " of the step-", step, " checkpoint"));
  }
}

// moe.expert_bias: (MoE layers, n_experts), every rank holds it whole, so rank 0's copy; no name when off.
CheckpointTensor expert_bias_tensor(CheckpointContext& ctx) {
  if (!ctx.expert_bias) return {};
  return {"router/expert_bias", {int64_t(ctx.expert_bias->size()) / ctx.n_experts, ctx.n_experts}, *ctx.expert_bias,
          nullptr, {}};
}

CheckpointImage image_header(CheckpointContext& ctx, int64_t step) {
  const ProcessGrid& g = ctx.grid;
  CheckpointImage img;
  img.started_s = now_s();
  img.dir = ctx.cfg.checkpoint.dir;
  img.path = img.dir + "/" + checkpoint_file_name(step);
  img.keep = ctx.cfg.checkpoint.keep;
  CheckpointMeta& meta = img.meta;
  meta.step = step;
  meta.config_toml = to_toml(ctx.cfg);
  meta.dp = g.dp;
  meta.pp = g.pp;
  meta.tp = g.tp;
  meta.zero = describe_sharding(sharding_input(ctx.cfg)).group(GradGroup::dense).stage;  // 0 on one replica
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
  return img;
}

}  // namespace

int64_t checkpoint_largest_tensor_bytes(const ModelLayout& layout, const Config::Optimizer& opt) {
  int64_t n = 0;
  for (auto& e : checkpoint_manifest(layout, opt)) n = std::max(n, shape_numel(e.shape));
  return n * int64_t(sizeof(float));
}

CheckpointImage gather_checkpoint(CheckpointContext& ctx, int64_t step, std::shared_ptr<std::byte> host) {
  CheckpointImage img = image_header(ctx, step);
  auto manifest = checkpoint_manifest(ctx.layout, ctx.cfg.optimizer);
  if (ctx.grid.world_rank != 0) {
    send_tensors(ctx, manifest, step);
    return img;
  }
  // Rank 0: every tensor into one host block (pinned on CUDA when checkpoint.async keeps it).
  const int64_t bytes = checkpoint_bytes(ctx.layout, ctx.cfg.optimizer);
  img.host = host ? std::move(host)
                  : std::shared_ptr<std::byte>(new std::byte[static_cast<size_t>(bytes)], std::default_delete<std::byte[]>());
  float* at = reinterpret_cast<float*>(img.host.get());
  std::vector<float> shard;  // (shard_numel) one tp shard, when tensor parallelism splits the tensor
  img.tensors.reserve(manifest.size());
  for (auto& e : manifest) {
    receive_tensor(ctx, e, step, at, shard);
    img.tensors.push_back(CheckpointTensor{e.name, e.shape, {}, at, {}});
    at += shape_numel(e.shape);
  }
  if (CheckpointTensor bias = expert_bias_tensor(ctx); !bias.name.empty()) img.tensors.push_back(std::move(bias));
  img.copied_s = now_s();
  return img;
}

void write_checkpoint_image(const CheckpointImage& img, const std::function<void()>& on_tensor) {
  std::error_code ec;
  fs::create_directories(img.dir, ec);
  if (ec) throw Error(cat("checkpoint.dir ", img.dir, ": cannot create the directory: ", ec.message()));
  // RELAY_FAULT_SLOW_CHECKPOINT=S (tests): S seconds per tensor, a slow filesystem that still
  // makes progress (the watchdog must not end the job).
  const char* slow = std::getenv("RELAY_FAULT_SLOW_CHECKPOINT");
  const double per_tensor = slow ? std::atof(slow) : 0.0;
  write_checkpoint_file(img.path, img.meta, img.tensors, [&] {
    if (per_tensor > 0) std::this_thread::sleep_for(std::chrono::duration<double>(per_tensor));
    if (on_tensor) on_tensor();
  });
  write_latest(img.dir, checkpoint_file_name(img.meta.step));
  auto deleted = prune_checkpoints(img.dir, img.keep);
  const double mb = double(fs::file_size(img.path)) / (1024.0 * 1024.0), t = now_s();
  const std::string pruned = deleted.empty() ? "" : cat(", pruned ", deleted.size(), " older");
  if (img.background)
    std::printf("checkpoint step %lld: %s (%.1f MiB in %.2f s: %.2f s copying while training waited, then "
                "written in the background)%s\n",
                static_cast<long long>(img.meta.step), img.path.c_str(), mb, t - img.started_s,
                img.copied_s - img.started_s, pruned.c_str());
  else
    std::printf("checkpoint step %lld: %s (%.1f MiB in %.2f s)%s\n", static_cast<long long>(img.meta.step),
                img.path.c_str(), mb, t - img.started_s, pruned.c_str());
  std::fflush(stdout);
}

std::string save_checkpoint(CheckpointContext& ctx, int64_t step) {
  // Streamed: rank 0 receives each tensor just before writing it, into one buffer of the largest tensor, so it never
  // holds the whole model and optimizer state (ZeRO-3's point; checkpoint.async keeps a whole host copy instead).
  // Rank 0 writes; every rank learns the outcome, so a failed write (disk full, permission, quota) ends every rank
  // with rank 0's one-line message and exit code 1, the previous checkpoint and `latest` untouched. After a failed
  // write rank 0 still takes every remaining tensor, so no sender is left waiting. Nobody goes on before the file
  // and `latest` are in place.
  CheckpointImage img = image_header(ctx, step);
  auto manifest = checkpoint_manifest(ctx.layout, ctx.cfg.optimizer);
  if (ctx.grid.world_rank != 0) {
    send_tensors(ctx, manifest, step);
    agree_on_errors(MPI_COMM_WORLD, [] {});
    return img.path;
  }
  int64_t largest = 0;
  for (auto& e : manifest) largest = std::max(largest, shape_numel(e.shape));
  std::vector<float> buffer(static_cast<size_t>(largest)), shard;  // (largest) one whole tensor at a time
  size_t next = 0;  // the first tensor not yet received
  auto fetch = [&](size_t i) {
    receive_tensor(ctx, manifest[i], step, buffer.data(), shard);
    next = i + 1;
    return static_cast<const float*>(buffer.data());
  };
  for (size_t i = 0; i < manifest.size(); ++i)
    img.tensors.push_back(CheckpointTensor{manifest[i].name, manifest[i].shape, {}, nullptr, [&fetch, i] { return fetch(i); }});
  if (CheckpointTensor bias = expert_bias_tensor(ctx); !bias.name.empty()) img.tensors.push_back(std::move(bias));
  agree_on_errors(MPI_COMM_WORLD, [&] {
    try {
      write_checkpoint_image(img, watchdog_progress);
    } catch (...) {
      while (next < manifest.size()) fetch(next);  // drain: every sender's tensor is taken
      throw;
    }
  });
  return img.path;
}

namespace {

// Where model.init_from's tensors come from: a safetensors file or a Hugging Face model directory.
// tensors: name -> shape as Relay holds it; read: one tensor as float32 in that shape.
struct InitSource {
  std::map<std::string, Shape> tensors;
  std::function<void(const std::string&, const Shape&, float*)> read;
};

}  // namespace

void load_init_from(CheckpointContext& ctx, const std::string& path) {
  const std::string where = cat("model.init_from = \"", path, "\"");
  InitSource src;
  std::unique_ptr<SafetensorsFile> file;
  std::unique_ptr<HfModelDir> dir;
  if (is_hf_dir(path)) {  // config.json checked against [model] before any tensor is read
    dir = std::make_unique<HfModelDir>(path, where);
    dir->check_matches(ctx.cfg.model);
    src.tensors = dir->tensors();
    src.read = [&](const std::string& n, const Shape& s, float* out) { dir->read(n, s, out); };
  } else {
    file = std::make_unique<SafetensorsFile>(path);
    for (auto& e : file->entries()) src.tensors[e.name] = e.shape;
    src.read = [&](const std::string& n, const Shape& s, float* out) { file->read(n, s, out); };
  }
  const std::string from = dir ? " from the directory" : "";
  // Per-MoE-layer rows of moe.expert_bias held as tensors (DeepSeek-V3's e_score_correction_bias): read into the
  // run's bias; without moe.expert_bias only zeros are accepted (transformers would route by them).
  const ModelFamily& family = model_family(ctx.cfg);
  const std::vector<std::string> bias_names = family.hf_expert_bias_names(ctx.cfg.model);
  std::set<std::string> bias_set(bias_names.begin(), bias_names.end());
  if (!bias_names.empty()) {
    const int64_t E = family.experts(ctx.cfg.model);
    std::vector<float> row(static_cast<size_t>(E));  // (E)
    for (size_t l = 0; l < bias_names.size(); ++l) {
      auto it = src.tensors.find(bias_names[l]);
      if (it == src.tensors.end()) continue;  // zero, as transformers initialises it
      if (it->second != Shape{E})
        throw Error(cat(where, ": tensor ", bias_names[l], " has shape ", shape_str(it->second), " but the model expects ",
                        shape_str(Shape{E})));
      src.read(bias_names[l], it->second, row.data());
      if (ctx.expert_bias) {
        std::copy(row.begin(), row.end(), ctx.expert_bias->begin() + int64_t(l) * E);
      } else if (std::any_of(row.begin(), row.end(), [](float b) { return b != 0.f; })) {
        throw Error(cat(where, ": tensor ", bias_names[l], " is non-zero but moe.expert_bias = false (the experts would "
                                "be chosen without it; hint: moe.expert_bias = true)"));
      }
    }
  }
  std::set<std::string> known;
  for (auto& p : ctx.layout.params()) {
    known.insert(p.name);
    auto it = src.tensors.find(p.name);
    if (it == src.tensors.end()) throw Error(cat(where, ": tensor ", p.name, " ", shape_str(p.shape), " is missing", from));
    if (it->second != p.shape)
      throw Error(cat(where, ": tensor ", p.name, " has shape ", shape_str(it->second), " but the model expects ",
                      shape_str(p.shape)));
  }
  for (auto& [name, shape] : src.tensors) {
    // A tied head saved by a module that keeps the name (nanoGPT's state_dict lists lm_head.weight,
    // the same tensor as transformer.wte.weight) and attention-mask / rotary buffers are not parameters.
    auto ends = [&](const std::string& tail) {
      return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool tied_alias = name == "lm_head.weight" && !known.count("lm_head.weight");
    const bool buffer = ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
    if (!known.count(name) && !tied_alias && !buffer && !bias_set.count(name))
      throw Error(cat(where, ": tensor ", name, " ", shape_str(shape),
                      " is not a parameter of this model (check the [model] section)"));
  }
  std::vector<float> buf, shard;  // (full_shape) the whole tensor; (shard shape) this tp rank's part
  for (auto& [name, param] : ctx.params) {
    buf.resize(static_cast<size_t>(shape_numel(param->full_shape)));
    src.read(name, param->full_shape, buf.data());
    const float* src = buf.data();
    if (ctx.grid.tp > 1 && !param->split.replicated()) {
      shard.resize(static_cast<size_t>(shape_numel(shard_shape(param->full_shape, param->split, ctx.grid.tp,
                                                               ctx.grid.tp_rank))));
      extract_shard(buf.data(), param->full_shape, param->split, ctx.grid.tp, ctx.grid.tp_rank, shard.data());
      src = shard.data();
    }
    LocalPiece lp = local_piece(ctx, "model/" + name);  // the whole tp shard, or (ZeRO-3) this rank's piece of it
    if (lp.tensor) ctx.be.upload(*lp.tensor, src + lp.offset);
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
  if (ctx.expert_bias) {
    const Shape want{int64_t(ctx.expert_bias->size()) / ctx.n_experts, ctx.n_experts};
    auto it = in_file.find("router/expert_bias");
    if (it == in_file.end())
      throw Error(cat(where, ": tensor router/expert_bias ", shape_str(want), " is missing, but moe.expert_bias = true "
                             "(the checkpoint was written without it; hint: moe.expert_bias = false)"));
    if (it->second != want)
      throw Error(cat(where, ": tensor router/expert_bias has shape ", shape_str(it->second), " but the model expects ",
                      shape_str(want)));
    reader.read("router/expert_bias", want, ctx.expert_bias->data());
  }
  ctx.optimizer.set_step_count(meta.optimizer_step);
  return meta.step;
}

}  // namespace relay

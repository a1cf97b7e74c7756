#include "parallel/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <numeric>
#include <tuple>
#include <utility>

#include "core/memory.hpp"
#include "core/test_faults.hpp"

namespace relay {

BucketLayout layout_buckets(const std::vector<BucketKey>& keys, BucketCaps caps, int dp, int expert_dp) {
  if (expert_dp <= 0) expert_dp = dp;
  // Per (chunk, counts_in_norm), reverse block order; a block's parameters never straddle two buckets.
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto key = [&](size_t i) {
    return std::make_tuple(keys[i].chunk, keys[i].tied, keys[i].tp_replicated, !keys[i].counts_in_norm, keys[i].expert,
                           -keys[i].block, keys[i].fp8);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  auto elems = [](double mb) { return std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024 / 4)); };
  const int64_t cap = elems(caps.mb), first_cap = caps.first_mb < 0 ? cap : std::min(cap, elems(caps.first_mb));
  BucketLayout out;
  int64_t fill = 0, limit = cap;
  for (size_t k = 0; k < order.size(); ++k) {
    const BucketKey &a = keys[order[k]], *prev = k ? &keys[order[k - 1]] : nullptr;
    const bool new_group = !prev || a.chunk != prev->chunk || a.counts_in_norm != prev->counts_in_norm ||
                           a.tp_replicated != prev->tp_replicated || a.expert != prev->expert || a.tied || prev->tied ||
                           a.fp8 != prev->fp8;
    const bool new_block = !prev || a.block != prev->block;
    if (new_group || (new_block && fill >= limit)) {
      out.groups.emplace_back();
      fill = 0;
      limit = new_group ? first_cap : cap;  // a run's first bucket is the small one
    }
    out.groups.back().push_back(order[k]);
    fill += a.numel;
  }
  for (auto& g : out.groups) {
    int64_t total = 0;
    for (size_t i : g) total += keys[i].numel;
    const int d = keys[g.front()].expert ? expert_dp : dp;
    out.padded.push_back((total + d - 1) / d * d);
    out.shards.push_back(d);
  }
  return out;
}

std::map<int, std::vector<Zero2Write>> zero2_writes(const std::vector<std::vector<int>>& chunk_param_blocks,
                                                    const std::map<int, std::vector<int>>& buckets_of_block) {
  std::map<int, std::vector<Zero2Write>> out;
  for (const auto& blocks : chunk_param_blocks)
    for (size_t k = 0; k < blocks.size(); ++k) {
      auto it = buckets_of_block.find(blocks[k]);
      if (it == buckets_of_block.end()) continue;
      const std::vector<int>* below = nullptr;  // the buckets of the block the backward visits next
      if (k > 0) {
        auto b = buckets_of_block.find(blocks[k - 1]);
        if (b != buckets_of_block.end()) below = &b->second;
      }
      for (int g : it->second)
        out[blocks[k]].push_back({g, !below || std::find(below->begin(), below->end(), g) == below->end()});
    }
  return out;
}

int Zero2Pool::open(int64_t elems, int64_t piece, const Reclaim& reclaim) {
  for (;;) {
    int best = -1;
    for (size_t i = 0; i < cap_.size(); ++i)
      if (free_[i] && fits(i, elems, piece) && (best < 0 || cap_[i] < cap_[size_t(best)])) best = int(i);
    if (best >= 0) {
      free_[size_t(best)] = false;
      return best;
    }
    const bool one_in_flight_fits =
        std::any_of(in_flight_.begin(), in_flight_.end(), [&](int i) { return fits(size_t(i), elems, piece); });
    if (!one_in_flight_fits) break;
    reclaim_oldest(reclaim);  // then look again
  }
  cap_.push_back(elems);
  piece_cap_.push_back(piece);
  free_.push_back(false);
  return static_cast<int>(cap_.size() - 1);
}

void Zero2Pool::close(int buffer, const Reclaim& reclaim) {
  in_flight_.push_back(buffer);
  while (in_flight_.size() > kInFlight) reclaim_oldest(reclaim);
}

void Zero2Pool::drain(const Reclaim& reclaim) {
  while (!in_flight_.empty()) reclaim_oldest(reclaim);
}

void Zero2Pool::reclaim_oldest(const Reclaim& reclaim) {
  const int buffer = in_flight_.front();
  reclaim(buffer);
  in_flight_.erase(in_flight_.begin());
  free_[size_t(buffer)] = true;
}

void GradBuckets::point(Bucket& b, const Tensor& flat, Tensor Param::*field) {
  for (size_t i = 0; i < b.members.size(); ++i) {
    auto& [p, at] = b.members[i];
    p->*field = flat.rows(at, shape_numel(b.shapes[i])).view(b.shapes[i]);
  }
}

namespace {
// The description GradBuckets follows: the replicas are comm's ranks (null: none), an expert's copies expert_comm's
// (null: no copy besides this rank's, ep = the replicas).
Sharding bucket_sharding(int zero, int pp, bool reshard, Communicator* comm, Communicator* expert_comm,
                         const std::vector<BucketParam>& params) {
  ShardingInput in;
  in.zero = zero;
  in.pp = pp;
  in.reshard_after_forward = reshard;
  in.replicas = comm ? comm->size() : 1;
  const bool experts = std::any_of(params.begin(), params.end(), [](const BucketParam& p) { return p.expert; });
  in.ep = !experts ? 1 : expert_comm ? in.replicas / expert_comm->size() : in.replicas;
  return describe_sharding(in);
}
}  // namespace

GradBuckets::GradBuckets(Backend& be, Communicator* comm, const std::vector<BucketParam>& params, BucketCaps caps,
                         int zero, GradReduce wire, bool reshard, int pp, Communicator* expert_comm,
                         bool fp8_param_gather, Communicator* tp_comm)
    : be_(be), comm_(comm), tp_comm_(tp_comm), sharding_(bucket_sharding(zero, pp, reshard, comm, expert_comm, params)),
      zero_(sharding_.group(GradGroup::dense).optimizer_state),
      per_micro_batch_(sharding_.group(GradGroup::dense).grads == GradHold::pooled),
      zero3_(sharding_.group(GradGroup::dense).parameters),
      reshard_(!sharding_.group(GradGroup::dense).gathered_kept),
      step_grads_(sharding_.group(GradGroup::dense).grads == GradHold::step_buckets),
      bf16_wire_(wire == GradReduce::bf16 && comm != nullptr) {
  MemoryScope scope(MemKind::grads);
  std::vector<BucketKey> keys;
  for (const BucketParam& p : params)
    keys.push_back({shape_numel(p.param->shape), p.chunk, p.block, p.counts_in_norm, p.tied, p.tp_replicated, p.expert,
                    zero3_ && p.param->fp8_weight});
  const BucketLayout layout = layout_buckets(keys, caps, sharding_.group(GradGroup::dense).shards(),
                                             sharding_.group(GradGroup::expert).shards());
  for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
    const auto& g = layout.groups[gi];
    Bucket b;
    b.group = params[g.front()].expert ? GradGroup::expert : GradGroup::dense;
    b.comm = b.group == GradGroup::expert ? expert_comm : comm;
    b.zero = sharding_.group(b.group).optimizer_state;
    if (const Move* m = sharding_.find(b.group, Moved::gradients)) b.reduce = m->collective;
    b.wired = wire == GradReduce::bf16 && b.comm;
    const int shards = b.zero ? b.comm->size() : 1;
    const int64_t padded = layout.padded[gi];
    b.padded = padded;
    if (!b.zero || (!per_micro_batch_ && !step_grads_)) b.flat = Tensor(be, {padded});
    if (b.zero) b.shard = Tensor(be, {padded / shards});
    b.chunk = params[g.front()].chunk;
    b.counts_in_norm = params[g.front()].counts_in_norm;
    if (b.wired && !per_micro_batch_) {
      if (!step_grads_) b.wire = Tensor(be, {padded}, DType::bf16);
      if (b.zero) b.wire_shard = Tensor(be, {padded / shards}, DType::bf16);
    }
    const bool has_work = params[g.front()].param->work_dtype != DType::f32;
    b.work_dtype = params[g.front()].param->work_dtype;
    b.fp8 = fp8_param_gather && zero3_ && b.zero && params[g.front()].param->fp8_weight;
    if (zero3_ && b.zero) {  // this rank's piece of the masters; nothing whole
      MemoryScope as_params(MemKind::params);
      b.master = Tensor(be, {padded / shards});
      be.fill(b.master, 0.f);  // the padding
    } else if (b.zero) {
      MemoryScope as_params(MemKind::params);  // the parameters' new home
      b.values = Tensor(be, {padded});
      be.fill(b.values, 0.f);  // the padding
      if (has_work) b.work = Tensor(be, {padded}, DType::bf16);
    }
    int64_t at = 0;
    for (size_t i : g) {
      Param* p = params[i].param;
      const int64_t n = shape_numel(p->shape);
      // ZeRO-3: gathered for each use, no codes kept beyond it (model/param.hpp); also an expert's whole unit with no
      // other copy, as the memory plan counts ZeRO-3's parameters (their pieces, the whole units, no FP8 cache).
      if (zero3_) p->fp8_cache.off = true;
      if (zero3_ && b.zero) {  // its elements in this rank's piece go into the masters; nothing whole is kept
        const int64_t piece = padded / shards, lo = piece * b.comm->rank(), a = std::max(lo, at),
                      e = std::min(lo + piece, at + n);
        if (a < e) {
          Tensor dst = b.master.rows(a - lo, e - a);
          if (p->value.defined()) {
            be.copy(dst, p->value.view({n}).rows(a - at, e - a));
          } else {  // deferred (ParamStore defer): the host's values, one parameter at a time
            const std::vector<float> v = p->initial();
            be.upload(dst, v.data() + (a - at));
          }
        }
        p->value = Tensor();
        p->work = Tensor();
        p->initial = nullptr;  // taken
      } else if (b.zero) {  // the parameter moves into the bucket's flat buffer, initial values and all
        Tensor v = b.values.rows(at, n).view(p->value.shape());
        be.copy(v, p->value);
        p->value = v;
        if (has_work) {
          Tensor w = b.work.rows(at, n).view(p->value.shape());
          be.copy(w, p->work);
          p->work = w;
        }
        p->weights_changed();  // the same values at another address (model/param.hpp: a moved copy is a new version)
      } else if (!p->value.defined()) {  // ZeRO-3's deferred values of an expert with no other copy: made whole here
        p->materialize(be);
      }
      b.shapes.push_back(p->shape);
      bucket_of_[p] = static_cast<int>(buckets_.size());
      b.members.push_back({p, at});
      at += n;
    }
    if (b.flat.defined()) point(b, b.flat, &Param::grad);
    buckets_.push_back(std::move(b));
  }
}

void GradBuckets::watch(ModelChunk& chunk) {
  const bool fill = micro_batches_ > 0 && !per_micro_batch_;  // launch_when_filled
  if (!per_micro_batch_ && !zero3_ && !fill) return;
  writes_per_step_.resize(buckets_.size(), 0);
  chunk_param_blocks_.emplace_back();
  for (auto& blk : chunk.blocks()) {
    const int index = blk->spec().index;
    if (!blk->params().empty()) chunk_param_blocks_.back().push_back(index);
    for (Param* p : blk->params()) {
      auto it = bucket_of_.find(p);
      RELAY_ASSERT(it != bucket_of_.end(), "parameter " << p->name << " has no gradient bucket");
      if (fill) {  // this block's weight gradients write the bucket once per micro-batch
        auto& mine = fills_[index];
        if (std::find(mine.begin(), mine.end(), it->second) == mine.end()) {
          mine.push_back(it->second);
          writes_per_step_[static_cast<size_t>(it->second)] += micro_batches_;
        }
      }
      if (!buckets_[static_cast<size_t>(it->second)].zero) continue;  // whole: nothing to gather or reduce-scatter
      auto& mine = buckets_of_block_[index];
      if (std::find(mine.begin(), mine.end(), it->second) == mine.end()) mine.push_back(it->second);
    }
  }
  if (per_micro_batch_) writes_ = zero2_writes(chunk_param_blocks_, buckets_of_block_);
  chunk.set_hooks(this);
}

void GradBuckets::before_weight_grads(int block) {
  auto it = writes_.find(block);
  if (it == writes_.end()) return;
  for (const Zero2Write& w : it->second) {
    const int bi = w.bucket;
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    if (b.buffer >= 0) continue;  // already open (an earlier writer of this pass)
    const int64_t piece = b.shard.numel();
    b.buffer = pool_plan_.open(b.padded, piece, [this](int old) { reclaim(old); });
    if (static_cast<size_t>(b.buffer) == pool_.size()) {  // a new buffer of this bucket's sizes
      MemoryScope scope(MemKind::grads);
      PoolBuffer pb;
      pb.flat = Tensor(be_, {b.padded});
      pb.recv = Tensor(be_, {piece});
      if (bf16_wire_) {
        pb.wire = Tensor(be_, {b.padded}, DType::bf16);
        pb.wire_recv = Tensor(be_, {piece}, DType::bf16);
      }
      pool_.push_back(std::move(pb));
    }
    PoolBuffer& pb = pool_[static_cast<size_t>(b.buffer)];
    Tensor flat = pb.flat.rows(0, b.padded);
    be_.fill(flat, 0.f);
    point(b, flat, &Param::grad);
  }
}

void GradBuckets::start_gather(Bucket& b) {
  if (b.full.defined()) return;  // gathered, or on its way
  MemoryScope scope(MemKind::params);
  const int64_t piece = b.master.numel();
  b.full = Tensor(be_, {b.padded}, b.fp8 ? DType::fp8_e4m3 : b.work_dtype);
  Tensor mine = b.full.rows(piece * b.comm->rank(), piece);
  if (b.fp8) quantise_piece(b);
  else if (b.work_dtype == DType::f32) be_.copy(mine, b.master);
  else be_.convert(b.master, mine);
  b.gather = b.comm->iallgather(b.full);
  b.gather->what = b.fp8 ? "the ZeRO-3 parameter all-gather (FP8 codes)" : "the ZeRO-3 parameter all-gather";
  trace_gather_issued(b);
  if (kill_in_gather_) std::raise(SIGKILL);  // test only: a rank lost mid-collective
}

// torchtitan's Float8 all-gather: each weight's tensorwise scale from the max over the ranks of the amax of their
// pieces of it (the whole weight's amax), then this rank's piece quantised with it. The codes and scales are those
// Fp8Linear makes from the gathered bf16 weight, bit for bit: the piece is the same bf16 values, and both take the
// amax as float bits (an exact max) and quantise each element on its own. Under tensor parallelism Fp8Linear takes a
// weight's scale from the max over the tp group of its shards' amax (the whole tensor's): so does this, a second max
// over the tp group (a replicated weight's amax is the same on every tp rank; the tp ranks' FP8 units hold the same
// weights in the same order, shapes and all: the vocabulary-parallel embedding and head are never FP8).
void GradBuckets::quantise_piece(Bucket& b) {
  const int64_t piece = b.master.numel(), lo = piece * b.comm->rank();
  const auto k = static_cast<int64_t>(b.members.size());
  Tensor work(be_, {piece}, b.work_dtype);  // (piece) the working values the bf16 gather would send
  be_.convert(b.master, work);
  Tensor amax(be_, {k, 1}, DType::i32);  // (members, 1) |w|'s max as float bits; 0 where the piece holds none of w
  b.fp8_scales = Tensor(be_, {k, 1});    // (members, 1)
  auto slice = [&](int64_t i, auto&& fn) {  // member i's elements in this piece as (1, count), count possibly 0
    const int64_t at = b.members[size_t(i)].second, n = shape_numel(b.shapes[size_t(i)]);
    const int64_t a = std::clamp(at, lo, lo + piece), e = std::clamp(at + n, lo, lo + piece);
    fn(a - lo, e - a);
  };
  for (int64_t i = 0; i < k; ++i)
    slice(i, [&](int64_t off, int64_t count) {
      Tensor m = amax.rows(i, 1);  // (1, 1)
      be_.fp8_amax(work.rows(off, count).view({1, count}), Fp8Tiling::tensor, m);
    });
  RequestPtr req = b.comm->iallreduce(amax, ReduceOp::max);
  req->what = "the ZeRO-3 FP8 parameter amax all-reduce";
  wait_for(*req);
  if (tp_comm_) {
    RequestPtr tp = tp_comm_->iallreduce(amax, ReduceOp::max);
    tp->what = "the ZeRO-3 FP8 parameter amax all-reduce (max over the tensor-parallel group)";
    wait_for(*tp);
  }
  Tensor mine = b.full.rows(lo, piece);  // (piece) e4m3
  for (int64_t i = 0; i < k; ++i)
    slice(i, [&](int64_t off, int64_t count) {
      Tensor q = mine.rows(off, count).view({1, count}), s = b.fp8_scales.rows(i, 1);  // (1, count), (1, 1)
      be_.fp8_quantize_amax(work.rows(off, count).view({1, count}), Fp8Tiling::tensor, amax.rows(i, 1), q, s);
    });
}

void GradBuckets::finish_gather(Bucket& b) {
  start_gather(b);
  if (!b.gather) return;  // ready
  wait_for(*b.gather);
  b.gather.reset();
  trace_gather_done(b);
  point(b, b.full, b.work_dtype == DType::f32 && !b.fp8 ? &Param::value : &Param::work);
  for (auto& [p, at] : b.members) p->weights_changed();
  if (b.fp8)
    for (size_t i = 0; i < b.members.size(); ++i) b.members[i].first->fp8_scale = b.fp8_scales.rows(int64_t(i), 1);
}

void GradBuckets::release(Bucket& b) {
  if (b.gather) {  // a prefetch nobody used
    wait_for(*b.gather);
    trace_gather_done(b);
  }
  b.gather.reset();
  b.full = Tensor();
  b.fp8_scales = Tensor();
  for (auto& [p, at] : b.members) {
    p->value = p->work = p->fp8_scale = Tensor();
    p->weights_changed();
  }
}

const std::vector<int>& GradBuckets::units_of(int block) const {
  static const std::vector<int> none;
  auto it = buckets_of_block_.find(block);
  return zero3_ && it != buckets_of_block_.end() ? it->second : none;
}

void GradBuckets::before_params(int block) {
  if (params_in_flight_)  // the values this block reads come back from the last step's all-gather
    if (auto it = buckets_of_block_.find(block); it != buckets_of_block_.end())
      for (int bi : it->second) settle(buckets_[static_cast<size_t>(bi)]);
  const std::vector<int>& mine = units_of(block);
  release_kept(mine);  // kept for a backward that did not come next (those this block reads stay)
  for (int bi : mine) {
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    finish_gather(b);
    ++b.users;
  }
}

void GradBuckets::release_kept(const std::vector<int>& still_read) {
  for (int bi : std::exchange(kept_, {})) {
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    if (b.users == 0 && std::find(still_read.begin(), still_read.end(), bi) == still_read.end()) release(b);
  }
}

void GradBuckets::prefetch_params(int block) {
  for (int bi : units_of(block)) start_gather(buckets_[static_cast<size_t>(bi)]);
}

void GradBuckets::after_params(int block, bool backward_next) {
  for (int bi : units_of(block)) {
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    RELAY_ASSERT(b.users > 0, "ZeRO-3: block " << block << " let go of parameters it did not hold");
    if (--b.users > 0 || !reshard_) continue;
    if (backward_next) kept_.push_back(bi);  // its backward reads them first: not gathered twice in a row
    else release(b);
  }
}

void GradBuckets::after_weight_grads(int block) {
  if (auto f = fills_.find(block); f != fills_.end())
    for (int bi : f->second)  // the last pass over a bucket: its gradients are final, send them
      if (--writes_left_[static_cast<size_t>(bi)] == 0) launch(buckets_[static_cast<size_t>(bi)]);
  auto it = writes_.find(block);
  if (it == writes_.end()) return;
  for (const Zero2Write& w : it->second) {
    const int bi = w.bucket;
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    RELAY_ASSERT(b.buffer >= 0, "ZeRO-2: bucket " << bi << " written by block " << block << " is not open");
    if (!w.closes) continue;
    // Its last writer is done: this micro-batch's gradients go out, this rank's piece comes back to pool.recv.
    PoolBuffer& pb = pool_[static_cast<size_t>(b.buffer)];
    const int64_t piece = b.shard.numel();
    if (tracer_) pb.launch_mark = tracer_->mark();
    Tensor flat = pb.flat.rows(0, b.padded);
    if (bf16_wire_) {
      Tensor w = pb.wire.rows(0, b.padded), wr = pb.wire_recv.rows(0, piece);
      be_.convert(flat, w);
      pb.request = b.comm->ireduce_scatter_sum(w, wr);
    } else {
      Tensor r = pb.recv.rows(0, piece);
      pb.request = b.comm->ireduce_scatter_sum(flat, r);
    }
    pb.request->what = cat("the ZeRO-2 gradient reduce-scatter of bucket ", bi);
    pb.bucket = bi;
    const int buffer = b.buffer;
    b.buffer = -1;
    pool_plan_.close(buffer, [this](int old) { reclaim(old); });
  }
}

void GradBuckets::reclaim(int buffer) {
  PoolBuffer& pb = pool_[static_cast<size_t>(buffer)];
  RELAY_ASSERT(pb.bucket >= 0 && pb.request, "ZeRO-2: pool buffer " << buffer << " is not in flight");
  wait_for(*pb.request);
  Bucket& b = buckets_[static_cast<size_t>(pb.bucket)];
  const int64_t piece = b.shard.numel();
  Tensor recv = pb.recv.rows(0, piece);
  if (bf16_wire_) be_.convert(pb.wire_recv.rows(0, piece), recv);
  be_.add(b.shard, recv, b.shard);
  if (tracer_)
    tracer_->add({cat("reduce-scatter bucket ", pb.bucket), "allreduce_grads", kTrackComm, trace_step_, -1, b.chunk,
                  pb.launch_mark, tracer_->mark(), static_cast<int64_t>(pb.bucket)});
  pb.request.reset();
  pb.bucket = -1;
}

void GradBuckets::wait_for(Request& r) {
  const auto t0 = std::chrono::steady_clock::now();
  r.wait();
  waited_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradBuckets::zero() {
  for (auto& b : buckets_) {
    if (per_micro_batch_ && b.zero) {  // the shard sums every micro-batch's piece
      RELAY_ASSERT(b.buffer < 0, "ZeRO-2: a bucket is still open at the start of a step");
      be_.fill(b.shard, 0.f);
    } else if (step_grads_ && b.zero) {  // the step's whole gradients, freed by finish()
      MemoryScope scope(MemKind::grads);
      b.flat = Tensor(be_, {b.padded});
      if (bf16_wire_) b.wire = Tensor(be_, {b.padded}, DType::bf16);
      be_.fill(b.flat, 0.f);
      point(b, b.flat, &Param::grad);
    } else {
      be_.fill(b.flat, 0.f);
    }
    b.request.reset();
    b.launched = false;
    b.widened = false;
  }
  writes_left_ = writes_per_step_;
}

void GradBuckets::launch(Bucket& b) {
  if (per_micro_batch_) return;  // ZeRO-2 launches each bucket as its last writer finishes
  if (b.launched) return;
  b.launched = true;
  if (tracer_) b.launch_mark = tracer_->mark();
  if (!b.comm) return;
  if (b.wired) be_.convert(b.flat, b.wire);
  Tensor& send = b.wired ? b.wire : b.flat;
  if (b.reduce == Collective::reduce_scatter)
    b.request = b.comm->ireduce_scatter_sum(send, b.wired ? b.wire_shard : b.shard);
  else
    b.request = b.comm->iallreduce_sum(send);
  test_fault_point("bucket");  // test only: a rank stopped or lost mid-collective
}

void GradBuckets::for_each_slice(const std::function<void(size_t, size_t, int64_t, int64_t)>& fn) const {
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    for (size_t i = 0; i < b.members.size(); ++i) {
      const int64_t at = b.members[i].second, n = shape_numel(b.shapes[i]);
      if (!b.zero) {
        fn(bi, i, at, at + n);
        continue;
      }
      const int64_t lo = own_begin(b), hi = lo + b.shard.numel();
      const int64_t a = std::max(lo, at), e = std::min(hi, at + n);
      if (a < e) fn(bi, i, a, e);  // (else another replica's piece)
    }
  }
}

std::vector<OptimSlice> GradBuckets::optimizer_slices() const {
  std::vector<OptimSlice> out;
  for_each_slice([&](size_t bi, size_t i, int64_t a, int64_t e) {
    const Bucket& b = buckets_[bi];
    auto& [p, at] = b.members[i];
    if (!b.zero) {
      out.push_back(whole(p));
    } else {
      const int64_t lo = own_begin(b);
      Tensor value = zero3_ ? b.master.rows(a - lo, e - a) : b.values.rows(a, e - a);
      out.push_back({p, value, b.shard.rows(a - lo, e - a), a - at, Tensor()});  // work: gathered when used
    }
  });
  return out;
}

Tensor GradBuckets::reduced_grad(Param* p) {
  for (Bucket& b : buckets_)
    if (b.members.size() == 1 && b.members.front().first == p) return b.zero ? b.shard : p->grad;
  if (!zero_) return p->grad;
  RELAY_ASSERT(false, "tied parameter " << p->name << " has no bucket of its own");
}

void GradBuckets::gather_params() {
  if (zero3_) {  // the masters changed: any gathered copy is stale
    for (Bucket& b : buckets_) {
      RELAY_ASSERT(b.users == 0, "ZeRO-3: parameters still in use after the step");
      if (b.zero) release(b);  // (a bucket with no other copy keeps its parameters whole)
    }
    kept_.clear();
    return;
  }
  // ZeRO-1, 2: every replica's updated piece to every replica. With launch_when_filled each bucket's gather is only
  // issued here and waited for where the next forward first reads the bucket (before_params) or at settle_params();
  // without, all are waited for at once.
  settle_params();  // (none in flight: the step's forward settled them all)
  for (size_t bi : gather_order()) issue_gather(buckets_[bi]);
  params_in_flight_ = true;
  if (micro_batches_ == 0) settle_params();
}

// The order the next forward reads the buckets, so that the first block's parameters arrive first: chunk after
// chunk, and each chunk's buckets (filled in reverse block order) last to first. Every rank has the same order.
std::vector<size_t> GradBuckets::gather_order() const {
  std::vector<size_t> order(buckets_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return buckets_[x].chunk != buckets_[y].chunk ? buckets_[x].chunk < buckets_[y].chunk : x > y;
  });
  return order;
}

void GradBuckets::issue_gather(Bucket& b) {
  if (!b.zero) return;
  b.gather = b.comm->iallgather_in_turn(b.values);  // in gather_order(), a few at a time
  b.gather->what = "the ZeRO parameter all-gather";
  trace_gather_issued(b);
}

void GradBuckets::trace_gather_issued(Bucket& b) {
  b.gather_tracer = tracer_;
  if (!tracer_) return;
  b.gather_mark = tracer_->mark();
  b.gather_step = trace_step_;
}

void GradBuckets::trace_gather_done(Bucket& b) {
  Tracer* t = std::exchange(b.gather_tracer, nullptr);
  if (!t) return;  // issued outside the traced steps
  const auto k = static_cast<size_t>(&b - buckets_.data());
  t->add({cat("param gather bucket ", k), "gather_params", kTrackComm, b.gather_step, -1, b.chunk, b.gather_mark,
          t->mark(), static_cast<int64_t>(buckets_.size()) + gather_spans_++});
}

std::optional<UpdateGroups> GradBuckets::update_groups() {
  if (!zero_ || zero3_ || micro_batches_ == 0) return std::nullopt;
  settle_params();  // (none in flight: the step's forward settled them all)
  // Each bucket's slices (indices into optimizer_slices(), which lists them in the same walk).
  std::vector<std::vector<size_t>> by_bucket(buckets_.size());
  size_t slice = 0;
  for_each_slice([&](size_t bi, size_t, int64_t, int64_t) { by_bucket[bi].push_back(slice++); });
  UpdateGroups g;
  std::vector<size_t> order = gather_order();
  for (size_t bi : order) g.slices.push_back(std::move(by_bucket[bi]));
  g.after = [this, order](size_t group) { issue_gather(buckets_[order[group]]); };
  params_in_flight_ = true;
  return g;
}

void GradBuckets::settle(Bucket& b) {
  if (!b.gather) return;
  wait_for(*b.gather);
  b.gather.reset();
  trace_gather_done(b);
  if (b.work.defined()) be_.convert(b.values, b.work);
  for (auto& [p, at] : b.members) p->weights_changed();  // every replica's updated piece arrived
}

void GradBuckets::settle_params() {
  if (!params_in_flight_) return;
  for (Bucket& b : buckets_) settle(b);
  params_in_flight_ = false;
}

void GradBuckets::launch_chunk(int chunk) {
  for (auto& b : buckets_)
    if (b.chunk == chunk) launch(b);
}

void GradBuckets::progress() {
  for (auto& b : buckets_)
    if (b.request) b.request->test();
  for (auto& pb : pool_)  // progress only: reclaimed in launch order
    if (pb.request) pb.request->test();
}

void GradBuckets::finish() {
  if (per_micro_batch_) {
    for (size_t k = 0; k < buckets_.size(); ++k)
      RELAY_ASSERT(buckets_[k].buffer < 0, "ZeRO-2: bucket " << k << " still open at the end of the backward");
    pool_plan_.drain([this](int old) { reclaim(old); });
    return;
  }
  for (auto& b : buckets_) launch(b);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (!b.request) continue;
    wait_for(*b.request);
    if (b.wired && !b.widened) {  // widen the bf16 sum back into the f32 gradients, once
      b.widened = true;
      if (b.zero) be_.convert(b.wire_shard, b.shard);
      else be_.convert(b.wire, b.flat);
    }
    if (step_grads_) {  // ZeRO-3 under pp > 1: only the shard outlives the step
      b.flat = b.wire = Tensor();
      for (auto& [p, at] : b.members) p->grad = Tensor();
    }
    if (tracer_)
      tracer_->add({cat("allreduce bucket ", k), "allreduce_grads", kTrackComm, trace_step_, -1, b.chunk,
                    b.launch_mark, tracer_->mark(), static_cast<int64_t>(k)});
  }
}

double GradBuckets::norm_share() {
  double s = 0;
  for (auto& b : buckets_)
    if (b.counts_in_norm && (b.zero || !b.comm || b.comm->rank() == 0)) s += be_.sum_squares(b.zero ? b.shard : b.flat);
  return s;
}

void GradBuckets::scale(float s) {
  for (auto& b : buckets_) be_.scale(b.zero ? b.shard : b.flat, s);
}

}  // namespace relay

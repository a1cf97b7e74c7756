// The CPU backend: the reference implementation of every Backend operation (oneDNN GEMMs, OpenMP loops).
#pragma once
#include <memory>

#include "backend/backend.hpp"
#include "backend/cpu_op_profile.hpp"

namespace relay {

class CpuBackend final : public Backend {
 public:
  // bf16_gemm: train.cpu_bf16_gemm ("auto", "native" or "widened"), applied by set_precision(bf16). time_bf16_gemm:
  // whether "auto" times the test GEMM here; false: another rank times it (world rank 0 of a job, train/setup.cpp) and
  // bf16 GEMMs run widened (correct on every CPU) until adopt_bf16_gemm gives this one its choice.
  explicit CpuBackend(int threads, std::string bf16_gemm = "auto", bool time_bf16_gemm = true);
  ~CpuBackend() override;
  Device device() const override { return Device::cpu; }
  std::string describe() const override;
  int64_t available_bytes() const override;
  void set_precision(Precision p) override;
  // train.cpu_bf16_gemm = "auto": the choice this backend timed (1 widened, 0 native; -1 not timed: not bf16, or
  // configured, or no native path; 1 as well while it waits for another rank's) and its note; adopt_bf16_gemm makes
  // another rank's choice this one's, so that every rank of a job multiplies bf16 the same way (train/setup.cpp
  // takes world rank 0's, the only rank that times it).
  int bf16_auto_choice() const { return auto_widen_; }
  const std::string& bf16_note() const { return bf16_note_; }
  void adopt_bf16_gemm(int widen, const std::string& note);
  bool supports(DType) const override { return true; }

  std::shared_ptr<std::byte> allocate(size_t bytes) override;
  std::shared_ptr<std::byte> allocate_host(size_t bytes) override { return allocate(bytes); }
  void upload(Tensor& dst, const void* host_src) override;
  void download(void* host_dst, const Tensor& src) override;
  void synchronize() override {}
  // RELAY_OP_PROFILE=1: wall time by op (cpu_op_profile.hpp).
  void op_begin(const char* op) const override {
    if (profile_) profile_->begin(op);
  }
  void op_end() const override {
    if (profile_) profile_->end();
  }
  void op_profile_restart() override {
    if (profile_) profile_->restart();
  }

 protected:
  void copy_impl(Tensor& dst, const Tensor& src) override;
  void gather_rows_impl(const Tensor& src, const Tensor& index, Tensor& dst) override;
  void copy_columns_impl(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override;
  void attention_merge_impl(Tensor& out, Tensor& lse, const Tensor& out2, const Tensor& lse2, int64_t B, int64_t T,
                            int64_t H) override;
  void flash_attention_gqa_forward_at_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t Tq,
                                           int64_t Tk, const Tensor& q_pos, int64_t H, int64_t KV, Tensor& out,
                                           Tensor& lse, const Tensor& doc_start) override;
  void flash_attention_gqa_backward_at_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk,
                                            const Tensor& q_pos, int64_t H, int64_t KV, Tensor& dq, Tensor& dk,
                                            Tensor& dv, const Tensor& doc_start) override;
  void fill_impl(Tensor& x, float value) override;
  void convert_impl(const Tensor& src, Tensor& dst) override;
  void matmul_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                   float beta) override;
  void add_bias_impl(Tensor& y, const Tensor& bias) override;
  void bias_grad_impl(const Tensor& dy, Tensor& db, float beta) override;
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, LinearAct act,
                   Tensor* pre_act) override;
  void linear_backward_input_impl(const Tensor& dy, const Tensor& w, Tensor& dx, LinearAct act,
                                  const Tensor& act_in) override;
  void fp8_quantize_impl(const Tensor& x, Fp8Tiling tiling, Tensor& q, Tensor& scales) override;
  void fp8_amax_impl(const Tensor& x, Fp8Tiling tiling, Tensor& amax) override;
  void fp8_quantize_amax_impl(const Tensor& x, Fp8Tiling tiling, const Tensor& amax, Tensor& q,
                              Tensor& scales) override;
  void fp8_matmul_impl(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a, const Tensor& b,
                       const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y, float beta) override;
  void grouped_matmul_impl(const Tensor& a, const std::vector<Tensor>& b, bool trans_b, Tensor& y,
                           const std::vector<int64_t>& offsets, float beta) override;
  void grouped_matmul_weight_impl(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                                  const std::vector<Tensor>& dw, float beta) override;
  void activation_forward_impl(Activation act, const Tensor& x, Tensor& y) override;
  void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void scale_impl(Tensor& x, float s) override;
  void add_impl(const Tensor& a, const Tensor& b, Tensor& y) override;
  double sum_squares_impl(const Tensor& x) override;
  void layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                              Tensor& mean, Tensor& rstd) override;
  void layernorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, Tensor& dx) override;
  void layernorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                      Tensor& dgamma, Tensor& dbeta) override;
  void cross_entropy_impl(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                          Tensor* dlogits) override;
  void mse_impl(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred) override;
  void argmax_impl(const Tensor& logits, Tensor& out) override;
  void row_max_impl(const Tensor& x, Tensor& out) override;
  void cross_entropy_partial_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  const Tensor& row_max, Tensor& partial) override;
  void cross_entropy_finish_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                 const Tensor& row_max, const Tensor& total, float grad_scale, Tensor& losses,
                                 Tensor* dlogits) override;
  void embedding_forward_impl(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T, Tensor& out,
                              int64_t vocab_start, const Tensor& positions) override;
  void embedding_backward_impl(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte, Tensor& dwpe,
                               int64_t vocab_start, const Tensor& positions) override;
  void attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) override;
  void attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T,
                               int64_t H, Tensor& dqkv) override;
  void flash_attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& out,
                                    Tensor& lse, const Tensor& doc_start) override;
  void flash_attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     int64_t B, int64_t T, int64_t H, Tensor& dqkv, const Tensor& doc_start) override;
  void attention_decode_impl(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H,
                             Tensor& out) override;
  void rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd) override;
  void rmsnorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                   Tensor& dx) override;
  void rmsnorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dgamma) override;
  void moe_router_forward_impl(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse,
                               Tensor& experts, Tensor& weights, const Tensor& bias) override;
  void moe_router_backward_impl(const Tensor& probs, const Tensor& lse, const Tensor& experts, const Tensor& dweights,
                                bool renormalize, const Tensor& seq_grad, int64_t T, float z_scale,
                                Tensor& dlogits) override;
  void moe_group_router_forward_impl(const Tensor& logits, const GroupRouting& r, Tensor& probs, Tensor& experts,
                                     Tensor& weights, const Tensor& bias) override;
  void moe_group_router_backward_impl(const Tensor& probs, const Tensor& experts, const Tensor& dweights,
                                      const GroupRouting& r, const Tensor& seq_grad, int64_t T,
                                      Tensor& dlogits) override;
  void moe_combine_impl(const Tensor& rows, const Tensor& pos, const Tensor& weights, Tensor& y) override;
  void moe_combine_backward_impl(const Tensor& dy, const Tensor& rows, const Tensor& pos, const Tensor& weights,
                                 Tensor& drows, Tensor& dweights) override;
  void swiglu_forward_impl(const Tensor& gate, const Tensor& up, Tensor& h) override;
  void swiglu_backward_impl(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate,
                            Tensor& dup) override;
  void rotary_columns_impl(const Tensor& src, Tensor& dst, int64_t head_width, int64_t off, bool interleaved,
                           bool gather) override;
  void rope_impl(const Tensor& x, int64_t T, int64_t head_dim, double theta, int64_t pos0, bool inverse,
                 Tensor& y, const Tensor& positions, const RopeScaling& scaling) override;
  void flash_attention_gqa_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t T,
                                        int64_t H, int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start) override;
  void flash_attention_gqa_backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t H,
                                         int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) override;
  void attention_decode_latent_impl(const Tensor& q, const Tensor& kv, Tensor& cache, int64_t t, int64_t H,
                                    float scale, Tensor& out) override;
  void attention_decode_gqa_impl(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kcache, Tensor& vcache,
                                 int64_t t, int64_t H, int64_t KV, Tensor& out) override;
  void adamw_step_many_impl(const std::vector<AdamWSlot>& slots, const AdamWArgs& args) override;
  void adamw_step_impl(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWArgs& args,
                       Tensor& work) override;
  void sgd_step_impl(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& args,
                     Tensor& work) override;

 private:
  int threads_;
  std::string bf16_gemm_;  // as configured
  std::string bf16_note_;  // how bf16 GEMMs run, for describe(); empty until set_precision(bf16)
  int auto_widen_ = -1;    // "auto"'s timed choice (1 widened, 0 native), made by the first set_precision(bf16)
  bool time_bf16_gemm_;    // whether "auto" times its test GEMM here (else widened until adopt_bf16_gemm)
  std::unique_ptr<CpuOpProfile> profile_;  // RELAY_OP_PROFILE=1 only
};

}  // namespace relay

// FlashAttention-2 causal self-attention on the CPU (kernels/cpu/flash_attention.cpp): the result of
// attention_forward / attention_backward without the (B, H, T, T) probabilities, for float32 or bfloat16
// storage (math in float32). Dao et al. arXiv:2205.14135, Dao arXiv:2307.08691.
#pragma once
#include <cstdint>

#include "core/bf16.hpp"

namespace relay::cpu {

// qkv (B*T, 3C) [q | k | v]; out (B*T, C); lse (B, H, T) float32: log-sum-exp of each query row's scaled
// scores, saved for the backward. Head h uses columns [h*hd, (h+1)*hd) of each part, hd = C/H; scale
// 1/sqrt(hd); query t sees keys s <= t. Elem is float or bf16.
// doc_start (B*T), optional (data.document_mask): query t of sequence b sees keys [doc_start[b*T + t], t] only,
// the first position of its document within the sequence. Documents are contiguous: doc_start[t] <= t,
// non-decreasing in t, and equal over a document. Key tiles that lie before every query's document are skipped.
template <typename Elem>
void flash_attention_forward(const Elem* qkv, Elem* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H,
                             const int32_t* doc_start = nullptr);

// dout (B*T, C), qkv, out and lse of the forward -> dqkv (B*T, 3C), overwritten (not accumulated).
// Bitwise the same for any OpenMP thread count.
template <typename Elem>
void flash_attention_backward(const Elem* dout, const Elem* qkv, const Elem* out, const float* lse, Elem* dqkv,
                              int64_t B, int64_t T, int64_t C, int64_t H, const int32_t* doc_start = nullptr);

// Grouped-query attention on strided row views: q (B*T rows, ldq apart) holds H heads of hd columns, k and v
// (B*T rows, ldkv apart) KV heads; query head h reads key/value head h / (H / KV). out (B*T, H*hd), lse
// (B, H, T). GPT's packed layout is q = qkv, k = qkv + C, v = qkv + 2C, ldq = ldkv = 3C, KV = H.
// Value heads may be narrower or wider than query/key heads (DeepSeek-V3's MLA: hd = 192, hd_v = 128): v (B*T rows,
// ldv apart) holds KV heads of hd_v columns, out (B*T, H*hd_v); the scale stays 1/sqrt(hd). hd_v <= 0 means hd and
// ldv <= 0 means ldkv: every caller that leaves them out gets exactly the arithmetic of equal head dims.
template <typename Elem>
void flash_attention_gqa_forward(const Elem* q, const Elem* k, const Elem* v, int64_t ldq, int64_t ldkv, Elem* out,
                                 float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                 const int32_t* doc_start = nullptr, int64_t hd_v = 0, int64_t ldv = 0);
// dq (rows ldq apart), dk (rows ldkv apart), dv (rows ldv apart; hd_v columns a head): overwritten. A key/value head's gradients sum its query
// heads' in order (deterministic for any thread count).
template <typename Elem>
void flash_attention_gqa_backward(const Elem* dout, const Elem* q, const Elem* k, const Elem* v, int64_t ldq,
                                  int64_t ldkv, const Elem* out, const float* lse, Elem* dq, Elem* dk, Elem* dv,
                                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                  const int32_t* doc_start = nullptr, int64_t hd_v = 0, int64_t ldv = 0);

// Queries at chosen positions of a longer key sequence (context parallelism: a rank's chunks of each sequence
// against the whole sequence's gathered keys): q, out (B*Tq rows), k, v (B*Tk rows); query t of sequence b is at
// key position q_pos[b*Tq + t] (non-decreasing in t, < Tk) and sees keys [doc_start[b*Tq + t], q_pos[b*Tq + t]]
// (doc_start optional, as above). lse (B, H, Tq). The backward writes dq (B*Tq rows) and dk, dv (B*Tk rows: every
// key's gradient from these queries alone, to be summed over the ranks holding the other queries). With q_pos
// null and Tq == Tk these are the functions above; hd_v and ldv as above.
template <typename Elem>
void flash_attention_gqa_forward_at(const Elem* q, const Elem* k, const Elem* v, int64_t ldq, int64_t ldkv, Elem* out,
                                    float* lse, int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos, int64_t H,
                                    int64_t KV, int64_t hd, const int32_t* doc_start, int64_t hd_v = 0,
                                    int64_t ldv = 0);
template <typename Elem>
void flash_attention_gqa_backward_at(const Elem* dout, const Elem* q, const Elem* k, const Elem* v, int64_t ldq,
                                     int64_t ldkv, const Elem* out, const float* lse, Elem* dq, Elem* dk, Elem* dv,
                                     int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos, int64_t H, int64_t KV,
                                     int64_t hd, const int32_t* doc_start, int64_t hd_v = 0, int64_t ldv = 0);

}  // namespace relay::cpu

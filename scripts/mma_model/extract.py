#!/usr/bin/env python3
"""Cuts the kernels out of two versions of kernels/cuda/flash_attention_mma.cu for compare.cpp: the helpers and
kernels (not the launchers), in namespaces oldk and newk, with the few functions written in inline PTX (mma,
ldmatrix, cp.async) removed so that warp_model.hpp's CPU versions stand in for them.
Usage: extract.py BASE.cu TREE.cu BASE_OUT.inc TREE_OUT.inc"""
import sys
def remove_fn(s, start_pat):
    i = s.find(start_pat)
    if i < 0: return s, False
    j = s.index('{', i)
    depth = 0
    k = j
    while True:
        if s[k] == '{': depth += 1
        elif s[k] == '}':
            depth -= 1
            if depth == 0: break
        k += 1
    return s[:i] + s[k+1:], True
def extract(path, ns, out):
    s = open(path).read()
    a = s.index('namespace relay::cuda {'); b = s.index('// launchers')
    s = s[a:b].replace('namespace relay::cuda {', 'namespace %s {' % ns, 1)
    for pat in ['__device__ inline void mma(', 'template <bool TRANS>\n__device__ inline void ldmatrix_x4',
                '__device__ inline void cp_async16(', '__device__ inline void cp_async_commit()',
                'template <int N>\n__device__ inline void cp_async_wait()']:
        s, _ = remove_fn(s, pat)
    # the old file's load_b_cols_x2 issues ldmatrix.trans inline: route it to the model
    s, had = remove_fn(s, 'template <int LD>\n__device__ inline void load_b_cols_x2(')
    assert had
    s = s.replace('namespace {', '''namespace {
template <int LD>
void load_b_cols_x2(const __nv_bfloat16* s, int k0, int n0, uint32_t (&b)[4]) {
  const int lane = threadIdx.x % 32, i = lane / 8, r = lane % 8;
  ldmatrix_x4<true>(s + (k0 + r + (i & 1) * 8) * LD + n0 + (i >> 1) * 8, b);
}''', 1)
    s = s.replace('extern __shared__ __align__(16) unsigned char smem[];', 'unsigned char* smem = g_smem;')
    assert 'asm' not in s, [l for l in s.split('\n') if 'asm' in l]
    s += '\n}  // namespace\n}  // namespace ' + ns + '\n'
    open(out, 'w').write(s)
extract(sys.argv[1], 'oldk', sys.argv[3])
extract(sys.argv[2], 'newk', sys.argv[4])

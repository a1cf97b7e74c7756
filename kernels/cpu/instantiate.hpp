// Explicit instantiation of a kernel template for the two float storage types (float, bf16), so the
// definitions stay in their .cpp files. Usage after a definition: RELAY_FOR_FLOAT_TYPES(INST_ADD)
// with #define INST_ADD(X) template void add<X>(const X*, const X*, X*, int64_t);
#pragma once
#include "core/bf16.hpp"

#define RELAY_FOR_FLOAT_TYPES(M) M(float) M(::relay::bf16)

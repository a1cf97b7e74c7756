// Tensor views over backend-owned storage.
#include "core/tensor.hpp"

#include <algorithm>

#include "core/memory.hpp"

namespace relay {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::fp8_e4m3: return 1;
    case DType::fp8_e5m2: return 1;
  }
  return 4;
}
const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "float32";
    case DType::i32: return "int32";
    case DType::bf16: return "bfloat16";
    case DType::fp8_e4m3: return "float8_e4m3";
    case DType::fp8_e5m2: return "float8_e5m2";
  }
  return "?";
}
bool is_fp8(DType dt) { return dt == DType::fp8_e4m3 || dt == DType::fp8_e5m2; }
Fp8Format fp8_format(DType dt) {
  RELAY_ASSERT(is_fp8(dt), "fp8_format of a " << dtype_name(dt) << " tensor");
  return dt == DType::fp8_e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
}
DType fp8_dtype(Fp8Format f) { return f == Fp8Format::e4m3 ? DType::fp8_e4m3 : DType::fp8_e5m2; }


std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor::Tensor(Allocator& alloc, Shape shape, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype), device_(alloc.device()) {
  for (int64_t d : shape_) RELAY_ASSERT(d >= 0, "negative dimension in " << shape_str(shape_));
  std::shared_ptr<std::byte> storage = alloc.allocate(std::max<size_t>(bytes(), 4));
  // Counted under the current MemoryScope's kind until the storage (shared by every view) is freed.
  const MemKind kind = current_mem_kind();
  const int64_t n = static_cast<int64_t>(bytes());
  mem_account(kind, n);
  std::byte* p = storage.get();
  mem_ = std::shared_ptr<std::byte>(p, [storage = std::move(storage), kind, n](std::byte*) mutable {
    mem_account(kind, -n);
    storage.reset();
  });
}

float* Tensor::f32() {
  RELAY_ASSERT(dtype_ == DType::f32, "tensor is " << dtype_name(dtype_));
  return static_cast<float*>(raw());
}
const float* Tensor::f32() const {
  RELAY_ASSERT(dtype_ == DType::f32, "tensor is " << dtype_name(dtype_));
  return static_cast<const float*>(raw());
}
int32_t* Tensor::i32() {
  RELAY_ASSERT(dtype_ == DType::i32, "tensor is " << dtype_name(dtype_));
  return static_cast<int32_t*>(raw());
}
const int32_t* Tensor::i32() const {
  RELAY_ASSERT(dtype_ == DType::i32, "tensor is " << dtype_name(dtype_));
  return static_cast<const int32_t*>(raw());
}

bf16* Tensor::b16() {
  RELAY_ASSERT(dtype_ == DType::bf16, "tensor is " << dtype_name(dtype_));
  return static_cast<bf16*>(raw());
}
const bf16* Tensor::b16() const {
  RELAY_ASSERT(dtype_ == DType::bf16, "tensor is " << dtype_name(dtype_));
  return static_cast<const bf16*>(raw());
}

uint8_t* Tensor::fp8() {
  RELAY_ASSERT(is_fp8(dtype_), "tensor is " << dtype_name(dtype_) << ", not an fp8 dtype");
  return static_cast<uint8_t*>(raw());
}
const uint8_t* Tensor::fp8() const {
  RELAY_ASSERT(is_fp8(dtype_), "tensor is " << dtype_name(dtype_) << ", not an fp8 dtype");
  return static_cast<const uint8_t*>(raw());
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  RELAY_ASSERT(ndim() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
               "rows(" << begin << ", " << count << ") of " << shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = count;
  t.offset_ += static_cast<size_t>(begin * (shape_[0] ? numel() / shape_[0] : 0)) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::view(Shape shape) const {
  RELAY_ASSERT(shape_numel(shape) == numel(), "view " << shape_str(shape) << " of " << shape_str(shape_));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

}  // namespace relay

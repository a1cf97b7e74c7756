// Tensor: a shaped, typed view of memory owned by a Backend (host memory for the CPU backend,
// device memory for CUDA). Row-major; views share storage, so slicing micro-batches is free.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/fp8.hpp"

namespace relay {

// f32: float32; i32: token ids, class targets, argmax; bf16: bfloat16 activations and working weights;
// fp8_e4m3, fp8_e5m2: FP8 GEMM operands (core/fp8.hpp), one byte an element, with their scales beside them in f32.
enum class DType : uint8_t { f32, i32, bf16, fp8_e4m3, fp8_e5m2 };
enum class Device : uint8_t { cpu, cuda };
using Shape = std::vector<int64_t>;

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
bool is_fp8(DType dt);
Fp8Format fp8_format(DType dt);   // dt must be an fp8 dtype
DType fp8_dtype(Fp8Format f);
std::string shape_str(const Shape& s);  // "[256, 1024]"
int64_t shape_numel(const Shape& s);

// Where tensor memory comes from; every Backend is one (core does not depend on backend/).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual std::shared_ptr<std::byte> allocate(size_t bytes) = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates through the backend; contents are undefined until written.
  Tensor(Allocator& alloc, Shape shape, DType dtype = DType::f32);

  bool defined() const { return mem_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_.at(static_cast<size_t>(d < 0 ? d + ndim() : d)); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() { return mem_.get() + offset_; }
  const void* raw() const { return mem_.get() + offset_; }
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;
  bf16* b16();
  const bf16* b16() const;
  uint8_t* fp8();  // the codes of an fp8_e4m3 or fp8_e5m2 tensor
  const uint8_t* fp8() const;
  // Typed access for kernels templated on the storage type: data<float>() or data<bf16>().
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;

  // Rows [begin, begin + count) of the leading dimension, sharing storage.
  Tensor rows(int64_t begin, int64_t count) const;
  // Same storage, another shape with the same number of elements.
  Tensor view(Shape shape) const;

 private:
  std::shared_ptr<std::byte> mem_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

template <>
inline float* Tensor::data<float>() { return f32(); }
template <>
inline const float* Tensor::data<float>() const { return f32(); }
template <>
inline bf16* Tensor::data<bf16>() { return b16(); }
template <>
inline const bf16* Tensor::data<bf16>() const { return b16(); }

}  // namespace relay

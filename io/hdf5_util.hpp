// Small helpers over the HDF5 C API: RAII handles, one lock for every HDF5 call sequence, and a CHECK
// that turns a failed call into a relay::Error carrying HDF5's own message (automatic printing is off).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace relay {

// Every HDF5 call sequence in Relay holds this lock: the prefetch thread and the main thread both
// read, and rank 0 writes checkpoints. Debian's build is compiled thread-safe, but a serial HDF5
// built without --enable-threadsafe is not, and the lock costs nothing next to the I/O.
std::mutex& hdf5_mutex();

// Holds hdf5_mutex() and switches off HDF5's automatic error printing for the calling thread
// (a thread-safe HDF5 keeps one error stack per thread); failures are reported by RELAY_H5_CHECK.
class Hdf5Lock {
 public:
  Hdf5Lock();

 private:
  std::lock_guard<std::mutex> lock_;
};

// Owns one HDF5 identifier and closes it with the matching H5?close. Handles are created and
// destroyed under Hdf5Lock: declare the lock first so that it is released last.
template <herr_t (*Close)(hid_t)>
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  ~H5Handle() { reset(); }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }  // for a checked close
  void reset() {
    if (id_ >= 0) Close(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using H5File = H5Handle<H5Fclose>;
using H5Dataset = H5Handle<H5Dclose>;
using H5Space = H5Handle<H5Sclose>;
using H5Type = H5Handle<H5Tclose>;
using H5Attr = H5Handle<H5Aclose>;
using H5Plist = H5Handle<H5Pclose>;
using H5Object = H5Handle<H5Oclose>;

// The messages on the calling thread's HDF5 error stack, outermost (the API call) and innermost
// (the cause, e.g. "No such file or directory"); clears the stack.
std::string h5_error_message();

// Throws relay::Error: "<context>: HDF5 call <call> failed (<file>:<line>): <HDF5's message>".
[[noreturn]] void h5_fail(const char* call, const std::string& context, const char* file, int line);

// Describes a stored type the way numpy would: "float32", "int64", "uint8", "string", "compound".
std::string h5_type_name(hid_t type);
// The extent of a dataspace: {} for a scalar.
std::vector<int64_t> h5_shape(hid_t space);
std::string shape_string(const std::vector<int64_t>& shape);  // "[1000, 64]"

// Call first thing in main, before any HDF5 call: HDF5's own exit handler closes the files still
// open, and one whose close already failed (a checkpoint write into a full disk) crashes it
// (SIGSEGV in H5F__close_cb). Relay closes every file it opens itself, so the handler is switched off.
void hdf5_disable_exit_cleanup();

// A data file must not change under a running job: HDF5 reads the bytes past a shortened file as
// zeros, so a file truncated mid-run (a full quota, a copy still in progress) would train on zeros
// silently. Throws an Error naming the file and both sizes when it is gone or shorter than at open.
void check_file_not_shrunk(const std::string& path, uint64_t size_at_open, const std::string& where);

// Scalar attributes of obj (a file, group or dataset): a string (fixed or variable length, as h5py
// writes them) and any integer type as int64. Errors name `ctx` and the attribute.
std::string h5_read_str_attr(hid_t obj, const char* name, const std::string& ctx);
int64_t h5_read_i64_attr(hid_t obj, const char* name, const std::string& ctx);

}  // namespace relay

// Checks an HDF5 call (negative = failure); `context` names the file and dataset and is only built
// on failure. Evaluates to the call's result (an id, herr_t or htri_t).
#define RELAY_H5_CHECK(call, context)                                              \
  ([&]() {                                                                         \
    auto relay_h5_result_ = (call);                                                \
    if (relay_h5_result_ < 0) ::relay::h5_fail(#call, (context), __FILE__, __LINE__); \
    return relay_h5_result_;                                                       \
  }())

// HDF5 helpers: the global lock, error-stack messages for RELAY_H5_CHECK, type and shape names.
#include "io/hdf5_util.hpp"

#include <filesystem>

namespace relay {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  std::string s = e->func_name ? e->func_name : "";
  if (e->desc && *e->desc) s += cat(s.empty() ? "" : ": ", e->desc);
  out->push_back(s);
  return 0;
}

}  // namespace

std::string h5_error_message() {
  std::vector<std::string> entries;  // outermost (the API call) first
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &entries);
  H5Eclear2(H5E_DEFAULT);
  if (entries.empty()) return "no message on the HDF5 error stack";
  if (entries.size() == 1) return entries.front();
  return cat(entries.front(), " (cause: ", entries.back(), ")");
}

void h5_fail(const char* call, const std::string& context, const char* file, int line) {
  std::string detail = h5_error_message();
  for (char& c : detail)
    if (c == '\n') c = ' ';  // HDF5 embeds ctime()'s newline: keep the error on one line
  // A failed write or open carries the OS's reason ("errno = 28, error message = 'No space left on
  // device'"): say it first, in plain words.
  std::string os;
  const auto at = detail.find("error message = '");
  if (at != std::string::npos) {
    const auto end = detail.find('\'', at + 17);
    if (end != std::string::npos) os = detail.substr(at + 17, end - at - 17);
  }
  const std::string short_call = std::string(call).substr(0, std::string(call).find('('));
  throw Error(cat(context, ": ", os.empty() ? "" : os + " (", short_call, " failed",
                  os.empty() ? "" : ")", "; HDF5 at ", file, ":", line, ": ", detail));
}

std::string h5_type_name(hid_t type) {
  const size_t bytes = H5Tget_size(type);
  std::string order = H5Tget_order(type) == H5T_ORDER_BE && bytes > 1 ? " (big-endian)" : "";
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return cat(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", 8 * bytes, order);
    case H5T_FLOAT: return cat("float", 8 * bytes, order);
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "vlen";
    case H5T_ARRAY: return "array";
    default: return "unknown type";
  }
}

std::vector<int64_t> h5_shape(hid_t space) {
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank <= 0) return {};
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

void hdf5_disable_exit_cleanup() { H5dont_atexit(); }

void check_file_not_shrunk(const std::string& path, uint64_t size_at_open, const std::string& where) {
  std::error_code ec;
  const auto now = std::filesystem::file_size(path, ec);
  if (ec) throw Error(cat(where, ": the file became unreadable during the run (", ec.message(), ")"));
  if (now < size_at_open)
    throw Error(cat(where, ": the file shrank from ", size_at_open, " to ", now,
                    " bytes during the run (truncated or being rewritten); the batch just read is not trusted"));
}

std::string h5_read_str_attr(hid_t obj, const char* name, const std::string& ctx) {
  if (RELAY_H5_CHECK(H5Aexists(obj, name), ctx) <= 0) throw Error(cat(ctx, ": attribute '", name, "' is missing"));
  H5Attr a(RELAY_H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT), ctx));
  H5Type ft(RELAY_H5_CHECK(H5Aget_type(a.get()), ctx));
  if (H5Tget_class(ft.get()) != H5T_STRING) throw Error(cat(ctx, ": attribute '", name, "' is not a string"));
  if (H5Tis_variable_str(ft.get()) > 0) {
    H5Type mt(RELAY_H5_CHECK(H5Tcopy(H5T_C_S1), ctx));
    RELAY_H5_CHECK(H5Tset_size(mt.get(), H5T_VARIABLE), ctx);
    RELAY_H5_CHECK(H5Tset_cset(mt.get(), H5Tget_cset(ft.get())), ctx);
    char* p = nullptr;
    RELAY_H5_CHECK(H5Aread(a.get(), mt.get(), &p), ctx);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(ft.get());
  std::string s(n, '\0');
  RELAY_H5_CHECK(H5Aread(a.get(), ft.get(), s.data()), ctx);
  return s.substr(0, s.find('\0'));
}

int64_t h5_read_i64_attr(hid_t obj, const char* name, const std::string& ctx) {
  if (RELAY_H5_CHECK(H5Aexists(obj, name), ctx) <= 0) throw Error(cat(ctx, ": attribute '", name, "' is missing"));
  H5Attr a(RELAY_H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT), ctx));
  int64_t v = 0;
  RELAY_H5_CHECK(H5Aread(a.get(), H5T_NATIVE_INT64, &v), ctx);
  return v;
}

}  // namespace relay

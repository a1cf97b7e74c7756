// TensorBoard event files, written without TensorFlow: TFRecord framing (tensorflow/core/lib/io/
// record_writer.cc: length, masked CRC32C of the length, data, masked CRC32C of the data) around
// Event protocol buffers (tensorflow/core/util/event.proto) encoded by hand. The first event carries
// file_version "brain.Event:2"; each later one a Summary of scalar simple_values at a step, which
// `tensorboard --logdir` and its EventAccumulator read as scalars.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace relay {

// CRC-32C (Castagnoli), and TFRecord's mask of it: rotate right by 15, add 0xa282ead8.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class EventFileWriter {
 public:
  // Creates dir and events.out.tfevents.<unix time>.<host>.<pid> in it (the name TensorBoard looks
  // for); throws Error naming the file when it cannot.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event at `step` holding a scalar per (tag, value); flushed, so TensorBoard sees it at once.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace relay

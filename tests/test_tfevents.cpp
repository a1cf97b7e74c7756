// TensorBoard event files (io/tfevents.cpp): CRC-32C against its published check values, and the bytes
// of a record against TFRecord's framing. Reading them with TensorBoard's own reader is
// tests/torch/test_tensorboard_events.py.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "io/tfevents.hpp"
#include "support/test_support.hpp"

namespace relay {

TEST(TfEvents, Crc32cCheckValues) {
  // RFC 3720 (iSCSI) B.4 and the CRC catalogue's CRC-32/ISCSI check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TfEvents, RecordsAreFramedAndStartWithTheFileVersion) {
  test::TempDir dir;
  std::string path;
  {
    EventFileWriter w(dir.file("tb"));
    path = w.path();
    w.scalars(7, {{"train/loss", 0.5}});
  }
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t off = 0;
  std::vector<std::string> records;
  while (off + 12 <= bytes.size()) {
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + off, 8);
    std::memcpy(&len_crc, bytes.data() + off + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(bytes.data() + off, 8));
    ASSERT_LE(off + 12 + len + 4, bytes.size());
    records.push_back(bytes.substr(off + 12, len));
    std::memcpy(&data_crc, bytes.data() + off + 12 + len, 4);
    EXPECT_EQ(data_crc, masked_crc32c(records.back().data(), len));
    off += 12 + len + 4;
  }
  EXPECT_EQ(off, bytes.size());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_NE(records[0].find("\x1a\x0d" "brain.Event:2"), std::string::npos);  // field 3, 13 bytes
  const float half = 0.5f;
  std::string value = std::string("\x0a\x0a") + "train/loss" + "\x15" + std::string(reinterpret_cast<const char*>(&half), 4);
  EXPECT_NE(records[1].find(value), std::string::npos);  // Value { tag = 1; simple_value = 2 }
  EXPECT_NE(records[1].find(std::string("\x10\x07", 2)), std::string::npos);  // step = 7
}

}  // namespace relay

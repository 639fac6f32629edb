// ByteWriter / ByteReader: little-endian binary encoding of control messages
// and manifests. The reader never reads past its buffer: a short or
// malformed message makes ok() false instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ftrun {

class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.append(p, sizeof(T));
  }
  void PutString(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.append(s.data(), s.size());
  }
  // An optional u64: a presence byte, then the value (0 when absent).
  void PutOptionalU64(const std::optional<uint64_t>& v) {
    Put<uint8_t>(v.has_value() ? 1 : 0);
    Put<uint64_t>(v.value_or(0));
  }
  // A u32 count, then the values.
  void PutU64s(const std::vector<uint64_t>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (uint64_t x : v) Put<uint64_t>(x);
  }
  const std::string& data() const { return buf_; }
  std::string Take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view data) : data_(data) {}

  template <typename T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    if (!ok_ || data_.size() - pos_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string GetString() {
    uint32_t n = Get<uint32_t>();
    if (!ok_ || data_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // A count that must fit in what is left, each element at least `min_each`
  // bytes: guards allocations against a corrupt length.
  uint32_t GetCount(size_t min_each) {
    uint32_t n = Get<uint32_t>();
    if (ok_ && min_each > 0 && n > (data_.size() - pos_) / min_each) ok_ = false;
    return ok_ ? n : 0;
  }
  std::optional<uint64_t> GetOptionalU64() {
    const bool has = Get<uint8_t>() != 0;
    const uint64_t v = Get<uint64_t>();
    return has ? std::optional<uint64_t>(v) : std::nullopt;
  }
  // A count that fits in what is left (GetCount), then the values.
  std::vector<uint64_t> GetU64s() {
    std::vector<uint64_t> v(GetCount(sizeof(uint64_t)));
    for (uint64_t& x : v) x = Get<uint64_t>();
    return v;
  }
  bool ok() const { return ok_; }
  bool done() const { return pos_ == data_.size(); }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace ftrun

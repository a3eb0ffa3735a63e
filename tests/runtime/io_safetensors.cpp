// The safetensors reader/writer: round trips, header alignment, a hand-made
// file read byte for byte, every header rejection (with its message), expect()
// messages, and the atomic write; opening costs O(n log n) name comparisons
// and a small multiple of the header in memory, hostile headers included;
// names and metadata are checked (UTF-8, NUL, length) with byte offsets.
// own translation unit: it replaces the global operator delete and defines a macro before its includes.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"
#include "support/repeats.hpp"

#include <headroom/io/safetensors.hpp>

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

// Live bytes allocated through operator new, and their peak, counted while
// `tracking` is on (malloc_usable_size gives the same figure on allocation
// and release). Replacing operator new affects the whole test executable, but
// counts only while a test here turns tracking on. Under AddressSanitizer the
// allocator is the sanitizer's own, so the memory test is left to the plain
// build (as host_memory.cpp is).
#define HEADROOM_TEST_COUNTS_ALLOCATIONS (!HEADROOM_TEST_SANITIZED)

#if HEADROOM_TEST_COUNTS_ALLOCATIONS
namespace {
std::atomic<bool> tracking{false};
std::atomic<long long> live_bytes{0}, peak_bytes{0};
}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  if (tracking.load(std::memory_order_relaxed)) {
    const long long now = live_bytes += static_cast<long long>(malloc_usable_size(p));
    long long peak = peak_bytes.load(std::memory_order_relaxed);
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
  }
  return p;
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept {
  if (p && tracking.load(std::memory_order_relaxed)) live_bytes -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }
#endif

namespace {
using headroom::test::TempDir;
using headroom::test::write_file;

namespace fs = std::filesystem;
using headroom::DType;
using headroom::io::format_error;
using headroom::io::SafetensorsFile;
using headroom::io::TensorView;
using headroom::io::write_safetensors;
using Catch::Contains;

// How many writers' temporaries ("<file>.headroom-tmp-<random>", io/durable.hpp) `dir` holds.
int temporaries_in(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".headroom-tmp-") != std::string::npos;
  return n;
}

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file made of: u64 header length, `json`, `data_bytes` zero bytes.
fs::path make_file(const TempDir& tmp, const std::string& json, std::size_t data_bytes,
                   const std::string& name = "bad.safetensors") {
  const fs::path p = tmp / name;
  write_file(p, le64(json.size()) + json + std::string(data_bytes, '\0'));
  return p;
}

template <class T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name) {
  const auto* t = f.find(name);
  REQUIRE(t != nullptr);
  std::vector<T> v((t->end - t->begin) / sizeof(T));
  f.read(name, v.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace

TEST_CASE("safetensors: round trip of several dtypes and shapes with metadata", "[io][safetensors]") {
  TempDir tmp;
  const fs::path p = tmp / "model.safetensors";

  const std::vector<float> w = {1.5f, -2.f, 3.25f, 0.f, 7.f, -8.5f};  // [2, 3]
  const std::vector<std::uint16_t> h = {0x3F80, 0x4000, 0xBF80, 0x0000};  // bf16 [4]
  const std::vector<double> d = {3.141592653589793};                  // [1]
  const std::vector<std::int32_t> idx = {-1, 2, -3, 4};              // [2, 2]
  const std::vector<std::int8_t> q = {-128, 0, 127};                 // [3]
  const std::vector<std::uint16_t> s = {0x3C00};                     // f16 scalar []
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "quote\" back\\ nl\n tab\t"}};

  write_safetensors(p,
                    {
                        {"model.layers.0.weight", DType::F32, {2, 3}, w.data()},
                        {"h", DType::BF16, {4}, h.data()},
                        {"pi", DType::F64, {1}, d.data()},
                        {"ids", DType::I32, {2, 2}, idx.data()},
                        {"q", DType::I8, {3}, q.data()},
                        {"empty", DType::U8, {0, 5}, nullptr},
                        {"scalar", DType::F16, {}, s.data()},
                    },
                    meta);
  CHECK(temporaries_in(tmp.dir) == 0);

  const SafetensorsFile f(p);
  CHECK(f.metadata().to_map() == meta);
  REQUIRE(f.tensors().size() == 7);
  const std::vector<std::string> order = {"model.layers.0.weight", "h", "pi", "ids", "q", "empty", "scalar"};
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(f.tensors()[i].name == order[i]);

  const auto& tw = f.expect("model.layers.0.weight", DType::F32, {2, 3});
  CHECK(tw.begin == 0);
  CHECK(tw.end == 24);
  f.expect("h", DType::BF16, {4});
  f.expect("pi", DType::F64, {1});
  f.expect("ids", DType::I32, {2, 2});
  f.expect("q", DType::I8, {3});
  const auto& te = f.expect("empty", DType::U8, {0, 5});
  CHECK(te.begin == te.end);
  f.expect("scalar", DType::F16, {});

  CHECK(read_tensor<float>(f, "model.layers.0.weight") == w);
  CHECK(read_tensor<std::uint16_t>(f, "h") == h);
  CHECK(read_tensor<double>(f, "pi") == d);
  CHECK(read_tensor<std::int32_t>(f, "ids") == idx);
  CHECK(read_tensor<std::int8_t>(f, "q") == q);
  CHECK(read_tensor<std::uint16_t>(f, "scalar") == s);
  f.read("empty", nullptr, 0);

  CHECK(f.find("nope") == nullptr);
  CHECK_THROWS_AS(f.read("nope", nullptr, 0), format_error);
  std::vector<float> small(2);
  CHECK_THROWS_AS(f.read("model.layers.0.weight", small.data(), 8), std::invalid_argument);

  // No metadata and no tensors: still a valid file.
  const fs::path e = tmp / "empty.safetensors";
  write_safetensors(e, {});
  const SafetensorsFile fe(e);
  CHECK(fe.tensors().empty());
  CHECK(fe.metadata().empty());
}

TEST_CASE("safetensors: header is padded with spaces so data starts 8-byte aligned", "[io][safetensors]") {
  TempDir tmp;
  const std::vector<float> x = {1.f, 2.f, 3.f};
  for (int len = 1; len <= 10; ++len) {
    std::string file = "a";  // (built by appends: GCC 12 warns falsely on "a" + to_string(...))
    file += std::to_string(len);
    file += ".safetensors";
    const fs::path p = tmp / file;
    const std::map<std::string, std::string> meta =
        len % 2 ? std::map<std::string, std::string>{} : std::map<std::string, std::string>{{"k", std::string(static_cast<std::size_t>(len), 'v')}};
    write_safetensors(p, {{std::string(static_cast<std::size_t>(len), 'n'), DType::F32, {3}, x.data()}}, meta);
    const std::string bytes = read_bytes(p);
    REQUIRE(bytes.size() >= 8);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    CHECK(n % 8 == 0);
    CHECK((8 + n) % 8 == 0);
    REQUIRE(bytes.size() == 8 + n + 12);
    const std::string header = bytes.substr(8, n);
    const auto close = header.find_last_of('}');
    REQUIRE(close != std::string::npos);
    CHECK(header.size() - (close + 1) < 8);  // at most 7 pad bytes
    for (std::size_t i = close + 1; i < header.size(); ++i) CHECK(header[i] == ' ');
    float back[3];
    std::memcpy(back, bytes.data() + 8 + n, sizeof back);
    CHECK(back[0] == 1.f);
    CHECK(back[2] == 3.f);
    CHECK(SafetensorsFile(p).tensors().size() == 1);
  }
}

TEST_CASE("safetensors: a hand-made file is read correctly", "[io][safetensors]") {
  TempDir tmp;
  // Whitespace, an escaped name ("w\u00e9" = "wé"), metadata after tensors and
  // tensors listed out of offset order are all legal.
  const std::string json =
      "{ \"b\": {\"dtype\": \"I8\", \"shape\": [2], \"data_offsets\": [8, 10]},\n"
      "  \"w\\u00e9\" : {\"shape\":[2],\"dtype\":\"F32\",\"data_offsets\":[0,8]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"esc\": \"a\\\"b\\\\c\\/d\\n\"} }";
  std::string bytes = le64(json.size()) + json;
  // 1.0f, 2.0f little endian, then int8 -1, 5.
  const unsigned char data[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40, 0xFF, 0x05};
  bytes.append(reinterpret_cast<const char*>(data), sizeof data);
  const fs::path p = tmp / "tiny.safetensors";
  write_file(p, bytes);

  const SafetensorsFile f(p);
  REQUIRE(f.tensors().size() == 2);
  // tensors() is in data (file) order.
  CHECK(f.tensors()[0].name == "w\xC3\xA9");
  CHECK(f.tensors()[0].dtype == DType::F32);
  CHECK(f.tensors()[0].shape == std::vector<std::int64_t>{2});
  CHECK(f.tensors()[0].begin == 0);
  CHECK(f.tensors()[0].end == 8);
  CHECK(f.tensors()[1].name == "b");
  CHECK(f.tensors()[1].dtype == DType::I8);
  CHECK(f.tensors()[1].begin == 8);
  CHECK(f.tensors()[1].end == 10);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("esc") == "a\"b\\c/d\n");
  CHECK(read_tensor<float>(f, "w\xC3\xA9") == std::vector<float>{1.f, 2.f});
  CHECK(read_tensor<std::int8_t>(f, "b") == std::vector<std::int8_t>{-1, 5});
}

TEST_CASE("safetensors: malformed files are rejected with clear messages", "[io][safetensors]") {
  TempDir tmp;
  const std::string file = "bad.safetensors";
  auto rejects = [&](const fs::path& p, const std::string& what) {
    INFO(what);
    CHECK_THROWS_AS(SafetensorsFile(p), format_error);
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains(file) && Contains(what));
  };
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  std::uint64_t b, std::uint64_t e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };

  SECTION("missing file") { rejects(tmp / file, "cannot open"); }
  SECTION("shorter than 8 bytes") {
    write_file(tmp / file, "");
    rejects(tmp / file, "file too short");
    write_file(tmp / file, std::string(5, '\0'));
    rejects(tmp / file, "file too short");
  }
  SECTION("shorter than 8 + N") {
    write_file(tmp / file, le64(100) + "{}");
    rejects(tmp / file, "header length 100 exceeds the file size");
  }
  SECTION("absurd header length") {
    write_file(tmp / file, le64(~std::uint64_t{0}) + "{}");
    rejects(tmp / file, "exceeds the file size");
  }
  SECTION("JSON that does not parse") {
    rejects(make_file(tmp, "{\"a\":", 0), "invalid JSON");
    rejects(make_file(tmp, "", 0), "invalid JSON");
    rejects(make_file(tmp, "{\"a\":true}", 0), "unexpected character 't'");
    rejects(make_file(tmp, "{\"a\":null}", 0), "unexpected character 'n'");
    rejects(make_file(tmp, "{\"a\":1.5}", 0), "only non-negative integers");
    rejects(make_file(tmp, "{\"a\":1e3}", 0), "only non-negative integers");
    rejects(make_file(tmp, "{\"a\":-1}", 0), "negative numbers");
    rejects(make_file(tmp, "{\"a\":01}", 0), "leading zeros");
    rejects(make_file(tmp, "{\"a\":99999999999999999999}", 0), "integer too large");
    rejects(make_file(tmp, "{}}", 0), "trailing characters");
    rejects(make_file(tmp, "{\"a\":[1,]}", 0), "invalid JSON");
    rejects(make_file(tmp, "{\"__metadata__\":{},}", 0), "expected a string key");
    rejects(make_file(tmp, "{\"a\\q\":1}", 0), "bad escape");
    rejects(make_file(tmp, "{\"a\\ud800\":1}", 0), "unpaired high surrogate");
    rejects(make_file(tmp, "{\"a\nb\":1}", 0), "control character");
    rejects(make_file(tmp, "{\"x\":{\"extra\":" + std::string(100, '[') + std::string(100, ']') + "}}", 0),
            "nesting too deep");
    rejects(make_file(tmp, "[]", 0), "not a JSON object");
  }
  SECTION("unknown and unsupported dtypes") {
    rejects(make_file(tmp, "{" + entry("x", "F33", "[1]", 0, 4) + "}", 4), "tensor 'x': unknown dtype 'F33'");
    rejects(make_file(tmp, "{" + entry("x", "I64", "[1]", 0, 8) + "}", 8),
            "tensor 'x': unsupported dtype 'I64'");
  }
  SECTION("shape product * dtype size != end - begin") {
    rejects(make_file(tmp, "{" + entry("x", "F32", "[3]", 0, 8) + "}", 8), "needs 12 bytes");
    rejects(make_file(tmp, "{" + entry("x", "F32", "[2,\"a\"]", 0, 8) + "}", 8), "\"shape\" holds a string");
  }
  SECTION("malformed entries") {
    rejects(make_file(tmp, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4), "tensor 'x': missing \"data_offsets\"");
    rejects(make_file(tmp, "{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), "missing \"dtype\"");
    rejects(make_file(tmp, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4),
            "not an array of two integers");
    rejects(make_file(tmp, "{\"x\":3}", 0), "entry for tensor 'x' is not an object");
    rejects(make_file(tmp, "{\"__metadata__\":{\"k\":1}}", 0), "value for key 'k' is not a string");
    rejects(make_file(tmp, "{\"__metadata__\":[]}", 0), "\"__metadata__\" is not an object");
  }
  SECTION("offsets out of range") {
    rejects(make_file(tmp, "{" + entry("x", "F32", "[4]", 0, 16) + "}", 8), "out of range");
    rejects(make_file(tmp, "{" + entry("x", "F32", "[1]", 8, 4) + "}", 8), "begin after end");
  }
  SECTION("overlapping offsets") {
    rejects(make_file(tmp, "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12),
            "tensor 'b' data [4, 12) overlaps tensor 'a'");
  }
  SECTION("holes in the data buffer") {
    rejects(make_file(tmp, "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}", 12),
            "hole in the data buffer: bytes [4, 8)");
    rejects(make_file(tmp, "{" + entry("a", "F32", "[1]", 4, 8) + "}", 8), "hole in the data buffer: bytes [0, 4)");
    rejects(make_file(tmp, "{" + entry("a", "F32", "[1]", 0, 4) + "}", 8),
            "bytes [4, 8) at the end of the file belong to no tensor");
  }
  SECTION("duplicate names") {
    rejects(make_file(tmp, "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[1]", 4, 8) + "}", 8),
            "duplicate key 'a' at bytes 9 and 62: two tensors with one name");
  }
}

TEST_CASE("safetensors: expect() names the tensor and what differs", "[io][safetensors]") {
  TempDir tmp;
  const fs::path p = tmp / "ckpt.safetensors";
  const std::vector<float> w(6, 1.f);
  write_safetensors(p, {{"lm_head.weight", DType::F32, {2, 3}, w.data()}});
  const SafetensorsFile f(p);

  CHECK(f.expect("lm_head.weight", DType::F32, {2, 3}).name == "lm_head.weight");
  CHECK_THROWS_AS(f.expect("lm_head.wieght", DType::F32, {2, 3}), format_error);
  CHECK_THROWS_WITH(f.expect("lm_head.wieght", DType::F32, {2, 3}),
                    Contains("ckpt.safetensors") && Contains("tensor 'lm_head.wieght' not found"));
  CHECK_THROWS_WITH(f.expect("lm_head.weight", DType::BF16, {2, 3}),
                    Contains("tensor 'lm_head.weight'") && Contains("dtype is F32, expected BF16") &&
                        !Contains("shape"));
  CHECK_THROWS_WITH(f.expect("lm_head.weight", DType::F32, {3, 2}),
                    Contains("tensor 'lm_head.weight'") && Contains("shape is [2, 3], expected [3, 2]") &&
                        !Contains("dtype"));
  CHECK_THROWS_WITH(f.expect("lm_head.weight", DType::F16, {6}),
                    Contains("dtype is F32, expected F16") && Contains("shape is [2, 3], expected [6]"));
}

TEST_CASE("safetensors: writing is atomic", "[io][safetensors]") {
  TempDir tmp;
  const fs::path p = tmp / "out.safetensors";
  const std::vector<float> a = {1.f, 2.f};
  write_safetensors(p, {{"a", DType::F32, {2}, a.data()}}, {{"v", "1"}});
  CHECK(temporaries_in(tmp.dir) == 0);
  const std::string before = read_bytes(p);

  SECTION("a null data pointer with nonzero size throws mid-write") {
    const std::vector<float> b = {3.f, 4.f, 5.f};
    CHECK_THROWS_WITH(write_safetensors(p, {{"b", DType::F32, {3}, b.data()}, {"c", DType::F32, {4}, nullptr}},
                                        {{"v", "2"}}),
                      Contains("out.safetensors") && Contains("tensor 'c' has no data"));
  }
  SECTION("invalid tensor lists throw before anything is written") {
    CHECK_THROWS_WITH(write_safetensors(p, {{"a", DType::F32, {2}, a.data()}, {"a", DType::F32, {2}, a.data()}}),
                      Contains("duplicate tensor name 'a'"));
    CHECK_THROWS_WITH(write_safetensors(p, {{"a", DType::F32, {-2}, a.data()}}), Contains("negative dimension"));
    CHECK_THROWS_WITH(write_safetensors(p, {{"__metadata__", DType::F32, {2}, a.data()}}),
                      Contains("__metadata__"));
    // names the reader would refuse are refused before they are written
    CHECK_THROWS_WITH(write_safetensors(p, {{std::string("a\xC0\xAF", 3), DType::F32, {2}, a.data()}}),
                      Contains("tensor name") && Contains("byte 1: invalid UTF-8: overlong encoding"));
    CHECK_THROWS_WITH(write_safetensors(p, {{std::string("a\0b", 3), DType::F32, {2}, a.data()}}),
                      Contains("tensor name") && Contains("byte 1: a NUL byte"));
    CHECK_THROWS_WITH(write_safetensors(p, {{std::string(4097, 'n'), DType::F32, {2}, a.data()}}),
                      Contains("is 4097 bytes, more than 4096"));
    CHECK_THROWS_WITH(write_safetensors(p, {{"a", DType::F32, {2}, a.data()}}, {{"k", std::string("\xED\xA0\x80", 3)}}),
                      Contains("__metadata__ value") && Contains("byte 0: invalid UTF-8"));
  }
  CHECK(temporaries_in(tmp.dir) == 0);
  CHECK(read_bytes(p) == before);
  const SafetensorsFile f(p);
  CHECK(f.metadata().at("v") == "1");
  CHECK(read_tensor<float>(f, "a") == a);

  // A directory that does not exist: nothing is created anywhere.
  const fs::path nowhere = tmp / "missing_dir" / "x.safetensors";
  CHECK_THROWS_WITH(write_safetensors(nowhere, {{"a", DType::F32, {2}, a.data()}}),
                    Contains("cannot create") && Contains("temporary file"));
  CHECK_FALSE(fs::exists(nowhere));
}

namespace {

// One tensor entry of a hand-written header.
std::string entry_json(const std::string& name, const std::string& dtype, const std::string& shape, std::uint64_t b,
                       std::uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

// The error message of opening `p`, or "" when it opens.
std::string open_error(const fs::path& p) {
  try {
    SafetensorsFile f(p);
  } catch (const format_error& e) {
    return e.what();
  }
  return "";
}

// The file offset of the first `needle` in `json` (the header starts at byte 8).
std::string offset_of(const std::string& json, const std::string& needle, std::size_t from = 0) {
  const std::size_t at = json.find(needle, from);
  REQUIRE(at != std::string::npos);
  return std::to_string(8 + at);
}

// Counts name comparisons on this thread while it lives (and stops counting
// even when what it measures throws).
struct CountComparisons {
  std::uint64_t count = 0;
  CountComparisons() { headroom::io::detail::safetensors::name_comparisons = &count; }
  ~CountComparisons() { headroom::io::detail::safetensors::name_comparisons = nullptr; }
  CountComparisons(const CountComparisons&) = delete;
  CountComparisons& operator=(const CountComparisons&) = delete;
};

#if HEADROOM_TEST_COUNTS_ALLOCATIONS
// Peak bytes held through operator new while opening `p` (it may throw).
long long peak_while_opening(const fs::path& p, bool& opened) {
  live_bytes = 0;
  peak_bytes = 0;
  tracking = true;
  try {
    SafetensorsFile f(p);
    opened = true;
  } catch (const format_error&) {
    opened = false;
  }
  tracking = false;
  return peak_bytes.load();
}
#endif

}  // namespace

TEST_CASE("safetensors: opening makes O(n log n) name comparisons, a lookup O(log n)", "[io][safetensors][scaling]") {
  TempDir tmp;
  // 200,000 one-byte tensors; names in an order unlike both the header order
  // and the data order (i * 7919 mod n is a permutation: 7919 is prime).
  constexpr std::uint64_t n = 200'000;
  auto name_of = [&](std::uint64_t i) { return "model.layers." + std::to_string(i * 7919 % n) + ".w"; };
  std::string json = "{";
  for (std::uint64_t i = 0; i < n; ++i) {
    if (i) json += ',';
    const std::uint64_t slot = (i * 104729) % n;  // data order differs from header order too
    json += entry_json(name_of(i), "U8", "[1]", slot, slot + 1);
  }
  json += "}";
  const fs::path p = make_file(tmp, json, n, "big.safetensors");

  const std::uint64_t log2n = static_cast<std::uint64_t>(std::ceil(std::log2(static_cast<double>(n))));  // 18
  std::optional<SafetensorsFile> opened;
  std::uint64_t comparisons = 0;
  {
    CountComparisons c;
    opened.emplace(p);
    comparisons = c.count;
  }
  const SafetensorsFile& f = *opened;
  INFO("comparisons while opening: " << comparisons);
  // One sort of the names and one pass over neighbours: about n log2 n
  // (3.6 million here); the linear scans this replaces made n^2 (4e10).
  CHECK(comparisons <= 3 * n * log2n);

  REQUIRE(f.tensors().size() == n);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (f.tensors()[i].begin != i) FAIL("tensors() is not in data order at " << i);
  }
  for (std::uint64_t i = 0; i < n; i += 997) {
    const std::string name = name_of(i);
    CountComparisons c;
    const auto* t = f.find(name);
    const auto* missing = f.find(name + "x");
    REQUIRE(t != nullptr);
    CHECK(t->name == name);
    CHECK(t->begin == (i * 104729) % n);
    CHECK(missing == nullptr);
    CHECK(c.count <= 2 * (log2n + 1));
  }
  CountComparisons c;
  const std::string last = name_of(n - 1);
  const auto& t = f.expect(last, DType::U8, {1});
  std::uint8_t byte = 1;
  f.read(last, &byte, 1);
  CHECK(t.name == last);
  CHECK(byte == 0);
  CHECK(c.count <= 2 * (log2n + 1));
}

#if HEADROOM_TEST_COUNTS_ALLOCATIONS
TEST_CASE("safetensors: opening holds at most 5x the header in memory, hostile headers included",
          "[io][safetensors][memory]") {
  namespace st = headroom::io::detail::safetensors;
  TempDir tmp;
  // Each header is about 4 MB; the bound: 5 x header + 256 KiB (stream
  // buffers, the path, the messages).
  constexpr std::size_t target = 4'000'000;
  struct Case {
    std::string what, json;
    std::size_t data_bytes;
    bool valid;
  };
  std::vector<Case> cases;
  {  // many zero-size tensors with short names
    std::string j = "{";
    for (std::size_t i = 0; j.size() < target; ++i) j += (i ? "," : "") + entry_json(std::to_string(i), "U8", "[0]", 0, 0);
    cases.push_back({"many tiny tensors", j + "}", 0, true});
  }
  {  // tensors of 64 dimensions of 1: 2 bytes of text, 8 of memory per dimension
    std::string shape = "[1";
    for (std::size_t d = 1; d < st::max_rank; ++d) shape += ",1";
    shape += "]";
    std::string j = "{";
    std::size_t i = 0;
    for (; j.size() < target; ++i) j += (i ? "," : "") + entry_json("t" + std::to_string(i), "U8", shape, i, i + 1);
    cases.push_back({"tensors of the largest rank", j + "}", i, true});
  }
  {  // many __metadata__ keys
    std::string j = "{\"__metadata__\":{";
    for (std::size_t i = 0; j.size() < target; ++i) j += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"\"";
    cases.push_back({"many metadata keys", j + "}}", 0, true});
  }
  {  // one long metadata value, escapes included
    std::string v;
    while (v.size() < target) v += "abc\\u00e9\\ud83d\\ude00\\n";
    cases.push_back({"a long metadata value", "{\"__metadata__\":{\"k\":\"" + v + "\"}}", 0, true});
  }
  {  // names at the length limit
    std::string j = "{";
    for (std::size_t i = 0; j.size() < target; ++i) {
      std::string name = std::to_string(i);
      name += std::string(st::max_name_bytes - name.size(), 'n');
      j += (i ? "," : "") + entry_json(name, "U8", "[0]", 0, 0);
    }
    cases.push_back({"long names", j + "}", 0, true});
  }
  {  // an unknown member of a tensor entry: deep nesting, many keys
    std::string junk;
    for (std::size_t i = 0; junk.size() < target; ++i) {
      junk += (i ? ",\"" : "\"") + std::to_string(i) + "\":";
      junk += std::string(60, '[') + std::string(60, ']');
    }
    cases.push_back({"an unknown member, deep and wide",
                     "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"junk\":{" + junk + "}}}", 0, true});
  }
  {  // rejected at the very end: a duplicate name
    std::string j = "{";
    std::size_t i = 0;
    for (; j.size() < target; ++i) j += (i ? "," : "") + entry_json(std::to_string(i), "U8", "[0]", 0, 0);
    cases.push_back({"a duplicate after many tensors", j + "," + entry_json("0", "U8", "[0]", 0, 0) + "}", 0, false});
  }
  {  // bare commas: a prescan that trusted them would reserve 80 bytes per byte
    cases.push_back({"bare commas", "{\"a\":{}" + std::string(target, ',') + "}", 0, false});
    cases.push_back({"bare metadata commas", "{\"__metadata__\":{\"a\":\"\"" + std::string(target, ',') + "}}", 0, false});
  }
  for (const Case& c : cases) {
    INFO(c.what << ": header of " << c.json.size() << " bytes");
    const fs::path p = make_file(tmp, c.json, c.data_bytes, "hostile.safetensors");
    bool opened = false;
    const long long peak = peak_while_opening(p, opened);
    INFO("peak " << peak << " bytes = " << static_cast<double>(peak) / static_cast<double>(c.json.size())
                 << " x the header");
    CHECK(opened == c.valid);
    CHECK(peak <= static_cast<long long>(5 * c.json.size() + 256 * 1024));
  }

  {  // a header over the cap is refused before it is read
    const fs::path p = tmp / "huge.safetensors";
    write_file(p, le64(st::max_header_bytes + 1) + "{");
    fs::resize_file(p, 8 + st::max_header_bytes + 1);  // sparse: no 100 MB written
    bool opened = true;
    const long long peak = peak_while_opening(p, opened);
    CHECK_FALSE(opened);
    CHECK(peak < 256 * 1024);
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("header length 100000001 exceeds the limit of 100000000 bytes"));
  }
}

#endif  // HEADROOM_TEST_COUNTS_ALLOCATIONS

TEST_CASE("safetensors: names and metadata are UTF-8 without NUL, within 4096 bytes, errors give the offset",
          "[io][safetensors]") {
  TempDir tmp;
  const std::string file = "bad.safetensors";
  // `bad` (raw bytes or escapes) inside the name of tensor "a<bad>z"; the
  // error must name the file, the role and the offset of `bad`.
  auto rejects_name = [&](const std::string& bad, const std::string& why) {
    const std::string json = "{ " + entry_json("a" + bad + "z", "U8", "[0]", 0, 0) + "}";
    const std::string msg = open_error(make_file(tmp, json, 0, file));
    INFO("name a" << bad << "z: " << msg);
    CHECK_THAT(msg, Contains(file) && Contains("tensor name at byte " + offset_of(json, bad) + ": ") && Contains(why));
  };
  SECTION("each bad name is refused at the offset of its problem") {
  rejects_name("\xC0\xAF", "invalid UTF-8: overlong encoding");          // '/' in two bytes
  rejects_name("\xE0\x80\xAF", "invalid UTF-8: overlong encoding");      // '/' in three bytes
  rejects_name("\xF0\x80\x80\xAF", "invalid UTF-8: overlong encoding");  // '/' in four bytes
  rejects_name("\xED\xA0\x80", "encoded UTF-16 surrogate");              // U+D800 in UTF-8
  rejects_name("\xED\xBF\xBF", "encoded UTF-16 surrogate");              // U+DFFF
  rejects_name("\xF4\x90\x80\x80", "above U+10FFFF");
  rejects_name("\xF8\x88\x80\x80\x80", "above U+10FFFF");
  rejects_name("\x80", "continuation byte without a lead byte");
  rejects_name("\xE2\x82", "truncated sequence");
  rejects_name("\xFF", "above U+10FFFF");
  rejects_name(std::string(1, '\0'), "NUL byte");
  rejects_name("\\u0000", "NUL character (\\u0000)");
  rejects_name("\\ud800", "unpaired high surrogate");
  rejects_name("\\ud800\\u0041", "unpaired high surrogate");
  rejects_name("\\udc00", "unpaired low surrogate");
  rejects_name("\\u12x4", "bad \\u escape");
  }

  SECTION("escapes decode to UTF-8; valid multi-byte UTF-8 is kept") {
    const std::string json = "{" + entry_json("e\\u00e9 \\u20ac \\ud83d\\ude00 \xF0\x9F\x98\x80 \\/\\t", "U8", "[0]", 0, 0) +
                             ",\"__metadata__\":{\"k\\u00e9\":\"v\\ud834\\udd1e\"}}";
    const SafetensorsFile f(make_file(tmp, json, 0, file));
    REQUIRE(f.tensors().size() == 1);
    CHECK(f.tensors()[0].name == "e\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF0\x9F\x98\x80 /\t");
    CHECK(f.metadata().at("k\xC3\xA9") == "v\xF0\x9D\x84\x9E");
  }
  SECTION("a name of 4096 bytes is read, one of 4097 is refused at its first byte") {
    const std::string ok(4096, 'n');
    const SafetensorsFile f(make_file(tmp, "{" + entry_json(ok, "U8", "[0]", 0, 0) + "}", 0, file));
    CHECK(f.find(ok) != nullptr);
    const std::string json = "{" + entry_json(ok + "n", "U8", "[0]", 0, 0) + "}";
    CHECK_THAT(open_error(make_file(tmp, json, 0, file)),
               Contains(file) && Contains("tensor name at byte 9: longer than 4096 bytes"));
    // 2048 two-byte characters are 4096 bytes; escapes count as what they decode to.
    std::string e;
    for (int i = 0; i < 2048; ++i) e += "\\u00e9";
    CHECK(SafetensorsFile(make_file(tmp, "{" + entry_json(e, "U8", "[0]", 0, 0) + "}", 0, file)).tensors().size() == 1);
    CHECK_THAT(open_error(make_file(tmp, "{" + entry_json(e + "n", "U8", "[0]", 0, 0) + "}", 0, file)),
               Contains("longer than 4096 bytes"));
  }
  SECTION("__metadata__ keys and values follow the same rules") {
    auto rejects_meta = [&](const std::string& json, const std::string& bad, const std::string& what) {
      const std::string msg = open_error(make_file(tmp, json, 0, file));
      INFO(msg);
      CHECK_THAT(msg, Contains(file) && Contains(what + " at byte " + offset_of(json, bad) + ": "));
      return msg;
    };
    CHECK_THAT(rejects_meta("{\"__metadata__\":{\"k\xC0\x80\":\"v\"}}", "\xC0", "__metadata__ key"), Contains("overlong"));
    CHECK_THAT(rejects_meta("{\"__metadata__\":{\"k\":\"v\xED\xA0\x80\"}}", "\xED", "__metadata__ value"),
               Contains("surrogate"));
    CHECK_THAT(rejects_meta("{\"__metadata__\":{\"k\\u0000\":\"v\"}}", "\\u0000", "__metadata__ key"), Contains("NUL"));
    CHECK_THAT(rejects_meta("{\"__metadata__\":{\"k\":\"v\\u0000\"}}", "\\u0000", "__metadata__ value"), Contains("NUL"));
    const std::string long_key = "{\"__metadata__\":{\"" + std::string(4097, 'k') + "\":\"v\"}}";
    CHECK_THAT(rejects_meta(long_key, "\"kkk", "__metadata__ key"), Contains("longer than 4096 bytes"));
    // Values may be long: trainers keep whole JSON configurations there.
    const std::string long_value(100'000, 'v');
    const SafetensorsFile f(make_file(tmp, "{\"__metadata__\":{\"k\":\"" + long_value + "\"}}", 0, file));
    CHECK(f.metadata().at("k") == long_value);
  }
  SECTION("invalid UTF-8 anywhere in the header is refused, ignored members included") {
    const std::string json =
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"note\":[\"ok\",\"\xC1\xBF\"]}}";
    CHECK_THAT(open_error(make_file(tmp, json, 0, file)),
               Contains("string at byte " + offset_of(json, "\xC1") + ": invalid UTF-8: overlong encoding"));
    const std::string outside = "{\"x\":\xC3\xA9}";
    CHECK_THAT(open_error(make_file(tmp, outside, 0, file)),
               Contains("invalid JSON header at byte 13: unexpected character byte 0xC3"));
  }
}

TEST_CASE("safetensors: duplicate keys name both offsets", "[io][safetensors]") {
  TempDir tmp;
  const std::string file = "dup.safetensors";
  auto message = [&](const std::string& json, std::size_t data = 0) { return open_error(make_file(tmp, json, data, file)); };
  {
    const std::string json = "{" + entry_json("w", "F32", "[1]", 0, 4) + ", " + entry_json("v", "F32", "[1]", 4, 8) +
                             ", " + entry_json("w", "F32", "[1]", 8, 12) + "}";
    CHECK_THAT(message(json, 12), Contains(file) && Contains("duplicate key 'w' at bytes " + offset_of(json, "\"w\"") +
                                                             " and " + offset_of(json, "\"w\"", 10) +
                                                             ": two tensors with one name"));
  }
  {
    const std::string json = "{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"a\":\"3\"}}";
    CHECK_THAT(message(json), Contains("in \"__metadata__\": duplicate key 'a' at bytes " + offset_of(json, "\"a\"") +
                                       " and " + offset_of(json, "\"a\":\"3")));
    // Empty keys with empty values take no room once decoded: still told apart.
    const std::string empty = "{\"__metadata__\":{\"\":\"\", \"\":\"\"}}";
    CHECK_THAT(message(empty), Contains("duplicate key '' at bytes 25 and 32"));
  }
  {
    const std::string json = "{\"__metadata__\":{},\"__metadata__\":{}}";
    CHECK_THAT(message(json), Contains("duplicate key '__metadata__' at bytes 9 and 27"));
  }
  {
    const std::string json = "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"dtype\":\"U8\",\"data_offsets\":[0,0]}}";
    CHECK_THAT(message(json), Contains("tensor 'x': duplicate key 'dtype' at bytes " + offset_of(json, "\"dtype\"") +
                                       " and " + offset_of(json, "\"dtype\"", 10)));
  }
  {
    const std::string json =
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"n\":{\"p\":1,\"q\":{\"p\":2},\"p\":3}}}";
    CHECK_THAT(message(json), Contains("duplicate key 'p' at bytes " + offset_of(json, "\"p\"") + " and " +
                                       offset_of(json, "\"p\":3")));
    const std::string unknown = "{\"x\":{\"u\":1,\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"u\":2}}";
    CHECK_THAT(message(unknown), Contains("tensor 'x': duplicate key 'u' at bytes " + offset_of(unknown, "\"u\"") + " and " +
                                          offset_of(unknown, "\"u\":2")));
  }
}

TEST_CASE("safetensors: a directory, a shape beyond 64 dimensions", "[io][safetensors]") {
  TempDir tmp;
  fs::create_directories(tmp / "model.safetensors");
  CHECK_THROWS_WITH(SafetensorsFile(tmp / "model.safetensors"),
                    Contains("model.safetensors: is a directory, not a safetensors file"));

  std::string shape64 = "[1", shape65;
  for (int d = 1; d < 64; ++d) shape64 += ",1";
  shape65 = shape64 + ",1]";
  shape64 += "]";
  const SafetensorsFile f(make_file(tmp, "{" + entry_json("x", "U8", shape64, 0, 1) + "}", 1));
  CHECK(f.tensors()[0].shape == std::vector<std::int64_t>(64, 1));
  CHECK_THAT(open_error(make_file(tmp, "{" + entry_json("x", "U8", shape65, 0, 1) + "}", 1)),
             Contains("tensor 'x': shape has more than 64 dimensions"));
}

TEST_CASE("safetensors: metadata lookups and iteration", "[io][safetensors]") {
  TempDir tmp;
  const SafetensorsFile f(make_file(tmp, "{\"__metadata__\":{\"b\":\"2\",\"a\":\"1\",\"c\":\"\"}}", 0));
  const auto& m = f.metadata();
  CHECK(m.size() == 3);
  CHECK(m.at("a") == "1");
  CHECK(m.get("c") == std::optional<std::string_view>(""));
  CHECK_FALSE(m.get("d"));
  CHECK_FALSE(m.contains("d"));
  CHECK_THROWS_AS(m.at("d"), std::out_of_range);
  std::string keys;
  for (const auto& [k, v] : m) keys += std::string(k) + "=" + std::string(v) + ";";
  CHECK(keys == "a=1;b=2;c=;");
}

TEST_CASE("detail::json: duplicate keys name both offsets, numbers stay within a double, UTF-8 is checked",
          "[io][json]") {
  namespace js = headroom::io::detail::json;
  CHECK_THROWS_AS(js::parse("{\"a\":1,\"b\":2,\"a\":3}"), js::parse_error);
  CHECK_THROWS_WITH(js::parse("{\"a\":1,\"b\":2,\"a\":3}"), Contains("invalid JSON at byte 13: duplicate key 'a' (first at byte 1)"));
  CHECK_THROWS_WITH(js::parse("{\"x\":1e999}"), Contains("number out of the range of a double"));
  CHECK_THROWS_WITH(js::parse("[-1e400]"), Contains("number out of the range of a double"));
  CHECK(js::parse("[1e308, 5e-324, 0.1]").items[1].number == 5e-324);
  CHECK_THROWS_WITH(js::parse("\"\xC0\xAF\""), Contains("invalid JSON at byte 1: invalid UTF-8: overlong encoding"));
  CHECK_THROWS_WITH(js::parse("\"\\udc00\""), Contains("unpaired low surrogate"));
  CHECK(js::parse("\"\\ud83d\\ude00\"").string == "\xF0\x9F\x98\x80");
  // Many keys: sorted once, not compared pairwise.
  std::string big = "{";
  for (int i = 0; i < 50'000; ++i) big += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  CHECK(js::parse(big + "}").keys.size() == 50'000);
}

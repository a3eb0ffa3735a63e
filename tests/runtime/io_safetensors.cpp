// The safetensors reader/writer: round trips, header alignment, a hand-made
// file read byte for byte, every header rejection (with its message), expect()
// messages, and the atomic write.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/io/safetensors.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

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
  CHECK_FALSE(fs::exists(p.string() + ".tmp"));

  const SafetensorsFile f(p);
  CHECK(f.metadata() == meta);
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
    rejects(make_file(tmp, "{\"a\":{},}", 0), "expected a string key");
    rejects(make_file(tmp, "{\"a\\q\":1}", 0), "bad escape");
    rejects(make_file(tmp, "{\"a\\ud800\":1}", 0), "unpaired high surrogate");
    rejects(make_file(tmp, "{\"a\nb\":1}", 0), "control character");
    rejects(make_file(tmp, std::string(100, '[') + std::string(100, ']'), 0), "nesting too deep");
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
            "duplicate key \"a\"");
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
  const fs::path tmp_file = p.string() + ".tmp";
  const std::vector<float> a = {1.f, 2.f};
  write_safetensors(p, {{"a", DType::F32, {2}, a.data()}}, {{"v", "1"}});
  CHECK_FALSE(fs::exists(tmp_file));
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
  }
  CHECK_FALSE(fs::exists(tmp_file));
  CHECK(read_bytes(p) == before);
  const SafetensorsFile f(p);
  CHECK(f.metadata().at("v") == "1");
  CHECK(read_tensor<float>(f, "a") == a);

  // A directory that does not exist: nothing is created anywhere.
  const fs::path nowhere = tmp / "missing_dir" / "x.safetensors";
  CHECK_THROWS_WITH(write_safetensors(nowhere, {{"a", DType::F32, {2}, a.data()}}),
                    Contains("cannot create temporary file"));
  CHECK_FALSE(fs::exists(nowhere));
}

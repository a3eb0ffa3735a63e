// libFuzzer target: SafetensorsFile on arbitrary bytes.
//
// The bytes are opened twice: as a whole file, and as the JSON header of a
// file with an empty data buffer (its length prefix made to fit, so mutations
// of the JSON text reach the parser without having to keep a binary length
// right). Each is written to a per-process scratch file and opened. A file that
// is refused must be refused with io::format_error (anything else escapes and
// fails the run); a file that opens must keep every promise the reader makes:
//   - tensors() is in data order and covers the data buffer exactly;
//   - each tensor's byte size is product(shape) * size_of(dtype), its rank at
//     most max_rank;
//   - names are unique, UTF-8, free of NUL and at most max_name_bytes long, and
//     find / expect return that very tensor;
//   - read() gives the file's bytes, read_converted the same values;
//   - metadata keys are unique and in order, keys and values UTF-8 without
//     NUL, keys within max_name_bytes, and get() finds each one.
#include <headroom/io/safetensors.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace io = headroom::io;
namespace st = headroom::io::detail::safetensors;

[[noreturn]] void broken(const char* what, int line) {
  std::fprintf(stderr, "fuzz safetensors: a promise of the reader is broken (line %d): %s\n", line, what);
  std::abort();
}
#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) broken(#cond, __LINE__); \
  } while (0)

const std::filesystem::path& scratch() {
  static const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("headroom_fuzz_safetensors_" + std::to_string(::getpid()));
  return p;
}

bool utf8_without_nul(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '\0') return false;
    const char* why = nullptr;
    const std::size_t n = io::detail::utf8_sequence(s.substr(i), why);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void check(const io::SafetensorsFile& f, const std::uint8_t* data, std::size_t size) {
  FUZZ_CHECK(size >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  FUZZ_CHECK(n <= st::max_header_bytes && n <= size - 8);
  const std::uint8_t* buffer = data + 8 + n;
  const std::uint64_t buffer_size = size - 8 - n;

  std::uint64_t cursor = 0;
  std::vector<std::string_view> names;
  for (const io::TensorInfo& t : f.tensors()) {
    FUZZ_CHECK(t.begin == cursor);
    FUZZ_CHECK(t.end >= t.begin && t.end <= buffer_size);
    cursor = t.end;
    FUZZ_CHECK(t.shape.size() <= st::max_rank);
    std::uint64_t elements = 1;
    for (std::int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0);
      const auto e = st::mul(elements, static_cast<std::uint64_t>(d));
      FUZZ_CHECK(e.has_value());
      elements = *e;
    }
    FUZZ_CHECK(st::mul(elements, headroom::size_of(t.dtype)) == t.end - t.begin);
    FUZZ_CHECK(t.name.size() <= st::max_name_bytes && utf8_without_nul(t.name) && t.name != "__metadata__");
    FUZZ_CHECK(f.find(t.name) == &t);
    FUZZ_CHECK(&f.expect(t.name, t.dtype, t.shape) == &t);
    names.push_back(t.name);

    std::vector<unsigned char> bytes(static_cast<std::size_t>(t.end - t.begin));
    f.read(t.name, bytes.data(), bytes.size());
    FUZZ_CHECK(bytes.empty() || std::memcmp(bytes.data(), buffer + t.begin, bytes.size()) == 0);
    if (io::is_float(t.dtype)) {
      std::vector<double> wide(static_cast<std::size_t>(elements));
      io::read_converted(f, t, std::span<double>(wide));
      if (t.dtype == headroom::DType::F64 && !bytes.empty())
        FUZZ_CHECK(std::memcmp(wide.data(), bytes.data(), bytes.size()) == 0);
      if (t.dtype == headroom::DType::F32) {
        std::vector<float> narrow(static_cast<std::size_t>(elements));
        io::read_converted(f, t, std::span<float>(narrow));
        FUZZ_CHECK(bytes.empty() || std::memcmp(narrow.data(), bytes.data(), bytes.size()) == 0);
      }
    }
  }
  FUZZ_CHECK(cursor == buffer_size);
  std::sort(names.begin(), names.end());
  FUZZ_CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  if (!std::binary_search(names.begin(), names.end(), std::string_view("absent\x01"))) {
    FUZZ_CHECK(f.find("absent\x01") == nullptr);
    try {
      f.expect("absent\x01", headroom::DType::U8, {});
      broken("expect() of a missing tensor returned", __LINE__);
    } catch (const io::format_error&) {
    }
  }

  std::optional<std::string_view> previous;
  std::size_t count = 0;
  for (const auto& [key, value] : f.metadata()) {
    FUZZ_CHECK(!previous || *previous < key);
    previous = key;
    FUZZ_CHECK(key.size() <= st::max_name_bytes && utf8_without_nul(key) && utf8_without_nul(value));
    FUZZ_CHECK(f.metadata().get(key) == value);
    ++count;
  }
  FUZZ_CHECK(count == f.metadata().size());
}

}  // namespace

namespace {

void open_and_check(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(scratch(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) broken("cannot write the scratch file", __LINE__);
  }
  std::optional<io::SafetensorsFile> f;
  try {
    f.emplace(scratch());
  } catch (const io::format_error&) {
    return;  // refused, as it should be, with a message
  }
  check(*f, data, size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  open_and_check(data, size);
  std::vector<std::uint8_t> file(8 + size);
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(std::uint64_t{size} >> (8 * i));
  if (size > 0) std::memcpy(file.data() + 8, data, size);
  open_and_check(file.data(), file.size());
  return 0;
}

#pragma once
// Token files and the training data set built on one, on the host.
//
// A token file ("HRTOK1") holds one tokenized corpus:
//   [0, 8)     magic "HRTOK1\0\0"
//   [8, 12)    u32 element size in bytes: 2 when vocab_size <= 65536, else 4
//   [12, 16)   u32 vocab_size: every id lies in [0, vocab_size)
//   [16, 24)   u64 count: the number of tokens
//   [24, ...)  count ids, each an unsigned little-endian integer of the element size
// All fields little-endian. The data starts at byte 24, so it is aligned for
// either element size in a mapped file. write_tokens goes through
// io::replace_file (io/durable.hpp): it replaces only a missing path or a token
// file (one that starts with the magic), writes a new temporary file of its
// own beside it, fsyncs it, renames it over `path` and fsyncs the directory:
// an interrupted write never leaves a broken file, and a finished one
// survives a power cut.
//
// TokenFile maps a token file read-only (mmap) and checks its header.
// TokenDataset splits one into a training part (the head) and a validation
// part (the tail, contiguous), draws training batches at random offsets from a
// seeded generator, walks the validation part in fixed windows, and gives the
// unigram baseline a model has to beat.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "durable.hpp"
#include "tokenizer.hpp"

namespace headroom::io {

namespace detail::tokens {

inline constexpr char magic[8] = {'H', 'R', 'T', 'O', 'K', '1', '\0', '\0'};
inline constexpr std::size_t header_bytes = 24;

inline std::uint32_t element_size_for(std::uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

inline void put_le(char* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
inline std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Whether the file at `path` starts with the token file magic: the only kind
// of file write_tokens replaces.
inline bool is_token_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in.read(head, 8) && std::memcmp(head, magic, 8) == 0;
}

}  // namespace detail::tokens

// Writes `ids` as a token file at `path` (atomically and durably, see above).
// Every id must lie in [0, vocab_size); vocab_size in [1, 2^32). Throws
// data_error naming the file on a bad id or a failed write, overwrite_refused
// (touching nothing) when `path` is a directory or a file other than a token
// file, and std::system_error when an fsync fails.
inline void write_tokens(const std::filesystem::path& path, std::span<const std::int32_t> ids,
                         std::uint64_t vocab_size) {
  namespace t = detail::tokens;
  const auto fail = [&](const std::string& what) { throw data_error("tokens: " + path.string() + ": " + what); };
  if (vocab_size == 0 || vocab_size > 0xFFFFFFFFull) fail("vocab size " + std::to_string(vocab_size) + " out of range");
  const std::uint32_t esize = t::element_size_for(vocab_size);
  std::vector<char> bytes(t::header_bytes + ids.size() * esize);  // header + (count,) ids
  std::memcpy(bytes.data(), t::magic, 8);
  t::put_le(bytes.data() + 8, esize, 4);
  t::put_le(bytes.data() + 12, vocab_size, 4);
  t::put_le(bytes.data() + 16, ids.size(), 8);
  char* out = bytes.data() + t::header_bytes;
  for (std::size_t i = 0; i < ids.size(); ++i, out += esize) {
    if (ids[i] < 0 || static_cast<std::uint64_t>(ids[i]) >= vocab_size)
      fail("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
           " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    t::put_le(out, static_cast<std::uint64_t>(ids[i]), static_cast<int>(esize));
  }
  replace_file(
      path, "write_tokens", "headroom token file (\"HRTOK1\")", t::is_token_file,
      [&](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); },
      [&](const std::string& what) { fail(what); });
}

// A token file mapped read-only. Move-only; unmaps on destruction.
class TokenFile {
 public:
  // Maps and validates `path`; throws data_error naming the file when it is
  // missing, a directory or not a regular file, shorter than the header, has a bad magic or element size, or its
  // size disagrees with the header's count. Ids are not range-checked here
  // (TokenDataset checks them while counting).
  explicit TokenFile(const std::filesystem::path& path) : path_(path) {
    namespace t = detail::tokens;
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("cannot open: " + std::system_category().message(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail("cannot stat: " + std::system_category().message(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(S_ISDIR(st.st_mode) ? "is a directory, not a token file" : "is not a regular file");
    }
    bytes_ = static_cast<std::size_t>(st.st_size);
    if (bytes_ < t::header_bytes) {
      ::close(fd);
      fail(bytes_ == 0 ? std::string("the file is empty; expected a 24-byte header")
                       : "truncated: " + std::to_string(bytes_) + " bytes, shorter than the 24-byte header");
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file open
    if (p == MAP_FAILED) fail("mmap failed: " + std::system_category().message(err));
    base_ = static_cast<const unsigned char*>(p);
    try {
      validate();
    } catch (...) {
      unmap();
      throw;
    }
  }

  TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }
  TokenFile& operator=(TokenFile&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      count_ = std::exchange(o.count_, 0);
      esize_ = o.esize_;
      vocab_ = o.vocab_;
    }
    return *this;
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile() { unmap(); }

  std::size_t size() const { return count_; }
  std::uint32_t element_size() const { return esize_; }  // 2 or 4
  std::uint32_t vocab_size() const { return vocab_; }
  const std::filesystem::path& path() const { return path_; }

  // Token i (i < size()), read as little-endian whatever the host.
  std::int32_t operator[](std::size_t i) const {
    return static_cast<std::int32_t>(detail::tokens::get_le(data() + i * esize_, static_cast<int>(esize_)));
  }

  // Copies tokens [first, first + n) into out (n ints); first + n <= size().
  void copy(std::size_t first, std::size_t n, std::int32_t* out) const {
    const unsigned char* p = data() + first * esize_;
    if (esize_ == 2)
      for (std::size_t k = 0; k < n; ++k, p += 2) out[k] = static_cast<std::int32_t>(p[0] | (p[1] << 8));
    else
      for (std::size_t k = 0; k < n; ++k, p += 4)
        out[k] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
                                           (static_cast<std::uint32_t>(p[2]) << 16) |
                                           (static_cast<std::uint32_t>(p[3]) << 24));
  }

  // The raw ids as stored: size() * element_size() little-endian bytes.
  std::span<const std::byte> raw() const {
    return {reinterpret_cast<const std::byte*>(data()), count_ * esize_};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw data_error("tokens: " + path_.string() + ": " + what);
  }
  const unsigned char* data() const { return base_ + detail::tokens::header_bytes; }

  void validate() {
    namespace t = detail::tokens;
    if (std::memcmp(base_, t::magic, 8) != 0) fail("not a headroom token file (bad magic; expected \"HRTOK1\")");
    esize_ = static_cast<std::uint32_t>(t::get_le(base_ + 8, 4));
    vocab_ = static_cast<std::uint32_t>(t::get_le(base_ + 12, 4));
    const std::uint64_t count = t::get_le(base_ + 16, 8);
    if (esize_ != 2 && esize_ != 4) fail("element size " + std::to_string(esize_) + " in the header; must be 2 or 4");
    if (vocab_ == 0) fail("vocab size 0 in the header");
    if (esize_ == 2 && vocab_ > 65536)
      fail("vocab size " + std::to_string(vocab_) + " does not fit the header's 2-byte elements");
    const std::uint64_t data_bytes = bytes_ - t::header_bytes;
    const bool truncated = count > data_bytes / esize_;
    if (truncated || count * esize_ != data_bytes) {
      const bool fits = count <= (UINT64_MAX - t::header_bytes) / esize_;  // the size needed fits a u64
      fail(std::string(truncated ? "truncated" : "trailing bytes") + ": the header says " + std::to_string(count) +
           " tokens of " + std::to_string(esize_) + " bytes, which needs " +
           (fits ? std::to_string(t::header_bytes + count * esize_) : std::string("over 2^64")) +
           " bytes with the header; the file has " + std::to_string(bytes_) + " bytes");
    }
    count_ = static_cast<std::size_t>(count);
  }

  void unmap() {
    if (base_) ::munmap(const_cast<unsigned char*>(base_), bytes_);
    base_ = nullptr;
  }

  std::filesystem::path path_;
  const unsigned char* base_ = nullptr;  // the whole mapped file, header included
  std::size_t bytes_ = 0;
  std::size_t count_ = 0;
  std::uint32_t esize_ = 0;
  std::uint32_t vocab_ = 0;
};

// A tokenized corpus split into training and validation parts.
//
//   tokens [0, train_size())                     training: random windows
//   tokens [train_size(), size())                validation: fixed windows, the tail
//
// validation_size() = floor(fraction * size()). A window of T inputs covers
// T + 1 consecutive tokens: inputs are the first T, targets the last T (the
// next token of each input).
class TokenDataset {
 public:
  // The generator's seed when none is given.
  static constexpr std::uint64_t default_seed = 1234;

  // Throws data_error (naming the file) for an empty file, a fraction outside
  // (0, 1), a split that comes out empty, or an id outside the header's vocabulary.
  TokenDataset(TokenFile file, double validation_fraction, std::uint64_t seed = default_seed)
      : file_(std::move(file)), rng_(seed) {
    const std::size_t n = file_.size();
    if (n == 0) fail("the data set is empty (0 tokens)");
    if (!(validation_fraction > 0.0 && validation_fraction < 1.0))
      fail("validation fraction " + std::to_string(validation_fraction) + " must lie in (0, 1)");
    const auto val = static_cast<std::size_t>(std::floor(validation_fraction * static_cast<double>(n)));
    if (val == 0 || val == n)
      fail("a validation fraction of " + std::to_string(validation_fraction) + " of " + std::to_string(n) +
           " tokens leaves " + (val == 0 ? "the validation" : "the training") + " split empty");
    train_ = n - val;
    unigram_loss_ = compute_unigram_loss();
  }

  // Tokenizes the text file `text` with `tok` and caches the ids as a token
  // file `<text file name>.<tok.name()>.tok`, next to the text or in `cache_dir`.
  // A cache newer than the text and made with the same vocabulary size is
  // reused; a broken token file there is rebuilt, anything else there is
  // refused (overwrite_refused, see write_tokens). A missing text file:
  // data_error telling the user to run scripts/fetch-corpus; a directory: a
  // data_error that says so.
  template <Tokenizer Tok>
  static TokenDataset from_text(const std::filesystem::path& text, const Tok& tok, double validation_fraction,
                                std::uint64_t seed = default_seed, const std::filesystem::path& cache_dir = {}) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(text, ec);
    if (fs::is_directory(st)) throw data_error("corpus: " + text.string() + " is a directory, not a text file");
    if (!fs::exists(st))
      throw data_error("corpus: " + text.string() +
                       ": file not found; run scripts/fetch-corpus to download the corpora (into data/corpus)");
    if (!fs::is_regular_file(st)) throw data_error("corpus: " + text.string() + " is not a regular file");
    const std::string cache_name = text.filename().string() + "." + std::string(tok.name()) + ".tok";
    const fs::path cache = cache_dir.empty() ? fs::path(text).replace_filename(cache_name) : cache_dir / cache_name;
    if (fs::exists(cache, ec) && fs::last_write_time(cache, ec) >= fs::last_write_time(text, ec) && !ec) {
      try {
        TokenFile f(cache);
        if (f.vocab_size() == tok.vocab_size()) return TokenDataset(std::move(f), validation_fraction, seed);
      } catch (const data_error&) {
        // a broken cache is rebuilt below
      }
    }
    std::ifstream in(text, std::ios::binary);
    if (!in) throw data_error("corpus: " + text.string() + ": cannot open the file");
    const std::string content{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!cache_dir.empty()) fs::create_directories(cache_dir);
    write_tokens(cache, tok.encode(content), tok.vocab_size());
    return TokenDataset(TokenFile(cache), validation_fraction, seed);
  }

  std::size_t size() const { return file_.size(); }
  std::size_t train_size() const { return train_; }
  std::size_t validation_size() const { return file_.size() - train_; }
  std::size_t vocab_size() const { return file_.vocab_size(); }
  const TokenFile& file() const { return file_; }

  // Restarts the training batches' generator.
  void reseed(std::uint64_t seed) { rng_.seed(seed); }

  // Fills B training sequences of T tokens, each from a random offset in the
  // training split (uniform over the train_size() - T possible windows):
  //   tokens   (B, T) row-major: tokens[b*T + t]  = token[o_b + t]
  //   targets  (B, T) row-major: targets[b*T + t] = token[o_b + t + 1]
  // Deterministic for a seed: the offsets are drawn from std::mt19937_64
  // (whose output the standard fixes) by unbiased rejection, not by
  // std::uniform_int_distribution (whose output it does not). Allocates nothing.
  void next_batch(std::int32_t* tokens, std::int32_t* targets, std::size_t B, std::size_t T) {
    check_shape(B, T, "next_batch");
    if (train_ < T + 1)
      fail("the training split has " + std::to_string(train_) + " tokens, too few for one sequence of T + 1 = " +
           std::to_string(T + 1) + " tokens");
    const std::uint64_t windows = train_ - T;  // offsets 0 .. train_ - T - 1
    for (std::size_t b = 0; b < B; ++b) {
      const auto o = static_cast<std::size_t>(uniform_below(windows));
      file_.copy(o, T, tokens + b * T);
      file_.copy(o + 1, T, targets + b * T);
    }
  }

  // The validation split cut into consecutive windows of T + 1 tokens that
  // share only their boundary token (window w starts at train_size() + w*T), so
  // every validation token after the first is a target exactly once; grouped B
  // windows to a batch. Only whole batches: up to B*T - 1 trailing tokens go unused.
  class ValidationBatches {
   public:
    std::size_t size() const { return batches_; }
    // Fills batch i (i < size()) into tokens and targets, (B, T) each, as next_batch does.
    void fill(std::size_t i, std::int32_t* tokens, std::int32_t* targets) const {
      if (i >= batches_)
        throw data_error("tokens: " + ds_->file_.path().string() + ": validation batch " + std::to_string(i) +
                         " of " + std::to_string(batches_));
      for (std::size_t b = 0; b < B_; ++b) {
        const std::size_t o = ds_->train_ + (i * B_ + b) * T_;
        ds_->file_.copy(o, T_, tokens + b * T_);
        ds_->file_.copy(o + 1, T_, targets + b * T_);
      }
    }
    std::size_t batch() const { return B_; }
    std::size_t seq() const { return T_; }

   private:
    friend class TokenDataset;
    ValidationBatches(const TokenDataset* ds, std::size_t B, std::size_t T, std::size_t batches)
        : ds_(ds), B_(B), T_(T), batches_(batches) {}
    const TokenDataset* ds_;
    std::size_t B_, T_, batches_;
  };

  // Throws data_error when the validation split holds fewer than B windows.
  // The view refers to this data set: keep it alive, and do not move it, meanwhile.
  ValidationBatches validation_batches(std::size_t B, std::size_t T) const {
    check_shape(B, T, "validation_batches");
    const std::size_t val = validation_size();
    const std::size_t windows = val > T ? (val - 1) / T : 0;
    if (windows < B)
      fail("the validation split has " + std::to_string(val) + " tokens: " + std::to_string(windows) +
           " windows of T + 1 = " + std::to_string(T + 1) + " tokens, fewer than one batch of B = " +
           std::to_string(B) + "; lower B or T, or raise the validation fraction");
    return ValidationBatches(this, B, T, windows / B);
  }

  // The unigram baseline, in nats per token: the cross-entropy on the
  // validation split of the training split's token frequencies with add-one
  // smoothing over the vocabulary V (the file's vocab size):
  //   p(v) = (count_train(v) + 1) / (train_size() + V)
  //   loss = -(1 / validation_size()) * sum over validation tokens x of ln p(x)
  // A model that learned nothing but the token frequencies gets about this;
  // one that uses context must get below it.
  double unigram_loss() const { return unigram_loss_; }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw data_error("tokens: " + file_.path().string() + ": " + what);
  }
  void check_shape(std::size_t B, std::size_t T, std::string_view who) const {
    if (B == 0 || T == 0)
      fail(std::string(who) + ": B = " + std::to_string(B) + " and T = " + std::to_string(T) + " must be positive");
  }

  // Uniform in [0, n), n > 0: reject the 2^64 mod n lowest outputs, so the
  // accepted ones cover a whole number of copies of [0, n).
  std::uint64_t uniform_below(std::uint64_t n) {
    const std::uint64_t reject_below = (0 - n) % n;  // = 2^64 mod n
    std::uint64_t x;
    do x = rng_();
    while (x < reject_below);
    return x % n;
  }

  // The counts behind unigram_loss(). What they take is bounded by the file,
  // never by the header's vocab size alone (a 200-byte file may claim 2^32 - 1
  // ids): a dense table of V counts when V is at most the file's token count
  // plus 65,536, else a sorted copy of the training ids (4 bytes a token),
  // where a validation token's count is the length of its run.
  double compute_unigram_loss() const {
    const std::size_t V = file_.vocab_size(), n = file_.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::int32_t id = file_[i];
      if (id < 0 || static_cast<std::size_t>(id) >= V)
        fail("token id " + std::to_string(id) + " at position " + std::to_string(i) +
             " is outside the vocabulary [0, " + std::to_string(V) + ") of the header");
    }
    const double log_denominator = std::log(static_cast<double>(train_) + static_cast<double>(V));
    double sum = 0;
    auto add = [&](std::uint64_t count) { sum += std::log(static_cast<double>(count + 1)) - log_denominator; };
    if (V <= n + 65536) {
      std::vector<std::uint64_t> counts(V, 0);  // (V)
      for (std::size_t i = 0; i < train_; ++i) ++counts[static_cast<std::size_t>(file_[i])];
      for (std::size_t i = train_; i < n; ++i) add(counts[static_cast<std::size_t>(file_[i])]);
    } else {
      std::vector<std::int32_t> train(train_);  // (train_size()) sorted
      file_.copy(0, train_, train.data());
      std::sort(train.begin(), train.end());
      for (std::size_t i = train_; i < n; ++i) {
        const auto [first, last] = std::equal_range(train.begin(), train.end(), file_[i]);
        add(static_cast<std::uint64_t>(last - first));
      }
    }
    return -sum / static_cast<double>(validation_size());
  }

  TokenFile file_;
  std::size_t train_ = 0;  // tokens in the training split
  std::mt19937_64 rng_;
  double unigram_loss_ = 0;
};

}  // namespace headroom::io

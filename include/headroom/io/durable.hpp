#pragma once
// Durable, atomic writes, and the rule for what a writer may replace.
//
// Every io/ writer that puts a file at a path (write_safetensors behind
// save_pretrained / save_merged / export_adapter, adapter_config.json, token
// files) goes through replace_file:
//
//   1. the target must be missing or a file of the writer's own kind (a
//      safetensors file, a token file, ...); anything else, a directory
//      included, is refused with overwrite_refused and nothing is touched;
//   2. the bytes go to a new temporary file beside it (same directory, so the
//      same file system), "<path>.headroom-tmp-<12 random characters>",
//      created by this write alone (O_CREAT | O_EXCL | O_NOFOLLOW, another name
//      drawn while one exists), which is flushed and fsync'ed;
//   3. the temporary is renamed over the path and the directory is fsync'ed.
//
// So when replace_file returns, the new file survives a power cut; until the
// rename, the old file is there, intact. Nothing else beside the target is
// opened, written or removed: a file or a link of the user's named
// "<path>.tmp" (or anything that is not this writer's temporary) is left as
// it was, and a write never follows a link to put its bytes elsewhere.
//
// What a killed writer leaves behind: at most its temporary. The next write
// of the same target removes such leftovers: entries of its directory named
// exactly "<file name>.headroom-tmp-" and 12 characters of [a-z0-9], that are
// regular files (not links) owned by this user and that no writer holds: a
// writer keeps an exclusive flock on its temporary until it is renamed, so
// a writer at work in another process keeps its file (the lock goes with the
// process that dies). save_checkpoint follows the same rules for directories
// (only a missing path, an empty directory or a headroom checkpoint is
// replaced; its staging directory is its own new one) (io/checkpoint.hpp).
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <random>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace headroom::io {

// A writer was asked to replace something that is not of its own kind (a
// directory, or a file it did not write): nothing was touched.
struct overwrite_refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Flushes a file's or a directory's contents to the disk (fsync); throws
// std::system_error on failure. A no-op where POSIX is unavailable.
inline void sync_path(const std::filesystem::path& path) {
#if defined(__unix__) || defined(__APPLE__)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + path.string() + " to fsync it");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::system_error(err, std::generic_category(), "fsync of " + path.string() + " failed");
#else
  (void)path;
#endif
}

// ": " and the system's reason for the last failed call (errno: "No space
// left on device"), or nothing when it set none.
inline std::string system_reason() {
  const int err = errno;
  return err != 0 ? ": " + std::string(std::strerror(err)) : std::string();
}

// The directory that holds `path` ("." for a bare name).
inline std::filesystem::path parent_dir(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

namespace detail::durable {

// What follows a writer's own names: "<name><marker><random>".
inline constexpr std::string_view temporary_marker = ".headroom-tmp-";
inline constexpr std::string_view random_alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
inline constexpr std::size_t random_length = 12;  // 36^12: about 62 bits
// How many names a writer draws before it gives up (each taken by another file).
inline constexpr int name_attempts = 64;

// 12 characters of [a-z0-9] from std::random_device: a name no other
// program can predict (as mkstemp's XXXXXX).
inline std::string random_suffix() {
  std::random_device device;
  std::uniform_int_distribution<std::size_t> pick(0, random_alphabet.size() - 1);
  std::string s(random_length, '0');
  for (char& c : s) c = random_alphabet[pick(device)];
  return s;
}

// Whether `name` is `stem` + `marker` + random_suffix()'s shape: the names a
// writer gives what it creates beside `stem`.
inline bool is_own_name(std::string_view name, std::string_view stem, std::string_view marker) {
  if (name.size() != stem.size() + marker.size() + random_length) return false;
  if (name.substr(0, stem.size()) != stem || name.substr(stem.size(), marker.size()) != marker) return false;
  for (const char c : name.substr(stem.size() + marker.size()))
    if (random_alphabet.find(c) == std::string_view::npos) return false;
  return true;
}

// A new directory "<path><marker><random>" beside `path`, created by this
// call (mkdir, which fails on any existing name: another name is drawn).
// Throws std::system_error, naming the directory and the system's reason.
inline std::filesystem::path create_own_directory(const std::filesystem::path& path, std::string_view marker) {
  const std::filesystem::path parent = parent_dir(path);
  const std::string stem = path.filename().string() + std::string(marker);
  for (int attempt = 1;; ++attempt) {
    const std::filesystem::path p = parent / (stem + random_suffix());
#if defined(__unix__) || defined(__APPLE__)
    if (::mkdir(p.c_str(), 0777) == 0) return p;
    const int err = errno;
#else
    std::error_code ec;
    if (std::filesystem::create_directory(p, ec)) return p;
    const int err = ec ? ec.value() : EEXIST;
#endif
    if (err != EEXIST || attempt == name_attempts)
      throw std::system_error(err, std::generic_category(), "cannot create the directory " + p.string());
  }
}

#if defined(__unix__) || defined(__APPLE__)
// An ostream's buffer over a descriptor: large writes go straight to
// write(2); the first error sticks (error(), and errno after each failed
// call) and fails every later write.
class DescriptorBuffer : public std::streambuf {
 public:
  explicit DescriptorBuffer(int fd) : fd_(fd), buffer_(std::size_t{1} << 16) { empty(); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n <= epptr() - pptr()) {
      std::memcpy(pptr(), s, static_cast<std::size_t>(n));
      pbump(static_cast<int>(n));
      return n;
    }
    return drain() && put(s, static_cast<std::size_t>(n)) ? n : 0;
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  void empty() { setp(buffer_.data(), buffer_.data() + buffer_.size()); }
  // Writes all of [s, s + n) unless an error stops it.
  bool put(const char* s, std::size_t n) {
    while (n > 0 && error_ == 0) {
      const ::ssize_t w = ::write(fd_, s, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        error_ = w < 0 ? errno : EIO;
      } else {
        s += w;
        n -= static_cast<std::size_t>(w);
      }
    }
    if (error_ != 0) errno = error_;  // what the caller's message reports
    return error_ == 0;
  }
  bool drain() {
    const auto n = static_cast<std::size_t>(pptr() - pbase());
    empty();
    return put(buffer_.data(), n);
  }

  int fd_;
  std::vector<char> buffer_;
  int error_ = 0;
};

// Removes what killed writers of `path` left (see the top of this file):
// entries beside it named "<file name>.headroom-tmp-<12 of [a-z0-9]>" that
// are regular files owned by this user and locked by no writer. Anything
// else, and anything it cannot inspect, is left alone.
inline void clear_leftovers(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const std::string stem = path.filename().string();
  std::error_code ec;
  for (fs::directory_iterator it(parent_dir(path), ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    if (!is_own_name(p.filename().string(), stem, temporary_marker)) continue;
    const int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);  // a link is not opened
    if (fd < 0) continue;
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && held.st_uid == ::geteuid() && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        ::lstat(p.c_str(), &named) == 0 && named.st_dev == held.st_dev && named.st_ino == held.st_ino)
      ::unlink(p.c_str());
    ::close(fd);
  }
}
#endif

}  // namespace detail::durable

// Throws overwrite_refused unless `path` is missing or `is_own_kind(path)`
// says it is a file of `kind` (the writer's own). `writer` names the caller
// in the message: "write_safetensors: out/notes.txt exists and is not a
// safetensors file; refusing to replace it (nothing was written)".
inline void check_replaceable(const std::filesystem::path& path, std::string_view writer, std::string_view kind,
                              const std::function<bool(const std::filesystem::path&)>& is_own_kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status s = fs::symlink_status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw std::system_error(ec, std::string(writer) + ": cannot inspect " + path.string());
  if (!fs::exists(s)) return;
  const std::string head = std::string(writer) + ": " + path.string();
  const std::string tail = "; refusing to replace it (nothing was written)";
  if (fs::is_directory(s)) throw overwrite_refused(head + " is a directory, not a " + std::string(kind) + tail);
  if (!fs::is_regular_file(s)) throw overwrite_refused(head + " exists and is not a regular file" + tail);
  if (!is_own_kind(path)) throw overwrite_refused(head + " exists and is not a " + std::string(kind) + tail);
}

// Writes a file through a temporary of its own beside it (steps 2 and 3
// above): `body` writes the bytes into the stream; `fail(message)` must
// throw the writer's own error type. On any error the temporary is removed
// and an existing `path` is left as it was. Call check_replaceable first.
inline void write_durably(const std::filesystem::path& path, const std::function<void(std::ostream&)>& body,
                          const std::function<void(const std::string&)>& fail) {
  namespace fs = std::filesystem;
  namespace du = detail::durable;
#if defined(__unix__) || defined(__APPLE__)
  du::clear_leftovers(path);
  const std::string stem = path.string() + std::string(du::temporary_marker);
  fs::path tmp;
  int fd = -1;
  for (int attempt = 1; fd < 0; ++attempt) {
    tmp = stem + du::random_suffix();
    errno = 0;
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    // The lock is held until the rename: another writer's clear_leftovers
    // leaves a file at work alone. One that locked it first (between the
    // open and here) may remove it: then another name is drawn. A file
    // system without flock leaves it unlocked (and no one removes it).
    if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(fd);
      fd = -1;
      errno = EWOULDBLOCK;
    } else if (fd < 0 && errno != EEXIST) {
      fail("cannot create the temporary file " + tmp.string() + system_reason());
    }
    if (fd < 0 && attempt == du::name_attempts) fail("cannot create the temporary file " + tmp.string() + system_reason());
  }
  struct stat created {};
  ::fstat(fd, &created);
  try {
    du::DescriptorBuffer buffer(fd);
    std::ostream out(&buffer);
    body(out);
    out.flush();
    if (!out) {
      errno = buffer.error();
      fail("write failed on " + tmp.string() + system_reason());
    }
    errno = 0;
    if (::fsync(fd) != 0) fail("fsync of " + tmp.string() + " failed" + system_reason());
    errno = 0;
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp.string() + " to " + path.string() + system_reason());
  } catch (...) {
    struct stat named {};  // removed only while it is still the file this write created
    if (::lstat(tmp.c_str(), &named) == 0 && named.st_dev == created.st_dev && named.st_ino == created.st_ino) ::unlink(tmp.c_str());
    ::close(fd);
    throw;
  }
  ::close(fd);
#else
  fs::path tmp;
  std::ofstream out;
  for (int attempt = 1;; ++attempt) {
    tmp = path.string() + std::string(du::temporary_marker) + du::random_suffix();
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(tmp, ec))) break;
    if (attempt == du::name_attempts) fail("cannot create the temporary file " + tmp.string() + ": File exists");
  }
  try {
    errno = 0;
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create the temporary file " + tmp.string() + system_reason());
    body(out);
    out.flush();
    if (!out) fail("write failed on " + tmp.string() + system_reason());
    out.close();
    if (!out) fail("closing " + tmp.string() + " failed" + system_reason());
    fs::rename(tmp, path);
  } catch (...) {
    if (out.is_open()) out.close();
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
#endif
  sync_path(parent_dir(path));
}

// check_replaceable, then write_durably: the whole rule in one call.
inline void replace_file(const std::filesystem::path& path, std::string_view writer, std::string_view kind,
                         const std::function<bool(const std::filesystem::path&)>& is_own_kind,
                         const std::function<void(std::ostream&)>& body,
                         const std::function<void(const std::string&)>& fail) {
  check_replaceable(path, writer, kind, is_own_kind);
  write_durably(path, body, fail);
}

}  // namespace headroom::io

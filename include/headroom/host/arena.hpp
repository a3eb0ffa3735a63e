#pragma once
// The host engine's memory: one block per tier, of exactly the plan's bytes,
// allocated once when a trainer starts.
//   device tier  : anonymous memory (RAM), page-aligned
//   offload tier : a file in a directory the user chooses (default: the
//                  system temp dir), unlinked at once, so nothing is left
//                  behind. The engine's copies go through the file
//                  (pread / pwrite: no page of the tier enters the process);
//                  the same file is also mapped, for tools that read or
//                  write a tensor in place (checkpoints, tests).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace headroom::host {

// The offload folder can hold the planned tier: it exists, is a directory
// this process may write, and its file system has `bytes` free for it.
inline void check_offload_dir(const std::filesystem::path& dir, std::int64_t bytes) {
  const std::string tier = "the planned offload tier of " + std::to_string(bytes) + " B";
  std::error_code ec;
  const auto st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st))
    throw std::runtime_error("headroom: the offload folder '" + dir.string() + "' does not exist; create it, or choose another " +
                             "for " + tier + " (TrainOptions::offload_dir)");
  if (!std::filesystem::is_directory(st))
    throw std::runtime_error("headroom: the offload folder '" + dir.string() + "' is not a directory; it must hold " + tier);
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw std::runtime_error("headroom: the offload folder '" + dir.string() + "' is not writable (" + std::strerror(errno) +
                             "); it must hold " + tier);
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    const std::int64_t free = static_cast<std::int64_t>(fs.f_bavail) * static_cast<std::int64_t>(fs.f_frsize);
    if (free < bytes)
      throw std::runtime_error("headroom: the offload folder '" + dir.string() + "' has " + std::to_string(free) +
                               " B free, less than " + tier + " (" + std::to_string(bytes - free) + " B short)");
  }
}

class Arena {
 public:
  Arena() = default;
  // RAM: `bytes` of zeroed anonymous memory.
  explicit Arena(std::int64_t bytes) : bytes_(bytes) {
    if (bytes <= 0) return;
    void* p = ::mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("headroom: could not allocate the " + std::to_string(bytes) + " B arena: " + std::strerror(errno));
    data_ = static_cast<std::byte*>(p);
  }
  // A file-backed mapping of `bytes` in directory `dir`. The directory is
  // checked first (it exists, is a directory, is writable, has `bytes`
  // free), and the file's blocks are reserved (posix_fallocate), so a full
  // disk is refused here, with the bytes needed, rather than found by a
  // write into the mapping in the middle of a step (which the kernel
  // answers with SIGBUS).
  Arena(std::int64_t bytes, const std::filesystem::path& dir) : bytes_(bytes), file_backed_(true) {
    if (bytes <= 0) return;
    check_offload_dir(dir, bytes);
    std::string tmpl = (dir / "headroom-offload-XXXXXX").string();
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0)
      throw std::runtime_error("headroom: cannot create the offload file in '" + dir.string() + "': " + std::strerror(errno));
    ::unlink(tmpl.c_str());
    if (const int err = ::posix_fallocate(fd, 0, bytes); err != 0) {
      ::close(fd);
      throw std::runtime_error("headroom: cannot reserve the planned offload tier of " + std::to_string(bytes) +
                               " B in the offload folder '" + dir.string() + "': " + std::strerror(err));
    }
    void* p = ::mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error("headroom: cannot map the offload file in '" + dir.string() + "': " + why);
    }
    data_ = static_cast<std::byte*>(p);
    fd_ = fd;
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept { swap(o); }
  Arena& operator=(Arena&& o) noexcept {
    swap(o);
    return *this;
  }
  ~Arena() {
    if (data_ != nullptr) ::munmap(data_, static_cast<std::size_t>(bytes_));
    if (fd_ >= 0) ::close(fd_);
  }

  std::byte* data() const { return data_; }
  std::int64_t bytes() const { return bytes_; }
  bool file_backed() const { return file_backed_; }
  template <class T>
  T* at(std::int64_t offset) const {
    return reinterpret_cast<T*>(data_ + offset);
  }

  // Offload tier, through the file rather than the mapping (the two see
  // the same page cache): reads or writes `bytes` at `offset` from or into
  // memory outside the mapping, so no page of the tier is mapped into this
  // process and none faults. A file system error (EIO) throws.
  void read(std::int64_t offset, void* to, std::int64_t bytes) const {
    if (fd_ < 0) return void(std::memcpy(to, data_ + offset, static_cast<std::size_t>(bytes)));
    transfer(offset, bytes, [&](std::int64_t done, std::int64_t n) {
      return ::pread(fd_, static_cast<std::byte*>(to) + done, static_cast<std::size_t>(n), offset + done);
    });
  }
  void write(std::int64_t offset, const void* from, std::int64_t bytes) const {
    if (fd_ < 0) return void(std::memcpy(data_ + offset, from, static_cast<std::size_t>(bytes)));
    transfer(offset, bytes, [&](std::int64_t done, std::int64_t n) {
      return ::pwrite(fd_, static_cast<const std::byte*>(from) + done, static_cast<std::size_t>(n), offset + done);
    });
  }

  // Offload tier: the range was just written; let the kernel write it back
  // and take its pages out of this process's resident set.
  void release(std::int64_t offset, std::int64_t bytes) const {
    if (!file_backed_) return;
    page_range(offset, bytes, [](void* p, std::size_t n) { ::madvise(p, n, MADV_DONTNEED); });
  }

 private:
  std::byte* data_ = nullptr;
  std::int64_t bytes_ = 0;
  bool file_backed_ = false;
  int fd_ = -1;  // the offload file (file-backed only)

  void swap(Arena& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(file_backed_, o.file_backed_);
    std::swap(fd_, o.fd_);
  }
  template <class F>
  void transfer(std::int64_t offset, std::int64_t bytes, F&& io) const {
    for (std::int64_t done = 0; done < bytes;) {
      const ssize_t n = io(done, bytes - done);
      if (n > 0) {
        done += n;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        throw std::runtime_error("headroom: the offload file: " + std::string(n == 0 ? "unexpected end of file" : std::strerror(errno)) +
                                 " at byte " + std::to_string(offset + done) + " of a " + std::to_string(bytes) + " B transfer");
      }
    }
  }
  // the whole pages inside [offset, offset + bytes)
  template <class F>
  void page_range(std::int64_t offset, std::int64_t bytes, F&& f) const {
    const std::int64_t page = ::sysconf(_SC_PAGESIZE);
    const std::int64_t lo = (offset + page - 1) / page * page, hi = (offset + bytes) / page * page;
    if (hi > lo) f(data_ + lo, static_cast<std::size_t>(hi - lo));
  }
};

inline std::filesystem::path default_offload_dir() {
  std::error_code ec;
  auto p = std::filesystem::temp_directory_path(ec);
  return ec ? std::filesystem::path("/tmp") : p;
}

}  // namespace headroom::host

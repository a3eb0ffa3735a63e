#pragma once
// The host engine's memory: one block per tier, of exactly the plan's bytes,
// allocated once when a trainer starts.
//   device tier  : anonymous memory (RAM), page-aligned
//   offload tier : a file-backed shared mapping in a directory the user
//                  chooses (default: the system temp dir). The file is
//                  unlinked at once, so nothing is left behind; after an
//                  offload copy the pages are released from the process
//                  (written back to the file by the kernel); the plan's
//                  prefetch copies them back one block ahead of their backward.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace headroom::host {

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
  // A file-backed mapping of `bytes` in directory `dir`.
  Arena(std::int64_t bytes, const std::filesystem::path& dir) : bytes_(bytes), file_backed_(true) {
    if (bytes <= 0) return;
    std::string tmpl = (dir / "headroom-offload-XXXXXX").string();
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0)
      throw std::runtime_error("headroom: cannot create the offload file in '" + dir.string() + "': " + std::strerror(errno));
    ::unlink(tmpl.c_str());
    if (::ftruncate(fd, bytes) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error("headroom: cannot size the offload file in '" + dir.string() + "' to " + std::to_string(bytes) +
                               " B: " + why);
    }
    void* p = ::mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED)
      throw std::runtime_error("headroom: cannot map the offload file in '" + dir.string() + "': " + std::strerror(errno));
    data_ = static_cast<std::byte*>(p);
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
  }

  std::byte* data() const { return data_; }
  std::int64_t bytes() const { return bytes_; }
  bool file_backed() const { return file_backed_; }
  template <class T>
  T* at(std::int64_t offset) const {
    return reinterpret_cast<T*>(data_ + offset);
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

  void swap(Arena& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(file_backed_, o.file_backed_);
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

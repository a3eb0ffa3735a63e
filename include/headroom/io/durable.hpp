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
//   2. the bytes go to the sibling "<path>.tmp" (same directory, so the same
//      file system), which is flushed and fsync'ed;
//   3. the temporary is renamed over the path and the directory is fsync'ed.
//
// So when replace_file returns, the new file survives a power cut; until the
// rename, the old file is there, intact; a crash leaves at most a stray
// "<path>.tmp", which the next write replaces. save_checkpoint follows the
// same rule for directories (only a missing path or a headroom checkpoint is
// replaced) with its own staging directory (io/checkpoint.hpp).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
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

// Writes a file through its sibling "<path>.tmp" (steps 2 and 3 above):
// `body` writes the bytes into the open stream; `fail(message)` must throw
// the writer's own error type. On any error the temporary is removed and an
// existing `path` is left as it was. Call check_replaceable first.
inline void write_durably(const std::filesystem::path& path, const std::function<void(std::ofstream&)>& body,
                          const std::function<void(const std::string&)>& fail) {
  namespace fs = std::filesystem;
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream out;
  try {
    errno = 0;
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create the temporary file " + tmp.string() + system_reason());
    body(out);
    out.flush();
    if (!out) fail("write failed on " + tmp.string() + system_reason());
    out.close();
    if (!out) fail("closing " + tmp.string() + " failed" + system_reason());
    sync_path(tmp);
    fs::rename(tmp, path);
  } catch (...) {
    if (out.is_open()) out.close();
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  sync_path(parent_dir(path));
}

// check_replaceable, then write_durably: the whole rule in one call.
inline void replace_file(const std::filesystem::path& path, std::string_view writer, std::string_view kind,
                         const std::function<bool(const std::filesystem::path&)>& is_own_kind,
                         const std::function<void(std::ofstream&)>& body,
                         const std::function<void(const std::string&)>& fail) {
  check_replaceable(path, writer, kind, is_own_kind);
  write_durably(path, body, fail);
}

}  // namespace headroom::io

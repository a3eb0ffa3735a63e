// Opening safetensors files: time and peak memory of SafetensorsFile's
// constructor (read the header, validate it, index the names) on a file with
// many tensors and on hostile headers just under the 100 MB cap.
//
//   safetensors_open [--tensors N]... [--hostile-bytes B]... [--dir D]
//
// writes one file per case under D (default: the system temp folder; the
// files are removed afterwards), then opens each in a fresh process of this
// program, so each peak resident size (VmHWM) is that open's alone. Columns:
// the header's size, the tensors and metadata entries read, the wall and CPU
// time to open, the process's peak RSS and how much of it the open added
// (peak minus the peak before the open), also as a multiple of the header.
// MB are 10^6 bytes. Defaults: --tensors 1000000 --hostile-bytes 99999000.
// A plain main, not Google Benchmark: one open per process is the measure.
#include <headroom/io/safetensors.hpp>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

// Peak resident set size of this process in KiB (VmHWM of /proc/self/status).
long vm_hwm_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return -1;
}

void write_file(const fs::path& p, const std::string& header, std::uint64_t data_bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  const std::string zeros(1 << 16, '\0');
  for (std::uint64_t left = data_bytes; left > 0;) {
    const std::uint64_t n = left < zeros.size() ? left : zeros.size();
    out.write(zeros.data(), static_cast<std::streamsize>(n));
    left -= n;
  }
  if (!out) {
    std::fprintf(stderr, "safetensors_open: cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

std::string entry(const std::string& name, const char* dtype, const std::string& shape, std::uint64_t b,
                  std::uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

struct Case {
  std::string what;
  fs::path file;
};

// n tensors as a model would have them: blocks of nine weights, F16 [4] each.
Case many_tensors(const fs::path& dir, std::uint64_t n) {
  static const char* parts[] = {"attn_q", "attn_k", "attn_v", "attn_o", "ffn_gate", "ffn_up", "ffn_down", "norm_1", "norm_2"};
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  h.reserve(static_cast<std::size_t>(n) * 90);
  for (std::uint64_t i = 0; i < n; ++i)
    h += "," + entry("blk." + std::to_string(i / 9) + "." + parts[i % 9] + ".weight", "F16", "[4]", 8 * i, 8 * i + 8);
  h += "}";
  Case c{std::to_string(n) + " tensors", dir / ("tensors_" + std::to_string(n) + ".safetensors")};
  write_file(c.file, h, 8 * n);
  return c;
}

// Hostile headers of about `bytes` bytes, each valid (so all of it is read).
std::vector<Case> hostile(const fs::path& dir, std::uint64_t bytes) {
  std::vector<Case> cases;
  const std::string tag = std::to_string(bytes);
  {  // zero-size tensors with the shortest unique names
    std::string h = "{";
    h.reserve(bytes + 100);
    for (std::uint64_t i = 0; h.size() + 60 < bytes; ++i) h += (i ? "," : "") + entry(std::to_string(i), "U8", "[0]", 0, 0);
    h += "}";
    h.append(bytes > h.size() ? bytes - h.size() : 0, ' ');
    cases.push_back({"hostile: tiny tensors", dir / ("tiny_" + tag + ".safetensors")});
    write_file(cases.back().file, h, 0);
  }
  {  // one-byte tensors of rank 64 (2 bytes of text, 8 of memory per dimension)
    std::string shape = "[1";
    for (int d = 1; d < 64; ++d) shape += ",1";
    shape += "]";
    std::string h = "{";
    h.reserve(bytes + 100);
    std::uint64_t i = 0;
    for (; h.size() + 220 < bytes; ++i) h += (i ? "," : "") + entry("t" + std::to_string(i), "U8", shape, i, i + 1);
    h += "}";
    h.append(bytes > h.size() ? bytes - h.size() : 0, ' ');
    cases.push_back({"hostile: rank-64 tensors", dir / ("rank64_" + tag + ".safetensors")});
    write_file(cases.back().file, h, i);
  }
  {  // __metadata__ with the shortest unique keys and empty values
    std::string h = "{\"__metadata__\":{";
    h.reserve(bytes + 100);
    for (std::uint64_t i = 0; h.size() + 30 < bytes; ++i) h += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"\"";
    h += "}}";
    h.append(bytes > h.size() ? bytes - h.size() : 0, ' ');
    cases.push_back({"hostile: metadata keys", dir / ("metadata_" + tag + ".safetensors")});
    write_file(cases.back().file, h, 0);
  }
  return cases;
}

// CPU seconds (user + system) this process has used.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Child: open one file, print "seconds cpu_seconds tensors metadata hwm_before hwm_after".
int open_one(const char* file) {
  const long before = vm_hwm_kib();
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t tensors = 0, metadata = 0;
  try {
    const headroom::io::SafetensorsFile f(file);
    tensors = f.tensors().size();
    metadata = f.metadata().size();
  } catch (const std::exception& e) {
    std::printf("error %s\n", e.what());
    return 1;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%.3f %.3f %zu %zu %ld %ld\n", s, cpu_seconds() - cpu0, tensors, metadata, before, vm_hwm_kib());
  return 0;
}

// Runs `self open file` and returns its one line of output.
std::string spawn_open(const char* self, const fs::path& file) {
  int fds[2];
  if (pipe(fds) != 0) return "error pipe";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::string path = file.string();
  char open_arg[] = "open";
  char* argv[] = {const_cast<char*>(self), open_arg, path.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  if (rc != 0) return "error spawn";
  int status = 0;
  waitpid(pid, &status, 0);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "open") == 0) return open_one(argv[2]);

  std::vector<std::uint64_t> tensor_counts, hostile_bytes;
  fs::path dir = fs::temp_directory_path() / ("headroom_safetensors_open_" + std::to_string(getpid()));
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tensors") tensor_counts.push_back(std::strtoull(argv[i + 1], nullptr, 10));
    else if (flag == "--hostile-bytes") hostile_bytes.push_back(std::strtoull(argv[i + 1], nullptr, 10));
    else if (flag == "--dir") dir = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--tensors N]... [--hostile-bytes B]... [--dir D]\n", argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "usage: %s [--tensors N]... [--hostile-bytes B]... [--dir D]\n", argv[0]);
    return 2;
  }
  if (tensor_counts.empty() && hostile_bytes.empty()) {
    tensor_counts = {1'000'000};
    hostile_bytes = {99'999'000};
  }
  fs::create_directories(dir);
  std::vector<Case> cases;
  for (std::uint64_t n : tensor_counts) cases.push_back(many_tensors(dir, n));
  for (std::uint64_t b : hostile_bytes)
    for (Case& c : hostile(dir, b)) cases.push_back(std::move(c));

  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::printf("%-26s %9s %9s %9s %8s %8s %9s %9s %8s\n", "case", "header MB", "tensors", "metadata", "wall s",
              "CPU s", "peak MB", "added MB", "x header");
  for (const Case& c : cases) {
    std::ifstream in(c.file, std::ios::binary);
    unsigned char len[8] = {};
    in.read(reinterpret_cast<char*>(len), 8);
    std::uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | len[i];
    const std::string line = spawn_open(self.c_str(), c.file);
    double s = 0, cpu = 0;
    std::size_t tensors = 0, metadata = 0;
    long before = 0, after = 0;
    if (std::sscanf(line.c_str(), "%lf %lf %zu %zu %ld %ld", &s, &cpu, &tensors, &metadata, &before, &after) != 6) {
      std::printf("%-26s %9.1f  %s\n", c.what.c_str(), static_cast<double>(header) / 1e6, line.c_str());
      continue;
    }
    const double added = static_cast<double>(after - before) * 1024.0;  // VmHWM is in KiB
    std::printf("%-26s %9.1f %9zu %9zu %8.3f %8.3f %9.1f %9.1f %8.2f\n", c.what.c_str(),
                static_cast<double>(header) / 1e6, tensors, metadata, s, cpu, static_cast<double>(after) * 1024.0 / 1e6,
                added / 1e6, added / static_cast<double>(header));
    std::fflush(stdout);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}

#pragma once
// The process's resident memory, as Linux reports it in /proc/self/status:
// what the trainer's "planned = used" checks compare the plan against.
// Returns -1 where the file or the field does not exist.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

namespace headroom::host {

// A /proc/self/status field given in kB ("VmRSS", "VmHWM"), in bytes.
inline std::int64_t status_bytes(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 && line[field.size()] == ':')
      return std::strtoll(line.c_str() + field.size() + 1, nullptr, 10) * 1024;
  return -1;
}
inline std::int64_t resident_bytes() { return status_bytes("VmRSS"); }
// The peak since the process started, or since reset_peak_resident().
inline std::int64_t peak_resident_bytes() { return status_bytes("VmHWM"); }
// Resets the peak to the current resident size (Linux >= 4.0).
inline void reset_peak_resident() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace headroom::host

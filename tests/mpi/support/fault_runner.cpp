// fault_runner <spec>: runs an mpirun whose job is meant to fail, and passes
// (exit 0) when it fails the way the spec allows. Used by every
// headroom_mpi_fault_test (tests/mpi/CMakeLists.txt), which writes the spec.
//
// It checks only what the job guarantees, and all of it:
//   - mpirun exits, nonzero, within `within` seconds (else it is sent
//     SIGTERM, its process group SIGKILL 3 s later, and the test fails);
//   - no process of the job outlives mpirun (each process it starts inherits
//     HEADROOM_FAULT_JOB=<token> from the runner; /proc is searched for it
//     for up to 5 s after mpirun's exit, and what is left is killed and
//     named);
//   - every line a rank prints matches one `require` or `allow` regex, whole
//     (ECMAScript syntax), and names the rank that printed it: its first
//     "rank R of N" is the rank's own (with OpenMPI's --tag-output, `tagged`);
//   - each `require` regex matches at least one line.
// How many ranks print is not checked: once one rank of a failed job exits,
// the launcher stops the others, and which of them prints first is a race.
//
// The spec, one item per line (written by CMake; no escaping):
//   within <seconds>
//   ranks <n>
//   tagged 0|1       1: rank lines arrive as "[job,rank]<stdout|stderr>:text"
//                    and every other line is the launcher's own; 0: only lines
//                    starting "headroom" are taken as the ranks'
//   require <regex>
//   allow <regex>
//   arg <word>       mpirun and its arguments, one per line, in order
// A line "headroom-test: killed at <unix microseconds>" (a rank about to
// SIGKILL itself) makes the runner print the time from that moment to
// mpirun's exit.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct Rule {
  std::string text;
  std::regex re;
};

struct Spec {
  double within = 30;
  int ranks = 0;
  bool tagged = false;
  std::vector<Rule> require, allow;
  std::vector<std::string> args;
};

Spec read_spec(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read the spec ") + path);
  Spec s;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "within") s.within = std::stod(value);
    else if (key == "ranks") s.ranks = std::stoi(value);
    else if (key == "tagged") s.tagged = value == "1";
    else if (key == "require") s.require.push_back({value, std::regex(value)});
    else if (key == "allow") s.allow.push_back({value, std::regex(value)});
    else if (key == "arg") s.args.push_back(value);
    else throw std::runtime_error(std::string(path) + ": unknown item '" + key + "'");
  }
  if (s.args.empty() || s.require.empty() || s.ranks < 1)
    throw std::runtime_error(std::string(path) + ": a spec needs ranks, at least one require and the command");
  return s;
}

// What mpirun printed, each stream as it came.
struct Output {
  std::string out, err;
};

struct Job {
  int status = -1;         // waitpid's status; -1 when mpirun did not exit in time
  double seconds = 0;      // from the start to mpirun's exit (or to the kill)
  long long exit_unix_us = 0;
  Output output;
};

long long unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool drain(int fd, std::string& into) {  // false at end of file
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    return false;
  }
}

Job run(const Spec& spec, const std::string& token) {
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const auto t0 = clock_type::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);  // its own process group: killed as one if it overstays
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(out_pipe[0]), ::close(out_pipe[1]), ::close(err_pipe[0]), ::close(err_pipe[1]);
    ::setenv("HEADROOM_FAULT_JOB", token.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : spec.args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "fault_runner: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_pipe[1]), ::close(err_pipe[1]);
  for (int fd : {out_pipe[0], err_pipe[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  Job job;
  const auto deadline = t0 + std::chrono::duration<double>(spec.within);
  bool open_out = true, open_err = true;
  std::optional<clock_type::time_point> exited;
  for (;;) {
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    ::poll(fds, 2, 20);
    if (open_out) open_out = drain(out_pipe[0], job.output.out);
    if (open_err) open_err = drain(err_pipe[0], job.output.err);
    if (!exited) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = clock_type::now();
        job.status = status;
        job.exit_unix_us = unix_us();
        job.seconds = std::chrono::duration<double>(*exited - t0).count();
      } else if (clock_type::now() > deadline) {
        // overstayed: SIGTERM lets mpirun stop its ranks (they are in process
        // groups of their own); SIGKILL to its group 3 s later if it has not exited
        job.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
        ::kill(pid, SIGTERM);
        for (int i = 0; i < 60 && ::waitpid(pid, &status, WNOHANG) != pid; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (::kill(pid, 0) == 0) {
          ::killpg(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
        }
        exited = clock_type::now();
      }
    }
    // after the exit, what is still in the pipes; a process that outlives
    // mpirun may hold them open: read for at most 1 s more
    if (exited && ((!open_out && !open_err) || clock_type::now() > *exited + std::chrono::seconds(1))) break;
  }
  ::close(out_pipe[0]), ::close(err_pipe[0]);
  return job;
}

// The processes alive with HEADROOM_FAULT_JOB=<token> in their environment.
std::vector<std::string> processes_with(const std::string& token) {
  const std::string needle = "HEADROOM_FAULT_JOB=" + token;
  std::vector<std::string> found;
  DIR* proc = ::opendir("/proc");
  if (!proc) return found;
  while (const dirent* e = ::readdir(proc)) {
    const char* name = e->d_name;
    if (name[0] < '0' || name[0] > '9') continue;
    std::ifstream env(std::string("/proc/") + name + "/environ", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    const std::size_t at = text.find(needle);
    if (at == std::string::npos || (at > 0 && text[at - 1] != '\0')) continue;
    if (at + needle.size() < text.size() && text[at + needle.size()] != '\0') continue;
    std::ifstream cmd(std::string("/proc/") + name + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    found.push_back(std::string(name) + " (" + cmdline + ")");
  }
  ::closedir(proc);
  return found;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

struct RankLine {
  int rank = -1;  // -1: not known (untagged output)
  std::string text;
};

std::vector<RankLine> rank_lines(const Output& output, bool tagged) {
  static const std::regex tag(R"(^\[[0-9]+,([0-9]+)\]<std(out|err|diag)>:(.*)$)");
  std::vector<RankLine> lines;
  for (const std::string* stream : {&output.out, &output.err})
    for (const std::string& line : lines_of(*stream)) {
      std::smatch m;
      if (tagged) {
        if (std::regex_match(line, m, tag)) lines.push_back({std::stoi(m[1].str()), m[3].str()});
      } else if (line.rfind("headroom", 0) == 0) {
        lines.push_back({-1, line});
      }
    }
  return lines;
}

int check(const Spec& spec, const Job& job, const std::vector<std::string>& outlived) {
  std::vector<std::string> failures;
  if (job.status < 0) {
    char within[32];
    std::snprintf(within, sizeof within, "%g", spec.within);
    failures.push_back(std::string("mpirun did not exit within ") + within + " s (the runner stopped it)");
  } else if (WIFEXITED(job.status) && WEXITSTATUS(job.status) == 0) {
    failures.push_back("mpirun exited 0; the job was meant to fail");
  }
  for (const std::string& p : outlived) failures.push_back("a process of the job outlived mpirun by 5 s: " + p);

  static const std::regex self(R"(rank ([0-9]+) of ([0-9]+))");
  const std::vector<RankLine> lines = rank_lines(job.output, spec.tagged);
  std::vector<int> matched(spec.require.size(), 0);
  for (const RankLine& line : lines) {
    bool known = false;
    for (std::size_t i = 0; i < spec.require.size(); ++i)
      if (std::regex_match(line.text, spec.require[i].re)) known = true, ++matched[i];
    for (const Rule& rule : spec.allow) known = known || std::regex_match(line.text, rule.re);
    const std::string who = line.rank >= 0 ? "rank " + std::to_string(line.rank) : "a rank";
    if (!known) failures.push_back(who + " printed a line that no documented message matches: " + line.text);
    std::smatch m;
    if (line.rank >= 0 && std::regex_search(line.text, m, self) &&
        (std::stoi(m[1].str()) != line.rank || std::stoi(m[2].str()) != spec.ranks))
      failures.push_back(who + " of " + std::to_string(spec.ranks) + " printed another rank's name: " + line.text);
  }
  for (std::size_t i = 0; i < spec.require.size(); ++i)
    if (matched[i] == 0) failures.push_back("no rank printed a line matching '" + spec.require[i].text + "'");

  static const std::regex killed(R"(headroom-test: killed at ([0-9]+))");
  for (const RankLine& line : lines) {
    std::smatch m;
    if (job.status >= 0 && std::regex_match(line.text, m, killed))
      std::printf("kill to mpirun exit: %lld ms (job wall time %.0f ms)\n", (job.exit_unix_us - std::stoll(m[1].str())) / 1000,
                  job.seconds * 1000);
  }
  std::printf("%zu line(s) from the ranks, every one checked\n", lines.size());
  if (failures.empty()) return 0;
  std::printf("the job did not fail as expected:\n");
  for (const std::string& f : failures) std::printf("  %s\n", f.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fault_runner <spec>\n");
    return 2;
  }
  try {
    const Spec spec = read_spec(argv[1]);
    const std::string token = std::to_string(::getpid()) + "." + std::to_string(unix_us());
    const Job job = run(spec, token);
    std::vector<std::string> outlived = processes_with(token);
    for (int i = 0; i < 100 && !outlived.empty(); ++i) {  // the launcher's cleanup may lag its exit a little
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      outlived = processes_with(token);
    }
    for (const std::string& p : outlived) ::kill(std::stoi(p), SIGKILL);

    std::string shown;
    for (const auto& a : spec.args) shown += (shown.empty() ? "" : " ") + a;
    const std::string exit_text = job.status < 0                ? "none"
                                  : WIFEXITED(job.status)       ? "exit " + std::to_string(WEXITSTATUS(job.status))
                                  : WIFSIGNALED(job.status)     ? "signal " + std::to_string(WTERMSIG(job.status))
                                                                : "status " + std::to_string(job.status);
    std::printf("--- %s (%s, %.0f ms) ---\n--- stdout ---\n%s--- stderr ---\n%s--- end of output ---\n", shown.c_str(),
                exit_text.c_str(), job.seconds * 1000, job.output.out.c_str(), job.output.err.c_str());
    return check(spec, job, outlived);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_runner: %s\n", e.what());
    return 2;
  }
}

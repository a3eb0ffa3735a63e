// Each offload level on the host engine against the same run on the device
// tier alone: the GPT-2-shaped benchmark model (d 768, 4 layers, 12 heads,
// GPT-2's vocabulary, B4 T256; bench/host_step.cpp,
// bench/compare_headroom.cpp) trained with the same seed and batch, for
//   on-device   clip_norm 0 and 1.0
//   offload     OffloadOptimizer (ZeRO-Offload), clip_norm 0 (each parameter
//               updated from the offload tier by the update thread while the
//               backward runs on) and 1.0 (the update thread sums the squares
//               during the backward; the updates run after it)
//   params      OffloadOptimizer + OffloadParameters (ZeRO-Infinity): the
//               parameters too, fetched from the file before each event that
//               reads them; clip_norm 0 and 1.0
// with AdamW and AdamW8bit. Each configuration lives in its own trainer; their
// timed steps are interleaved (the order rotating each round) after a
// warm-up step each, so the machine's noise falls on all alike. Printed per
// configuration: tokens/s (median step) and its ratio to on-device at the
// same clip_norm (of the medians, and the median of each round's ratio),
// the plan's device and offload peaks, the peak resident memory of a
// process that trains that configuration alone (forked before any trainer
// exists; /proc/self/status VmHWM), the CPU time, page faults and
// involuntary context switches per step, and with offloading the bytes a
// step copied between the tiers (tier_traffic()) against the plan's figure
// (every trainable parameter's gradient, elements x sizeof(float), once per
// micro-batch; with OffloadParameters also the schedule's fetch copies:
// every stored parameter for its forward and backward, the tied table's
// for the embedding's forward, the LM head's loss event and the
// embedding's backward). Then three traced steps of each configuration (trace_into),
// of which the fastest is kept: where the step's time goes (forward, loss,
// backward, what follows the last compute step, the update thread's busy
// time), and, with --svg, the timeline of AdamW's steps drawn as SVG
// (docs/offload_timeline.svg).
//
//   offload_bench [--steps N] [--warmup N] [--threads N] [--optim adamw|adamw8bit|both]
//                 [--offload-dir DIR] [--svg FILE] [--no-rss]
//   --offload-dir  the offload tier's folder; default $HEADROOM_OFFLOAD_DIR, else the system temp folder
//
//   cmake --build build --target offload_bench && build/bench/offload_bench --svg docs/offload_timeline.svg
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <headroom/headroom.hpp>
#include <headroom/host/resident.hpp>
#include <headroom/train/host/trainer.hpp>
#include <memory>
#include <string>
#include <vector>

using namespace headroom;

namespace {

// GPT-2-shaped and wide enough that GEMMs dominate: d 768, 4 layers, 12 heads, GPT-2's vocabulary, B4 T256.
constexpr models::GPT2Config gpt2_d768_l4{50257, 768, 4, 12, 1024};
using GPT2 = models::GPT2<gpt2_d768_l4>;
constexpr int max_workers = 2;
template <class O>
using OnDevice = Train<GPT2, Batch<4>, Seq<256>, O, Workers<max_workers>>;
template <class O>
using Offloaded = Train<GPT2, Batch<4>, Seq<256>, O, Workers<max_workers>, OffloadOptimizer>;
template <class O>
using OffloadedParams = Train<GPT2, Batch<4>, Seq<256>, O, Workers<max_workers>, OffloadOptimizer, OffloadParameters>;

struct Args {
  int steps = 5, warmup = 1, threads = max_workers;
  std::string optim = "both", svg;
  std::filesystem::path offload_dir;
  bool rss = true;
};

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string fmt(const char* f, double a) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

// ---------------------------------------------------------------- one configuration

struct Span {  // host::Trainer<R>::Span, for every R
  int kind = 0;  // 0 step, 1 update_in_flight, 2 update_after
  int index = -1;
  double begin = 0, end = 0;
  EventKind step_kind = EventKind::forward;  // the schedule step's kind (kind 0)
};

struct Resident {
  std::int64_t before = -1, peak = -1, after = -1, anon = -1, file = -1;
};

struct Case {
  std::string name;
  bool offload = false;
  double clip = 0;
  std::int64_t plan_device = 0, plan_offload = 0, expected_traffic = 0;
  std::function<void()> step;
  std::function<std::pair<std::int64_t, std::int64_t>()> traffic;  // to_offload, to_device
  std::function<std::vector<Span>(double&)> traced_step;           // spans, and the step's wall time
  std::vector<double> secs;
  std::vector<double> paired;  // per round: the on-device step's time (same optimizer and clip_norm) over this one's
  double faults = 0, major_faults = 0, switches = 0, user = 0, sys = 0;  // summed over the timed steps
  std::int64_t to_offload = 0, to_device = 0;
  bool traffic_ok = true;
  Resident rss;
  std::vector<Span> trace;
  double trace_wall = 0;
};

const std::vector<std::int32_t>& tokens(bool targets) {
  // the same sequence as bench/compare_headroom.cpp; targets: the next token, wrapping around
  static const auto tt = [] {
    constexpr std::int64_t n = 4 * 256, vocab = gpt2_d768_l4.vocab;
    std::vector<std::int32_t> tok(n), tgt(n);
    std::uint32_t x = 12345;
    for (std::int64_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      tok[i] = static_cast<std::int32_t>((x >> 9) % vocab);
    }
    for (std::int64_t i = 0; i < n; ++i) tgt[i] = tok[(i + 1) % n];
    return std::pair{tok, tgt};
  }();
  return targets ? tt.second : tt.first;
}

TrainOptions options(const Args& a, double clip) {
  return TrainOptions{.seed = 1, .threads = a.threads, .lr = 1e-4, .clip_norm = clip, .offload_dir = a.offload_dir};
}

// The plan's bytes copied between the tiers in one step: every trainable
// parameter's gradient, once per micro-batch, to the offload tier (and with
// Accumulate<K> the K - 1 sums back), counted from the parameter list; with
// OffloadParameters the schedule's fetch copies too.
template <class Tr>
std::int64_t expected_traffic() {
  std::int64_t bytes = 0;
  for (std::size_t k = 0; k < Tr::param_count; ++k)
    if (Tr::param(k).trainable) bytes += Tr::param(k).elements() * static_cast<std::int64_t>(sizeof(float));
  bytes *= 2 * Tr::config.accumulate - 1;
  if constexpr (Tr::config.offload_params)
    for (const auto& st : Tr::sched.steps)
      if (st.kind == EventKind::fetch)
        for (int c = st.copy_begin; c < st.copy_end; ++c) bytes += Tr::sched.copies[static_cast<std::size_t>(c)].bytes;
  return bytes;
}

// Peak resident memory of a process that trains this configuration alone
// (warm-up step and one more): forked before the parent has run a step.
template <class R>
Resident measure_resident(const Args& a, double clip) {
  int fd[2];
  if (::pipe(fd) != 0) return {};
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return {};
  if (pid == 0) {
    ::close(fd[0]);
    Resident r;
    r.before = host::resident_bytes();
    {
      host::Trainer<R> t(options(a, clip));
      t.step(tokens(false), tokens(true));
      t.step(tokens(false), tokens(true));
      r.peak = host::peak_resident_bytes();
      r.after = host::resident_bytes();
      r.anon = host::status_bytes("RssAnon");
      r.file = host::status_bytes("RssFile") + host::status_bytes("RssShmem");
    }
    const bool ok = ::write(fd[1], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    ::_exit(ok ? 0 : 1);
  }
  ::close(fd[1]);
  Resident r;
  if (::read(fd[0], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) r = Resident{};
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return r;
}

template <class R>
std::unique_ptr<Case> make_case(const Args& a, std::string name, double clip, std::shared_ptr<void>& keep) {
  using Tr = host::Trainer<R>;
  auto t = std::make_shared<Tr>(options(a, clip));
  keep = t;
  auto c = std::make_unique<Case>();
  c->name = std::move(name);
  c->offload = Tr::config.offload_optimizer;
  c->clip = clip;
  c->plan_device = Tr::plan.peak_bytes(Tier::device);
  c->plan_offload = Tr::plan.peak_bytes(Tier::offload);
  c->expected_traffic = c->offload ? expected_traffic<Tr>() : 0;
  Tr* tr = t.get();
  c->step = [tr] { tr->step(tokens(false), tokens(true)); };
  c->traffic = [tr] {
    const auto tt = tr->tier_traffic();
    return std::pair{tt.to_offload, tt.to_device};
  };
  c->traced_step = [tr](double& wall) {
    std::vector<typename Tr::Span> buf(4096);
    tr->trace_into(buf);
    const auto t0 = std::chrono::steady_clock::now();
    tr->step(tokens(false), tokens(true));
    wall = seconds_since(t0);
    const std::size_t n = tr->traced();
    tr->trace_into({});
    std::vector<Span> out;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& s = buf[i];
      Span o{static_cast<int>(s.kind), s.index, s.begin, s.end};
      if (s.kind == Tr::Span::step) o.step_kind = Tr::sched.steps[static_cast<std::size_t>(s.index)].kind;
      out.push_back(o);
    }
    std::sort(out.begin(), out.end(), [](const Span& x, const Span& y) { return x.begin < y.begin; });
    return out;
  };
  return c;
}

// ---------------------------------------------------------------- where a step's time goes

struct Phases {
  double forward = 0, loss = 0, backward = 0, after = 0, wall = 0;  // after: from the last compute step to the step's end
  double update_busy = 0, update_in_backward = 0;                    // the update thread's spans, and their part before the backward's end
  double backward_end = 0;
};

Phases phases_of(const Case& c) {
  Phases p;
  p.wall = c.trace_wall;
  double loss_begin = -1, loss_end = 0, last_end = 0;
  for (const Span& s : c.trace)
    if (s.kind == 0) {
      last_end = std::max(last_end, s.end);
      if (s.step_kind == EventKind::loss) loss_begin = s.begin, loss_end = s.end;
    }
  p.forward = loss_begin;
  p.loss = loss_end - loss_begin;
  p.backward = last_end - loss_end;
  p.backward_end = last_end;
  p.after = c.trace_wall - last_end;
  for (const Span& s : c.trace)
    if (s.kind == 1) {
      p.update_busy += s.end - s.begin;
      p.update_in_backward += std::max(0.0, std::min(s.end, last_end) - s.begin);
    }
  return p;
}

// ---------------------------------------------------------------- the timeline

const char* colour_of(EventKind k) {
  switch (k) {
    case EventKind::forward: return "#4e79a7";
    case EventKind::loss: return "#edc948";
    case EventKind::backward: return "#e15759";
    case EventKind::recompute: return "#f28e2b";
    case EventKind::offload:
    case EventKind::prefetch: return "#76b7b2";
    case EventKind::update: return "#59a14f";
    default: return "#999999";
  }
}

bool write_svg(const std::string& path, const std::vector<const Case*>& rows, const std::string& caption,
               const std::string& command) {
  const double W = 1000, left = 190, right = 20, top = 56, lane = 22, gap = 6, pair_gap = 26;
  const double pw = W - left - right;
  double tmax = 0;
  for (const Case* c : rows) tmax = std::max(tmax, c->trace_wall);
  const double ms_max = 1000 * tmax;
  double tick = 100;  // 100, 200, 500, 1000, 2000, ... ms: at most 12 ticks
  for (int k = 0; ms_max / tick > 12; ++k) tick *= k % 3 == 1 ? 2.5 : 2;
  const auto x = [&](double seconds) { return left + pw * (1000 * seconds) / (tick * std::ceil(ms_max / tick)); };
  const double span_ms = tick * std::ceil(ms_max / tick);
  // lanes: per case, the compute thread, and for offloaded cases the update thread
  double H = top;
  for (const Case* c : rows) H += (c->offload ? 2 * lane + gap : lane) + pair_gap;
  const double axis_y = H - pair_gap + 10;
  H = axis_y + 96;
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", W) + "\" height=\"" + fmt("%.0f", H) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<desc>" + caption + "; " + command + "</desc>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"10\" y=\"20\" font-size=\"14\">One training step, OffloadOptimizer on the host engine: the compute thread "
       "and the update thread</text>\n";
  s += "<text x=\"10\" y=\"38\" fill=\"#555\">" + caption + "</text>\n";
  for (double t = 0; t <= span_ms + 1e-9; t += tick) {
    const double xx = left + pw * t / span_ms;
    s += "<line x1=\"" + fmt("%.1f", xx) + "\" x2=\"" + fmt("%.1f", xx) + "\" y1=\"" + fmt("%.1f", top - 6) + "\" y2=\"" +
         fmt("%.1f", axis_y) + "\" stroke=\"#eee\"/>\n";
    s += "<text x=\"" + fmt("%.1f", xx) + "\" y=\"" + fmt("%.1f", axis_y + 14) + "\" text-anchor=\"middle\">" +
         fmt("%.0f", t) + "</text>\n";
  }
  s += "<text x=\"" + fmt("%.1f", left + pw / 2) + "\" y=\"" + fmt("%.1f", axis_y + 30) +
       "\" text-anchor=\"middle\">ms since the step began</text>\n";
  double y = top;
  const auto rect = [&](double b, double e, double yy, const char* fill, const std::string& title) {
    const double x0 = x(b), w = std::max(0.6, x(e) - x0);
    s += "<rect x=\"" + fmt("%.1f", x0) + "\" y=\"" + fmt("%.1f", yy) + "\" width=\"" + fmt("%.1f", w) + "\" height=\"" +
         fmt("%.0f", lane) + "\" fill=\"" + fill + "\"><title>" + title + "</title></rect>\n";
  };
  for (const Case* c : rows) {
    const Phases p = phases_of(*c);
    s += "<text x=\"" + fmt("%.1f", left - 8) + "\" y=\"" + fmt("%.1f", y + 15) + "\" text-anchor=\"end\">" + c->name +
         "</text>\n";
    s += "<rect x=\"" + fmt("%.1f", left) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.1f", x(c->trace_wall) - left) +
         "\" height=\"" + fmt("%.0f", lane) + "\" fill=\"#f4f4f4\"/>\n";
    for (const Span& sp : c->trace)
      if (sp.kind == 0)
        rect(sp.begin, sp.end, y, colour_of(sp.step_kind),
             std::string(name_of(sp.step_kind)) + " (schedule step " + std::to_string(sp.index) + ")");
    // the step's end: after the last compute step, the update (on device; with clipping, offloaded)
    s += "<line x1=\"" + fmt("%.1f", x(c->trace_wall)) + "\" x2=\"" + fmt("%.1f", x(c->trace_wall)) + "\" y1=\"" +
         fmt("%.1f", y - 3) + "\" y2=\"" + fmt("%.1f", y + (c->offload ? 2 * lane + gap : lane) + 3) +
         "\" stroke=\"black\"/>\n";
    if (!c->offload) {
      if (p.after > 0) rect(p.backward_end, c->trace_wall, y, "#9c755f", "optimizer update (on device)");
      y += lane + pair_gap;
      continue;
    }
    y += lane + gap;
    s += "<text x=\"" + fmt("%.1f", left - 8) + "\" y=\"" + fmt("%.1f", y + 15) +
         "\" text-anchor=\"end\" fill=\"#555\">update thread</text>\n";
    s += "<rect x=\"" + fmt("%.1f", left) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.1f", x(c->trace_wall) - left) +
         "\" height=\"" + fmt("%.0f", lane) + "\" fill=\"#f4f4f4\"/>\n";
    int n = 0;
    for (const Span& sp : c->trace) {
      if (sp.kind == 0) continue;
      const bool in_flight = sp.kind == 1;
      const char* fill = in_flight ? (n++ % 2 ? "#59a14f" : "#8cd17d") : (n++ % 2 ? "#b07aa1" : "#d4a6c8");
      const double yy = in_flight ? y : y - lane - gap;  // update_after runs on the compute thread's lane
      rect(sp.begin, sp.end, yy, fill,
           in_flight ? "update thread: parameter " + std::to_string(sp.index)
                     : std::string("update after the backward (every parameter, on the compute workers)"));
    }
    y += lane + pair_gap;
  }
  // the legend
  double lx = left, ly = axis_y + 48;
  const auto key = [&](const char* fill, const std::string& label) {
    s += "<rect x=\"" + fmt("%.1f", lx) + "\" y=\"" + fmt("%.1f", ly - 10) + "\" width=\"12\" height=\"12\" fill=\"" + fill +
         "\"/>\n";
    s += "<text x=\"" + fmt("%.1f", lx + 17) + "\" y=\"" + fmt("%.1f", ly) + "\">" + label + "</text>\n";
    lx += 30 + 7.0 * static_cast<double>(label.size());
  };
  key(colour_of(EventKind::forward), "forward");
  key(colour_of(EventKind::loss), "LM head + loss");
  key(colour_of(EventKind::backward), "backward (+ gradient copy to the offload tier)");
  key("#8cd17d", "update in flight (one parameter)");
  lx = left, ly += 20;
  key("#9c755f", "on-device update");
  key("#d4a6c8", "update after the backward (clip_norm > 0)");
  s += "<text x=\"10\" y=\"" + fmt("%.1f", ly + 22) + "\" fill=\"#555\" font-size=\"10\">" + command + "</text>\n";
  s += "</svg>\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  return std::fclose(f) == 0 && ok;
}

// ---------------------------------------------------------------- the run

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Usage {
  double minflt, majflt, nivcsw, user, sys;
};
Usage usage() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto s = [](timeval t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return {static_cast<double>(u.ru_minflt), static_cast<double>(u.ru_majflt), static_cast<double>(u.ru_nivcsw), s(u.ru_utime),
          s(u.ru_stime)};
}

constexpr int traced_steps = 3;

enum class Level { device, optimizer, parameters };
struct Spec {
  std::string name;
  Level level;
  double clip;
};
std::vector<Spec> specs_of(const std::string& optim) {
  return {{optim + " on-device clip 0", Level::device, 0.0},     {optim + " on-device clip 1", Level::device, 1.0},
          {optim + " offload clip 0", Level::optimizer, 0.0},    {optim + " offload clip 1", Level::optimizer, 1.0},
          {optim + " params clip 0", Level::parameters, 0.0},    {optim + " params clip 1", Level::parameters, 1.0}};
}

// Each configuration's resident memory, in a process of its own. Called
// before this process has run any step: a forked child of a process whose
// OpenMP pool exists would wait for the pool's threads at its first
// parallel region (they are not copied by fork).
template <class O>
std::vector<Resident> resident_of(const Args& a, const std::string& optim) {
  const std::vector<Spec> specs = specs_of(optim);
  std::vector<Resident> rss(specs.size());
  if (a.rss)
    for (std::size_t i = 0; i < specs.size(); ++i)
      rss[i] = specs[i].level == Level::parameters ? measure_resident<OffloadedParams<O>>(a, specs[i].clip)
               : specs[i].level == Level::optimizer  ? measure_resident<Offloaded<O>>(a, specs[i].clip)
                                                     : measure_resident<OnDevice<O>>(a, specs[i].clip);
  return rss;
}

template <class O>
void run_optimizer(const Args& a, const std::string& optim, const std::vector<Resident>& rss,
                   std::vector<std::unique_ptr<Case>>& out) {
  const std::vector<Spec> specs = specs_of(optim);
  std::vector<std::shared_ptr<void>> keep(specs.size());
  std::vector<std::unique_ptr<Case>> cases;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    cases.push_back(specs[i].level == Level::parameters ? make_case<OffloadedParams<O>>(a, specs[i].name, specs[i].clip, keep[i])
                    : specs[i].level == Level::optimizer  ? make_case<Offloaded<O>>(a, specs[i].name, specs[i].clip, keep[i])
                                                          : make_case<OnDevice<O>>(a, specs[i].name, specs[i].clip, keep[i]));
    cases.back()->rss = rss[i];
  }
  for (int w = 0; w < a.warmup; ++w)
    for (auto& c : cases) c->step();
  const std::size_t n = cases.size();
  for (int r = 0; r < a.steps; ++r)
    for (std::size_t j = 0; j < n; ++j) {  // the order rotates each round
      Case& c = *cases[(j + static_cast<std::size_t>(r)) % n];
      const Usage u0 = usage();
      const auto t0 = std::chrono::steady_clock::now();
      c.step();
      c.secs.push_back(seconds_since(t0));
      const Usage u1 = usage();
      c.faults += u1.minflt - u0.minflt;
      c.major_faults += u1.majflt - u0.majflt;
      c.switches += u1.nivcsw - u0.nivcsw;
      c.user += u1.user - u0.user;
      c.sys += u1.sys - u0.sys;
      if (c.offload) {
        const auto [to, back] = c.traffic();
        c.to_offload = to, c.to_device = back;
        c.traffic_ok = c.traffic_ok && to + back == c.expected_traffic;
      }
      std::fprintf(stderr, "  round %d  %-28s %.3f s\n", r + 1, c.name.c_str(), c.secs.back());
    }
  // each round: the on-device step over the offloaded one of the same optimizer and clip_norm (steps close in time)
  for (auto& c : cases)
    for (const auto& b : cases)
      if (!b->offload && b->clip == c->clip)
        for (std::size_t r = 0; r < c->secs.size(); ++r) c->paired.push_back(b->secs[r] / c->secs[r]);
  // traced steps, interleaved as well: each configuration's fastest is kept (the least disturbed by the machine)
  for (int r = 0; r < traced_steps; ++r)
    for (auto& c : cases) {
      double wall = 0;
      std::vector<Span> trace = c->traced_step(wall);
      if (r == 0 || wall < c->trace_wall) c->trace = std::move(trace), c->trace_wall = wall;
    }
  for (auto& c : cases) c->step = nullptr, c->traffic = nullptr, c->traced_step = nullptr;  // before the trainers go
  for (auto& c : cases) out.push_back(std::move(c));
}

int usage_error() {
  std::fprintf(stderr,
               "usage: offload_bench [--steps N] [--warmup N] [--threads N] [--optim adamw|adamw8bit|both] "
               "[--offload-dir DIR] [--svg FILE] [--no-rss]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const char* d = std::getenv("HEADROOM_OFFLOAD_DIR"); d != nullptr && *d) a.offload_dir = d;
  std::string command = "offload_bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--steps") && has_value) a.steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warmup") && has_value) a.warmup = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && has_value) a.threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--optim") && has_value) a.optim = argv[++i];
    else if (!std::strcmp(argv[i], "--offload-dir") && has_value) a.offload_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--svg") && has_value) a.svg = argv[++i];
    else if (!std::strcmp(argv[i], "--no-rss")) a.rss = false;
    else return usage_error();
  }
  if (a.steps < 1 || a.warmup < 0 || a.threads < 1 || a.threads > max_workers ||
      (a.optim != "adamw" && a.optim != "adamw8bit" && a.optim != "both"))
    return usage_error();
  if (a.offload_dir.empty()) a.offload_dir = host::default_offload_dir();

  const std::string cpu = cpu_name();
  std::printf("CPU: %s (%ld online), %d compute thread(s) + the update thread\n", cpu.c_str(), ::sysconf(_SC_NPROCESSORS_ONLN),
              a.threads);
  std::printf("model: GPT-2 shape d 768, 4 layers, 12 heads, vocab 50257; B4 T256 (1024 tokens a step), seed 1, lr 1e-4\n");
  std::printf("offload folder: %s\n", a.offload_dir.c_str());
  std::printf("%d warm-up step(s) and %d timed steps per configuration, interleaved\n\n", a.warmup, a.steps);
  std::fflush(stdout);

  std::vector<std::unique_ptr<Case>> cases;
  const bool adamw = a.optim != "adamw8bit", adamw8bit = a.optim != "adamw";
  const std::vector<Resident> rss = adamw ? resident_of<AdamW>(a, "AdamW") : std::vector<Resident>{};
  const std::vector<Resident> rss8 = adamw8bit ? resident_of<AdamW8bit>(a, "AdamW8bit") : std::vector<Resident>{};
  if (adamw) run_optimizer<AdamW>(a, "AdamW", rss, cases);
  if (adamw8bit) run_optimizer<AdamW8bit>(a, "AdamW8bit", rss8, cases);

  constexpr double MiB = 1 << 20;
  constexpr double tokens_per_step = 4 * 256;
  std::printf("%-26s %9s %7s %7s %8s %8s %8s %8s %10s %11s %9s %8s %7s %12s %12s\n", "configuration", "tokens/s", "ratio",
              "paired", "step_ms", "min_ms", "user_ms", "sys_ms", "device_MiB", "offload_MiB", "peak_RSS", "faults", "inv_cs",
              "traffic_MiB", "expected_MiB");
  for (const auto& c : cases) {
    const Case* base = nullptr;  // on-device, same optimizer and clip
    for (const auto& b : cases)
      if (!b->offload && b->clip == c->clip && b->name.substr(0, b->name.find(' ')) == c->name.substr(0, c->name.find(' ')))
        base = b.get();
    const double med = median(c->secs), tps = tokens_per_step / med;
    const double ratio = base != nullptr ? median(base->secs) / med : 1;
    const double steps = static_cast<double>(c->secs.size());
    std::printf("%-26s %9.1f %7.3f %7.3f %8.1f %8.1f %8.1f %8.1f %10.1f %11.1f %9s %8.0f %7.0f %12s %12s%s\n", c->name.c_str(),
                tps, ratio, median(c->paired), 1000 * med, 1000 * *std::min_element(c->secs.begin(), c->secs.end()),
                1000 * c->user / steps, 1000 * c->sys / steps, c->plan_device / MiB,
                c->plan_offload / MiB, c->rss.peak > 0 ? fmt("%.1f", c->rss.peak / MiB).c_str() : "-", c->faults / steps,
                c->switches / steps, c->offload ? fmt("%.2f", (c->to_offload + c->to_device) / MiB).c_str() : "-",
                c->offload ? fmt("%.2f", c->expected_traffic / MiB).c_str() : "-",
                c->offload ? (c->traffic_ok ? "  (equal, every step)" : "  (DIFFERS)") : "");
  }
  std::printf("\nratio: the on-device step's median time (same optimizer and clip_norm) over this one's; paired: the median\n"
              "over the rounds of the same ratio within a round; user_ms, sys_ms: CPU time per timed step (all threads);\n"
              "faults, inv_cs: minor page faults and involuntary context switches per timed step (getrusage);\n"
              "traffic: tier_traffic() of every timed step against the plan's gradient bytes\n");
  if (a.rss) {
    std::printf("\nresident memory of a process training the configuration alone (MiB): before the trainer, peak, after two "
                "steps (anonymous / file-backed)\n");
    for (const auto& c : cases)
      std::printf("  %-26s %8.1f %8.1f %8.1f (%.1f / %.1f); peak above the plan's device tier: %.1f\n", c->name.c_str(),
                  c->rss.before / MiB, c->rss.peak / MiB, c->rss.after / MiB, c->rss.anon / MiB, c->rss.file / MiB,
                  (c->rss.peak - c->plan_device) / MiB);
  }
  std::printf("\nthe fastest of %d traced steps each (ms): forward, loss, backward, after the last compute step, the step; the update "
              "thread busy (of which before the backward's end)\n", traced_steps);
  for (const auto& c : cases) {
    const Phases p = phases_of(*c);
    std::printf("  %-26s %8.1f %8.1f %8.1f %8.1f %8.1f", c->name.c_str(), 1000 * p.forward, 1000 * p.loss, 1000 * p.backward,
                1000 * p.after, 1000 * p.wall);
    if (c->offload && p.update_busy > 0) std::printf("   update thread %8.1f (%.1f)", 1000 * p.update_busy, 1000 * p.update_in_backward);
    std::printf("\n");
  }
  if (!a.svg.empty()) {
    std::vector<const Case*> rows;
    for (const auto& c : cases)
      if (c->name.rfind("AdamW ", 0) == 0 || (a.optim == "adamw8bit"))
        if ((c->offload && c->name.find(" params ") == std::string::npos) || c->clip == 0) rows.push_back(c.get());
    const std::string caption = "GPT-2 shape d 768, 4 layers, B4 T256, " + std::string(rows.empty() ? "" : rows[0]->name.substr(0, rows[0]->name.find(' '))) +
                                ", " + std::to_string(a.threads) + " compute thread(s), " + cpu + " (" +
                                std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + " cores); the fastest of " +
                                std::to_string(traced_steps) + " traced steps each";
    if (!write_svg(a.svg, rows, caption, command)) {
      std::fprintf(stderr, "offload_bench: cannot write %s\n", a.svg.c_str());
      return 1;
    }
    std::printf("\ntimeline: %s\n", a.svg.c_str());
  }
  return 0;
}

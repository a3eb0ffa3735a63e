// Durable writes and what a writer may replace (io/durable.hpp): every file
// a writer puts at a path is fsync'ed before it is renamed into place, and
// its directory after; a writer replaces only a missing path or a file of its
// own kind. fsync is interposed here (it records which path each call
// flushed), so the evidence is the system calls themselves.
// own translation unit: it interposes fsync at global scope.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/io/dataset.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/train/host/trainer.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace {
std::mutex fsync_mutex;
std::vector<std::string>* fsync_log = nullptr;  // set while a test records
}  // namespace

// Every fsync in this executable passes through here: the path of the
// descriptor is recorded while a test records, then the real fsync runs.
extern "C" int fsync(int fd) {
  using Fn = int (*)(int);
  static Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "fsync"));
  {
    std::lock_guard<std::mutex> lock(fsync_mutex);
    if (fsync_log) {
      char buf[4096];
      const std::string link = "/proc/self/fd/" + std::to_string(fd);
      const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
      fsync_log->push_back(n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?"));
    }
  }
  return real(fd);
}

using namespace headroom;
using Catch::Contains;

namespace {
namespace fs = std::filesystem;
using headroom::test::TempDir;
using headroom::test::write_file;

// Records the paths fsync'ed while it lives.
struct FsyncRecorder {
  std::vector<std::string> paths;
  FsyncRecorder() {
    std::lock_guard<std::mutex> lock(fsync_mutex);
    fsync_log = &paths;
  }
  ~FsyncRecorder() {
    std::lock_guard<std::mutex> lock(fsync_mutex);
    fsync_log = nullptr;
  }
  // Index of the first fsync of `p` (canonical), or -1.
  long index_of(const fs::path& p) const {
    const std::string want = fs::weakly_canonical(p).string();
    std::lock_guard<std::mutex> lock(fsync_mutex);
    const auto it = std::find(paths.begin(), paths.end(), want);
    return it == paths.end() ? -1 : static_cast<long>(it - paths.begin());
  }
  // Index of the first fsync of a file whose path is `pattern`, in which
  // "<random>" stands for the 12 random characters [a-z0-9] of a writer's
  // own names (io/durable.hpp), or -1. The path's directory is made canonical.
  long index_of_pattern(const fs::path& pattern) const {
    const std::string want = (fs::weakly_canonical(pattern.parent_path()) / pattern.filename()).string();
    std::lock_guard<std::mutex> lock(fsync_mutex);
    const auto it = std::find_if(paths.begin(), paths.end(), [&](const std::string& p) { return matches(p, want); });
    return it == paths.end() ? -1 : static_cast<long>(it - paths.begin());
  }
  // Whether `path` is `pattern` with each "<random>" 12 characters of [a-z0-9].
  static bool matches(std::string_view path, std::string_view pattern) {
    constexpr std::string_view random = "<random>";
    while (!pattern.empty()) {
      if (pattern.substr(0, random.size()) == random) {
        if (path.size() < 12) return false;
        for (const char c : path.substr(0, 12))
          if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
        path.remove_prefix(12);
        pattern.remove_prefix(random.size());
      } else {
        if (path.empty() || path[0] != pattern[0]) return false;
        path.remove_prefix(1);
        pattern.remove_prefix(1);
      }
    }
    return path.empty();
  }
  // Index of the first fsync of the temporary a writer of `target` writes
  // ("<target>.headroom-tmp-<random>"), or -1.
  long index_of_temporary(const fs::path& target) const {
    return index_of_pattern(target.string() + ".headroom-tmp-<random>");
  }
  // Index of the last fsync of `p`, or -1.
  long last_index_of(const fs::path& p) const {
    const std::string want = fs::weakly_canonical(p).string();
    std::lock_guard<std::mutex> lock(fsync_mutex);
    const auto it = std::find(paths.rbegin(), paths.rend(), want);
    return it == paths.rend() ? -1 : static_cast<long>(paths.rend() - it - 1);
  }
};

// The entries of a directory, by name.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

constexpr models::LlamaConfig llama_io{48, 64, 128, 2, 4, 2, 64, false};
using LoRARun = Train<models::Llama<llama_io, Apply<LoRA<4>, On<q_proj, v_proj>>>, Batch<2>, Seq<12>, Precision<DType::F32>, AdamW>;

const std::vector<float> one_tensor_values = {1, 2, 3, 4};
std::vector<io::TensorView> one_tensor() { return {io::TensorView{"w", DType::F32, {2, 2}, one_tensor_values.data()}}; }

}  // namespace

TEST_CASE("durable: write_safetensors fsyncs the file before its rename and the directory after", "[io][durable]") {
  TempDir tmp;
  const fs::path path = tmp / "model.safetensors";
  FsyncRecorder rec;
  io::write_safetensors(path, one_tensor());
  const long file = rec.index_of_temporary(path);  // flushed under its temporary name, before the rename
  const long dir = rec.last_index_of(tmp.dir);
  CHECK(file >= 0);
  CHECK(dir > file);
  CHECK(io::SafetensorsFile(path).tensors().size() == 1);
}

TEST_CASE("durable: export_adapter, save_pretrained and save_merged fsync every file and the directory", "[io][durable]") {
  TempDir tmp;
  host::Trainer<LoRARun> t({.seed = 3});
  FsyncRecorder rec;
  io::export_adapter(t, tmp / "adapter", "base");
  CHECK(rec.index_of_temporary(tmp / "adapter" / "adapter_model.safetensors") >= 0);
  CHECK(rec.index_of_temporary(tmp / "adapter" / "adapter_config.json") >= 0);
  CHECK(rec.last_index_of(tmp / "adapter") > rec.index_of_temporary(tmp / "adapter" / "adapter_config.json"));
  io::save_pretrained(t, tmp / "model.safetensors");
  CHECK(rec.index_of_temporary(tmp / "model.safetensors") >= 0);
  io::save_merged(t, tmp / "merged.safetensors");
  CHECK(rec.index_of_temporary(tmp / "merged.safetensors") >= 0);
  CHECK(rec.last_index_of(tmp.dir) > rec.index_of_temporary(tmp / "merged.safetensors"));
}

TEST_CASE("durable: write_tokens fsyncs the file before its rename and the directory after", "[io][durable]") {
  TempDir tmp;
  const fs::path path = tmp / "train.tok";
  const std::vector<std::int32_t> ids = {1, 2, 3, 40};
  FsyncRecorder rec;
  io::write_tokens(path, ids, 48);
  CHECK(rec.index_of_temporary(path) >= 0);
  CHECK(rec.last_index_of(tmp.dir) > rec.index_of_temporary(path));
  CHECK(io::TokenFile(path).size() == 4);
}

TEST_CASE("durable: save_checkpoint fsyncs its files, the staging directory and the parent", "[io][durable]") {
  TempDir tmp;
  host::Trainer<LoRARun> t({.seed = 4});
  FsyncRecorder rec;
  io::save_checkpoint(t, tmp / "ckpt");
  const fs::path staging = tmp / "ckpt.headroom-saving-<random>";
  // the files were flushed under the staging directory's name, before the swap
  CHECK(rec.index_of_pattern(staging / "model.safetensors.headroom-tmp-<random>") >= 0);
  CHECK(rec.index_of_pattern(staging / "optimizer.safetensors.headroom-tmp-<random>") >= 0);
  CHECK(rec.index_of_pattern(staging / "trainer.json.headroom-tmp-<random>") >= 0);
  CHECK(rec.index_of(tmp.dir) >= 0);
}

TEST_CASE("durable: write_safetensors replaces only a missing path or a safetensors file", "[io][durable]") {
  TempDir tmp;
  SECTION("a safetensors file is replaced") {
    const fs::path path = tmp / "model.safetensors";
    io::write_safetensors(path, one_tensor());
    const std::vector<float> other = {9, 9};
    io::write_safetensors(path, {io::TensorView{"v", DType::F32, {2}, other.data()}});
    CHECK(io::SafetensorsFile(path).find("v") != nullptr);
  }
  SECTION("a text file is left as it was") {
    const fs::path notes = tmp / "notes.txt";
    write_file(notes, "do not lose me");
    REQUIRE_THROWS_AS(io::write_safetensors(notes, one_tensor()), io::overwrite_refused);
    REQUIRE_THROWS_WITH(io::write_safetensors(notes, one_tensor()),
                        Contains("notes.txt exists and is not a safetensors file") && Contains("nothing was written"));
    CHECK(read_text(notes) == "do not lose me");
    CHECK(names_in(tmp.dir) == std::vector<std::string>{"notes.txt"});  // no temporary was made
  }
  SECTION("a directory is left as it was") {
    const fs::path dir = tmp / "out";
    fs::create_directories(dir);
    write_file(dir / "a.txt", "a");
    REQUIRE_THROWS_WITH(io::write_safetensors(dir, one_tensor()), Contains("is a directory, not a safetensors file"));
    CHECK(read_text(dir / "a.txt") == "a");
  }
  SECTION("save_pretrained onto a checkpoint directory is refused") {
    host::Trainer<LoRARun> t({.seed = 5});
    io::save_checkpoint(t, tmp / "ckpt");
    REQUIRE_THROWS_AS(io::save_pretrained(t, tmp / "ckpt"), io::overwrite_refused);
    host::Trainer<LoRARun> u({.seed = 6});
    io::load_checkpoint(u, tmp / "ckpt");
  }
}

TEST_CASE("durable: export_adapter writes nothing unless both of its files may be replaced", "[io][durable]") {
  TempDir tmp;
  host::Trainer<LoRARun> t({.seed = 7});
  const fs::path dir = tmp / "adapter";
  SECTION("someone's adapter_config.json") {
    fs::create_directories(dir);
    write_file(dir / "adapter_config.json", "my notes");
    REQUIRE_THROWS_WITH(io::export_adapter(t, dir, "base"), Contains("adapter_config.json exists and is not a PEFT adapter config"));
    CHECK(read_text(dir / "adapter_config.json") == "my notes");
    CHECK_FALSE(fs::exists(dir / "adapter_model.safetensors"));
  }
  SECTION("a file where the folder should be") {
    write_file(dir, "a file");
    REQUIRE_THROWS_WITH(io::export_adapter(t, dir, "base"), Contains("exists and is not a directory"));
    CHECK(read_text(dir) == "a file");
  }
  SECTION("an earlier export is replaced") {
    io::export_adapter(t, dir, "base");
    io::export_adapter(t, dir, "base2");
    CHECK_THAT(read_text(dir / "adapter_config.json"), Contains("\"base2\""));
  }
}

TEST_CASE("durable: a write the file system refuses is reported with the system's reason, the old file kept", "[io][durable]") {
  TempDir tmp;
  const fs::path path = tmp / "model.safetensors";
  io::write_safetensors(path, one_tensor());
  const std::string before = read_text(path);
  std::vector<float> big(1 << 20, 0.5f);  // 4 MiB
  // a file system too small for it: the process's file-size limit at 64 KiB (EFBIG, "File too large")
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails instead of the process stopping
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message = "(no error)";
  try {
    io::write_safetensors(path, {io::TensorView{"big", DType::F32, {1 << 20}, big.data()}});
  } catch (const std::exception& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, handler);
  CHECK_THAT(message, Contains(path.string()) && Contains("write failed") && Contains(std::strerror(EFBIG)));
  CHECK(read_text(path) == before);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.dir)) names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"model.safetensors"});  // no temporary left
}

TEST_CASE("durable: a writer leaves a file or a link named like a temporary of its target alone", "[io][durable]") {
  TempDir tmp;
  host::Trainer<LoRARun> t({.seed = 8});
  const fs::path path = tmp / "model.safetensors";
  SECTION("the user's own <path>.tmp") {
    write_file(path.string() + ".tmp", "my notes");
    io::save_pretrained(t, path);
    io::save_pretrained(t, path);  // over the first
    CHECK(read_text(path.string() + ".tmp") == "my notes");
    CHECK(names_in(tmp.dir) == std::vector<std::string>{"model.safetensors", "model.safetensors.tmp"});
    CHECK(io::SafetensorsFile(path).tensors().size() > 0);
  }
  SECTION("a link named <path>.tmp to another file: the model is not written through it") {
    write_file(tmp / "precious.txt", "do not lose me");
    fs::create_symlink(tmp / "precious.txt", path.string() + ".tmp");
    io::save_pretrained(t, path);
    CHECK(read_text(tmp / "precious.txt") == "do not lose me");
    CHECK(fs::is_symlink(path.string() + ".tmp"));
    CHECK(fs::read_symlink(path.string() + ".tmp") == tmp / "precious.txt");
    CHECK(names_in(tmp.dir) == std::vector<std::string>{"model.safetensors", "model.safetensors.tmp", "precious.txt"});
  }
  SECTION("token files and dangling links too") {
    fs::create_symlink(tmp / "nowhere", tmp / "train.tok.tmp");
    io::write_tokens(tmp / "train.tok", std::vector<std::int32_t>{1, 2, 3}, 48);
    CHECK(fs::is_symlink(tmp / "train.tok.tmp"));
    CHECK_FALSE(fs::exists(tmp / "nowhere"));
    CHECK(names_in(tmp.dir) == std::vector<std::string>{"train.tok", "train.tok.tmp"});
  }
}

TEST_CASE("durable: what a killed writer left is cleared by the next write of the same target, nothing else", "[io][durable]") {
  TempDir tmp;
  const fs::path path = tmp / "model.safetensors";
  const std::string left = path.string() + ".headroom-tmp-";
  write_file(left + "a1b2c3d4e5f6", "half a model");                      // a killed writer's
  write_file(left + "A1B2C3D4E5F6", "not the writer's alphabet");          // not its name
  write_file(left + "a1b2c3", "too short");                                // not its name
  write_file(tmp / "other.safetensors.headroom-tmp-a1b2c3d4e5f6", "x");    // another target's
  fs::create_directory(left + "b1b2c3d4e5f6");                             // a directory
  write_file(tmp / "target.txt", "kept");
  fs::create_symlink(tmp / "target.txt", left + "c1b2c3d4e5f6");          // a link
  write_file(left + "d1b2c3d4e5f6", "a live writer's");                    // locked: its writer is at work
  const int live = ::open((left + "d1b2c3d4e5f6").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(live >= 0);
  REQUIRE(::flock(live, LOCK_EX) == 0);
  io::write_safetensors(path, one_tensor());
  ::close(live);
  CHECK(names_in(tmp.dir) == std::vector<std::string>{
                                 "model.safetensors", "model.safetensors.headroom-tmp-A1B2C3D4E5F6",
                                 "model.safetensors.headroom-tmp-a1b2c3", "model.safetensors.headroom-tmp-b1b2c3d4e5f6",
                                 "model.safetensors.headroom-tmp-c1b2c3d4e5f6", "model.safetensors.headroom-tmp-d1b2c3d4e5f6", "other.safetensors.headroom-tmp-a1b2c3d4e5f6",
                                 "target.txt"});
  CHECK(read_text(tmp / "target.txt") == "kept");
  CHECK(io::SafetensorsFile(path).tensors().size() == 1);
}

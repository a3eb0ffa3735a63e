// Token files and the data set: the file layout byte for byte, the split,
// deterministic training batches (the generator scheme pinned), targets as the
// next tokens, validation windows, the unigram baseline on a hand-computed
// example, tokenizing a text file into a cached token file, and every bad input
// (with its message).
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/io/dataset.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>

namespace {
using headroom::test::TempDir;
using headroom::test::write_file;

namespace fs = std::filesystem;
using headroom::io::ByteTokenizer;
using headroom::io::data_error;
using headroom::io::overwrite_refused;
using headroom::io::TokenDataset;
using headroom::io::TokenFile;
using headroom::io::write_tokens;

// How many writers' temporaries ("<file>.headroom-tmp-<random>", io/durable.hpp) `dir` holds.
int temporaries_in(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".headroom-tmp-") != std::string::npos;
  return n;
}
using Catch::Contains;
using Ids = std::vector<std::int32_t>;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string le(std::uint64_t v, int bytes) {
  std::string s(static_cast<std::size_t>(bytes), '\0');
  for (int i = 0; i < bytes; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A token file header as the format describes it.
std::string header(std::uint32_t esize, std::uint32_t vocab, std::uint64_t count,
                   std::string magic = std::string("HRTOK1\0\0", 8)) {
  return magic + le(esize, 4) + le(vocab, 4) + le(count, 8);
}

// ids 0, 1, ..., n-1: a token's value is its position, so windows are easy to check.
Ids iota(std::size_t n) {
  Ids v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(i);
  return v;
}

TokenDataset make_dataset(const TempDir& tmp, const Ids& ids, std::uint64_t vocab, double fraction,
                          std::uint64_t seed = TokenDataset::default_seed) {
  const fs::path p = tmp / "data.tok";
  write_tokens(p, ids, vocab);
  return TokenDataset(TokenFile(p), fraction, seed);
}

}  // namespace

TEST_CASE("token file: layout byte for byte, 2- and 4-byte elements", "[io][dataset]") {
  const TempDir tmp;
  SECTION("vocab <= 65536: u16 elements") {
    write_tokens(tmp / "a.tok", Ids{1, 258, 65535}, 65536);
    CHECK(read_bytes(tmp / "a.tok") == header(2, 65536, 3) + le(1, 2) + le(258, 2) + le(65535, 2));
    const TokenFile f(tmp / "a.tok");
    CHECK(f.size() == 3);
    CHECK(f.element_size() == 2);
    CHECK(f.vocab_size() == 65536);
    CHECK(f[0] == 1);
    CHECK(f[1] == 258);
    CHECK(f[2] == 65535);
    CHECK(f.raw().size() == 6);
  }
  SECTION("vocab > 65536: u32 elements") {
    write_tokens(tmp / "b.tok", Ids{70000, 0, 65536}, 70001);
    CHECK(read_bytes(tmp / "b.tok") == header(4, 70001, 3) + le(70000, 4) + le(0, 4) + le(65536, 4));
    const TokenFile f(tmp / "b.tok");
    CHECK(f.element_size() == 4);
    Ids out(3);
    f.copy(0, 3, out.data());
    CHECK(out == Ids{70000, 0, 65536});
  }
  SECTION("writing is atomic: no temporary left, an old file is replaced whole") {
    write_tokens(tmp / "c.tok", iota(100), 256);
    write_tokens(tmp / "c.tok", Ids{7}, 256);
    CHECK(TokenFile(tmp / "c.tok").size() == 1);
    CHECK(temporaries_in(tmp.dir) == 0);
  }
  SECTION("an id outside the vocabulary is refused, naming the file") {
    REQUIRE_THROWS_WITH(write_tokens(tmp / "d.tok", Ids{3, 256}, 256),
                        Contains("d.tok") && Contains("token id 256 at position 1"));
    CHECK_FALSE(fs::exists(tmp / "d.tok"));
  }
  SECTION("a moved-from file gives up its mapping") {
    write_tokens(tmp / "e.tok", iota(5), 256);
    TokenFile a(tmp / "e.tok");
    TokenFile b(std::move(a));
    CHECK(b.size() == 5);
    CHECK(b[4] == 4);
  }
}

TEST_CASE("token file: write_tokens replaces only a missing path or a token file", "[io][dataset]") {
  const TempDir tmp;
  const fs::path p = tmp / "out.tok";
  SECTION("a directory is refused, and left as it was") {
    fs::create_directory(p);
    write_file(p / "inside.txt", "keep");
    REQUIRE_THROWS_AS(write_tokens(p, Ids{1, 2}, 256), overwrite_refused);
    REQUIRE_THROWS_WITH(write_tokens(p, Ids{1, 2}, 256),
                        Contains("write_tokens: " + p.string() + " is a directory") && Contains("nothing was written"));
    CHECK(fs::is_directory(p));
    CHECK(read_bytes(p / "inside.txt") == "keep");
    CHECK(temporaries_in(tmp.dir) == 0);
  }
  SECTION("a file of another kind is refused, and left as it was") {
    write_file(p, "my notes, not tokens");
    REQUIRE_THROWS_AS(write_tokens(p, Ids{1, 2}, 256), overwrite_refused);
    REQUIRE_THROWS_WITH(write_tokens(p, Ids{1, 2}, 256),
                        Contains(p.string() + " exists and is not a headroom token file"));
    CHECK(read_bytes(p) == "my notes, not tokens");
    write_file(p, "HRTOK");  // shorter than the magic
    REQUIRE_THROWS_AS(write_tokens(p, Ids{1}, 256), overwrite_refused);
    CHECK(read_bytes(p) == "HRTOK");
    CHECK(temporaries_in(tmp.dir) == 0);
  }
  SECTION("a token file, even a broken one, is replaced") {
    write_file(p, header(2, 256, 9) + "xy");  // the magic, then a truncated body
    REQUIRE_THROWS_AS(TokenFile(p), data_error);
    write_tokens(p, Ids{4, 5}, 256);
    CHECK(read_bytes(p) == header(2, 256, 2) + le(4, 2) + le(5, 2));
  }
  SECTION("a bad id leaves an existing file as it was") {
    write_tokens(p, Ids{7}, 256);
    REQUIRE_THROWS_AS(write_tokens(p, Ids{300}, 256), data_error);
    CHECK(TokenFile(p)[0] == 7);
  }
}

TEST_CASE("token file: every bad file is refused with its reason and its name", "[io][dataset]") {
  const TempDir tmp;
  const fs::path p = tmp / "bad.tok";

  REQUIRE_THROWS_WITH(TokenFile(tmp / "missing.tok"), Contains("missing.tok") && Contains("cannot open"));

  fs::create_directory(tmp / "dir.tok");
  REQUIRE_THROWS_WITH(TokenFile(tmp / "dir.tok"), Contains("dir.tok: is a directory, not a token file"));
  REQUIRE(::mkfifo((tmp / "fifo.tok").c_str(), 0600) == 0);  // opened without waiting for a writer
  REQUIRE_THROWS_WITH(TokenFile(tmp / "fifo.tok"), Contains("fifo.tok: is not a regular file"));

  write_file(p, "");
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("bad.tok") && Contains("empty"));

  write_file(p, header(2, 256, 0).substr(0, 10));
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("bad.tok") && Contains("truncated: 10 bytes") &&
                                         Contains("24-byte header"));

  write_file(p, header(2, 256, 4) + le(1, 2) + le(2, 2));  // 2 of 4 tokens
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("bad.tok") && Contains("truncated") && Contains("4 tokens") &&
                                         Contains("needs 32 bytes") && Contains("the file has 28 bytes"));

  write_file(p, header(2, 256, 1) + le(1, 2) + "x");
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("trailing bytes") && Contains("needs 26 bytes"));

  write_file(p, header(2, 256, 1, std::string("GGUF\0\0\0\0", 8)) + le(1, 2));
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("bad.tok") && Contains("bad magic"));

  write_file(p, header(3, 256, 1) + "abc");
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("element size 3"));

  write_file(p, header(2, 70000, 1) + le(1, 2));
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("vocab size 70000") && Contains("2-byte"));

  write_file(p, header(2, 0, 0));
  REQUIRE_THROWS_WITH(TokenFile(p), Contains("vocab size 0"));

  // an id beyond the header's vocabulary: found when the data set counts tokens
  write_file(p, header(2, 4, 3) + le(1, 2) + le(9, 2) + le(2, 2));
  REQUIRE_NOTHROW(TokenFile(p));
  REQUIRE_THROWS_WITH(TokenDataset(TokenFile(p), 0.5),
                      Contains("bad.tok") && Contains("token id 9 at position 1") && Contains("[0, 4)"));
}

TEST_CASE("data set: the split is head / tail at floor(fraction * size)", "[io][dataset]") {
  const TempDir tmp;
  const auto ds = make_dataset(tmp, iota(100), 256, 0.1);
  CHECK(ds.size() == 100);
  CHECK(ds.train_size() == 90);
  CHECK(ds.validation_size() == 10);
  CHECK(ds.vocab_size() == 256);
  const auto small = make_dataset(tmp, iota(10), 256, 0.25);  // floor(2.5) = 2
  CHECK(small.train_size() == 8);
  CHECK(small.validation_size() == 2);

  REQUIRE_THROWS_WITH(make_dataset(tmp, iota(10), 256, 0.05),
                      Contains("data.tok") && Contains("of 10 tokens leaves the validation split empty"));
  REQUIRE_THROWS_WITH(make_dataset(tmp, iota(10), 256, 1.0), Contains("must lie in (0, 1)"));
  REQUIRE_THROWS_WITH(make_dataset(tmp, iota(10), 256, 0.0), Contains("must lie in (0, 1)"));
  REQUIRE_THROWS_WITH(make_dataset(tmp, Ids{}, 256, 0.1), Contains("data.tok") && Contains("empty (0 tokens)"));
}

TEST_CASE("data set: training batches are windows of the train split, targets shifted by one", "[io][dataset]") {
  const TempDir tmp;
  constexpr std::size_t B = 4, T = 8;
  auto ds = make_dataset(tmp, iota(1000), 1000, 0.2);  // train [0, 800)
  std::vector<std::int32_t> tokens(B * T), targets(B * T);  // (B, T) each
  for (int step = 0; step < 50; ++step) {
    ds.next_batch(tokens.data(), targets.data(), B, T);
    for (std::size_t b = 0; b < B; ++b) {
      const std::int32_t o = tokens[b * T];
      CHECK(o >= 0);
      CHECK(o + static_cast<std::int32_t>(T) < 800);  // the last target is still in the train split
      for (std::size_t t = 0; t < T; ++t) {
        CHECK(tokens[b * T + t] == o + static_cast<std::int32_t>(t));
        CHECK(targets[b * T + t] == o + static_cast<std::int32_t>(t) + 1);
      }
    }
  }
}

TEST_CASE("data set: batches are deterministic for a seed, and the scheme is pinned", "[io][dataset]") {
  const TempDir tmp;
  constexpr std::size_t B = 3, T = 4;
  const Ids ids = iota(100);
  auto a = make_dataset(tmp, ids, 256, 0.2);  // train 80: offsets uniform in [0, 76)
  std::vector<std::int32_t> ta(B * T), ya(B * T), tb(B * T), yb(B * T);

  // offset k = (k-th output of std::mt19937_64(seed)) mod windows, when that output is not
  // rejected (rejection needs an output below 2^64 mod 76 = 16: never, in practice)
  std::mt19937_64 reference(TokenDataset::default_seed);
  a.next_batch(ta.data(), ya.data(), B, T);
  for (std::size_t b = 0; b < B; ++b) CHECK(static_cast<std::uint64_t>(ta[b * T]) == reference() % 76);
  CHECK(ta[0] == 60);  // seed 1234: std::mt19937_64 output 17473339210090333472, mod 76

  SECTION("same seed, same batches; reseed replays") {
    auto b = make_dataset(tmp, ids, 256, 0.2);
    b.next_batch(tb.data(), yb.data(), B, T);
    CHECK(ta == tb);
    CHECK(ya == yb);
    a.reseed(TokenDataset::default_seed);
    a.next_batch(tb.data(), yb.data(), B, T);
    CHECK(ta == tb);
  }
  SECTION("another seed, other batches") {
    auto c = make_dataset(tmp, ids, 256, 0.2, 99);
    c.next_batch(tb.data(), yb.data(), B, T);
    CHECK(ta != tb);
  }
  SECTION("every window is reachable, the extremes included") {
    auto d = make_dataset(tmp, iota(15), 256, 0.2);  // train 12, T = 4: offsets 0..7
    std::set<std::int32_t> seen;
    std::int32_t t1[4], y1[4];
    for (int i = 0; i < 400; ++i) {
      d.next_batch(t1, y1, 1, 4);
      seen.insert(t1[0]);
    }
    CHECK(seen == std::set<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  }
}

TEST_CASE("data set: too short a split for T + 1 tokens is an error naming the sizes", "[io][dataset]") {
  const TempDir tmp;
  auto ds = make_dataset(tmp, iota(10), 256, 0.5);  // train 5, validation 5
  std::int32_t tokens[8], targets[8];
  REQUIRE_NOTHROW(ds.next_batch(tokens, targets, 1, 4));  // 5 tokens = one window of T + 1
  REQUIRE_THROWS_WITH(ds.next_batch(tokens, targets, 1, 5),
                      Contains("data.tok") && Contains("training split has 5 tokens") && Contains("T + 1 = 6"));
  REQUIRE_THROWS_WITH(ds.next_batch(tokens, targets, 0, 4), Contains("B = 0"));
  REQUIRE_THROWS_WITH(ds.validation_batches(1, 5),
                      Contains("data.tok") && Contains("validation split has 5 tokens") && Contains("T + 1 = 6"));
}

TEST_CASE("data set: validation batches are consecutive windows over the tail", "[io][dataset]") {
  const TempDir tmp;
  const auto ds = make_dataset(tmp, iota(100), 256, 0.2);  // validation [80, 100): 20 tokens
  // windows of T + 1 = 5 tokens start at 80, 84, 88, 92 ((20 - 1) / 4 = 4 windows); B = 2: 2 batches
  const auto val = ds.validation_batches(2, 4);
  REQUIRE(val.size() == 2);
  std::vector<std::int32_t> tokens(8), targets(8);  // (B, T) each
  val.fill(0, tokens.data(), targets.data());
  CHECK(tokens == Ids{80, 81, 82, 83, 84, 85, 86, 87});
  CHECK(targets == Ids{81, 82, 83, 84, 85, 86, 87, 88});
  val.fill(1, tokens.data(), targets.data());
  CHECK(tokens == Ids{88, 89, 90, 91, 92, 93, 94, 95});
  CHECK(targets == Ids{89, 90, 91, 92, 93, 94, 95, 96});
  REQUIRE_THROWS_WITH(val.fill(2, tokens.data(), targets.data()), Contains("validation batch 2 of 2"));

  CHECK(ds.validation_batches(1, 19).size() == 1);  // 20 tokens: exactly one window of 20
  REQUIRE_THROWS_WITH(ds.validation_batches(5, 4),
                      Contains("4 windows") && Contains("fewer than one batch of B = 5"));
}

TEST_CASE("data set: the unigram baseline, computed by hand", "[io][dataset]") {
  const TempDir tmp;
  // vocab 4; train = [0 0 1 2], validation = [0 3] (floor(0.34 * 6) = 2)
  // add-one: p(v) = (count(v) + 1) / (4 + 4): p(0) = 3/8, p(3) = 1/8
  const auto ds = make_dataset(tmp, Ids{0, 0, 1, 2, 0, 3}, 4, 0.34);
  REQUIRE(ds.validation_size() == 2);
  CHECK(ds.unigram_loss() == Approx(-(std::log(3.0 / 8) + std::log(1.0 / 8)) / 2).epsilon(1e-12));

  // a uniform training split over the whole vocabulary gives ln V
  const auto uniform = make_dataset(tmp, Ids{0, 1, 2, 3, 0, 1, 2, 3, 1, 2}, 4, 0.2);
  CHECK(uniform.unigram_loss() == Approx(std::log(4.0)).epsilon(1e-12));
}

TEST_CASE("data set: a header's vocab size sizes nothing the file does not back", "[io][dataset]") {
  const TempDir tmp;
  // vocab 2^32 - 1 in a 44-byte file (5 tokens of 4 bytes): once a table of 8 bytes per id, 32 GiB
  // and std::bad_alloc. train = [5 5 7 1000000], validation = [9]: p(9) = 1 / (4 + V)
  const double V = 4294967295.0;
  const auto huge = make_dataset(tmp, Ids{5, 5, 7, 1000000, 9}, 4294967295u, 0.2);
  CHECK(fs::file_size(tmp / "data.tok") == 44);
  REQUIRE(huge.validation_size() == 1);
  CHECK(huge.unigram_loss() == Approx(std::log(4 + V)).epsilon(1e-12));

  // vocab 2^29 (4 GiB as such a table, 4.2 GB resident once filled): the process's peak resident
  // set grows by far less. train = [3 3 2^29-1 3 8], validation = [3 8]: p(3) = 4 / (5 + V), p(8) = 2 / (5 + V)
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const double V2 = 536870912.0;
  const auto big = make_dataset(tmp, Ids{3, 3, 536870911, 3, 8, 3, 8}, 536870912u, 0.3);
  REQUIRE(big.validation_size() == 2);
  CHECK(big.unigram_loss() == Approx(-(std::log(4 / (5 + V2)) + std::log(2 / (5 + V2))) / 2).epsilon(1e-12));
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  CHECK(after.ru_maxrss - before.ru_maxrss < 256 * 1024);  // KiB

  // the dense table and the sorted ids agree: the same ids under a vocabulary on either side of the bound
  // (tokens + 65,536 = 65,556)
  Ids ids;
  std::mt19937 g(7);
  for (int i = 0; i < 20; ++i) ids.push_back(static_cast<std::int32_t>(g() % 50));
  const double dense = make_dataset(tmp, ids, 65556, 0.25).unigram_loss();
  const double sorted = make_dataset(tmp, ids, 65557, 0.25).unigram_loss();
  const double V3 = 65556.0;  // the sparse one's denominator is one larger: compare it by hand
  double by_hand = 0;
  for (std::size_t i = 15; i < 20; ++i) {
    double count = 0;
    for (std::size_t j = 0; j < 15; ++j) count += ids[j] == ids[i];
    by_hand -= std::log((count + 1) / (15 + V3 + 1));
  }
  CHECK(sorted == Approx(by_hand / 5).epsilon(1e-12));
  CHECK(dense == Approx(sorted - std::log(15 + V3 + 1) + std::log(15 + V3)).epsilon(1e-12));
}

TEST_CASE("data set from a text file: tokenized once, cached as a token file", "[io][dataset]") {
  const TempDir tmp;
  const fs::path text = tmp / "tiny.txt";
  const std::string content = "It is a truth universally acknowledged.\n";
  write_file(text, content);

  const auto ds = TokenDataset::from_text(text, ByteTokenizer{}, 0.25);
  const fs::path cache = tmp / "tiny.txt.byte.tok";
  REQUIRE(fs::exists(cache));
  CHECK(ds.size() == content.size());
  CHECK(ds.file()[0] == 'I');
  CHECK(ds.file().vocab_size() == 256);

  // a second call maps the cache without writing it again
  const auto stamp = fs::last_write_time(cache);
  const auto again = TokenDataset::from_text(text, ByteTokenizer{}, 0.25);
  CHECK(fs::last_write_time(cache) == stamp);
  CHECK(again.size() == content.size());

  // a broken cache (a token file cut short) is rebuilt
  write_file(cache, read_bytes(cache).substr(0, 30));
  CHECK(TokenDataset::from_text(text, ByteTokenizer{}, 0.25).size() == content.size());
  CHECK(TokenFile(cache).size() == content.size());

  // a file that is not a token file where the cache goes is refused, not overwritten
  write_file(cache, "junk");
  REQUIRE_THROWS_AS(TokenDataset::from_text(text, ByteTokenizer{}, 0.25), overwrite_refused);
  CHECK(read_bytes(cache) == "junk");
  fs::remove(cache);

  // or the cache goes into a given folder
  const auto elsewhere = TokenDataset::from_text(text, ByteTokenizer{}, 0.25, 7, tmp / "cache");
  CHECK(fs::exists(tmp / "cache" / "tiny.txt.byte.tok"));
  CHECK(elsewhere.size() == content.size());

  REQUIRE_THROWS_WITH(TokenDataset::from_text(tmp / "austen.txt", ByteTokenizer{}, 0.1),
                      Contains("austen.txt") && Contains("not found") && Contains("scripts/fetch-corpus"));
  REQUIRE_THROWS_WITH(TokenDataset::from_text(tmp / "cache", ByteTokenizer{}, 0.1),
                      Contains("corpus: " + (tmp / "cache").string() + " is a directory, not a text file"));
  write_file(tmp / "empty.txt", "");
  REQUIRE_THROWS_WITH(TokenDataset::from_text(tmp / "empty.txt", ByteTokenizer{}, 0.1),
                      Contains("empty.txt.byte.tok") && Contains("empty (0 tokens)"));
}

// io::HfTokenizer's encode throughput on files: the headroom half of
// bench/tokenizer/vs-hf, which runs the tokenizers library on the same files.
//
//   tokenizer_json TOKENIZER_JSON FILE...
//
// Prints one line per FILE: name, bytes, tokens, the best of 3 encode() calls
// in seconds, MB/s (10^6 bytes); the load time of the tokenizer.json first.
#include <headroom/io/hf_tokenizer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_json TOKENIZER_JSON FILE...\n");
    return 2;
  }
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  try {
    const auto t0 = clock::now();
    const headroom::io::HfTokenizer tok{std::filesystem::path(argv[1])};
    std::printf("load\t%.3f s\n", seconds(clock::now() - t0));
    for (int f = 2; f < argc; ++f) {
      std::ifstream in(argv[f], std::ios::binary);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      double best = 1e300;
      std::size_t tokens = 0;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t = clock::now();
        tokens = tok.encode(text).size();
        best = std::min(best, seconds(clock::now() - t));
      }
      std::printf("%s\t%zu\t%zu\t%.4f\t%.2f\n", std::filesystem::path(argv[f]).filename().c_str(), text.size(), tokens,
                  best, static_cast<double>(text.size()) / best / 1e6);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_json: %s\n", e.what());
    return 1;
  }
  return 0;
}

// tokenize TOKENIZER_JSON FILE [--special] [--decode]
//
// Prints the token ids of FILE's text under a Hugging Face tokenizer.json, one
// per line, as the tokenizers library's encode(text, add_special_tokens=False)
// gives them; --special adds the post-processor's special tokens (BOS / EOS).
// With --decode, FILE holds ids (separated by whitespace) and the text they
// decode to is printed, special tokens included. FILE "-" is standard input.
//
//   tokenize models/tokenizer.json notes.txt > notes.ids
//   tokenize models/tokenizer.json notes.ids --decode
#include <headroom/io/hf_tokenizer.hpp>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::string read_all(const std::string& path) {
  if (path == "-") return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw headroom::io::data_error(path + ": cannot open the file");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& path) {
  std::vector<std::int32_t> ids;
  std::size_t line = 1;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      line += c == '\n';
      ++i;
      continue;
    }
    std::int32_t id = 0;
    const auto r = std::from_chars(text.data() + i, text.data() + text.size(), id);
    const std::size_t end = static_cast<std::size_t>(r.ptr - text.data());
    if (r.ec != std::errc() || (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))))
      throw headroom::io::data_error(path + ": line " + std::to_string(line) + ": expected a token id");
    ids.push_back(id);
    i = end;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> files;
  bool special = false, decode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--special") special = true;
    else if (a == "--decode") decode = true;
    else if (a.starts_with("--") && a.size() > 2) {
      std::cerr << "tokenize: unknown option " << a << "\n";
      return 2;
    } else files.push_back(a);
  }
  if (files.size() != 2) {
    std::cerr << "usage: tokenize TOKENIZER_JSON FILE [--special] [--decode]\n";
    return 2;
  }
  try {
    const headroom::io::HfTokenizer tok{std::filesystem::path(files[0])};
    const std::string path(files[1]);
    const std::string text = read_all(path);
    if (decode) {
      const std::string out = tok.decode(parse_ids(text, path));
      std::fwrite(out.data(), 1, out.size(), stdout);
      return 0;
    }
    std::string out;
    for (const std::int32_t id : tok.encode(text, {.add_special_tokens = special})) {
      out += std::to_string(id);
      out += '\n';
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  } catch (const std::exception& e) {
    std::cerr << "tokenize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

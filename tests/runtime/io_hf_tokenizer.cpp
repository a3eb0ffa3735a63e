// HfTokenizer on small tokenizer.json documents written here: each pipeline
// step's rule against expectations taken from the tokenizers library's own
// documentation (the split behaviours' "the-final--countdown" example, the
// added tokens' flags) or from the Unicode standard (U+FFFD for maximal
// subparts, Table 3-8), and every refusal with its message. The documents are
// valid for the reference library too, which gives the same ids. Equality with the
// reference library itself, on the real files, is tests/tokenizer/compare.sh
// (ctest tokenizer.reference.*).
#include <catch2/catch.hpp>

#include <headroom/io/dataset.hpp>
#include <headroom/io/hf_tokenizer.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using headroom::io::data_error;
using headroom::io::HfTokenizer;
using Catch::Matchers::Contains;
using Ids = std::vector<std::int32_t>;

// A vocab of the given tokens, ids in order.
std::string vocab_of(const std::vector<std::string>& tokens) {
  std::string v = "{";
  for (std::size_t i = 0; i < tokens.size(); ++i)
    v += (i ? ", \"" : "\"") + tokens[i] + "\": " + std::to_string(i);
  return v + "}";
}

struct Doc {
  explicit Doc(std::string v) : vocab(std::move(v)) {}
  std::string vocab;
  std::string merges = "[]";
  std::string model_extra;  // more members of the model, each with a leading ", "
  std::string normalizer = "null";
  std::string pre_tokenizer = "null";
  std::string added = "[]";
  std::string post_processor = "null";
  std::string decoder = "null";

  std::string json() const {
    return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": )" + added +
           R"(, "normalizer": )" + normalizer + R"(, "pre_tokenizer": )" + pre_tokenizer +
           R"(, "post_processor": )" + post_processor + R"(, "decoder": )" + decoder +
           R"(, "model": {"type": "BPE", "vocab": )" + vocab +
           R"(, "merges": )" + merges + model_extra + "}}";
  }
  HfTokenizer load() const { return HfTokenizer(json(), "test/tokenizer.json"); }
};

std::string split_on_dash(const char* behavior) {
  return std::string(R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")") + behavior +
         R"(", "invert": false})";
}

// Whole pieces are tokens (ignore_merges), so the ids show the pieces.
const std::vector<std::string> pieces_vocab = {"t", "h", "e", "f", "i", "n", "a", "l", "c", "o", "u", "d", "w", "-",
                                               "the", "final", "countdown", "the-", "final-", "-final", "-countdown",
                                               "--"};
std::vector<std::string> pieces(const HfTokenizer& tok, const std::string& text) {
  std::vector<std::string> out;
  for (const std::int32_t id : tok.encode(text)) out.push_back(pieces_vocab[static_cast<std::size_t>(id)]);
  return out;
}

}  // namespace

TEST_CASE("tokenizer.json Split: each behaviour cuts 'the-final--countdown' as the tokenizers docs say",
          "[io][hf_tokenizer]") {
  Doc d{vocab_of(pieces_vocab)};
  d.model_extra = R"(, "ignore_merges": true)";
  using V = std::vector<std::string>;
  d.pre_tokenizer = split_on_dash("Removed");
  CHECK(pieces(d.load(), "the-final--countdown") == V{"the", "final", "countdown"});
  d.pre_tokenizer = split_on_dash("Isolated");
  CHECK(pieces(d.load(), "the-final--countdown") == V{"the", "-", "final", "-", "-", "countdown"});
  d.pre_tokenizer = split_on_dash("MergedWithPrevious");
  CHECK(pieces(d.load(), "the-final--countdown") == V{"the-", "final-", "-", "countdown"});
  d.pre_tokenizer = split_on_dash("MergedWithNext");
  CHECK(pieces(d.load(), "the-final--countdown") == V{"the", "-final", "-", "-countdown"});
  d.pre_tokenizer = split_on_dash("Contiguous");
  CHECK(pieces(d.load(), "the-final--countdown") == V{"the", "-", "final", "--", "countdown"});
  // invert: the pattern's matches are the pieces kept apart, the rest the delimiters
  d.pre_tokenizer = R"({"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Removed", "invert": true})";
  CHECK(pieces(d.load(), "the-final--countdown") == V{"the", "final", "countdown"});
}

TEST_CASE("tokenizer.json BPE: merges by rank, leftmost first, ignore_merges, unknown characters",
          "[io][hf_tokenizer]") {
  //                         0    1    2    3     4     5
  Doc d{vocab_of({"a", "b", "c", "ab", "bc", "abc"})};
  d.merges = R"([["b", "c"], ["a", "bc"], ["a", "b"]])";
  // "abc": (b,c) has rank 0, so bc first, then (a,bc) -> abc; never ab
  CHECK(d.load().encode("abc") == Ids{5});
  // "aab": only (a,b) applies: a, ab
  CHECK(d.load().encode("aab") == Ids{0, 3});
  // "bcbc": two bc, equal rank: both merged
  CHECK(d.load().encode("bcbc") == Ids{4, 4});
  // a character outside the vocab, no unk_token, no byte fallback: dropped,
  // and its neighbours merge as if it had not been there
  CHECK(d.load().encode("axb") == Ids{3});
  // ignore_merges: a piece that is a token is that token, even against the merges' order
  Doc whole{vocab_of({"a", "b", "c", "ab", "abc"})};
  whole.merges = R"(["a b"])";
  CHECK(whole.load().encode("abc") == Ids{3, 2});
  whole.model_extra = R"(, "ignore_merges": true)";
  CHECK(whole.load().encode("abc") == Ids{4});
}

TEST_CASE("tokenizer.json BPE: byte fallback, then unk_token, fused or not", "[io][hf_tokenizer]") {
  std::vector<std::string> v = {"<unk>", "a"};
  for (const char* b : {"<0xC3>", "<0xA9>"}) v.push_back(b);  // the UTF-8 bytes of U+00E9
  Doc d{vocab_of(v)};
  d.model_extra = R"(, "unk_token": "<unk>", "byte_fallback": true)";
  d.decoder = R"({"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]})";
  const HfTokenizer tok = d.load();
  CHECK(tok.encode("a\xC3\xA9" "a") == Ids{1, 2, 3, 1});  // é -> <0xC3> <0xA9>
  CHECK(tok.decode(Ids{1, 2, 3, 1}) == "a\xC3\xA9" "a");
  // ü (C3 BC): <0xBC> missing, so the character is unk
  CHECK(tok.encode("\xC3\xBC\xC3\xBC" "a") == Ids{0, 0, 1});
  // a byte run that is not UTF-8 decodes to one U+FFFD per byte
  CHECK(tok.decode(Ids{2, 1}) == "\xEF\xBF\xBD" "a");
  Doc fused = d;
  fused.model_extra = R"(, "unk_token": "<unk>", "fuse_unk": true)";
  CHECK(fused.load().encode("\xC3\xBC\xC3\xBC" "a\xC3\xBC") == Ids{0, 1, 0});
}

TEST_CASE("tokenizer.json added tokens: longest first, lstrip / rstrip / single_word, special ones skipped on request",
          "[io][hf_tokenizer]") {
  Doc d{vocab_of({"a", "b", " ", "<", ">", "x"})};
  d.added = R"([{"id": 6, "content": "<x>", "special": true, "lstrip": false, "rstrip": false, "single_word": false, "normalized": false},
               {"id": 7, "content": "<x>>", "special": false, "lstrip": false, "rstrip": false, "single_word": false, "normalized": false},
               {"id": 8, "content": "ab", "special": false, "lstrip": false, "rstrip": false, "single_word": true, "normalized": false},
               {"id": 9, "content": "[s]", "special": true, "lstrip": true, "rstrip": true, "single_word": false, "normalized": false}])";
  const HfTokenizer tok = d.load();
  CHECK(tok.vocab_size() == 10);
  CHECK(tok.token_to_id("<x>>") == 7);
  CHECK(tok.encode("a<x>b") == Ids{0, 6, 1});
  CHECK(tok.encode("a<x>>b") == Ids{0, 7, 1});  // the longest at the leftmost place
  // single_word: "ab" alone is the added token; inside a word it is not
  CHECK(tok.encode("ab") == Ids{8});
  CHECK(tok.encode("a ab b") == Ids{0, 2, 8, 2, 1});
  CHECK(tok.encode("aab") == Ids{0, 0, 1});
  // lstrip / rstrip: the spaces around [s] go with it
  CHECK(tok.encode("a  [s]  b") == Ids{0, 9, 1});
  CHECK(tok.decode(Ids{0, 6, 1}) == "a <x> b");  // no decoder: tokens joined with spaces
  CHECK(tok.decode(Ids{0, 6, 1}, {.skip_special_tokens = true}) == "a b");
}

TEST_CASE("tokenizer.json normalizers and Metaspace, Digits, ByteLevel pre-tokenizers", "[io][hf_tokenizer]") {
  Doc d{vocab_of({"\xE2\x96\x81", "a", "b", "1", "2", "\xC3\xA9", "e", "\xE2\x96\x81" "a"})};  // ▁ a b 1 2 é e ▁a
  d.merges = R"([["\u2581", "a"]])";
  d.normalizer = R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Prepend", "prepend": "\u2581"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})";
  // NFC composes e + U+0301 into é before the model sees it
  CHECK(d.load().encode("a e\xCC\x81") == Ids{7, 0, 5});
  d.normalizer = "null";
  d.pre_tokenizer = R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})";
  d.added = R"([{"id": 8, "content": "<s>", "special": true, "lstrip": false, "rstrip": false, "single_word": false, "normalized": false}])";
  // "first": only the piece that begins the input gets the prefix
  CHECK(d.load().encode("a<s>a") == Ids{7, 8, 1});
  d.pre_tokenizer = R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true})";
  CHECK(d.load().encode("a<s>a") == Ids{7, 8, 7});
  d.decoder = R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"})";
  CHECK(d.load().decode(Ids{7, 0, 7}) == "a  a");  // the first token's replacement dropped
  d.pre_tokenizer = R"({"type": "Digits", "individual_digits": true})";
  d.decoder = "null";
  CHECK(d.load().encode("a12b") == Ids{1, 3, 4, 2});
  // ByteLevel maps each byte to GPT-2's printable alphabet (space -> U+0120)
  Doc bl{vocab_of({"a", "\xC4\xA0", "\xC4\xA0" "a"})};  // a, Ġ, Ġa
  bl.merges = R"(["\u0120 a"])";
  bl.pre_tokenizer = R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})";
  bl.decoder = R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})";
  CHECK(bl.load().encode("a a") == Ids{2, 2});  // " a" twice: the prefix space, then GPT-2's " ?\p{L}+"
  CHECK(bl.load().decode(Ids{2, 2}) == " a a");
}

TEST_CASE("tokenizer.json TemplateProcessing puts BOS / EOS around the ids when asked", "[io][hf_tokenizer]") {
  Doc d{vocab_of({"<s>", "</s>", "a"})};
  d.post_processor = R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}})";
  CHECK(d.load().encode("aa") == Ids{2, 2});
  CHECK(d.load().encode("aa", {.add_special_tokens = true}) == Ids{0, 2, 2, 1});
}

TEST_CASE("tokenizer.json decoders: invalid UTF-8 becomes U+FFFD per maximal subpart (Unicode Table 3-8)",
          "[io][hf_tokenizer]") {
  // The bytes 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 decode to
  // a FFFD FFFD FFFD b FFFD c FFFD FFFD d.
  std::vector<std::string> v;
  std::string all;
  for (const unsigned b : {0x61u, 0xF1u, 0x80u, 0xE1u, 0xC2u, 0x62u, 0x63u, 0xBFu, 0x64u}) {
    std::string s;
    s += static_cast<char>(b);
    std::string tok;
    for (const char c : s) {  // the byte's character in GPT-2's byte alphabet
      const char32_t cp = headroom::io::detail::gpt2::byte_to_unicode[static_cast<unsigned char>(c)];
      headroom::io::detail::append_utf8(tok, cp);
    }
    v.push_back(tok);
  }
  Doc d{vocab_of(v)};
  d.decoder = R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})";
  //                 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
  const Ids bytes = {0, 1, 2, 2, 3, 2, 4, 5, 2, 6, 2, 7, 8};
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(d.load().decode(bytes) == "a" + fffd + fffd + fffd + "b" + fffd + "c" + fffd + fffd + "d");
}

TEST_CASE("tokenizer.json refusals name the member and what is wrong", "[io][hf_tokenizer]") {
  const Doc base{vocab_of({"a", "b"})};
  const auto load_fails = [](const Doc& d, const std::string& a, const std::string& b) {
    REQUIRE_THROWS_AS(d.load(), data_error);
    REQUIRE_THROWS_WITH(d.load(), Contains("test/tokenizer.json") && Contains(a) && Contains(b));
  };
  Doc d = base;
  d.pre_tokenizer = R"({"type": "Whitespace"})";
  load_fails(d, "pre_tokenizer", "'Whitespace' is not supported");
  d = base;
  d.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": "Punctuation"}]})";
  load_fails(d, "pre_tokenizer.pretokenizers[1]", "'Punctuation'");
  d = base;
  d.normalizer = R"({"type": "Lowercase"})";
  load_fails(d, "normalizer", "'Lowercase' is not supported");
  d = base;
  d.decoder = R"({"type": "WordPiece", "prefix": "##"})";
  load_fails(d, "decoder", "'WordPiece' is not supported");
  d = base;
  d.post_processor = R"({"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]})";
  load_fails(d, "post_processor", "'BertProcessing' is not supported");
  d = base;
  d.model_extra = R"(, "dropout": 0.1)";
  load_fails(d, "model.dropout", "random");
  d = base;
  d.merges = R"(["a c"])";
  load_fails(d, "model.merges[0]", "'c' is not in the vocab");
  d = base;
  d.merges = R"(["a b"])";
  load_fails(d, "model.merges[0]", "the merged token 'ab' is not in the vocab");
  d = base;
  d.pre_tokenizer = R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})";
  load_fails(d, "pre_tokenizer.pattern", "does not compile");
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    std::string json = base.json();
    json.replace(json.find("\"BPE\""), 5, std::string("\"") + type + "\"");
    REQUIRE_THROWS_WITH(HfTokenizer(json, "test/tokenizer.json"),
                        Contains("model") && Contains(std::string("'") + type + "' is not supported"));
  }
  REQUIRE_THROWS_WITH(HfTokenizer("{\"model\": ", "test/tokenizer.json"),
                      Contains("test/tokenizer.json") && Contains("invalid JSON"));
  REQUIRE_THROWS_WITH(HfTokenizer(std::filesystem::path("/nonexistent/tokenizer.json")),
                      Contains("/nonexistent/tokenizer.json") && Contains("cannot open"));
  const HfTokenizer tok = base.load();
  REQUIRE_THROWS_WITH(tok.encode("ab\xFF"), Contains("not UTF-8") && Contains("byte 2"));
  REQUIRE_THROWS_WITH(tok.decode(Ids{0, 7}), Contains("token id 7 at position 1"));
}

TEST_CASE("tokenizer.json tokenizers feed TokenDataset like the others", "[io][hf_tokenizer]") {
  Doc d{vocab_of({"a", "b", " "})};
  const HfTokenizer tok = d.load();
  CHECK(tok.name().starts_with("hf-"));
  CHECK(tok.name().size() == 3 + 16);
  CHECK(Doc{vocab_of({"b", "a", " "})}.load().name() != tok.name());
  const auto dir = std::filesystem::temp_directory_path() / "headroom_hf_tokenizer_dataset";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "text.txt") << std::string(2000, 'a') + " " + std::string(2000, 'b');
  }
  const auto ds = headroom::io::TokenDataset::from_text(dir / "text.txt", tok, 0.1);
  CHECK(ds.vocab_size() == 3);
  std::filesystem::remove_all(dir);
}

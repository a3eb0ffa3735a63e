#pragma once
// tokenizer.json "pre_tokenizer": one normalized text -> the pieces the model
// tokenizes one by one.
//
//   Split {pattern: {String | Regex}, behavior, invert}
//       the pattern's matches cut each piece; behavior says where they go:
//       Isolated (pieces of their own), Removed, MergedWithPrevious,
//       MergedWithNext, Contiguous (adjacent matches one piece)
//   ByteLevel {add_prefix_space, use_regex}
//       a space before each piece that lacks one; with use_regex, GPT-2's
//       pattern splits ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+);
//       then each byte becomes one symbol of the byte alphabet (see below)
//   Digits {individual_digits}
//       numeric characters (Nd, Nl, No) split off: each alone, or each run
//   Metaspace {replacement, prepend_scheme: always | first | never, split}
//       spaces become the replacement, which is put before each piece
//       (always) or the input's first piece (first); with split, a piece
//       starts at every replacement character
//   Sequence {pretokenizers}
// Anything else is an error naming it. Empty pieces are dropped.
//
// The byte alphabet: ByteLevel maps each byte to a printable code point
// (GPT-2's bytes_to_unicode). When ByteLevel is the last step, as in every
// published file, the mapping is left to the model (PreTokenized::byte_level):
// it starts each piece from one symbol per byte, without building the mapped
// text.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fields.hpp"
#include "normalizer.hpp"
#include "regex.hpp"
#include "text.hpp"

namespace headroom::io::detail::hf {

// The pieces of one text: spans of `text`, which grows when a step rewrites a
// piece (the rewritten piece is appended and the span moves to it).
struct PreTokenized {
  struct Piece {
    std::uint32_t begin, end;
    bool at_input_start;  // begins where the encoded input begins
  };
  std::string text;
  std::vector<Piece> pieces;
  bool byte_level = false;  // the pieces are raw bytes, each one symbol of the byte alphabet

  std::string_view view(const Piece& p) const { return std::string_view(text).substr(p.begin, p.end - p.begin); }
};

// Where a pattern matched in a piece, and what lies between: consecutive
// spans covering the piece, in order.
struct Segment {
  std::size_t begin, end;
  bool is_match;
};

enum class SplitBehavior : std::uint8_t { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// The pieces `segments` make under `behavior`, as [begin, end) spans (empty
// ones included; the caller drops them).
inline void apply_behavior(std::vector<Segment>& segs, SplitBehavior behavior, std::vector<Segment>& out) {
  out.clear();
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Segment& s : segs)
        if (!s.is_match) out.push_back(s);
      return;
    case SplitBehavior::Isolated:
      out = segs;
      return;
    case SplitBehavior::Contiguous: {
      bool previous = false;
      for (const Segment& s : segs) {
        if (s.is_match == previous && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous = s.is_match;
      }
      return;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous = false;
      for (const Segment& s : segs) {
        if (s.is_match && !previous && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous = s.is_match;
      }
      return;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous = false;
      for (std::size_t k = segs.size(); k-- > 0;) {
        const Segment& s = segs[k];
        if (s.is_match && !previous && !out.empty()) out.back().begin = s.begin;
        else out.push_back(s);
        previous = s.is_match;
      }
      std::reverse(out.begin(), out.end());
      return;
    }
  }
}

class PreTokenizer {
 public:
  PreTokenizer() = default;  // none: the text is one piece

  static PreTokenizer from_json(const JsonValue& v, const std::string& where) {
    PreTokenizer p;
    p.add(v, where);
    // Every ByteLevel but a last one maps its pieces' text at once.
    for (std::size_t i = 0; i + 1 < p.steps_.size(); ++i)
      if (auto* b = std::get_if<ByteLevel>(&p.steps_[i])) b->map_now = true;
    return p;
  }

  // Splits `text` into pieces; `at_input_start`: the text begins the input.
  void operator()(std::string text, bool at_input_start, PreTokenized& out) const {
    out.text = std::move(text);
    out.pieces.clear();
    out.byte_level = false;
    if (out.text.size() >= 0xFFFFFFFFu / 2)
      throw data_error("tokenizer: a text of " + std::to_string(out.text.size()) +
                       " bytes between added tokens; at most 2 GiB are supported");
    if (!out.text.empty()) out.pieces.push_back({0, static_cast<std::uint32_t>(out.text.size()), at_input_start});
    std::vector<Segment> segs, cut;
    for (const Step& s : steps_) std::visit([&](const auto& step) { step(out, segs, cut); }, s);
  }

 private:
  // Replaces every piece by the pieces `split(piece_text, segs)` cuts it into.
  template <class Cut>
  static void resplit(PreTokenized& pt, SplitBehavior behavior, std::vector<Segment>& segs,
                      std::vector<Segment>& cut, Cut&& find) {
    std::vector<PreTokenized::Piece> next;
    next.reserve(pt.pieces.size());
    for (const auto& p : pt.pieces) {
      segs.clear();
      find(pt.view(p), segs);
      apply_behavior(segs, behavior, cut);
      for (const Segment& s : cut)
        if (s.end > s.begin)
          next.push_back({static_cast<std::uint32_t>(p.begin + s.begin), static_cast<std::uint32_t>(p.begin + s.end),
                          p.at_input_start && s.begin == 0});
    }
    pt.pieces = std::move(next);
  }

  // The segments of a pattern's matches in `s`.
  template <class Matcher>
  static void segments_of(const Matcher& m, std::string_view s, std::vector<Segment>& segs, bool invert) {
    std::size_t prev = 0;
    m.for_each_match(s, [&](std::size_t b, std::size_t e) {
      if (b != prev) segs.push_back({prev, b, invert});
      segs.push_back({b, e, !invert});
      prev = e;
    });
    if (prev != s.size()) segs.push_back({prev, s.size(), invert});
  }

  // The segments of single characters for which pred(c) holds.
  template <class Pred>
  static void char_segments(std::string_view s, std::vector<Segment>& segs, Pred&& pred) {
    for (std::size_t i = 0; i < s.size();) {
      const auto c = code_point_at(s, i);
      if (pred(c.cp)) {
        segs.push_back({i, i + c.len, true});
      } else if (!segs.empty() && !segs.back().is_match && segs.back().end == i) {
        segs.back().end = i + c.len;
      } else {
        segs.push_back({i, i + c.len, false});
      }
      i += c.len;
    }
  }

  // Rewrites each piece to rewrite(piece text) (appended to the text).
  template <class Rewrite>
  static void rewrite_pieces(PreTokenized& pt, Rewrite&& rewrite) {
    std::string piece;
    for (auto& p : pt.pieces) {
      piece.assign(pt.view(p));
      if (!rewrite(piece, p)) continue;
      const auto begin = static_cast<std::uint32_t>(pt.text.size());
      pt.text += piece;
      if (pt.text.size() >= 0xFFFFFFFFu)
        throw data_error("tokenizer: a text between added tokens grew past 4 GiB in pre-tokenization");
      p.begin = begin;
      p.end = static_cast<std::uint32_t>(pt.text.size());
    }
  }

  struct Split {
    Pattern pattern;
    SplitBehavior behavior;
    bool invert;
    void operator()(PreTokenized& pt, std::vector<Segment>& segs, std::vector<Segment>& cut) const {
      resplit(pt, behavior, segs, cut,
              [&](std::string_view s, std::vector<Segment>& out) { segments_of(pattern, s, out, invert); });
    }
  };
  struct ByteLevel {
    bool add_prefix_space;
    std::shared_ptr<const Regex> gpt2;  // null: use_regex false
    bool map_now = false;               // map the bytes here (a later step reads the text)
    void operator()(PreTokenized& pt, std::vector<Segment>& segs, std::vector<Segment>& cut) const {
      if (add_prefix_space)
        rewrite_pieces(pt, [](std::string& s, const PreTokenized::Piece&) {
          if (s.starts_with(' ')) return false;
          s.insert(s.begin(), ' ');
          return true;
        });
      if (gpt2)
        resplit(pt, SplitBehavior::Isolated, segs, cut,
                [&](std::string_view s, std::vector<Segment>& out) { segments_of(*gpt2, s, out, false); });
      if (!map_now) {
        pt.byte_level = true;
        return;
      }
      rewrite_pieces(pt, [](std::string& s, const PreTokenized::Piece&) {
        std::string mapped;
        for (const char c : s) append_utf8(mapped, gpt2::byte_to_unicode[static_cast<unsigned char>(c)]);
        s = std::move(mapped);
        return true;
      });
    }
  };
  struct Digits {
    bool individual;
    void operator()(PreTokenized& pt, std::vector<Segment>& segs, std::vector<Segment>& cut) const {
      resplit(pt, individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous, segs, cut,
              [](std::string_view s, std::vector<Segment>& out) { char_segments(s, out, is_numeric); });
    }
  };
  struct Metaspace {
    std::string replacement;  // one character, UTF-8
    char32_t replacement_cp;
    enum class Prepend : std::uint8_t { Always, First, Never } prepend;
    bool split;
    void operator()(PreTokenized& pt, std::vector<Segment>& segs, std::vector<Segment>& cut) const {
      rewrite_pieces(pt, [&](std::string& s, const PreTokenized::Piece& p) {
        std::string r;
        r.reserve(s.size() + replacement.size());
        const bool prefix = !s.starts_with(replacement) &&
                            (prepend == Prepend::Always || (prepend == Prepend::First && p.at_input_start));
        if (prefix) r += replacement;
        for (const char c : s) {
          if (c == ' ') r += replacement;
          else r += c;
        }
        if (r == s) return false;
        s = std::move(r);
        return true;
      });
      if (split)
        resplit(pt, SplitBehavior::MergedWithNext, segs, cut, [&](std::string_view s, std::vector<Segment>& out) {
          char_segments(s, out, [&](char32_t c) { return c == replacement_cp; });
        });
    }
  };
  using Step = std::variant<Split, ByteLevel, Digits, Metaspace>;

  static SplitBehavior behavior_of(const Fields& f) {
    const std::string b = f.string("behavior");
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    throw data_error(f.at("behavior") + ": unknown behavior " + printable(b) +
                     " (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
  }

  void add(const JsonValue& v, const std::string& where) {
    const Fields f(v, where);
    const std::string type = type_of(f);
    if (type == "Split") {
      steps_.push_back(Split{Pattern::from_json(f, "pattern"), behavior_of(f), f.boolean("invert", false)});
    } else if (type == "ByteLevel") {
      std::shared_ptr<const Regex> re;
      if (f.boolean("use_regex", true))
        re = std::make_shared<Regex>(
            R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", f.where());
      steps_.push_back(ByteLevel{f.boolean("add_prefix_space", true), std::move(re)});
    } else if (type == "Digits") {
      steps_.push_back(Digits{f.boolean("individual_digits", false)});
    } else if (type == "Metaspace") {
      Metaspace m;
      m.replacement = f.string("replacement");
      const auto c = code_point_at(m.replacement, 0);
      if (m.replacement.empty() || c.len != m.replacement.size())
        throw data_error(f.at("replacement") + ": expected one character, got " + printable(m.replacement));
      m.replacement_cp = c.cp;
      if (const auto scheme = f.optional_string("prepend_scheme")) {
        if (*scheme == "always") m.prepend = Metaspace::Prepend::Always;
        else if (*scheme == "first") m.prepend = Metaspace::Prepend::First;
        else if (*scheme == "never") m.prepend = Metaspace::Prepend::Never;
        else throw data_error(f.at("prepend_scheme") + ": expected always, first or never, got " + printable(*scheme));
      } else {
        m.prepend = f.boolean("add_prefix_space", true) ? Metaspace::Prepend::Always : Metaspace::Prepend::Never;
      }
      m.split = f.boolean("split", true);
      steps_.push_back(std::move(m));
    } else if (type == "Sequence") {
      f.each("pretokenizers", [&](const JsonValue& e, const std::string& at) { add(e, at); });
    } else {
      unsupported(f, "pre-tokenizer", type, "Split, ByteLevel, Digits, Metaspace, Sequence");
    }
  }

  std::vector<Step> steps_;
};

}  // namespace headroom::io::detail::hf

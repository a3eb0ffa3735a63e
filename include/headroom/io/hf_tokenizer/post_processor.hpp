#pragma once
// tokenizer.json "post_processor": the special tokens put around an encoded
// text when they are asked for.
//
//   TemplateProcessing {single, special_tokens}
//       `single` lists {"SpecialToken": {"id": name}} and {"Sequence": {"id": "A"}}:
//       the ids special_tokens gives each name, and the text's ids where A stands
//   ByteLevel              changes no ids (it trims offsets)
//   Sequence {processors}  each in turn
// Anything else is an error naming it.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "fields.hpp"

namespace headroom::io::detail::hf {

class PostProcessor {
 public:
  PostProcessor() = default;

  static PostProcessor from_json(const JsonValue& v, const std::string& where) {
    PostProcessor p;
    p.add(v, where);
    return p;
  }

  // `ids` with the special tokens around it.
  std::vector<std::int32_t> operator()(std::vector<std::int32_t> ids) const {
    for (const auto& template_ : templates_) {
      std::vector<std::int32_t> out;
      out.reserve(ids.size() + 4);
      for (const Item& item : template_) {
        if (item.sequence) out.insert(out.end(), ids.begin(), ids.end());
        else out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
      ids = std::move(out);
    }
    return ids;
  }

 private:
  struct Item {
    bool sequence;                 // the encoded text
    std::vector<std::int32_t> ids;  // else: a special token's ids
  };

  void add(const JsonValue& v, const std::string& where) {
    const Fields f(v, where);
    const std::string type = type_of(f);
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      f.each("processors", [&](const JsonValue& e, const std::string& at) { add(e, at); });
      return;
    }
    if (type != "TemplateProcessing")
      unsupported(f, "post-processor", type, "TemplateProcessing, ByteLevel, Sequence");
    std::unordered_map<std::string, std::vector<std::int32_t>> special;
    const JsonValue& specials = f.need("special_tokens");
    if (specials.kind != JsonKind::Object) throw data_error(f.at("special_tokens") + ": expected an object");
    for (std::size_t i = 0; i < specials.keys.size(); ++i) {
      const Fields s(specials.items[i], f.at("special_tokens") + "." + specials.keys[i]);
      std::vector<std::int32_t> ids;
      for (const JsonValue& id : s.array("ids").items) {
        const auto x = id.integer();
        if (!x || *x < 0 || *x >= std::numeric_limits<std::int32_t>::max())
          throw data_error(s.at("ids") + ": expected token ids");
        ids.push_back(static_cast<std::int32_t>(*x));
      }
      special.emplace(s.string("id"), std::move(ids));
    }
    std::vector<Item> items;
    f.each("single", [&](const JsonValue& e, const std::string& at) {
      const Fields item(e, at);
      if (const JsonValue* tok = item.find("SpecialToken")) {
        const std::string name = Fields(*tok, item.at("SpecialToken")).string("id");
        const auto it = special.find(name);
        if (it == special.end())
          throw data_error(item.at("SpecialToken") + ": " + printable(name) + " is not in special_tokens");
        items.push_back({false, it->second});
      } else if (const JsonValue* seq = item.find("Sequence")) {
        const std::string id = Fields(*seq, item.at("Sequence")).string("id");
        if (id != "A") throw data_error(item.at("Sequence") + ": a single text is sequence A, not " + printable(id));
        items.push_back({true, {}});
      } else {
        item.fail("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    });
    templates_.push_back(std::move(items));
  }

  std::vector<std::vector<Item>> templates_;
};

}  // namespace headroom::io::detail::hf

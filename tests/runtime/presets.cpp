// The big presets, counted at run time (a 7B / 8B plan costs ~11 s when a
// static_assert evaluates it; tests/static/presets.cpp holds the small ones):
//   - parameter counts equal the published Hugging Face figures;
//   - LoRA trainable counts equal PEFT's print_trainable_parameters();
//   - parameter names follow the Hugging Face state dicts.
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace headroom;
using std::int64_t;

// The plan's pipeline run at run time (through a volatile pointer, so the
// compiler does not try to fold it); parameters need no packing.
template <class R>
detail::Expanded expand_params() {
  static detail::Expanded (*volatile fn)() = &detail::expand<R, false>;
  return fn();
}

struct Counts {
  int64_t all = 0, trainable = 0, adapters = 0;
};
template <class Model>
Counts count() {
  const detail::Expanded x = expand_params<Train<Model, Seq<16>>>();
  Counts c;
  for (const ParamInfo& p : x.params) {
    const int64_t n = p.rows * p.cols * p.instances;
    c.all += n;
    if (p.trainable) c.trainable += n;
    if (p.name == "lora_A" || p.name == "lora_B") c.adapters += n;
  }
  return c;
}

// LoRA adds A (r x in) and B (out x r): r * (in + out) per adapted projection.
constexpr int64_t lora(int64_t r, int64_t in, int64_t out) { return r * (in + out); }

using All7 = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;

// Full parameter names, "layers.3.self_attn.q_proj.weight": the node path
// below the root, a Repeat's children numbered by instance, Sequential
// children by position.
std::vector<std::string> param_names(const detail::Expanded& x) {
  std::vector<std::string> names;
  for (const ParamInfo& p : x.params) {
    for (int i = 0; i < p.instances; ++i) {
      std::vector<std::string> parts{std::string(p.name)};  // leaf first
      for (int n = p.node; n > 0; n = x.nodes[n].parent) {
        const NodeInfo& nd = x.nodes[n];
        if (nd.kind == "Repeat") parts.push_back(std::to_string(i));
        parts.push_back(nd.name.empty() ? std::to_string(nd.index) : std::string(nd.name));
      }
      std::string path;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (!path.empty()) path += '.';
        path += *it;
      }
      names.push_back(path);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// LlamaForCausalLM's state dict keys, "model." stripped (Qwen3ForCausalLM's
// with q_norm and k_norm).
std::vector<std::string> hf_llama_names(int layers, bool tied, bool qk_norm = false) {
  std::vector<std::string> n{"embed_tokens.weight", "norm.weight"};
  if (!tied) n.push_back("lm_head.weight");
  for (int i = 0; i < layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) n.push_back(l + "self_attn." + p + ".weight");
    if (qk_norm)
      for (const char* p : {"q_norm", "k_norm"}) n.push_back(l + "self_attn." + p + ".weight");
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) n.push_back(l + "mlp." + p + ".weight");
    n.push_back(l + "input_layernorm.weight");
    n.push_back(l + "post_attention_layernorm.weight");
  }
  std::sort(n.begin(), n.end());
  return n;
}

// GPT2LMHeadModel's keys, "transformer." stripped (lm_head is tied to wte).
std::vector<std::string> hf_gpt2_names(int layers) {
  std::vector<std::string> n{"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
  for (int i = 0; i < layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const char* m : {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"}) {
      n.push_back(h + m + ".weight");
      n.push_back(h + m + ".bias");
    }
  }
  std::sort(n.begin(), n.end());
  return n;
}

}  // namespace

TEST_CASE("presets: parameter counts equal the published Hugging Face figures", "[presets]") {
  // meta-llama/Llama-2-7b-hf
  CHECK(count<models::Llama<models::llama2_7b>>().all == 6'738'415'616);
  CHECK(count<models::Llama<models::llama2_7b>>().trainable == 6'738'415'616);
  // meta-llama/Meta-Llama-3-8B
  CHECK(count<models::Llama<models::llama3_8b>>().all == 8'030'261'248);
  // meta-llama/Llama-3.1-8B: Llama 3's shapes, RoPE scaled to 131,072 positions
  CHECK(count<models::Llama<models::llama3_1_8b>>().all == 8'030'261'248);
  // meta-llama/Llama-3.2-1B (embeddings tied)
  CHECK(count<models::Llama<models::llama3_2_1b>>().all == 1'235'814'400);
  // Qwen/Qwen2.5-0.5B (tied) and Qwen/Qwen2.5-7B: 0.49B and 7.61B on their
  // model cards; exactly, the sums of their config.json's shapes with the
  // q, k, v biases (494,032,768 and 7,615,616,512, the safetensors' totals / 2)
  CHECK(count<models::Llama<models::qwen2_5_0_5b>>().all == 494'032'768);
  CHECK(count<models::Llama<models::qwen2_5_7b>>().all == 7'615'616'512);
  // Qwen/Qwen3-0.6B (tied; head_dim 128 apart from 1024 / 16) and Qwen/Qwen3-8B:
  // 0.6B / 0.44B non-embedding and 8.2B / 6.95B on their model cards. By hand,
  // per layer q hd H D + k, v 2 hd KV D + o D hd H + 3 D F + norms 2 D + q_norm,
  // k_norm 2 hd: 0.6B 6,291,456 + 9,437,184 + 2,304 = 15,730,944 (x 28 =
  // 440,466,432), + embed 151936 x 1024 + norm 1024; 8B 41,943,040 +
  // 150,994,944 + 8,448 = 192,946,432 (x 36), + embed and lm_head 151936 x 4096 each + 4096
  CHECK(count<models::Llama<models::qwen3_0_6b>>().all == 596'049'920);
  CHECK(count<models::Llama<models::qwen3_8b>>().all == 8'190'735'360);
  // mistralai/Mistral-7B-v0.1 (the window changes no shape): 7.24B
  CHECK(count<models::Llama<models::mistral_7b>>().all == 7'241'732'096);
  // openai-community/gpt2, gpt2-medium
  CHECK(count<models::GPT2<models::gpt2_124m>>().all == 124'439'808);
  CHECK(count<models::GPT2<models::gpt2_355m>>().all == 354'823'168);
  // tiny_llama: embed 65,536 + 4 x 786,944 + norm 256 + lm_head 65,536 (tests/static/presets.cpp)
  CHECK(count<models::Llama<models::tiny_llama>>().all == 3'279'104);
}

TEST_CASE("presets: LoRA trainable counts equal PEFT's", "[presets][lora]") {
  SECTION("Llama-2-7B, r=8 on q_proj, v_proj") {
    // "trainable params: 4,194,304 || all params: 6,742,609,920"
    const Counts c = count<models::Llama<models::llama2_7b, Apply<LoRA<8>, On<q_proj, v_proj>>>>();
    CHECK(c.trainable == 4'194'304);
    CHECK(c.all == 6'742'609'920);
    CHECK(c.adapters == 32 * (lora(8, 4096, 4096) + lora(8, 4096, 4096)));
  }
  SECTION("Llama-3-8B, r=16 on all 7 projections") {
    // "trainable params: 41,943,040 || all params: 8,072,204,288"
    const Counts c = count<models::Llama<models::llama3_8b, Apply<LoRA<16>, All7>>>();
    CHECK(c.trainable == 41'943'040);
    CHECK(c.all == 8'072'204'288);
    // per layer: q, o 4096 -> 4096; k, v 4096 -> 1024 (8 KV heads x 128); gate, up 4096 -> 14336; down 14336 -> 4096
    const int64_t layer = 2 * lora(16, 4096, 4096) + 2 * lora(16, 4096, 1024) + 2 * lora(16, 4096, 14336) +
                          lora(16, 14336, 4096);
    CHECK(c.adapters == 32 * layer);
    // quantizing the frozen base changes nothing in the counts
    const Counts q = count<models::Llama<models::llama3_8b, Apply<Quantized<NF4, LoRA<16>>, All7>>>();
    CHECK(q.trainable == 41'943'040);
    CHECK(q.all == 8'072'204'288);
  }
  SECTION("GPT-2, r=8 on c_attn") {
    // "trainable params: 294,912 || all params: 124,734,720"
    const Counts c = count<models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<c_attn>>>>();
    CHECK(c.trainable == 294'912);
    CHECK(c.all == 124'734'720);
    CHECK(c.adapters == 12 * lora(8, 768, 3 * 768));
  }
  SECTION("GPT-2, r=8 on c_proj matches both attn.c_proj and mlp.c_proj, as PEFT does") {
    const Counts both = count<models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<c_proj>>>>();
    CHECK(both.trainable == 12 * (lora(8, 768, 768) + lora(8, 3072, 768)));
    const Counts attn = count<models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<attn_c_proj>>>>();
    CHECK(attn.trainable == 12 * lora(8, 768, 768));
    const Counts mlp = count<models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<mlp_c_proj>>>>();
    CHECK(mlp.trainable == 12 * lora(8, 3072, 768));
  }
  SECTION("Llama-3.2-1B, r=16 on all 7 projections") {
    // per layer: q, o 2048 -> 2048; k, v 2048 -> 512; gate, up 2048 -> 8192; down 8192 -> 2048
    const Counts c = count<models::Llama<models::llama3_2_1b, Apply<LoRA<16>, All7>>>();
    const int64_t layer = 2 * lora(16, 2048, 2048) + 2 * lora(16, 2048, 512) + 2 * lora(16, 2048, 8192) +
                          lora(16, 8192, 2048);
    CHECK(layer == 704'512);
    CHECK(c.trainable == 16 * layer);  // 11,272,192
    CHECK(c.all == 1'235'814'400 + 16 * layer);
  }
}

TEST_CASE("presets: parameter names follow the Hugging Face state dicts", "[presets][names]") {
  CHECK(param_names(expand_params<Train<models::Llama<models::llama3_8b>, Seq<16>>>()) == hf_llama_names(32, false));
  CHECK(param_names(expand_params<Train<models::Llama<models::llama3_2_1b>, Seq<16>>>()) == hf_llama_names(16, true));
  CHECK(param_names(expand_params<Train<models::Llama<models::qwen3_0_6b>, Seq<16>>>()) == hf_llama_names(28, true, true));
  CHECK(param_names(expand_params<Train<models::Llama<models::mistral_7b>, Seq<16>>>()) == hf_llama_names(32, false));
  CHECK(param_names(expand_params<Train<models::GPT2<models::gpt2_124m>, Seq<16>>>()) == hf_gpt2_names(12));
}

// Checkpointing chosen blocks (Apply<Checkpointed<>, Blocks<...>> and the
// other block selectors; layers/block_runs.hpp), and part of every block
// (Apply<Checkpointed<>, On<mlp_act>>: the MLP's activation; layers/mlp.hpp). Recomputing a block repeats
// its forward exactly, so a run with any blocks checkpointed trains as the
// run with none, to the bit: the evidence here is that twin, not the code
// that splits the blocks. The blocks keep the uniform model's names (the
// same parameter paths; the schedule lists a run's parameters run by run),
// so Hugging Face files and PEFT adapters hold the same tensors. Unclipped:
// the norm sums the squares in schedule order, so it may differ in its last
// bits (1e-12 here), and a clip scale would carry that into the weights.
// The plan's figures are pinned by hand in tests/static/tiny_llama_roles.cpp.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <headroom/headroom.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/train/host/trainer.hpp>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/fixtures.hpp"

using namespace headroom;
using headroom::test::Stream;
using headroom::test::TempDir;

namespace {
constexpr models::LlamaConfig cfg{64, 64, 128, 4, 4, 2, 64, false};  // 4 blocks
constexpr models::GPT2Config gcfg{64, 64, 4, 4, 64};

// Every parameter's stored bytes and optimizer state, by path.
template <class Tr>
std::map<std::string, std::vector<std::byte>> state_of(const Tr& t) {
  std::map<std::string, std::vector<std::byte>> out;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const auto* w = reinterpret_cast<const std::byte*>(t.weight(p));
    std::vector<std::byte>& v = out[Tr::path_of(p)];
    v.assign(w, w + p.elements() * static_cast<std::int64_t>(sizeof(typename Tr::T)));
    if (t.state(p) != nullptr) v.insert(v.end(), t.state(p), t.state(p) + Tr::config.optim.state_bytes(p.elements()));
  }
  return out;
}

// Two safetensors files hold the same tensors (names, dtypes, shapes, bytes), in whatever order.
bool same_tensors(const std::filesystem::path& a, const std::filesystem::path& b) {
  const io::SafetensorsFile fa(a), fb(b);
  if (fa.tensors().size() != fb.tensors().size()) return false;
  for (const io::TensorInfo& t : fa.tensors()) {
    const io::TensorInfo* u = fb.find(t.name);
    if (u == nullptr || u->dtype != t.dtype || u->shape != t.shape || u->end - u->begin != t.end - t.begin) return false;
    std::vector<char> x(static_cast<std::size_t>(t.end - t.begin)), y(x.size());
    fa.read(t.name, x.data(), x.size());
    fb.read(t.name, y.data(), y.size());
    if (x != y) return false;
  }
  return true;
}
std::string text_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Run A (blocks selected) and run B (the same model, none or all checkpointed): 4 steps, everything equal.
template <class RA, class RB>
void trains_as(TrainOptions o) {
  using A = host::Trainer<RA>;
  using B = host::Trainer<RB>;
  static_assert(A::param_count == B::param_count);
  o.clip_norm = 0;
  A a(o);
  B b(o);
  for (int s = 0; s < 4; ++s) {
    INFO("step " << s + 1);
    const Stream d(static_cast<std::size_t>(A::tokens_per_step), 70 + s);
    const StepStats x = a.step(d.tok, d.tgt), y = b.step(d.tok, d.tgt);
    CHECK(x.loss == y.loss);
    CHECK(std::abs(x.grad_norm - y.grad_norm) <= 1e-12 * y.grad_norm);
    const auto sa = state_of(a), sb = state_of(b);
    CHECK(sa.size() == A::param_count);  // the paths are distinct
    CHECK((sa == sb));                   // the same paths, and under each the same bytes
  }
  TempDir dir;
  io::save_pretrained(a, dir.dir / "a.safetensors");
  io::save_pretrained(b, dir.dir / "b.safetensors");
  CHECK(same_tensors(dir.dir / "a.safetensors", dir.dir / "b.safetensors"));
}

}  // namespace

TEST_CASE("selected blocks checkpointed: the run trains as the run with none, to the bit, under the same names",
          "[checkpointing]") {
  using Plain = models::Llama<cfg>;
  SECTION("Llama, Blocks<0, 2>: four runs of one block") {
    using Sel = models::Llama<cfg, Apply<Checkpointed<>, Blocks<0, 2>>>;
    static_assert(Sel::blocks::run_count == 4);
    trains_as<Train<Sel, Batch<2>, Seq<16>, AdamW>, Train<Plain, Batch<2>, Seq<16>, AdamW>>({.seed = 3, .lr = 1e-2});
  }
  SECTION("Llama, FirstBlocks<3>, with Accumulate<2> and two workers") {
    using Sel = models::Llama<cfg, Apply<Checkpointed<>, FirstBlocks<3>>>;
    static_assert(Sel::blocks::run_count == 2);
    trains_as<Train<Sel, Batch<2>, Seq<16>, AdamW, Accumulate<2>, Workers<2>>,
              Train<Plain, Batch<2>, Seq<16>, AdamW, Accumulate<2>, Workers<2>>>({.seed = 4, .lr = 1e-2});
  }
  SECTION("GPT-2 with LoRA on every block and EveryKth<2> checkpointed: against every block checkpointed") {
    using Lora = Apply<LoRA<4>, On<c_attn, c_fc>>;
    using Sel = models::GPT2<gcfg, Lora, Apply<Checkpointed<>, EveryKth<2>>>;
    using All = models::GPT2<gcfg, Lora, Apply<Checkpointed<>, EveryBlock>>;
    static_assert(Sel::blocks::run_count == 4);
    trains_as<Train<Sel, Batch<2>, Seq<16>, AdamW>, Train<All, Batch<2>, Seq<16>, AdamW>>({.seed = 5, .lr = 1e-2});
  }
}

TEST_CASE("the MLP's activation recomputed (On<mlp_act>): the run trains as the run that keeps it, to the bit",
          "[checkpointing]") {
  SECTION("Llama's silu(gate) * up") {
    using Act = models::Llama<cfg, Apply<Checkpointed<>, On<mlp_act>>>;
    trains_as<Train<Act, Batch<2>, Seq<16>, AdamW>, Train<models::Llama<cfg>, Batch<2>, Seq<16>, AdamW>>({.seed = 7, .lr = 1e-2});
  }
  SECTION("GPT-2's GELU, with LoRA on c_fc and c_proj (the segment holds an adapter)") {
    using Lora = Apply<LoRA<4>, On<c_fc, mlp_c_proj>>;
    using Act = models::GPT2<gcfg, Lora, Apply<Checkpointed<>, On<mlp_act>>>;
    trains_as<Train<Act, Batch<2>, Seq<16>, AdamW>, Train<models::GPT2<gcfg, Lora>, Batch<2>, Seq<16>, AdamW>>({.seed = 8, .lr = 1e-2});
  }
  SECTION("with the first two blocks checkpointed whole: those recompute as blocks, the others their activation") {
    using Both = models::Llama<cfg, Apply<Checkpointed<>, On<mlp_act>>, Apply<Checkpointed<>, FirstBlocks<2>>>;
    trains_as<Train<Both, Batch<2>, Seq<16>, AdamW>, Train<models::Llama<cfg>, Batch<2>, Seq<16>, AdamW>>({.seed = 9, .lr = 1e-2});
  }
}

TEST_CASE("selected blocks: adapters export under the uniform model's module names", "[checkpointing]") {
  using Lora = Apply<LoRA<4>, On<q_proj, v_proj>>;
  using Sel = models::Llama<cfg, Lora, Apply<Checkpointed<>, Blocks<1, 3>>>;
  using Plain = models::Llama<cfg, Lora>;
  host::Trainer<Train<Sel, Batch<2>, Seq<16>, AdamW>> a({.seed = 6});
  host::Trainer<Train<Plain, Batch<2>, Seq<16>, AdamW>> b({.seed = 6});
  TempDir dir;
  io::export_adapter(a, dir.dir / "a", "base");
  io::export_adapter(b, dir.dir / "b", "base");
  CHECK(same_tensors(dir.dir / "a" / "adapter_model.safetensors", dir.dir / "b" / "adapter_model.safetensors"));
  CHECK(text_of(dir.dir / "a" / "adapter_config.json") == text_of(dir.dir / "b" / "adapter_config.json"));
}

TEST_CASE("selected blocks: the report counts their recompute, half of every block's", "[checkpointing]") {
  using Sel = models::Llama<cfg, Apply<Checkpointed<>, Blocks<0, 2>>>;
  using R = Train<Sel, Batch<2>, Seq<16>, AdamW>;
  const std::string r = report(plan<R>());
  INFO(r);
  CHECK(r.find("recompute") != std::string::npos);
  CHECK(plan<R>().flops_recompute * 2 == plan<Train<models::Llama<cfg, Apply<Checkpointed<>, EveryBlock>>, Batch<2>, Seq<16>, AdamW>>().flops_recompute);
}

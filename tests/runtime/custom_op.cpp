// A new op with its own kernels (examples/relu_squared.hpp, the walkthrough
// of docs/custom-layers.md): checked by the layer test harness alone and in
// its block under policies, then trained by host::Trainer on real text (this
// repository's own documentation, read as bytes) until the loss is below
// the text's unigram baseline.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <headroom/io/dataset.hpp>
#include <headroom/io/tokenizer.hpp>
#include <headroom/train/host/trainer.hpp>
#include "support/layer_check.hpp"

#include "../../examples/relu_squared.hpp"

namespace {
using namespace headroom;
namespace fs = std::filesystem;

}  // namespace

TEST_CASE("the ReLU² op and its block pass the layer test harness", "[custom_op][harness]") {
  check_layer<my::ReluSquared<16>>();
  check_layer<my::MlpBlock<8, 16>>();
  check_layer<my::MlpBlock<8, 16, LoRA<4, Linear<8, 16>>, Frozen<Linear<16, 8>>>>();
  check_layer<Checkpointed<my::MlpBlock<8, 16>>>();
}

TEST_CASE("a model of ReLU² blocks trains on real text below its unigram baseline", "[custom_op]") {
  // the corpus: README.md and docs/*.md, as bytes
  const fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
  std::ostringstream text;
  for (const fs::path& p : {root / "README.md", root / "docs" / "architecture.md", root / "docs" / "training.md",
                            root / "docs" / "memory-model.md", root / "docs" / "custom-layers.md"}) {
    std::ifstream f(p, std::ios::binary);
    REQUIRE(f.good());
    text << f.rdbuf();
  }
  const fs::path dir = fs::temp_directory_path() / ("headroom_custom_op_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  { std::ofstream(dir / "docs.txt", std::ios::binary) << text.str(); }

  constexpr std::int64_t B = 4, T = 64;
  using Model = my::TinyLM<2, my::MlpBlock<64, 256>>;
  using Run = Train<Model, Batch<B>, Seq<T>, AdamW, Workers<2>>;
  const io::ByteTokenizer tk;
  io::TokenDataset ds = io::TokenDataset::from_text(dir / "docs.txt", tk, 0.05);
  host::Trainer<Run> t(TrainOptions{.lr = 3e-3, .warmup_steps = 10});
  std::vector<std::int32_t> tok(B * T), tgt(B * T);
  double first = 0, recent = 0;
  const int steps = 120;
  for (int s = 1; s <= steps; ++s) {
    ds.next_batch(tok.data(), tgt.data(), B, T);
    const StepStats st = t.step(tok, tgt);
    if (s == 1) first = st.loss;
    if (s > steps - 20) recent += st.loss / 20;
  }
  fs::remove_all(dir);
  INFO("first loss " << first << ", mean of the last 20 " << recent << ", unigram baseline " << ds.unigram_loss());
  CHECK(first > ds.unigram_loss());
  CHECK(recent < ds.unigram_loss());
}

// The headroom side of a parity run: for configuration NAME, writes into DIR
//   init.safetensors     the initial base weights (Hugging Face names)
//   adapter/             the initial LoRA adapters (PEFT layout), for LoRA configurations
//   batches.safetensors  tokens and targets, I32 (steps, batch, seq)
//   config.json          model dims, optimizer and its hyper-parameters
//   losses.json          the loss of every step, as trained here
//   final.safetensors    the weights after the last step (merged for LoRA)
// tests/parity/reference.py trains the same thing in PyTorch and compares.
//
//   parity_driver NAME DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <headroom/headroom.hpp>
#include <headroom/host/trainer.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/io/safetensors.hpp>
#include <string>
#include <vector>

using namespace headroom;
namespace fs = std::filesystem;

namespace {

constexpr int steps = 20;
constexpr models::LlamaConfig llama_cfg{96, 64, 160, 2, 4, 2, 64, false};

template <class R>
int run(const std::string& family, const fs::path& dir, double lr) {
  using Tr = host::Trainer<R>;
  Tr t({.seed = 17, .threads = 1, .lr = lr, .clip_norm = 0});
  fs::create_directories(dir);
  io::save_pretrained(t, dir / "init.safetensors");
  constexpr std::int64_t n = Tr::tokens_per_step, vocab = R::model::config.vocab;
  std::vector<std::int32_t> tok(steps * n), tgt(steps * n);
  std::uint32_t x = 12345;
  for (std::size_t i = 0; i < tok.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    tok[i] = static_cast<std::int32_t>((x >> 9) % vocab);
  }
  for (std::size_t i = 0; i < tok.size(); ++i) tgt[i] = (tok[i] * 7 + 3) % vocab;  // learnable
  io::write_safetensors(dir / "batches.safetensors",
                        {{"tokens", DType::I32, {steps, R::batch, R::seq}, tok.data()},
                         {"targets", DType::I32, {steps, R::batch, R::seq}, tgt.data()}});
  std::ofstream losses(dir / "losses.json");
  losses << "[";
  for (int s = 0; s < steps; ++s) {
    const auto st = t.step(std::span<const std::int32_t>(tok.data() + s * n, n), std::span<const std::int32_t>(tgt.data() + s * n, n));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.9g", s ? ", " : "", st.loss);
    losses << buf;
  }
  losses << "]\n";
  io::save_pretrained(t, dir / "final.safetensors");
  using O = typename R::optimizer;
  std::ofstream cfg(dir / "config.json");
  const auto& c = R::model::config;
  cfg << "{\"family\": \"" << family << "\", \"vocab\": " << c.vocab << ", \"dim\": " << c.dim << ", \"ffn\": " << c.ffn
      << ", \"layers\": " << c.layers << ", \"heads\": " << c.heads << ", \"kv_heads\": " << c.kv_heads
      << ", \"rope_theta\": " << c.rope_theta << ", \"batch\": " << R::batch << ", \"seq\": " << R::seq
      << ", \"steps\": " << steps << ", \"optimizer\": \"" << O::name << "\", \"lr\": " << lr
      << ", \"beta1\": " << O::beta1::value << ", \"beta2\": " << O::beta2::value
      << ", \"weight_decay\": " << O::weight_decay::value << ", \"eps\": 1e-8, \"norm_eps\": 1e-5}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: parity_driver NAME DIR   (NAME: llama_full)\n");
    return 2;
  }
  const std::string name = argv[1];
  if (name == "llama_full") return run<Train<models::Llama<llama_cfg>, Batch<2>, Seq<16>, AdamW>>("llama", argv[2], 3e-3);
  std::fprintf(stderr, "parity_driver: unknown configuration '%s'\n", name.c_str());
  return 2;
}

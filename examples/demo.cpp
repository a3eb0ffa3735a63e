// The main job, end to end on the CPU:
//   1. pretrain a small Llama-style model (models::tiny_llama, byte-level) on
//      Jane Austen until its validation loss is clearly below the unigram
//      baseline, and save it as safetensors (Hugging Face names);
//   2. QLoRA fine-tune it on the King James Bible: NF4 base loaded from that
//      file, LoRA on the attention projections, checkpointed blocks;
//   3. print the Bible's validation loss before and after, a text sample from
//      each stage (decoded with a planned KV cache), the plan's peak against
//      the arena and the process's peak resident memory, and tokens/s.
//
//   demo [--corpus DIR] [--out DIR] [--pretrain-steps N] [--finetune-steps N]
//        [--lr-pretrain X] [--lr-finetune X] [--threads N] [--eval-batches N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <headroom/headroom.hpp>
#include <headroom/host/cpu.hpp>
#include <headroom/host/resident.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/io/dataset.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/io/tokenizer.hpp>
#include <headroom/train/host/generator.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <vector>

using namespace headroom;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t B = 16, T = 128;
using Base = models::Llama<models::tiny_llama>;
using Pretrain = Train<Base, Batch<B>, Seq<T>, AdamW, Workers<2>>;
using QLoRAModel = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<16>>, On<q_proj, k_proj, v_proj, o_proj>>,
                                 Apply<Checkpointed<>, EveryBlock>>;
using Finetune = Train<QLoRAModel, Batch<B>, Seq<T>, AdamW, Workers<2>>;

struct Args {
  fs::path corpus = "data/corpus", out = "demo-out";
  int pretrain_steps = 300, finetune_steps = 120, threads = 2, eval_batches = 16;
  double lr_pretrain = 2e-3, lr_finetune = 1e-3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "demo: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--corpus") a.corpus = next();
    else if (k == "--out") a.out = next();
    else if (k == "--pretrain-steps") a.pretrain_steps = std::stoi(next());
    else if (k == "--finetune-steps") a.finetune_steps = std::stoi(next());
    else if (k == "--lr-pretrain") a.lr_pretrain = std::stod(next());
    else if (k == "--lr-finetune") a.lr_finetune = std::stod(next());
    else if (k == "--threads") a.threads = std::stoi(next());
    else if (k == "--eval-batches") a.eval_batches = std::stoi(next());
    else {
      std::fprintf(stderr,
                   "usage: demo [--corpus DIR] [--out DIR] [--pretrain-steps N] [--finetune-steps N]\n"
                   "            [--lr-pretrain X] [--lr-finetune X] [--threads N] [--eval-batches N]\n");
      std::exit(k == "--help" || k == "-h" ? 0 : 2);
    }
  }
  return a;
}

double mib(std::int64_t b) { return static_cast<double>(b) / (1 << 20); }

// Mean validation loss over the first n windows-batches.
template <class Trainer>
double validation_loss(Trainer& t, const io::TokenDataset& ds, int n, std::vector<std::int32_t>& tok, std::vector<std::int32_t>& tgt) {
  const auto batches = ds.validation_batches(B, T);
  const std::size_t count = std::min<std::size_t>(batches.size(), static_cast<std::size_t>(n));
  double s = 0;
  for (std::size_t i = 0; i < count; ++i) {
    batches.fill(i, tok.data(), tgt.data());
    s += t.evaluate(tok, tgt);
  }
  return s / static_cast<double>(count);
}

// A progress line: step, loss, tokens/s, ETA.
void progress(const char* what, int step, int steps, double loss, double tokens_per_s) {
  const int width = 28, done = steps > 0 ? step * width / steps : width;
  const double eta = tokens_per_s > 0 ? (steps - step) * double(B * T) / tokens_per_s : 0;
  std::fprintf(stderr, "\r%-9s [%.*s%*s] %4d/%d  loss %.3f  %6.0f tok/s  ETA %3.0f s ", what, done,
               "############################", width - done, "", step, steps, loss, tokens_per_s, eta);
  if (step == steps) std::fprintf(stderr, "\n");
}

// Trains `steps` steps; with a checkpoint folder, saves there every 50 steps
// (atomically), so a NaN loss or an interruption leaves the last good one.
template <class Trainer>
double train(Trainer& t, io::TokenDataset& ds, int steps, const char* what, std::vector<std::int32_t>& tok,
             std::vector<std::int32_t>& tgt, const fs::path& checkpoints = {}) {
  const auto start = std::chrono::steady_clock::now();
  double smooth = 0;
  for (int s = 1; s <= steps; ++s) {
    ds.next_batch(tok.data(), tgt.data(), B, T);
    host::StepStats st;
    try {
      st = t.step(tok, tgt);
    } catch (const non_finite_error& e) {  // a NaN loss or gradient: nothing was updated
      std::fprintf(stderr, "\n%s\n", e.what());
      if (!checkpoints.empty() && fs::exists(checkpoints))
        std::fprintf(stderr, "the last good checkpoint is %s (step %d)\n", checkpoints.c_str(), t.steps_done() / 50 * 50);
      throw;
    }
    if (!checkpoints.empty() && s % 50 == 0) io::save_checkpoint(t, checkpoints);
    smooth = s == 1 ? st.loss : 0.9 * smooth + 0.1 * st.loss;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s % 5 == 0 || s == steps) progress(what, s, steps, smooth, s * double(B * T) / secs);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return steps * double(B * T) / secs;
}

template <class Run>
std::string sample(const host::Trainer<Run>& t, const io::ByteTokenizer& tk, const std::string& prompt, int n) {
  host::Generator<Run, Context<T>> g(t, 7);
  const std::vector<std::int32_t> p = tk.encode(prompt);
  // the prompt and the sample fit the planned context
  std::vector<std::int32_t> out(static_cast<std::size_t>(std::min<std::int64_t>(n, T - static_cast<std::int64_t>(p.size()))));
  g.generate(p, out, {.temperature = 0.7, .top_k = 20});
  std::string s = prompt + tk.decode(out);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  fs::create_directories(a.out);
  std::printf("%s\n", host::cpu_report().c_str());
  const io::ByteTokenizer tk;
  std::vector<std::int32_t> tok(B * T), tgt(B * T);
  try {
    io::TokenDataset austen = io::TokenDataset::from_text(a.corpus / "austen.txt", tk, 0.02);
    io::TokenDataset kjv = io::TokenDataset::from_text(a.corpus / "kjv.txt", tk, 0.02);
    std::printf("corpora: Austen %zu bytes (unigram baseline %.3f nats/byte), KJV %zu bytes (unigram %.3f)\n", austen.size(),
                austen.unigram_loss(), kjv.size(), kjv.unigram_loss());

    // ---- 1. pretraining --------------------------------------------------------------------------
    const fs::path base_file = a.out / "tiny_llama_austen.safetensors";
    double pre_tps = 0;
    std::string pre_sample;
    std::int64_t pre_arena = 0;
    {
      host::Trainer<Pretrain> t({.seed = 1, .threads = a.threads, .lr = a.lr_pretrain, .warmup_steps = 20,
                                 .total_steps = a.pretrain_steps});
      pre_arena = t.arena_bytes();
      std::printf("\npretrain tiny_llama (%lld parameters) on Austen: batch %lld x %lld, AdamW, %d steps\n",
                  static_cast<long long>(Pretrain::dtype == DType::F32 ? host::Trainer<Pretrain>::plan.parameters() : 0),
                  static_cast<long long>(B), static_cast<long long>(T), a.pretrain_steps);
      std::printf("  plan peak %.2f MiB, arena %.2f MiB\n", mib(host::Trainer<Pretrain>::plan.peak_bytes()), mib(t.arena_bytes()));
      pre_tps = train(t, austen, a.pretrain_steps, "pretrain", tok, tgt);
      const double val = validation_loss(t, austen, a.eval_batches, tok, tgt);
      std::printf("  Austen validation loss %.3f nats/byte (unigram baseline %.3f): %s\n", val, austen.unigram_loss(),
                  val < austen.unigram_loss() - 0.3 ? "clearly below" : "NOT clearly below");
      io::save_pretrained(t, base_file);
      std::printf("  saved %s (%.2f MiB)\n", base_file.c_str(), mib(static_cast<std::int64_t>(fs::file_size(base_file))));
      pre_sample = sample(t, tk, "It is a truth universally acknowledged", 160);
    }

    // ---- 2. QLoRA fine-tuning --------------------------------------------------------------------
    host::Trainer<Finetune> f({.seed = 2, .threads = a.threads, .lr = a.lr_finetune, .warmup_steps = 10,
                               .total_steps = a.finetune_steps});
    io::load_pretrained(f, base_file);  // NF4-quantizes the projections as it loads them
    std::printf("\nQLoRA fine-tune on the King James Bible: NF4 base, LoRA r16 on q/k/v/o, checkpointed blocks, %d steps\n",
                a.finetune_steps);
    std::printf("  trainable %lld of %lld parameters; plan peak %.2f MiB (pretraining: %.2f MiB)\n",
                static_cast<long long>(host::Trainer<Finetune>::plan.trainable_parameters()),
                static_cast<long long>(host::Trainer<Finetune>::plan.parameters()),
                mib(host::Trainer<Finetune>::plan.peak_bytes()), mib(host::Trainer<Pretrain>::plan.peak_bytes()));
    const double before = validation_loss(f, kjv, a.eval_batches, tok, tgt);
    const double fine_tps = train(f, kjv, a.finetune_steps, "finetune", tok, tgt, a.out / "qlora-checkpoint");
    const double after = validation_loss(f, kjv, a.eval_batches, tok, tgt);
    const std::string fine_sample = sample(f, tk, "And God said", 160);
    io::export_adapter(f, a.out / "adapter", "tiny_llama_austen");
    std::printf("  adapter exported in PEFT's layout to %s (adapter_model.safetensors, adapter_config.json)\n",
                (a.out / "adapter").c_str());

    // ---- 3. the figures ------------------------------------------------------------------------------
    std::printf("\nKJV validation loss: before %.3f, after %.3f nats/byte (unigram %.3f)\n", before, after, kjv.unigram_loss());
    std::printf("\nsample after pretraining (Austen):\n  %s\n", pre_sample.c_str());
    std::printf("sample after QLoRA (KJV):\n  %s\n", fine_sample.c_str());
    using Gen = host::Generator<Finetune, Context<T>>;
    std::printf("\nmemory\n");
    std::printf("  pretrain  plan peak %10lld B  arena %10lld B\n", static_cast<long long>(host::Trainer<Pretrain>::plan.peak_bytes()),
                static_cast<long long>(pre_arena));
    std::printf("  finetune  plan peak %10lld B  arena %10lld B\n", static_cast<long long>(host::Trainer<Finetune>::plan.peak_bytes()),
                static_cast<long long>(f.arena_bytes()));
    std::printf("  generate  KV cache %lld B (context %lld), decode arena %lld B\n", static_cast<long long>(Gen::plan.kv_cache_bytes),
                static_cast<long long>(T), static_cast<long long>(Gen::plan.arena_bytes()));
    std::printf("  process peak resident (VmHWM) %.1f MiB\n", mib(host::peak_resident_bytes()));
    std::printf("speed: pretrain %.0f tokens/s, QLoRA fine-tune %.0f tokens/s (%d threads)\n", pre_tps, fine_tps, f.threads());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ndemo: %s\n", e.what());
    return 1;
  }
  return 0;
}

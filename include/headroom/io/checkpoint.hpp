#pragma once
// Training checkpoints that resume bit-identically, of host::Trainer and of
// cuda::Trainer (which copies its state to host memory and back:
// checkpoint_image). A run over several processes saves one part per
// process (sharded_checkpoint.hpp). Not in the umbrella header.
//
//   io::save_checkpoint(trainer, "run/ckpt", R"({"loader_position": 1234})");
//   host::Trainer<Run> resumed(options);                // the same Run and options
//   std::string extra = io::load_checkpoint(resumed, "run/ckpt");
//
// A checkpoint is a directory of three files:
//
//   model.safetensors      every parameter exactly as the arena stores it, named
//                          by its trainer path ("layers.0.self_attn.q_proj.weight"):
//                            dense        dtype of the run (F32 / F64), shape (rows, cols)
//                            quantized    "<path>" its codes, U8 (code bytes), and
//                                         "<path>.scales" its scaling state, U8 (scale bytes),
//                                         raw (host/quant.hpp describes both layouts)
//                            master       "<path>.master", F32 (rows, cols), where the run has them
//   optimizer.safetensors  "<path>": each trainable parameter's optimizer state,
//                          raw bytes, U8 (state bytes); "__quant_table__" and
//                          "__optim_table__": the model's shared code tables, if any
//   trainer.json           {"format": "headroom-checkpoint", "version": 4,
//                           "steps_done": N,
//                           "loss_scale": {"scale", "growth_tracker", "skipped"}  (a run that
//                                         scales its loss: train/loss_scaling.hpp),
//                           "signature": {"model", "dtype", "optimizer", "param_count",
//                                         "parameters": ["<path>: <storage>, shape (r, c)[, master f32],
//                                                         state <B> B" | "frozen", ...]},
//                           "files": {"model.safetensors": {"bytes", "hash"}, ...},
//                           "options": {lr, warmup_steps, ...}   (informational),
//                           "extra": <the caller's JSON object, verbatim>,
//                           "checksum": "<16 hex digits>"}  (the hash of this text with
//                                         these digits as zeros: an edited file is refused)
//
// The signature is what the checkpoint stores, so a checkpoint moves between
// runs that differ only in what is not saved (batch, sequence length,
// Workers<W>, checkpointed or offloaded activations), and a run that stores
// something else is refused with the first difference named.
//
// Gradients are not saved: a step overwrites them before reading them. The
// learning-rate schedule is a function of the step count and the trainer's
// options, so the resumed trainer must be built with the same TrainOptions
// (trainer.json records them but does not enforce them).
//
// What a save may replace: a missing path, an empty directory or a headroom
// checkpoint (a directory whose trainer.json says "headroom-checkpoint").
// Anything else (a file, a folder of other things) is refused with
// io::overwrite_refused before anything is touched.
//
// Atomic save: the three files are written into a new sibling directory of
// the save's own, "<dir>.headroom-saving-<12 random characters of [a-z0-9]>"
// (made by mkdir, so by this save alone: io/durable.hpp), fsync'ed
// (trainer.json last, renamed into place once everything else is on disk, so
// its presence marks a complete checkpoint), and the directory is then
// swapped in: on Linux with one renameat2(RENAME_EXCHANGE) (the old
// checkpoint is removed after), elsewhere by renaming `dir` over a new empty
// "<dir>.headroom-old-<random>", renaming the new one in and removing the old
// one. An interrupted save therefore leaves the old or the new checkpoint,
// never a broken one: load_checkpoint, when `dir` is missing, reads the
// complete sibling an interrupted swap left behind, and the next
// save_checkpoint finishes or discards what an interrupted one left. One
// process saves to a given `dir` at a time.
//
// What a save may read, move or remove beside `dir`: only directories it
// could have made itself (left_by_saves): named exactly "<dir>.headroom-
// saving-" or "<dir>.headroom-old-" and 12 characters of [a-z0-9], real
// directories (not links) owned by this user, holding nothing but the files
// a save writes. Anything else, "<dir>.headroom-saving" of the user's or a
// link of such a name included, is never touched.
//
// trainer.json is checked as the other files are: its last member,
// "checksum", is the hash of its own text (with those 16 digits as zeros),
// so an edited step count or option, or a damaged file, is refused naming
// trainer.json. The hash detects edits and corruption, not tampering (anyone
// can recompute it). Checkpoints of versions 1 to 3, written before the
// checksum, have none and load as before.
//
// load_checkpoint checks, before it writes anything into the trainer, that
// trainer.json is as save_checkpoint wrote it (its checksum), that its
// signature is this trainer's (another model, dtype,
// optimizer or parameter layout is refused with the differences named), that both files
// have the size and hash trainer.json recorded, and that every tensor is
// present with its dtype and shape. Errors are io::checkpoint_error, or the
// safetensors reader's io::format_error naming the tensor (checkpoint_error
// is a format_error, so one catch takes both).
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_files.hpp"
#include "sharded_checkpoint.hpp"

namespace headroom::io {

// Saves the trainer's parameters, optimizer state and step count to `dir`
// (see the top of this file), atomically. `extra_json`, if not empty, must be
// a JSON object; load_checkpoint returns it verbatim. A data-parallel run's
// ranks all call it, each saving its part (sharded_checkpoint.hpp).
template <class Trainer>
void save_checkpoint(const Trainer& t, const std::filesystem::path& dir, std::string_view extra_json = "") {
  namespace fs = std::filesystem;
  namespace ck = detail::checkpoint;
  const std::string extra = ck::checked_extra(extra_json);
  if constexpr (Trainer::config.world() > 1) {
    ck::save_sharded(t, dir, extra);
  } else {
    const fs::path d = ck::normalized(dir);
    ck::check_replaceable(d);
    const auto image = ck::image_of(t);
    const std::vector<TensorView> model = ck::model_tensors<Trainer>(image);
    ck::check_finite(d, model, t.steps_done());
    fs::create_directories(ck::parent_of(d));
    ck::recover(d);
    const fs::path staging = detail::durable::create_own_directory(d, ck::staging_marker);
    try {
      write_safetensors(staging / ck::model_file, model, {{"format", "headroom-checkpoint"}});
      ck::stage(ck::model_file);
      write_safetensors(staging / ck::optimizer_file, ck::optimizer_tensors<Trainer>(image), {{"format", "headroom-checkpoint"}});
      ck::stage(ck::optimizer_file);
      // The two safetensors files are durable already (write_safetensors
      // fsyncs them and the staging directory); trainer.json goes the same way.
      const std::vector<ck::FileRecord> files{ck::record(staging, ck::model_file), ck::record(staging, ck::optimizer_file)};
      ck::finish_save(staging, d, ck::trainer_json(t, files, extra, ck::format_version, ""));
    } catch (...) {
      std::error_code ec;
      fs::remove_all(staging, ec);
      throw;
    }
  }
}

// Restores a checkpoint written by save_checkpoint into a trainer of the
// same run: parameters, optimizer state, code tables and the step count.
// Returns the caller's extra JSON object as it was saved. Every rank of a
// data-parallel run calls it.
template <class Trainer>
std::string load_checkpoint(Trainer& t, const std::filesystem::path& dir) {
  namespace ck = detail::checkpoint;
  if constexpr (Trainer::config.world() > 1) {
    return ck::load_sharded(t, dir);
  } else {
    const ck::Opened o = ck::open_checkpoint<Trainer>(dir);
    ck::check_files(o, {ck::model_file, ck::optimizer_file});
    // every tensor present with its dtype and shape, then restored
    const SafetensorsFile model(o.dir / ck::model_file), optim(o.dir / ck::optimizer_file);
    const auto image = ck::image_of(t);
    const std::vector<TensorView> mv = ck::model_tensors<Trainer>(image), ov = ck::optimizer_tensors<Trainer>(image);
    ck::expect_exactly(model, mv);
    ck::expect_exactly(optim, ov);
    ck::read_all(model, mv);
    ck::read_all(optim, ov);
    ck::restore_image(t, image);
    t.set_steps_done(static_cast<int>(o.steps));
    ck::restore_loss_scale(o, t);
    return ck::extra_of(o);
  }
}

}  // namespace headroom::io

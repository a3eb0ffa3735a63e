#pragma once
// Checkpoints of a parallel run (DataParallel<N>, ZeRO<S>, TensorParallel<M>,
// PipelineParallel<P>), of either engine's trainer: one directory for the
// whole job, each process writing its own part. Every process calls
// io::save_checkpoint / io::load_checkpoint (checkpoint.hpp) with the same
// directory, which must be on a file system every one sees. Files are
// numbered by the process's rank r in the run (Trainer::world());
// "data-parallel rank" is Trainer::rank(). The processes exchange what the
// host agrees on (names, sizes, errors) through the trainer's communicator
// (gather_on_host). With tensor parallelism each process holds its block
// of the split parameters (ParamSlot::split), which its files hold as they
// are.
//
// The directory (format version 4; version 3 is read as well: the same
// without trainer.json's checksum):
//   model.rank-<r>.safetensors      process r's part of the parameters. ZeRO
//                                   3: its shard of each, "<path>" as a 1-D
//                                   tensor of the elements it holds
//                                   (Trainer::shard_of; quantized:
//                                   "<path>" and "<path>.scales", U8 byte
//                                   shards). Below ZeRO 3 the data-parallel
//                                   ranks hold the same parameters:
//                                   data-parallel rank 0 writes them whole, as
//                                   one process does; the others' files hold
//                                   no tensor.
//   optimizer.rank-<r>.safetensors  process r's optimizer state: ZeRO 1-3 the
//                                   state of the elements it updates ("<path>",
//                                   U8) and, where the run keeps f32 master
//                                   weights (a 16-bit cuda::Trainer), their
//                                   master weights ("<path>.master", F32,
//                                   1-D); ZeRO 0 data-parallel rank 0's whole
//                                   state (its masters whole are in its model
//                                   file, as one process keeps them); every
//                                   file also holds the shared code tables.
//   trainer.json                    as for one process, with "layout":
//                                   {"data_parallel": N, "zero": S,
//                                   "tensor_parallel": M, "pipeline_parallel":
//                                   P} and every process's files, their sizes
//                                   and hashes. With pipeline parallelism each
//                                   process holds its stage's parameters.
//
// Atomic as one process's save: rank 0 makes the staging directory (a new
// one of its own, its name sent to every rank), every rank writes and fsyncs
// its files into it, rank 0 checks that it sees every rank's files there, of
// the sizes their ranks wrote, and writes trainer.json once all have, then
// swaps the directory in. Ranks that do not see one file system under the
// path (a rank that does not see rank 0's staging directory, or whose files
// rank 0 does not see) fail the save on every rank with the directory or the
// file named, and the checkpoint there stays as it was. A rank that cannot
// do its part (the target may not be replaced, a weight is not finite, a
// write fails) fails the save on every rank, each with an error (its own, or
// one naming the ranks that failed and quoting the first one's error), and
// the checkpoint there stays as it was. A rank
// that dies during a save leaves the old checkpoint in place too (the others
// get a communication error, or are stopped by the launcher).
//
// load_checkpoint refuses a checkpoint of another layout (another N or
// stage, or one process's) with the difference named; it checks, on every
// rank, every file that rank reads before any rank writes into its trainer.
// Resuming on the same layout is bit-identical.
#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "../train/ownership.hpp"
#include "checkpoint_files.hpp"

namespace headroom::io::detail::checkpoint {

inline std::string rank_file(const char* kind, int r) { return std::string(kind) + ".rank-" + std::to_string(r) + ".safetensors"; }

// The ranks exchange on the host: block_bytes bytes of host memory from
// every rank, by rank, into `data` (size() blocks; this rank's own is block
// rank()). host::Communicator's all_gather; cuda::Communicator's
// all_gather_on_host (its collectives take device memory).
template <class Comm>
void gather_on_host(Comm& c, void* data, std::int64_t block_bytes) {
  if constexpr (requires { c.all_gather_on_host(data, block_bytes); }) c.all_gather_on_host(data, block_bytes);
  else c.all_gather(data, block_bytes);
}

// Rank `from`'s string `s` (what the other ranks pass is not read), on every rank.
template <class Comm>
std::string from_rank(Comm& c, int from, const std::string& s) {
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(c.size()), 0);
  sizes[static_cast<std::size_t>(c.rank())] = s.size();
  gather_on_host(c, sizes.data(), sizeof(std::uint64_t));
  const std::size_t n = static_cast<std::size_t>(sizes[static_cast<std::size_t>(from)]);
  if (n == 0) return {};
  std::vector<char> all(n * static_cast<std::size_t>(c.size()), '\0');
  if (c.rank() == from) std::memcpy(all.data() + n * static_cast<std::size_t>(from), s.data(), n);
  gather_on_host(c, all.data(), static_cast<std::int64_t>(n));
  return std::string(all.data() + n * static_cast<std::size_t>(from), n);
}

// Every rank reports whether its part succeeded; when one failed, every rank
// throws: the failed ones their own error, the others one naming the failed
// ranks and quoting the first one's error.
template <class Comm>
void settle(Comm& c, std::exception_ptr error, const std::filesystem::path& d, const std::string& what) {
  std::vector<std::uint8_t> failed(static_cast<std::size_t>(c.size()), 0);
  failed[static_cast<std::size_t>(c.rank())] = error ? 1 : 0;
  gather_on_host(c, failed.data(), 1);
  std::string ranks;
  int first = -1;
  for (int r = 0; r < c.size(); ++r)
    if (failed[static_cast<std::size_t>(r)] != 0) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      if (first < 0) first = r;
    }
  if (ranks.empty()) return;
  std::string mine;  // the first failed rank's message, to every rank
  if (c.rank() == first) {
    mine = "an unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      mine = e.what();
    } catch (...) {
    }
  }
  const std::string message = from_rank(c, first, mine);
  if (error) std::rethrow_exception(error);
  fail(d, what + ": rank " + ranks + " of " + std::to_string(c.size()) + " failed; rank " + std::to_string(first) + ": " + message);
}

template <class Trainer, class Image>
std::vector<TensorView> rank_model_tensors(const Trainer& t, const Image& image) {
  if constexpr (!Trainer::config.sharded(3)) {
    // (with ZeRO 1 and 2 the master weights are sharded: in the optimizer files)
    return t.rank() == 0 ? model_tensors<Trainer>(image, !Trainer::config.sharded(1)) : std::vector<TensorView>{};
  } else {
    constexpr DType dt = Trainer::config.dtype;
    std::vector<TensorView> v;
    for (std::size_t k = 0; k < Trainer::param_count; ++k) {
      const ParamSlot& p = Trainer::param(k);
      const std::string path = Trainer::path_of(p);
      if (p.quant.kind == QuantKind::none) {
        const auto s = t.shard_of(p);
        if (s.count > 0) v.push_back(TensorView{path, dt, {s.count}, image.weight(p)});
      } else {
        const auto codes = trainers::held_bytes(Trainer::config, p.quant.code_bytes(p.elements()), t.rank());
        const auto scales = trainers::held_bytes(Trainer::config, p.quant.scale_bytes(p.elements()), t.rank());
        if (codes.count > 0) v.push_back(TensorView{path, DType::U8, {codes.count}, image.codes(p)});
        if (scales.count > 0) v.push_back(TensorView{path + ".scales", DType::U8, {scales.count}, image.scales(p)});
      }
    }
    return v;
  }
}

template <class Trainer, class Image>
std::vector<TensorView> rank_optimizer_tensors(const Trainer& t, const Image& image) {
  if constexpr (Trainer::config.sharded(1))  // and the master weights of the elements it updates
    return optimizer_tensors<Trainer>(image, [&t](const ParamSlot& p) { return t.shard_of(p).count; }, true);
  else if (t.rank() == 0) return optimizer_tensors<Trainer>(image);
  else return optimizer_tensors<Trainer>(image, [](const ParamSlot&) { return std::int64_t{0}; });  // the tables alone
}

template <class Trainer>
void save_sharded(const Trainer& t, const std::filesystem::path& dir, const std::string& extra) {
  namespace fs = std::filesystem;
  auto& c = *t.world();
  const int r = c.rank(), n = c.size();
  const fs::path d = normalized(dir);
  fs::path staging;
  const std::string not_saved = "not saved; the checkpoint there, if any, is left as it was";
  std::exception_ptr error;

  // 1. every rank: the target may be replaced, and its weights are finite
  const auto image = image_of(t);
  std::vector<TensorView> model, optim;
  try {
    check_replaceable(d);
    model = rank_model_tensors(t, image);
    optim = rank_optimizer_tensors(t, image);
    check_finite(d, model, t.steps_done());
    check_finite(d, optim, t.steps_done());  // (ZeRO 1-3: the master weights are there)
  } catch (...) {
    error = std::current_exception();
  }
  settle(c, error, d, not_saved);

  // 2. rank 0 makes the staging directory (its own new one: io/durable.hpp)
  // and tells the others its name
  if (r == 0) {
    try {
      fs::create_directories(parent_of(d));
      recover(d);
      staging = durable::create_own_directory(d, staging_marker);
    } catch (...) {
      error = std::current_exception();
    }
  }
  settle(c, error, d, not_saved);
  staging = parent_of(d) / from_rank(c, 0, staging.filename().string());

  // 3. every rank writes its files (fsync'ed by write_safetensors) and hashes them
  std::vector<FileRecord> mine;
  try {
    std::error_code ec;
    if (r != 0 && !fs::is_directory(staging, ec))
      fail(d, "not saved: rank " + std::to_string(r) + " does not see " + staging.string() +
                  ", the directory rank 0 made for this save: the ranks do not save to one file system (every rank must "
                  "see the checkpoint's directory); the checkpoint there, if any, is left as it was");
    for (const auto& [kind, views] : {std::pair{model_file, &model}, std::pair{optimizer_file, &optim}}) {
      const std::string name = rank_file(kind == model_file ? "model" : "optimizer", r);
      write_safetensors(staging / name, *views, {{"format", "headroom-checkpoint"}});
      mine.push_back(record(staging, name));
    }
    stage("written");
  } catch (...) {
    error = std::current_exception();
  }
  auto discard = [&] {
    std::error_code ec;
    if (r == 0) fs::remove_all(staging, ec);
  };
  try {
    settle(c, error, d, not_saved);
  } catch (...) {
    discard();
    throw;
  }

  // 4. every rank's records reach rank 0: (bytes, 16 hex digits) per file
  struct Packed {
    std::uint64_t bytes[2];
    char hash[2][16];
  };
  std::vector<Packed> all(static_cast<std::size_t>(n));
  for (int f = 0; f < 2; ++f) {
    all[static_cast<std::size_t>(r)].bytes[f] = mine[static_cast<std::size_t>(f)].bytes;
    std::memcpy(all[static_cast<std::size_t>(r)].hash[f], mine[static_cast<std::size_t>(f)].hash.data(), 16);
  }
  gather_on_host(c, all.data(), sizeof(Packed));

  // 5. rank 0 sees every rank's files, of the sizes written, in its staging
  // directory (ranks that see other file systems under one path wrote
  // elsewhere), before anything replaces the checkpoint there; if not, every
  // rank throws the same error, naming the first file rank 0 does not see
  std::string unseen;
  for (int q = 0; r == 0 && q < n && unseen.empty(); ++q)
    for (int f = 0; f < 2 && unseen.empty(); ++f) {
      const fs::path p = staging / rank_file(f == 0 ? "model" : "optimizer", q);
      std::error_code ec;
      const bool seen = fs::is_regular_file(fs::symlink_status(p, ec));  // not a link to something else
      const std::uint64_t bytes = seen ? fs::file_size(p, ec) : 0, wrote = all[static_cast<std::size_t>(q)].bytes[f];
      if (!seen || ec) unseen = "rank 0 does not see " + p.string() + ", which rank " + std::to_string(q) + " wrote";
      else if (bytes != wrote)
        unseen = "rank 0 sees " + p.string() + " of " + std::to_string(bytes) + " bytes, rank " + std::to_string(q) + " wrote " +
                 std::to_string(wrote);
    }
  unseen = from_rank(c, 0, unseen);
  if (!unseen.empty()) {
    discard();
    fail(d, "not saved: " + unseen + ": the ranks do not save to one file system (every rank must see the checkpoint's "
                                     "directory); the checkpoint there, if any, is left as it was");
  }

  // 6. rank 0 writes trainer.json and swaps the directory in
  if (r == 0) {
    try {
      std::vector<FileRecord> files;
      for (int q = 0; q < n; ++q)
        for (int f = 0; f < 2; ++f)
          files.push_back(FileRecord{rank_file(f == 0 ? "model" : "optimizer", q), all[static_cast<std::size_t>(q)].bytes[f],
                                     std::string(all[static_cast<std::size_t>(q)].hash[f], 16)});
      detail::json::Writer layout;
      layout.begin_object()
          .key("data_parallel").integer(Trainer::config.dp)
          .key("zero").integer(Trainer::config.zero)
          .key("tensor_parallel").integer(Trainer::config.tp)
          .key("pipeline_parallel").integer(Trainer::config.pp)
          .end();
      finish_save(staging, d, trainer_json(t, files, extra, format_version, layout.text()));
    } catch (...) {
      error = std::current_exception();
      discard();
    }
  }
  settle(c, error, d, not_saved);
}

template <class Trainer>
std::string load_sharded(Trainer& t, const std::filesystem::path& dir) {
  auto& c = *t.world();
  const int r = c.rank();
  const std::string not_loaded = "not loaded; no rank's trainer was changed";
  std::exception_ptr error;
  // the files this process reads: its own, and those of data-parallel rank 0
  // of its stage and tensor-parallel rank (process `first`) where that one wrote for all
  const int first = Trainer::stage() * Trainer::config.dp * Trainer::config.tp + t.tensor_rank();
  std::vector<std::string> reads{rank_file("model", r), rank_file("optimizer", r)};
  if (!Trainer::config.sharded(3) && r != first) reads.push_back(rank_file("model", first));
  if (!Trainer::config.sharded(1) && r != first) reads.push_back(rank_file("optimizer", first));

  // 1. every rank checks everything it will read
  Opened o;
  const auto image = image_of(t);
  std::vector<TensorView> model, optim;
  try {
    o = open_checkpoint<Trainer>(dir);
    check_files(o, reads);
    // what this rank restores, from which file
    model = !Trainer::config.sharded(3) ? model_tensors<Trainer>(image, !Trainer::config.sharded(1)) : rank_model_tensors(t, image);
    optim = !Trainer::config.sharded(1) ? optimizer_tensors<Trainer>(image) : rank_optimizer_tensors(t, image);
    const SafetensorsFile mf(o.dir / rank_file("model", Trainer::config.sharded(3) ? r : first));
    const SafetensorsFile of(o.dir / rank_file("optimizer", Trainer::config.sharded(1) ? r : first));
    expect_exactly(mf, model);
    expect_exactly(of, optim);
  } catch (...) {
    error = std::current_exception();
  }
  settle(c, error, normalized(dir), not_loaded);

  // 2. every rank restores its part
  read_all(SafetensorsFile(o.dir / rank_file("model", Trainer::config.sharded(3) ? r : first)), model);
  read_all(SafetensorsFile(o.dir / rank_file("optimizer", Trainer::config.sharded(1) ? r : first)), optim);
  restore_image(t, image);
  t.set_steps_done(static_cast<int>(o.steps));
  restore_loss_scale(o, t);
  return extra_of(o);
}

}  // namespace headroom::io::detail::checkpoint

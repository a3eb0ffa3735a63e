#pragma once
// Hugging Face weight files as the io tests handle them: every tensor of a
// file raw (to change one and write them back), a parameter's values as
// f32 (dequantized when quantized), and two trainers' weights compared.
#include <catch2/catch.hpp>

#include "fixtures.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <headroom/host/quant.hpp>
#include <headroom/io/safetensors.hpp>
#include <headroom/plan/schedule.hpp>

namespace headroom::test::hf_files {

namespace fs = std::filesystem;

template <class Tr>
std::vector<float> dense(const Tr& t, const ParamSlot& p) {
  std::vector<float> v(static_cast<std::size_t>(p.elements()));
  if (p.quant.kind == QuantKind::none) std::copy(t.weight(p), t.weight(p) + p.elements(), v.begin());
  else host::dequantize_rows<float>(t.quant(p), 0, p.rows, v.data());
  return v;
}

template <class Tr>
void require_same_weights(const Tr& a, const Tr& b) {
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    INFO(Tr::path_of(p));
    REQUIRE(test::mismatch_at(dense(a, p), dense(b, p)) == -1);
  }
}

// All tensors of a file, raw, so a test can change one and write them back.
struct Raw {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
};
inline std::vector<Raw> read_all(const fs::path& p) {
  const io::SafetensorsFile f(p);
  std::vector<Raw> out;
  for (const io::TensorInfo& t : f.tensors()) {
    Raw r{t.name, t.dtype, t.shape, std::vector<unsigned char>(t.end - t.begin)};
    f.read(t.name, r.bytes.data(), r.bytes.size());
    out.push_back(std::move(r));
  }
  return out;
}
inline void write_all(const fs::path& p, const std::vector<Raw>& raws) {
  std::vector<io::TensorView> v;
  for (const Raw& r : raws) v.push_back({r.name, r.dtype, r.shape, r.bytes.data()});
  io::write_safetensors(p, v);
}
inline Raw& named(std::vector<Raw>& raws, const std::string& name) {
  for (Raw& r : raws)
    if (r.name == name) return r;
  FAIL("no tensor " << name);
  return raws.front();
}

}  // namespace headroom::test::hf_files

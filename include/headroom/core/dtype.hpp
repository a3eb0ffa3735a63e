#pragma once
// Element types of stored tensors and their sizes.
#include <cstdint>
#include <string_view>

namespace headroom {

enum class DType : std::uint8_t { F32, BF16, F16, F64, I32, I8, U8 };

constexpr std::int64_t size_of(DType t) {
  switch (t) {
    case DType::F64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::I8: case DType::U8: return 1;
  }
  return 0;
}

constexpr std::string_view name_of(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
  }
  return "?";
}

// True for the 16-bit float storage types that need f32 master weights.
constexpr bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

// Tags usable as template arguments: Precision<BF16>.
inline constexpr DType F32 = DType::F32;
inline constexpr DType BF16 = DType::BF16;
inline constexpr DType F16 = DType::F16;
inline constexpr DType F64 = DType::F64;

}  // namespace headroom

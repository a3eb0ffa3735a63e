// An integer storage type.
// expect: Precision<T>: T must be F32, BF16, F16 or F64
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Precision<DType::I8>);

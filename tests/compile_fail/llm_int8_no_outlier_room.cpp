// LLM.int8's bound on outlier columns must leave room for one.
// expect-gcc: LLMInt8<Threshold, MaxOutliers>: the bound on outlier columns must be positive (it is 0)
// expect-clang: headroom::diag::values<0>::hold<false>
// expect-clang: LLMInt8<Threshold, MaxOutliers>: the bound on outlier columns must be positive (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Quantized<LLMInt8<Ratio<6>, 0>, Linear<64, 64>>);

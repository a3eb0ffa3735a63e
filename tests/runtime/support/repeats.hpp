#pragma once
// How often a test runs one code path over, in the Release build and under
// the sanitizers.
//
// The sanitizer build (Debug, AddressSanitizer + UndefinedBehaviorSanitizer,
// build-sanitize/ in scripts/test) looks for memory errors and undefined
// behaviour: one pass over a code path shows what it would find, and every
// pass costs 20 to 50 times the Release build's. The tests that check numbers
// by running a path many times (a gradient check on many elements of each
// parameter, a run of many steps compared step by step) take their full
// count in the Release build, which checks the numbers, and a small count
// under the sanitizers, which still runs every path at least twice (the
// second step of a run is the first to read optimizer state and masters a
// step wrote).

// 1 in a build under AddressSanitizer (g++ and clang++ say so differently),
// else 0: for a test that must decide with the preprocessor.
#if defined(__SANITIZE_ADDRESS__)
#define HEADROOM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEADROOM_TEST_SANITIZED 1
#endif
#endif
#ifndef HEADROOM_TEST_SANITIZED
#define HEADROOM_TEST_SANITIZED 0
#endif

namespace headroom::test {

inline constexpr bool under_sanitizers = HEADROOM_TEST_SANITIZED != 0;

// `release` in the Release build, `sanitized` under the sanitizers.
constexpr int repeats(int release, int sanitized) { return under_sanitizers ? sanitized : release; }

}  // namespace headroom::test

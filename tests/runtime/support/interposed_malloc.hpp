#pragma once
// Interposes malloc and friends for a test program that counts allocations
// (glibc's __libc_* entry points do the work), so every allocation of the
// process is seen: operator new, Eigen's aligned_malloc, the OpenMP runtime,
// MPI, the C library. Each calls counted_allocation(bytes), which the test
// defines. Include it in exactly one translation unit of the program.
#include <cstddef>

void counted_allocation(std::size_t bytes);

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t n) {
  counted_allocation(n);
  return __libc_malloc(n);
}
void* calloc(std::size_t a, std::size_t b) {
  counted_allocation(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, std::size_t n) {
  counted_allocation(n);
  return __libc_realloc(p, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) {
  counted_allocation(n);
  return __libc_memalign(align, n);
}
void* memalign(std::size_t align, std::size_t n) {
  counted_allocation(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) {
  counted_allocation(n);
  *out = __libc_memalign(align, n);
  return *out == nullptr ? 12 /* ENOMEM */ : 0;
}
}

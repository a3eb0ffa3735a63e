#pragma once
// cvec<T>: the growable array the constexpr planner uses.
//
// std::vector works in constant evaluation with GCC, but clang 14 rejects
// libstdc++'s fill / copy into freshly allocated storage. cvec allocates
// with new T[] (elements always constructed) and copies by assignment, so
// both compilers evaluate it; T must be default-constructible and copyable.
#include <cstddef>

namespace headroom::detail {

template <class T>
class cvec {
 public:
  constexpr cvec() = default;
  constexpr cvec(std::size_t n, const T& v) { assign(n, v); }
  constexpr cvec(const cvec& o) { copy_from(o); }
  constexpr cvec(cvec&& o) noexcept : data_(o.data_), size_(o.size_), cap_(o.cap_) {
    o.data_ = nullptr;
    o.size_ = o.cap_ = 0;
  }
  constexpr cvec& operator=(const cvec& o) {
    if (this != &o) {
      release();
      copy_from(o);
    }
    return *this;
  }
  constexpr cvec& operator=(cvec&& o) noexcept {
    if (this != &o) {
      release();
      data_ = o.data_;
      size_ = o.size_;
      cap_ = o.cap_;
      o.data_ = nullptr;
      o.size_ = o.cap_ = 0;
    }
    return *this;
  }
  constexpr ~cvec() { release(); }

  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T& operator[](std::size_t i) { return data_[i]; }
  constexpr const T& operator[](std::size_t i) const { return data_[i]; }
  constexpr T& back() { return data_[size_ - 1]; }
  constexpr const T& back() const { return data_[size_ - 1]; }
  constexpr T* begin() { return data_; }
  constexpr T* end() { return data_ + size_; }
  constexpr const T* begin() const { return data_; }
  constexpr const T* end() const { return data_ + size_; }

  constexpr void reserve(std::size_t n) {
    if (n <= cap_) return;
    T* d = new T[n];
    for (std::size_t i = 0; i < size_; ++i) d[i] = static_cast<T&&>(data_[i]);
    delete[] data_;
    data_ = d;
    cap_ = n;
  }
  constexpr void push_back(const T& v) {
    if (size_ == cap_) reserve(cap_ < 8 ? 8 : cap_ * 2);
    data_[size_++] = v;
  }
  // Appends a default element and returns it, to be filled in place (a
  // copy of a large struct is costly in constant evaluation).
  constexpr T& emplace_back() {
    if (size_ == cap_) reserve(cap_ < 8 ? 8 : cap_ * 2);
    data_[size_] = T{};
    return data_[size_++];
  }
  constexpr void pop_back() { --size_; }
  constexpr void clear() { size_ = 0; }
  constexpr void assign(std::size_t n, const T& v) {
    clear();
    reserve(n);
    for (std::size_t i = 0; i < n; ++i) data_[i] = v;
    size_ = n;
  }
  // Inserts v before position pos (0 <= pos <= size).
  constexpr void insert_at(std::size_t pos, const T& v) {
    push_back(v);
    for (std::size_t i = size_ - 1; i > pos; --i) data_[i] = data_[i - 1];
    data_[pos] = v;
  }
  constexpr void erase_at(std::size_t pos) {
    for (std::size_t i = pos; i + 1 < size_; ++i) data_[i] = data_[i + 1];
    --size_;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;

  constexpr void release() {
    delete[] data_;
    data_ = nullptr;
    size_ = cap_ = 0;
  }
  constexpr void copy_from(const cvec& o) {
    reserve(o.size_);
    for (std::size_t i = 0; i < o.size_; ++i) data_[i] = o.data_[i];
    size_ = o.size_;
  }
};

}  // namespace headroom::detail

// Buffer<T>: a std::vector whose resize leaves new elements of a trivial T uninitialised, for
// buffers whose every element is written before it is read (a kernel's output, a conversion's
// destination). std::vector<float>::resize writes zeros first: for a megabyte of attention
// output that is a megabyte of memory written twice, on the batch thread.
#ifndef ATTNSERVE_BASE_BUFFER_H_
#define ATTNSERVE_BASE_BUFFER_H_

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace attnserve {

// std::allocator, but value-initialisation without arguments (resize, the count constructor)
// default-initialises instead: nothing for a trivial T.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  static_assert(std::is_trivially_default_constructible_v<T>, "for trivial element types");
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}

  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <class T>
using Buffer = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_BUFFER_H_

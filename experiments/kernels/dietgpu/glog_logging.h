// Minimal stand-in for glog: DietGPU uses it only for CHECK macros (abort on failure).
#pragma once
#include <cstdlib>
#include <iostream>
#include <sstream>
namespace glogstub {
struct Fatal {
  std::ostringstream s;
  Fatal(const char* f, int l, const char* c) { s << f << ":" << l << " check failed: " << c << " "; }
  ~Fatal() { std::cerr << s.str() << std::endl; std::abort(); }
  template <class T> Fatal& operator<<(const T& v) { s << v; return *this; }
};
struct Null { template <class T> Null& operator<<(const T&) { return *this; } };
}  // namespace glogstub
#define CHECK(c) if (c) {} else ::glogstub::Fatal(__FILE__, __LINE__, #c)
#define CHECK_EQ(a, b) CHECK((a) == (b))
#define CHECK_NE(a, b) CHECK((a) != (b))
#define CHECK_LE(a, b) CHECK((a) <= (b))
#define CHECK_LT(a, b) CHECK((a) < (b))
#define CHECK_GE(a, b) CHECK((a) >= (b))
#define CHECK_GT(a, b) CHECK((a) > (b))
#define DCHECK(c) CHECK(c)
#define DCHECK_EQ(a, b) CHECK_EQ(a, b)
#define DCHECK_LE(a, b) CHECK_LE(a, b)
#define DCHECK_LT(a, b) CHECK_LT(a, b)
#define DCHECK_GE(a, b) CHECK_GE(a, b)
#define LOG(x) ::glogstub::Null()
#define VLOG(x) ::glogstub::Null()

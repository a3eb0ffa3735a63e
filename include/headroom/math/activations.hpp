#pragma once
// Element-wise activations and their derivatives.
//   GELU, tanh form (Hendrycks & Gimpel 2016, arXiv:1606.08415; GPT-2's "gelu_new"):
//     gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2 / pi)
//   SiLU (Elfwing et al. 2017; Ramachandran et al. 2017): silu(x) = x sigmoid(x)
//   SwiGLU (Shazeer 2020, arXiv:2002.05202; Llama MLP): h = silu(gate) * up
#include <cmath>

#include "../core/config.hpp"

namespace headroom::math {

template <class T>
HEADROOM_HOST_DEVICE inline T gelu_tanh(T x) {
  using std::tanh;
  constexpr T k = T(0.7978845608028654);  // sqrt(2 / pi)
  constexpr T c = T(0.044715);
  return T(0.5) * x * (T(1) + tanh(k * (x + c * x * x * x)));
}

// d gelu_tanh / dx
template <class T>
HEADROOM_HOST_DEVICE inline T gelu_tanh_grad(T x) {
  using std::tanh;
  constexpr T k = T(0.7978845608028654);
  constexpr T c = T(0.044715);
  const T t = tanh(k * (x + c * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x);
}

template <class T>
HEADROOM_HOST_DEVICE inline T sigmoid(T x) {
  using std::exp;
  return T(1) / (T(1) + exp(-x));
}

template <class T>
HEADROOM_HOST_DEVICE inline T silu(T x) {
  return x * sigmoid(x);
}

// d silu / dx = s (1 + x (1 - s))
template <class T>
HEADROOM_HOST_DEVICE inline T silu_grad(T x) {
  const T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// h = silu(gate) * up
template <class T>
HEADROOM_HOST_DEVICE inline T swiglu(T gate, T up) {
  return silu(gate) * up;
}

// Backward of h = silu(gate) * up given dh: writes d gate and d up.
template <class T>
HEADROOM_HOST_DEVICE inline void swiglu_backward(T gate, T up, T dh, T& dgate, T& dup) {
  const T s = sigmoid(gate);
  dup = dh * gate * s;
  dgate = dh * up * s * (T(1) + gate * (T(1) - s));
}

}  // namespace headroom::math

#pragma once
// The host kernels of the built-in ops that need Eigen (linear, LoRA,
// attention, the fused LM head): their op headers hold them in a section
// compiled only where HEADROOM_HOST_KERNELS is set, so that a translation
// unit that only plans (headroom/headroom.hpp) never parses Eigen. The host
// engine (train/host/trainer.hpp) includes this header.
#ifndef HEADROOM_HOST_KERNELS
#define HEADROOM_HOST_KERNELS 1
#endif
#include "attention.hpp"
#include "linear.hpp"
#include "lm_head_loss.hpp"
#include "lora.hpp"

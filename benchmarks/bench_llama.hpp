// The Llama-2-7B-shaped bf16 state dict of the model benchmarks (291
// tensors, 13.5 GB; the same list as baselines/model_common.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "memcuda/shape.hpp"

namespace memcuda::bench {

constexpr std::size_t kLlamaTensors = 291;
constexpr std::uint64_t kLlamaElements = 6'738'415'616ull;  // 13,476,831,232 bf16 bytes

struct ModelTensor {
  std::string name;
  Shape shape;
  std::uint64_t elements = 0;
};

// HF names, checkpoint order; every dimension divided by `scale`, rounded
// up. Mirrors model_common.state_dict_shapes.
inline std::vector<ModelTensor> state_dict_specs(int scale) {
  auto div = [&](std::int64_t n) { return std::max<std::int64_t>(1, (n + scale - 1) / scale); };
  const std::int64_t h = div(4096), inter = div(11008), vocab = div(32000);
  std::vector<ModelTensor> out;
  auto add = [&](std::string name, Shape shape) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    out.push_back({std::move(name), std::move(shape), n});
  };
  add("model.embed_tokens.weight", {vocab, h});
  for (int i = 0; i < 32; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "self_attn.q_proj.weight", {h, h});
    add(p + "self_attn.k_proj.weight", {h, h});
    add(p + "self_attn.v_proj.weight", {h, h});
    add(p + "self_attn.o_proj.weight", {h, h});
    add(p + "mlp.gate_proj.weight", {inter, h});
    add(p + "mlp.up_proj.weight", {inter, h});
    add(p + "mlp.down_proj.weight", {h, inter});
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
  }
  add("model.norm.weight", {h});
  add("lm_head.weight", {vocab, h});
  return out;
}

// The list must be the 7B dict; returns its bytes.
inline std::uint64_t check_specs(const std::vector<ModelTensor>& specs, int scale) {
  if (specs.size() != kLlamaTensors)
    throw std::logic_error("state dict has " + std::to_string(specs.size()) + " tensors, expected 291");
  std::uint64_t n = 0;
  for (const auto& s : specs) n += s.elements;
  if (scale == 1 && n != kLlamaElements)
    throw std::logic_error("state dict has " + std::to_string(n) + " elements, expected " +
                           std::to_string(kLlamaElements));
  return n * 2;
}

}  // namespace memcuda::bench

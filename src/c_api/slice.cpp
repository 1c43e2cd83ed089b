// The C ABI of sliced reads: views of one dimension's range, and a state
// dict opened as a tensor-parallel rank's shard.
#include <string>
#include <vector>

#include "c_api_internal.hpp"
#include "memcuda/state_dict.hpp"

using memcuda_c::guarded;

namespace {

int slice_into(const memcuda_tensor* t, const memcuda::SliceSpec& spec, memcuda_tensor** out) {
  return guarded([&] {
    if (!out) throw memcuda::InvalidArgument("out is NULL");
    *out = nullptr;
    *out = new memcuda_tensor(memcuda_c::tensor(t).slice(spec));
  });
}

}  // namespace

extern "C" {

int memcuda_tensor_slice(const memcuda_tensor* t, int dim, int64_t start, int64_t length, memcuda_tensor** out) {
  return slice_into(t, memcuda::SliceSpec{.dim = dim, .start = start, .length = length}, out);
}

int memcuda_tensor_slice_tp(const memcuda_tensor* t, int dim, unsigned rank, unsigned world, memcuda_tensor** out) {
  return slice_into(t, memcuda::SliceSpec::tp(dim, rank, world), out);
}

const int64_t* memcuda_tensor_strides(const memcuda_tensor* t) { return t && t->t ? t->strides.data() : nullptr; }

static_assert(MEMCUDA_SHARD_WHOLE == memcuda::ShardRule::whole);

int memcuda_open_state_dict_sharded(memcuda_registry* reg, const char* prefix, unsigned rank, unsigned world,
                                    const memcuda_shard_rule* rules, size_t n_rules, int allow_unused,
                                    memcuda_tensor*** out, size_t* count) {
  return guarded([&] {
    if (!out || !count) throw memcuda::InvalidArgument("out or count is NULL");
    if (n_rules > 0 && !rules) throw memcuda::InvalidArgument("rules is NULL");
    *out = nullptr;
    *count = 0;
    memcuda::ShardRules shards{.rank = rank, .world = world, .rules = {}, .allow_unused = allow_unused != 0};
    for (size_t i = 0; i < n_rules; ++i) {
      if (!rules[i].pattern) throw memcuda::InvalidArgument("rules[" + std::to_string(i) + "].pattern is NULL");
      shards.rules.push_back({rules[i].pattern, rules[i].dim});
    }
    memcuda_c::to_array(memcuda::open_state_dict(memcuda_c::registry(reg), prefix ? prefix : "", shards), out, count);
  });
}

}  // extern "C"

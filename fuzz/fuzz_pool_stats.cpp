// libFuzzer target: the JSON array under `memcuda:pool_stats`, as any process
// reads it for TensorRegistry::stats() (decode_pool_stats). The leader
// writes it, but any Redis client can SET the key.
//
// Checks: decode_pool_stats throws nothing but ProtocolError; every accepted
// entry keeps the documented limits (device -1 exactly for host, 0..1023 for
// cuda; device_uuid empty or printable ASCII without spaces); encode_pool_stats
// of the result decodes back equal, with a text that is a fixed point.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/pool_stats.hpp"

namespace p = memcuda::protocol;

namespace {

bool same(const std::vector<memcuda::PoolStats>& a, const std::vector<memcuda::PoolStats>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].backend != b[i].backend || a[i].device != b[i].device ||
        a[i].device_uuid != b[i].device_uuid)
      return false;
    for (const auto& [name, member] : p::detail::kPoolCounters)
      if (a[i].*member != b[i].*member) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<memcuda::PoolStats> pools;
  try {
    pools = p::decode_pool_stats(memcuda_fuzz::as_text(data, size));
  } catch (const memcuda::ProtocolError& e) {
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
    return 0;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_pool_stats");
  }
  for (const auto& pool : pools) {
    if (pool.backend == memcuda::BackendKind::host)
      MEMCUDA_FUZZ_CHECK(pool.device == -1);
    else
      MEMCUDA_FUZZ_CHECK(pool.device >= 0 && pool.device <= p::kMaxDevice);
    MEMCUDA_FUZZ_CHECK(pool.device_uuid.size() <= p::kMaxDeviceUuidBytes);
    for (char c : pool.device_uuid) MEMCUDA_FUZZ_CHECK(c > 0x20 && c < 0x7f);
  }
  std::string encoded;
  try {
    encoded = p::encode_pool_stats(pools);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("encode_pool_stats of decoded pools");
  }
  std::vector<memcuda::PoolStats> back;
  try {
    back = p::decode_pool_stats(encoded);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_pool_stats of encode_pool_stats's output");
  }
  MEMCUDA_FUZZ_CHECK(same(back, pools), "encoded: " + memcuda_fuzz::shown(encoded));
  MEMCUDA_FUZZ_CHECK(p::encode_pool_stats(back) == encoded);
  return 0;
}

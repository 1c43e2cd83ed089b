// The fields of a model's version record (docs/protocol.md, "Model
// versions"): a Hash per name prefix, written by the publish_version
// script and read whole (HGETALL) by waiters.
#pragma once

#include "memcuda/config.hpp"

#include <string_view>

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

namespace model_field {
inline constexpr std::string_view version = "version";
inline constexpr std::string_view event_handle = "event_handle";
inline constexpr std::string_view backend = "backend";
inline constexpr std::string_view device = "device";
inline constexpr std::string_view device_uuid = "device_uuid";
inline constexpr std::string_view node = "node";
inline constexpr std::string_view session = "session";
inline constexpr std::string_view pid = "pid";
inline constexpr std::string_view published_ms = "published_ms";
}  // namespace model_field

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol

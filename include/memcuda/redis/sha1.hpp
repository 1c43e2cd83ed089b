// SHA-1 (FIPS 180-4), the name Redis gives a Lua script in EVALSHA. Only
// for that: it is not used for anything that needs a secure hash.
#pragma once

#include "memcuda/config.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

MEMCUDA_NAMESPACE_BEGIN namespace redis::detail {

inline std::string sha1_hex(std::string_view data) {
  std::uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  std::string m(data);
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  m.push_back(static_cast<char>(0x80));
  while (m.size() % 64 != 56) m.push_back('\0');
  for (int i = 7; i >= 0; --i) m.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  for (std::size_t off = 0; off < m.size(); off += 64) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      auto b = [&](int k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(m[off + 4 * i + k])); };
      w[i] = (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
    }
    for (int i = 16; i < 80; ++i) w[i] = std::rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f, k;
      if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999u; }
      else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1u; }
      else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDCu; }
      else { f = b ^ c ^ d; k = 0xCA62C1D6u; }
      std::uint32_t t = std::rotl(a, 5) + f + e + k + w[i];
      e = d; d = c; c = std::rotl(b, 30); b = a; a = t;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(40);
  for (auto v : h)
    for (int s = 28; s >= 0; s -= 4) out += kHex[(v >> s) & 15];
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis::detail

#include <string>

#include "ckpt/report.h"

namespace ckpt {
namespace {

// nlohmann::json accepts only valid UTF-8, so each WTF-8 surrogate (ED A0..BF xx) is
// parked on a code point of plane 16's private use area (U+10F800 + surrogate - D800)
// while the library serializes, and turned into a \u escape afterwards. Plane-16 private
// use characters in the input itself would be misread; no checkpoint key has been seen
// with them, and the alternative is losing every surrogate.
constexpr uint32_t kParkBase = 0x10F800;

std::string park(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    auto b = uint8_t(s[i]);
    if (b == 0xED && i + 2 < s.size() && (uint8_t(s[i + 1]) & 0xE0) == 0xA0) {
      uint32_t cp = 0xD000 | ((uint8_t(s[i + 1]) & 0x3F) << 6) | (uint8_t(s[i + 2]) & 0x3F);
      uint32_t parked = kParkBase + (cp - 0xD800);
      out += char(0xF0 | (parked >> 18));
      out += char(0x80 | ((parked >> 12) & 0x3F));
      out += char(0x80 | ((parked >> 6) & 0x3F));
      out += char(0x80 | (parked & 0x3F));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool has_surrogate(const std::string& s) {
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (uint8_t(s[i]) == 0xED && (uint8_t(s[i + 1]) & 0xE0) == 0xA0) return true;
  return false;
}

bool needs_parking(const nlohmann::json& j) {
  if (j.is_string()) return has_surrogate(j.get_ref<const std::string&>());
  if (j.is_array()) {
    for (const auto& e : j)
      if (needs_parking(e)) return true;
  }
  if (j.is_object()) {
    for (const auto& [k, v] : j.items())
      if (has_surrogate(k) || needs_parking(v)) return true;
  }
  return false;
}

nlohmann::json parked(const nlohmann::json& j) {
  if (j.is_string()) return park(j.get_ref<const std::string&>());
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : j) out.push_back(parked(e));
    return out;
  }
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, v] : j.items()) out[park(k)] = parked(v);
    return out;
  }
  return j;
}

std::string unpark(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < text.size(); ++i) {
    auto b = uint8_t(text[i]);
    if (b == 0xF4 && i + 3 < text.size() && uint8_t(text[i + 1]) == 0x8F && (uint8_t(text[i + 2]) & 0xE0) == 0xA0) {
      uint32_t cp = (4u << 18) | (0x0Fu << 12) | ((uint8_t(text[i + 2]) & 0x3F) << 6) | (uint8_t(text[i + 3]) & 0x3F);
      uint32_t surrogate = cp - kParkBase + 0xD800;
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += hex[(surrogate >> shift) & 0xF];
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

std::string json_text(const nlohmann::json& doc, int indent) {
  auto handler = nlohmann::json::error_handler_t::replace;
  if (!needs_parking(doc)) return doc.dump(indent, ' ', false, handler);
  return unpark(parked(doc).dump(indent, ' ', false, handler));
}

}  // namespace ckpt

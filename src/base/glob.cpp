// fnmatch.fnmatchcase, from Python 3.11's fnmatch.translate: the same classes (its chunk
// rule for ranges, empty ranges dropped, "[!]" and an unclosed "[" literal) evaluated
// directly instead of through a regular expression.
#include "base/glob.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::text {
namespace {

// Code points; a byte that is no part of valid UTF-8 stands for itself above the Unicode
// range, so that it matches only itself.
std::u32string code_points(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; ok && k < n; ++k) {
      const auto x = static_cast<unsigned char>(s[i + k]);
      ok = (x >> 6) == 2;
      c = (c << 6) | (x & 0x3F);
    }
    if (!ok) {
      out.push_back(0x110000 + b);
      ++i;
      continue;
    }
    out.push_back(c);
    i += n;
  }
  return out;
}

using item = glob::item;

// The class whose text is p[i, j) (between "[" and "]"), as translate builds it.
item make_class(const std::u32string& p, size_t i, size_t j) {
  std::u32string body = p.substr(i, j - i);
  std::vector<std::u32string> chunks;
  if (body.find(U'-') == std::u32string::npos) {
    chunks.push_back(body);
  } else {
    size_t k = p[i] == U'!' ? i + 2 : i + 1;
    for (;;) {
      size_t dash = std::u32string::npos;
      for (size_t m = k; m < j; ++m)
        if (p[m] == U'-') {
          dash = m;
          break;
        }
      if (dash == std::u32string::npos) break;
      chunks.push_back(p.substr(i, dash - i));
      i = dash + 1;
      k = dash + 3;
    }
    const std::u32string last = p.substr(i, j - i);
    if (!last.empty())
      chunks.push_back(last);
    else
      chunks.back() += U'-';
    // An empty range (its start after its end) is dropped with both its ends.
    for (size_t m = chunks.size() - 1; m > 0; --m)
      if (chunks[m - 1].back() > chunks[m].front()) {
        chunks[m - 1] = chunks[m - 1].substr(0, chunks[m - 1].size() - 1) + chunks[m].substr(1);
        chunks.erase(chunks.begin() + long(m));
      }
  }
  // The class's text, joined back: empty matches nothing, "!" any one character.
  std::u32string all;
  for (size_t m = 0; m < chunks.size(); ++m) all += (m ? U"-" : U"") + chunks[m];
  item it(item::cls);
  if (all.empty()) return item(item::never);
  if (all == U"!") return item(item::any);
  size_t skip = 0;
  if (all[0] == U'!') {
    it.negated = true;
    skip = 1;  // the '!' begins the first chunk: never a range's end
  }
  for (size_t m = 0; m < chunks.size(); ++m) {
    std::u32string ch = chunks[m];
    if (m == 0) ch = ch.substr(skip);
    // A range joins the last character of a chunk to the first of the next.
    const size_t from = m > 0 ? 1 : 0, to = m + 1 < chunks.size() ? ch.size() - 1 : ch.size();
    for (size_t q = from; q < to && q < ch.size(); ++q) it.chars.push_back(ch[q]);
    if (m + 1 < chunks.size() && !ch.empty()) it.ranges.push_back({ch.back(), chunks[m + 1].front()});
  }
  return it;
}

std::vector<item> compile(const std::u32string& p) {
  std::vector<item> out;
  for (size_t i = 0; i < p.size();) {
    const char32_t c = p[i++];
    if (c == U'*') {
      if (out.empty() || out.back().k != item::star) out.push_back(item(item::star));
    } else if (c == U'?') {
      out.push_back(item(item::any));
    } else if (c == U'[') {
      size_t j = i;
      if (j < p.size() && p[j] == U'!') ++j;
      if (j < p.size() && p[j] == U']') ++j;
      while (j < p.size() && p[j] != U']') ++j;
      if (j >= p.size()) {
        out.push_back(item(item::literal, c));
      } else {
        out.push_back(make_class(p, i, j));
        i = j + 1;
      }
    } else {
      out.push_back(item(item::literal, c));
    }
  }
  return out;
}

bool one(const item& it, char32_t x) {
  switch (it.k) {
    case item::literal: return it.c == x;
    case item::any: return true;
    case item::cls: return it.contains(x);
    default: return false;
  }
}

}  // namespace

bool glob::item::contains(char32_t x) const {
  bool in = chars.find(x) != std::u32string::npos;
  for (const auto& [lo, hi] : ranges) in = in || (lo <= x && x <= hi);
  return in != negated;
}

glob::glob(std::string_view pattern) : items_(compile(code_points(pattern))) {}

bool glob::matches(std::string_view key) const {
  const std::vector<item>& p = items_;
  const std::u32string s = code_points(key);
  // The usual backtracking over the last star: linear in practice, quadratic at worst.
  size_t pi = 0, si = 0, star = SIZE_MAX, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi].k == item::star) {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && one(p[pi], s[si])) {
      ++pi;
      ++si;
    } else if (star != SIZE_MAX) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi].k == item::star) ++pi;
  return pi == p.size();
}

}  // namespace ckpt::text

// Test helper: decodes a pickle with ckpt::pickle::parse and prints a canonical JSON
// rendering of the value graph, which tests/py/test_pickle_differential.py compares with
// the same rendering of what CPython's unpickler builds.
//   pickle_dump [--repr] [--no-eof] [--max-depth N] [--time N] FILE
// The canonical form (keys sorted, no spaces, ASCII only, as Python's
// json.dumps(sort_keys=True, separators=(",", ":")) writes it):
//   None/True/False -> null/true/false      int -> {"int":"<decimal>"}
//   float -> {"float":"<16 hex digits of the IEEE bits>"}
//   str -> {"str":"..."}, or {"str_hex":"<utf-8 surrogatepass hex>"} when it holds surrogates
//   bytes -> {"bytes":"<hex>"}              tuple -> {"tuple":[...]}
//   list/dict/set/bytearray/object carry "id" (first visit, counting from 0) and are later
//   written {"ref":N}; set and frozenset elements are rendered apart and sorted.
//   dict -> {"dict":[[k,v],...],"id":N,"ordered":bool[,"state":X]}
//   object -> {"args":X,"callable":X[,"dictitems":X],"id":N[,"kwargs":X][,"listitems":X],
//              "op":"reduce|newobj|newobj_ex|inst|obj"[,"state":X]}
//   global -> {"global":[<str>,<str>]}       persistent id -> {"persid":X}
// Exit status: 0, or the ckptool exit code of the error (one line on stderr).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/pickle.h"
#include "pickle/pickle_text.h"

namespace {

using ckpt::pickle::kind;
using ckpt::pickle::value;

class canonical {
 public:
  std::string render(const value* v, int depth = 0) {
    if (depth > 5000) throw std::runtime_error("value nested too deeply to render");
    switch (v->type) {
      case kind::none:
        return "null";
      case kind::boolean:
        return v->flag ? "true" : "false";
      case kind::integer:
        return "{\"int\":\"" + std::to_string(v->integer) + "\"}";
      case kind::big_integer:
        return "{\"int\":\"" + ckpt::pickle::detail::twos_to_decimal(v->text) + "\"}";
      case kind::floating: {
        uint64_t bits;
        std::memcpy(&bits, &v->floating, 8);
        char buf[32];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
        return std::string("{\"float\":\"") + buf + "\"}";
      }
      case kind::str:
        return str(v->text);
      case kind::bytes:
        return "{\"bytes\":\"" + hex(v->text) + "\"}";
      case kind::tuple:
        return "{\"tuple\":" + array(v->items, depth) + "}";
      case kind::frozenset:
        return "{\"frozenset\":" + sorted(v->items, depth) + "}";
      case kind::global:
        return "{\"global\":[" + str(std::string(v->global_module())) + "," +
               str(std::string(v->global_attr())) + "]}";
      case kind::persistent_id:
        return "{\"persid\":" + render(v->items.at(0), depth + 1) + "}";
      default:
        break;
    }
    // Identity-bearing (mutable) values.
    auto seen = ids_.find(v);
    if (seen != ids_.end()) return "{\"ref\":" + std::to_string(seen->second) + "}";
    std::string id = std::to_string(next_id_);
    ids_[v] = next_id_++;
    switch (v->type) {
      case kind::bytearray:
        return "{\"bytearray\":\"" + hex(v->text) + "\",\"id\":" + id + "}";
      case kind::list:
        return "{\"id\":" + id + ",\"list\":" + array(v->items, depth) + "}";
      case kind::set:
        return "{\"id\":" + id + ",\"set\":" + sorted(v->items, depth) + "}";
      case kind::dict: {
        std::string items = pairs(v->items, depth);
        std::string out =
            "{\"dict\":" + items + ",\"id\":" + id + ",\"ordered\":" + (v->flag ? "true" : "false");
        if (v->state) out += ",\"state\":" + render(v->state, depth + 1);
        return out + "}";
      }
      case kind::object: {
        auto slot = [&](size_t i) { return i < v->items.size() ? v->items[i] : nullptr; };
        std::string args = render(slot(ckpt::pickle::kArgs), depth + 1);
        std::string callable = render(slot(ckpt::pickle::kCallable), depth + 1);
        std::string out = "{\"args\":" + args + ",\"callable\":" + callable;
        if (const value* d = slot(ckpt::pickle::kDictItems))
          out += ",\"dictitems\":" + pairs(d->items, depth);
        out += ",\"id\":" + id;
        if (const value* k = slot(ckpt::pickle::kKwargs))
          out += ",\"kwargs\":" + render(k, depth + 1);
        if (const value* l = slot(ckpt::pickle::kListItems))
          out += ",\"listitems\":" + array(l->items, depth);
        out += std::string(",\"op\":\"") + op_name(v->op) + "\"";
        if (v->state) out += ",\"state\":" + render(v->state, depth + 1);
        return out + "}";
      }
      default:
        throw std::runtime_error("unknown node kind");
    }
  }

 private:
  static const char* op_name(ckpt::pickle::object_op op) {
    switch (op) {
      case ckpt::pickle::object_op::reduce:
        return "reduce";
      case ckpt::pickle::object_op::newobj:
        return "newobj";
      case ckpt::pickle::object_op::newobj_ex:
        return "newobj_ex";
      case ckpt::pickle::object_op::inst:
        return "inst";
      case ckpt::pickle::object_op::obj:
        return "obj";
    }
    return "?";
  }

  static std::string hex(std::string_view s) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    for (char c : s) {
      out.push_back(kHex[uint8_t(c) >> 4]);
      out.push_back(kHex[uint8_t(c) & 15]);
    }
    return out;
  }

  static void u_escape(std::string* out, uint32_t unit) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", unit);
    *out += buf;
  }

  // json.dumps(ensure_ascii=True) spelling.
  static std::string str(const std::string& text) {
    if (ckpt::pickle::detail::has_surrogate(text)) return "{\"str_hex\":\"" + hex(text) + "\"}";
    std::string out = "{\"str\":\"";
    for (size_t i = 0; i < text.size();) {
      uint32_t cp = ckpt::pickle::detail::next_code_point(text, &i);
      switch (cp) {
        case '"':
          out += "\\\"";
          continue;
        case '\\':
          out += "\\\\";
          continue;
        case '\n':
          out += "\\n";
          continue;
        case '\r':
          out += "\\r";
          continue;
        case '\t':
          out += "\\t";
          continue;
        case '\b':
          out += "\\b";
          continue;
        case '\f':
          out += "\\f";
          continue;
        default:
          break;
      }
      if (cp >= 0x20 && cp < 0x7f) {
        out.push_back(char(cp));
      } else if (cp < 0x10000) {
        u_escape(&out, cp);
      } else {
        cp -= 0x10000;
        u_escape(&out, 0xd800 + (cp >> 10));
        u_escape(&out, 0xdc00 + (cp & 0x3ff));
      }
    }
    return out + "\"}";
  }

  std::string array(const ckpt::pickle::item_list& items, int depth) {
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ",";
      out += render(items[i], depth + 1);
    }
    return out + "]";
  }

  std::string pairs(const ckpt::pickle::item_list& items, int depth) {
    std::string out = "[";
    for (size_t i = 0; i + 1 < items.size(); i += 2) {
      if (i) out += ",";
      out += "[" + render(items[i], depth + 1) + ",";
      out += render(items[i + 1], depth + 1) + "]";
    }
    return out + "]";
  }

  // Set order is hash order in CPython: render each element on its own and sort.
  std::string sorted(const ckpt::pickle::item_list& items, int depth) {
    std::vector<std::string> parts;
    for (const value* item : items) parts.push_back(canonical().render(item, depth + 1));
    std::sort(parts.begin(), parts.end());
    std::string out = "[";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
    return out + "]";
  }

  std::unordered_map<const value*, int> ids_;
  int next_id_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  bool as_repr = false;
  int repeat = 0;
  std::string path;
  ckpt::pickle::parse_options options;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repr"))
      as_repr = true;
    else if (!std::strcmp(argv[i], "--no-eof"))
      options.require_eof = false;
    else if (!std::strcmp(argv[i], "--max-depth") && i + 1 < argc)
      options.lim.max_depth = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--time") && i + 1 < argc)
      repeat = std::atoi(argv[++i]);
    else
      path = argv[i];
  }
  if (path.empty()) {
    std::fprintf(stderr,
                 "usage: pickle_dump [--repr] [--no-eof] [--max-depth N] [--time N] FILE\n");
    return 2;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "pickle_dump: cannot open %s\n", path.c_str());
    return 4;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  try {
    if (repeat > 0) {
      // Wall time, and this thread's CPU time, which a busy machine disturbs far less.
      auto cpu_ms = [] {
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
      };
      double best = 1e30, best_cpu = 1e30;
      size_t nodes = 0;
      for (int r = 0; r < repeat; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        double c0 = cpu_ms();
        ckpt::pickle::document doc = ckpt::pickle::parse(bytes.data(), bytes.size(), options);
        double c1 = cpu_ms();
        auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
        best_cpu = std::min(best_cpu, c1 - c0);
        nodes = doc.node_count();
      }
      std::printf("{\"bytes\":%zu,\"nodes\":%zu,\"best_ms\":%.3f,\"best_cpu_ms\":%.3f}\n",
                  bytes.size(), nodes, best, best_cpu);
      return 0;
    }
    ckpt::pickle::document doc = ckpt::pickle::parse(bytes.data(), bytes.size(), options);
    if (as_repr) {
      std::cout << ckpt::pickle::repr(doc.root, 100000) << "\n";
    } else {
      std::cout << canonical().render(doc.root) << "\n";
    }
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "pickle_dump: %s: %s\n", ckpt::errc_name(e.kind()), e.what());
    return ckpt::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pickle_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}

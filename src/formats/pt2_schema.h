// Internal: the pieces of torch.export's serialization schema that both the payload configs
// and the program JSON use (formats.md §14.3-14.4): strict JSON parsing with a depth bound,
// one-key union objects, SymInt, TensorMeta and the schema's own ScalarType enum (which is
// not c10's). Every failure is a ckpt::error naming the record, the entry and the byte
// offset of the record's data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/ordered_json.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"

namespace ckpt::detail::pt2s {

// Ordered: the configs' order is the state dict's order, and the first entry naming a file
// decides its dtype (formats.md §14.3), as Python's dict keeps it.
using json = nlohmann::ordered_json;

/// Where a JSON value came from, for messages: "data/weights/model_weights_config.json" and
/// the byte offset of the record's data in the archive.
struct where {
  std::string record;
  std::optional<uint64_t> offset;
  [[noreturn]] void fail(errc kind, const std::string& what) const;
};

/// Parses a JSON record: corrupt when it is not JSON, or nests deeper than 200 levels.
/// `leave_out`: members not to build (parse_ordered_json).
json parse(std::string_view text, const where& w, const detail::left_out_members& leave_out = {});

/// The (tag, value) of a union: an object with exactly one member.
std::pair<std::string, const json*> union_of(const json& j, const where& w, const std::string& what);
/// obj[key], which must exist (corrupt otherwise); `what` names obj in the message.
const json& member(const json& obj, const char* key, const where& w, const std::string& what);
/// obj[key] or nullptr when absent or null.
const json* optional_member(const json& obj, const char* key);
int64_t to_int(const json& j, const where& w, const std::string& what);
bool to_bool(const json& j, const where& w, const std::string& what);
const std::string& to_string(const json& j, const where& w, const std::string& what);
const json& to_object(const json& j, const where& w, const std::string& what);
const json& to_array(const json& j, const where& w, const std::string& what);

/// The schema's ScalarType (torch/_export/serde/schema.py) to ckptool's dtype; nullopt for
/// a number that is not one of its values, and for UNKNOWN (0).
std::optional<dtype> scalar_type(int64_t code);
/// The Layout enum's name ("Strided" for 7), nullptr when out of range.
const char* layout_name(int64_t code);

/// A SymInt union: {"as_int": n} or {"as_expr": {"expr_str", "hint"}}.
pt2::dim sym_int(const json& j, const where& w, const std::string& what);

struct tensor_meta {
  dtype type = dtype::float32;
  std::vector<pt2::dim> sizes, strides;
  pt2::dim storage_offset;
  bool requires_grad = false;
  std::string device;               // "cpu", "cuda:0", "meta"
  int64_t layout = 7;
};
tensor_meta parse_tensor_meta(const json& j, const where& w, const std::string& what);

/// Renders sympy's srepr of an integer expression ("Mul(Integer(2), Symbol('s77', ...))" ->
/// "2*s77"): Symbol, Integer, Add, Mul, FloorDiv, Mod, Max, Min, Pow and their nestings;
/// nullopt for anything else.
std::optional<std::string> render_srepr(std::string_view srepr);

}  // namespace ckpt::detail::pt2s

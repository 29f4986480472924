#pragma once
// Every field of a decoded dcp::metadata as text, one fact a line: the one-pass decoder and
// the tree decoder must write the same text for any .metadata the one-pass decoder takes.
// Shared by the dcp_metadata fuzz target and its unit test.
#include <string>
#include <vector>

#include "ckpt/dcp.h"

namespace ckpt::fuzz {

inline std::string dcp_metadata_text(const dcp::metadata& md) {
  std::string s;
  auto ints = [&](const std::vector<int64_t>& v) {
    s += '(';
    for (int64_t x : v) s += std::to_string(x) + ',';
    s += ')';
  };
  s += "protocol " + std::to_string(md.protocol) + "\n";
  for (const auto& it : md.items) {
    s += "item " + it.fqn + " @" + std::to_string(it.at) + (it.is_tensor ? " tensor " : " bytes\n");
    if (!it.is_tensor) continue;
    const auto& t = it.tensor;
    s += std::to_string(int(t.type)) + " " + t.layout + " grad " + std::to_string(t.requires_grad) + " mem " +
         std::to_string(t.memory_format) + " pin " + std::to_string(t.pin_memory) + " size ";
    ints(t.size);
    s += "\n";
    for (const auto& c : t.chunks) {
      s += "  chunk @" + std::to_string(c.at) + " src " + std::to_string(c.source) + " ";
      ints(c.offsets);
      ints(c.sizes);
      s += "\n";
    }
  }
  auto storage = [&](const char* what, const std::vector<dcp::storage_item>& v) {
    for (const auto& si : v) {
      s += std::string(what) + " " + si.fqn + " @" + std::to_string(si.at) + " src " + std::to_string(si.source) + " ";
      if (si.offsets) ints(*si.offsets);
      else s += "-";
      s += " index " + (si.index ? std::to_string(*si.index) : "-") + " " + si.relative_path + " " +
           std::to_string(si.offset) + "+" + std::to_string(si.length);
      for (const auto& d : si.transform_descriptors) s += " [" + d + "]";
      s += "\n";
    }
  };
  storage("storage", md.storage_data);
  storage("replica", md.replicas);
  s += "planner " + std::to_string(md.has_planner_data) + " opaque " + std::to_string(md.planner_data_opaque) + "\n";
  for (const auto& p : md.planner_data) {
    s += "  path " + p.fqn + ":";
    for (const auto& e : p.path) s += e.is_index ? " #" + std::to_string(e.index) : " '" + e.key + "'";
    s += "\n";
  }
  if (md.writer_meta) {
    const auto& w = *md.writer_meta;
    s += "writer " + w.checkpoint_id + " | " + w.save_id + " | " + (w.load_id ? "'" + *w.load_id + "'" : "-");
    for (const auto& m : w.modules) s += " module " + m;
    s += "\n";
  }
  s += "version " + (md.version ? "'" + *md.version + "'" : "-") + "\n";
  for (const auto& f : md.unknown_fields) s += "unknown " + f + "\n";
  for (const auto& g : md.globals) s += "global " + g + "\n";
  for (const auto& n : md.sources) s += "source " + n + "\n";
  return s;
}

}  // namespace ckpt::fuzz

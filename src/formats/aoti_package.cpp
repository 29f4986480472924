// AOTInductor packages from their zip directory and metadata (formats.md §15): which
// models, which files, the wrapper metadata, where the weights live, and the constants
// table from wrapper.cpp (aoti_wrapper.cpp). No record but the JSON metadata, the
// wrapper source and the small fixed records is read; the model library is never opened.
#include "formats/aoti_package.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "base/text.h"

namespace ckpt::aoti {
namespace {

constexpr std::string_view kAotiDir = "data/aotinductor/";
constexpr uint64_t kMaxMetadataBytes = 1u << 20;
constexpr uint64_t kMaxWrapperBytes = 256u << 20;

std::string role_of(std::string_view name) {
  if (text::ends_with(name, ".wrapper.cpp")) return "wrapper source";
  if (text::ends_with(name, ".kernel.cpp")) return "kernel source";
  if (text::ends_with(name, ".wrapper_metadata.json")) return "metadata";
  if (text::ends_with(name, ".kernel_metadata.json")) return "kernel metadata";
  if (text::ends_with(name, ".so")) return "model library";
  if (text::ends_with(name, ".blob")) return "weights blob";
  if (name == "weights_config.json") return "weights config";
  if (text::ends_with(name, "_compile_flags.json") || text::ends_with(name, "_linker_flags.json")) return "build flags";
  if (text::ends_with(name, ".o")) return "object file";
  if (text::ends_with(name, ".cubin") || text::ends_with(name, ".hsaco") || text::ends_with(name, ".spv") || text::ends_with(name, ".fatbin"))
    return "GPU kernel";
  return "other";
}

std::optional<uint64_t> stored_offset(const zip::entry& e) {
  return e.method == 0 ? std::optional<uint64_t>(e.data_offset) : std::nullopt;
}

std::string read_small(const zip::archive& ar, const zip::entry& e, uint64_t max) {
  if (e.uncompressed_size > max)
    throw error(errc::limit, "record " + std::string(e.record) + " is " + std::to_string(e.uncompressed_size) +
                                 " bytes, more than the " + std::to_string(max) + " ckptool reads",
                e.local_header_offset);
  auto bytes = ar.read_record(e);
  return std::string(bytes.begin(), bytes.end());
}

// The CPU features Inductor's ISA names stand for (its -m flags, formats.md §15.2), as
// /proc/cpuinfo names them.
const std::map<std::string, std::vector<std::string>>& isa_flags() {
  static const std::map<std::string, std::vector<std::string>> m = {
      {"AVX2", {"avx2", "fma"}},
      {"AVX512", {"avx512f", "avx512dq", "avx512vl", "avx512bw", "fma"}},
      {"AVX512_VNNI", {"avx512_vnni"}},
      {"AMX_TILE", {"amx_tile"}},
      {"ASIMD", {"asimd"}},
      {"NEON", {"asimd"}},
  };
  return m;
}

std::set<std::string> host_cpu_flags() {
  std::set<std::string> out;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  for (int n = 0; n < 4096 && std::getline(f, line); ++n) {
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    for (std::string w; words >> w;) out.insert(w);
    break;
  }
  return out;
}

void check_host(model& m) {
  auto machine = m.metadata.find("AOTI_MACHINE");
  struct utsname u {};
  if (machine != m.metadata.end() && !machine->second.empty() && ::uname(&u) == 0 && machine->second != u.machine) {
    m.isa_missing.push_back(machine->second);
    m.warnings.push_back("compiled for " + machine->second + "; this machine is " + u.machine);
    return;
  }
  auto isa = m.metadata.find("AOTI_CPU_ISA");
  if (isa == m.metadata.end() || isa->second.empty()) return;
  const std::set<std::string> have = host_cpu_flags();
  if (have.empty()) return;
  std::istringstream words(isa->second);
  for (std::string w; words >> w;) {
    auto it = isa_flags().find(w);
    if (it == isa_flags().end()) {
      m.warnings.push_back("CPU feature " + w + " of AOTI_CPU_ISA not checked against this CPU");
      continue;
    }
    for (const auto& f : it->second)
      if (!have.count(f)) {
        m.isa_missing.push_back(w);
        break;
      }
  }
  if (!m.isa_missing.empty()) {
    std::string list;
    for (const auto& w : m.isa_missing) list += (list.empty() ? "" : " ") + w;
    m.warnings.push_back("compiled for " + isa->second + "; this CPU lacks " + list +
                         ": running it would stop at an illegal instruction");
  }
}

void read_metadata(const zip::archive& ar, const zip::entry& e, model& m) {
  std::string text = read_small(ar, e, kMaxMetadataBytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& x) {
    throw error(errc::corrupt, "record " + std::string(e.record) + " is not valid JSON: " + x.what(), stored_offset(e));
  }
  if (!j.is_object()) throw error(errc::corrupt, "record " + std::string(e.record) + " is not a JSON object", stored_offset(e));
  for (auto& [k, v] : j.items()) {
    if (!v.is_string())
      throw error(errc::corrupt, "record " + std::string(e.record) + ": value of '" + k + "' is not a string", stored_offset(e));
    m.metadata[k] = v.get<std::string>();
  }
  auto dev = m.metadata.find("AOTI_DEVICE_KEY");
  if (dev == m.metadata.end() || dev->second.empty())
    throw error(errc::corrupt, "record " + std::string(e.record) + " has no AOTI_DEVICE_KEY", stored_offset(e));
  m.device = dev->second;
}

void read_model(const zip::archive& ar, model& m) {
  const zip::entry* wrapper = nullptr;
  const zip::entry* meta = nullptr;
  const std::string dir = std::string(kAotiDir) + m.name + "/";
  for (const auto& e : ar.entries()) {
    if (e.record.substr(0, dir.size()) != dir) continue;
    std::string_view rel = e.record.substr(dir.size());
    std::string role = role_of(rel);
    m.files.push_back({std::string(e.record), e.uncompressed_size, role});
    auto only_one = [&](std::string& slot) {
      if (!slot.empty())
        throw error(errc::unsupported, "model '" + m.name + "' has two " + role + " records (" + slot + ", " +
                                           std::string(e.record) + "); ckptool does not guess which one the loader takes",
                    e.local_header_offset);
      slot = std::string(e.record);
    };
    if (role == "wrapper source") {
      only_one(m.wrapper_record);
      wrapper = &e;
    } else if (role == "model library") {
      only_one(m.library_record);
    } else if (role == "weights blob") {
      only_one(m.blob_record);
    } else if (role == "weights config") {
      only_one(m.weights_config_record);
    } else if (role == "metadata") {
      if (meta)
        throw error(errc::unsupported, "model '" + m.name + "' has two metadata records (" + std::string(meta->record) +
                                           ", " + std::string(e.record) + ")",
                    e.local_header_offset);
      meta = &e;
    }
  }
  if (!meta) throw error(errc::corrupt, "model '" + m.name + "' has no *.wrapper_metadata.json record");
  read_metadata(ar, *meta, m);
  if (!wrapper)
    throw error(errc::unsupported, "model '" + m.name + "' has no *.wrapper.cpp record: its constants cannot be read "
                                   "without loading the library");
  std::string text = read_small(ar, *wrapper, kMaxWrapperBytes);
  try {
    parse_wrapper(text, m, stored_offset(*wrapper));
  } catch (error& x) {
    // Deflated: the offset is the record's, which a user can find with unzip -l.
    if (!x.offset()) throw error(x.kind(), x.message(), wrapper->local_header_offset);
    throw;
  }
  if (text.find("-march=native") != std::string::npos)
    m.warnings.push_back("compiled with -march=native: the library may use any instruction of the machine that built it");
  if (!m.blob_record.empty())
    m.weights = weights_place::blob;
  else if (!m.weights_config_record.empty())
    m.weights = weights_place::pickle_files;
  else if (m.include_weights && !m.library_record.empty())
    m.weights = weights_place::in_so;
  else
    m.weights = weights_place::none;
  if (m.library_record.empty())
    m.warnings.push_back("no compiled library (.so): LibTorch's loader would compile the sources at load time");
  if (m.weights == weights_place::none && !m.constants.empty())
    m.warnings.push_back("the package holds no weights: running it before every constant is loaded crashes (formats.md §15.5)");
  if (m.weights == weights_place::pickle_files)
    m.warnings.push_back("weights in data/weights/ as torch.save files: only Python's load_pt2 reads them");
  check_host(m);
}

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// The size of the weights a default package's library holds: the distance between the
// symbols _binary_constants_bin_start and _end of its ELF symbol table (formats.md §15.3).
// nullopt when the record is not a stored little-endian ELF64 file with those symbols;
// every offset read from the file is checked against the record first.
std::optional<uint64_t> library_weight_bytes(const zip::archive& ar, const zip::entry& e) {
  if (e.method != 0 || e.uncompressed_size < 64) return std::nullopt;
  const byte_source& src = ar.source();
  const uint64_t size = e.uncompressed_size;
  auto read = [&](uint64_t at, size_t n) {
    if (at > size || n > size - at) throw error(errc::corrupt, "the model library's ELF tables point past its end", e.data_offset);
    return src.read_vector(e.data_offset + at, n);
  };
  auto h = read(0, 64);
  if (h[0] != 0x7f || h[1] != 'E' || h[2] != 'L' || h[3] != 'F' || h[4] != 2 || h[5] != 1) return std::nullopt;
  const uint64_t shoff = le(&h[0x28], 8), shentsize = le(&h[0x3a], 2), shnum = le(&h[0x3c], 2);
  if (shentsize < 64 || shnum == 0) return std::nullopt;
  auto sh = read(shoff, size_t(shentsize * shnum));
  std::optional<uint64_t> start, end;
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint8_t* s = &sh[size_t(i * shentsize)];
    if (le(s + 4, 4) != 2) continue;  // SHT_SYMTAB
    const uint64_t off = le(s + 0x18, 8), bytes = le(s + 0x20, 8), link = le(s + 0x28, 4), ent = le(s + 0x38, 8);
    if (ent < 24 || link >= shnum || bytes > (64u << 20)) return std::nullopt;
    const uint8_t* l = &sh[size_t(link * shentsize)];
    const uint64_t str_off = le(l + 0x18, 8), str_bytes = le(l + 0x20, 8);
    if (str_bytes > (64u << 20)) return std::nullopt;
    auto syms = read(off, size_t(bytes));
    auto strs = read(str_off, size_t(str_bytes));
    for (uint64_t k = 0; k + ent <= bytes; k += ent) {
      const uint64_t name = le(&syms[size_t(k)], 4);
      if (name >= strs.size()) continue;
      const char* n = reinterpret_cast<const char*>(&strs[size_t(name)]);
      const size_t len = strnlen(n, strs.size() - size_t(name));
      const std::string_view sym(n, len);
      if (sym == "_binary_constants_bin_start") start = le(&syms[size_t(k) + 8], 8);
      if (sym == "_binary_constants_bin_end") end = le(&syms[size_t(k) + 8], 8);
    }
  }
  if (!start || !end || *end < *start) return std::nullopt;
  return *end - *start;
}

}  // namespace

const char* kind_name(constant_kind k) {
  switch (k) {
    case constant_kind::parameter: return "parameter";
    case constant_kind::buffer: return "buffer";
    case constant_kind::tensor_constant: return "tensor_constant";
    case constant_kind::folded_constant: return "folded_constant";
    case constant_kind::unknown: break;
  }
  return "unknown";
}

const char* place_name(weights_place p) {
  switch (p) {
    case weights_place::in_so: return "in_so";
    case weights_place::blob: return "blob";
    case weights_place::pickle_files: return "pickle_files";
    case weights_place::none: break;
  }
  return "none";
}

bool is_aoti_package(const zip::archive& ar) {
  const zip::entry* f = ar.find("archive_format");
  if (!f || f->uncompressed_size != 3) return false;
  auto bytes = ar.read_record(*f);
  if (std::string(bytes.begin(), bytes.end()) != "pt2") return false;
  bool aoti = false;
  for (const auto& e : ar.entries()) {
    if (e.record.substr(0, 7) == "models/" && text::ends_with(e.record, ".json")) return false;
    if (e.record.substr(0, kAotiDir.size()) == kAotiDir) aoti = true;
  }
  return aoti;
}

package read_package(const zip::archive& ar) {
  if (!is_aoti_package(ar)) throw error(errc::unsupported, "not an AOTInductor package (archive_format pt2 with data/aotinductor/)");
  package p;
  p.root = ar.prefix();
  p.archive_version = "0";  // a missing record reads as 0, as load_pt2 does
  if (const zip::entry* v = ar.find("archive_version")) {
    std::string text = read_small(ar, *v, 64);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (text != "0")
      throw error(errc::unsupported, "archive_version '" + text.substr(0, 20) + "': ckptool reads version 0 only",
                  stored_offset(*v));
    p.archive_version = text;
  }
  std::set<std::string> names;
  for (const auto& e : ar.entries()) {
    if (e.record.substr(0, kAotiDir.size()) != kAotiDir) continue;
    std::string_view rest = e.record.substr(kAotiDir.size());
    size_t slash = rest.find('/');
    if (slash == std::string_view::npos || slash == 0)
      throw error(errc::corrupt, "record " + std::string(e.record) + " is not inside a model folder", e.local_header_offset);
    names.insert(std::string(rest.substr(0, slash)));
  }
  for (const auto& n : names) {
    model m;
    m.name = n;
    read_model(ar, m);
    p.models.push_back(std::move(m));
  }
  return p;
}

const model& pick_model(const package& p, const std::string& name) {
  if (name.empty()) {
    if (p.models.size() == 1) return p.models[0];
    throw error(errc::usage, "the package holds " + std::to_string(p.models.size()) + " models; name one");
  }
  for (const auto& m : p.models)
    if (m.name == name) return m;
  throw error(errc::usage, "the package has no model '" + name + "'");
}

// Bytes a constant's view reaches into its storage: offset plus the farthest element.
std::optional<uint64_t> constant_extent(const constant& c) {
  if (!c.type || !c.strided) return std::nullopt;
  __int128 last = c.offset;
  for (size_t d = 0; d < c.shape.size(); ++d) {
    if (c.shape[d] == 0) return 0;
    last += __int128(c.shape[d] - 1) * c.stride[d];
  }
  __int128 bytes = (last + 1) * element_size(*c.type);
  if (bytes > __int128(UINT64_MAX)) return UINT64_MAX;
  return uint64_t(bytes);
}

std::vector<std::string> check_package(const zip::archive& ar, const package& p, std::vector<std::string>* notes) {
  std::vector<std::string> problems;
  for (const auto& m : p.models) {
    const std::string who = "model '" + m.name + "': ";
    if (m.library_record.empty()) problems.push_back(who + "no compiled library (.so)");
    uint64_t reserved = 0;
    const bool cpu = m.device == "cpu";
    for (size_t i = 0; i < m.constants.size(); ++i) {
      const constant& c = m.constants[i];
      const std::string at = who + "constant " + c.name + " (" + c.original_fqn + "): ";
      if (!c.type) problems.push_back(at + "dtype " + c.dtype_text + " unknown to ckptool");
      if (c.from_folded) continue;
      reserved += c.data_size;
      if (cpu && c.data_size % 64 != 0) problems.push_back(at + "data_size " + std::to_string(c.data_size) + " is not padded to 64 bytes");
      if (auto extent = constant_extent(c); extent && *extent > c.data_size)
        problems.push_back(at + "its view reaches byte " + std::to_string(*extent) + " of a " + std::to_string(c.data_size) +
                           "-byte slot");
    }
    if (m.weights == weights_place::in_so) {
      if (const zip::entry* lib = ar.find(m.library_record)) {
        std::optional<uint64_t> held = library_weight_bytes(ar, *lib);
        if (!held && notes)
          notes->push_back(who + "weights inside the model library, not located (no constants symbols): not checked");
        if (held && *held != reserved)
          problems.push_back(who + m.library_record + " holds " + std::to_string(*held) +
                             " bytes of weights; the constants table reserves " + std::to_string(reserved));
      }
    }
    if (!m.blob_record.empty()) {
      const zip::entry* b = ar.find(m.blob_record);
      if (b && b->uncompressed_size != reserved)
        problems.push_back(who + m.blob_record + " holds " + std::to_string(b->uncompressed_size) +
                           " bytes; the constants table reserves " + std::to_string(reserved));
    }
    if (m.inputs.size() != m.num_inputs || m.output_names.size() != m.num_outputs)
      problems.push_back(who + "input or output count differs from the model's declaration");
    for (size_t i = 0; i < m.inputs.size(); ++i)
      if (m.inputs[i].name.empty()) problems.push_back(who + "input " + std::to_string(i) + " has no name");
    for (size_t i = 0; i < m.output_names.size(); ++i)
      if (m.output_names[i].empty()) problems.push_back(who + "output " + std::to_string(i) + " has no name");
    if (m.in_spec.empty() || m.out_spec.empty()) problems.push_back(who + "no call spec (in_spec_/out_spec_)");
    for (const std::string& spec : {m.in_spec, m.out_spec}) {
      if (spec.empty()) continue;
      if (!nlohmann::json::accept(spec)) problems.push_back(who + "a call spec that is not JSON");
    }
  }
  return problems;
}

}  // namespace ckpt::aoti

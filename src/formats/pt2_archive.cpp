#include "formats/pt2_archive.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "base/byteio.h"
#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "formats/pt2_program.h"

namespace ckpt::detail {
namespace {

using pt2s::where;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string small_record(const zip::archive& ar, const zip::entry& e) {
  if (e.uncompressed_size > 64) throw_corrupt("record " + std::string(e.name) + " is longer than 64 bytes", e.data_offset);
  auto bytes = ar.read_record(e);
  return std::string(bytes.begin(), bytes.end());
}

std::string json_record(const zip::archive& ar, const zip::entry& e, const open_options& opt) {
  if (e.uncompressed_size > opt.max_json_bytes)
    throw_limit("record " + std::string(e.name) + " is " + std::to_string(e.uncompressed_size) +
                    " bytes, over the JSON record limit of " + std::to_string(opt.max_json_bytes),
                e.data_offset);
  auto bytes = ar.read_record(e);
  // One copy of the block: built from the vector's iterators, a string is filled a byte at
  // a time (5% of opening a program of 1.2 MB).
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

where where_of(const zip::entry& e) { return {std::string(e.record), e.data_offset}; }

// A model's name as torch.export.load takes it from models/<name>.json. Names with a '/'
// would put its configs in sub-folders no writer makes.
bool plain_model_name(std::string_view n) {
  return !n.empty() && n.size() <= 255 && n.find('/') == std::string_view::npos && n.find('\0') == std::string_view::npos;
}

// One flat tensor per file and config, as _build_file_map makes it (formats.md §14.3): the
// first entry naming the file decides its dtype and device; the others are views of it.
struct file_group {
  std::optional<size_t> storage;  // nullopt: no data (a meta or fake export's empty file)
  dtype type = dtype::uint8;
  std::string first_fqn;
  bool no_data = false;
};

class model_reader {
 public:
  model_reader(checkpoint& c, uint32_t file, const open_options& opt, pt2::model& m, bool several)
      : c_(c), file_(file), opt_(opt), ar_(*c.files[file].zip), m_(m), several_(several) {}

  void read_config(const zip::entry& cfg, bool weights) {
    const where w = where_of(cfg);
    const std::vector<payload_entry> entries = parse_payload_config(json_record(ar_, cfg, opt_), w);
    const std::string dir = weights ? "data/weights/" : "data/constants/";
    std::map<std::string, file_group> groups;
    for (const payload_entry& p : entries) {
      const std::string what = "entry " + text::quote(p.fqn, 120);
      const std::string record = dir + p.path_name;
      const zip::entry* e = ar_.find(record);
      if (!e) w.fail(errc::corrupt, what + ": its file " + record + " is not in the archive");
      // torch.export.load tells constants apart by file name (_load_constants).
      const bool custom_obj = !weights && starts_with(p.path_name, "custom_obj_");
      if (!weights && !custom_obj && !starts_with(p.path_name, "tensor_"))
        w.fail(errc::corrupt, what + ": path_name " + text::quote(p.path_name, 80) +
                                  " is neither tensor_<i> nor custom_obj_<i> (torch.export.load refuses it)");
      if (p.use_pickle || custom_obj) {
        // A tensor subclass torch.save'd whole, or a TorchScript object: only an unpickler
        // can read them, and ckptool never runs one.
        m_.opaque.push_back({p.fqn, record, custom_obj ? "script object (torch._C._pickle_save)" : "pickled tensor (use_pickle)",
                             e->uncompressed_size, weights});
        continue;
      }
      if (!p.meta) w.fail(errc::corrupt, what + ": a tensor entry without tensor_meta");
      add_tensor(p, *p.meta, *e, w, what, weights, groups[p.path_name]);
    }
  }

 private:
  void add_tensor(const payload_entry& p, const pt2s::tensor_meta& tm, const zip::entry& e, const where& w,
                  const std::string& what, bool weights, file_group& g) {
    if (tm.layout != 7)
      w.fail(errc::unsupported, what + ": layout " + pt2s::layout_name(tm.layout) + " (only strided tensors are read)");
    tensor_record t;
    t.type = tm.type;
    auto concrete = [&](const pt2::dim& d, const char* field) {
      if (!d.value)
        w.fail(errc::corrupt, what + ": symbolic " + field + " " + text::quote(d.raw, 80) + " in a stored tensor");
      return *d.value;
    };
    for (const auto& d : tm.sizes) {
      const int64_t v = concrete(d, "size");
      if (v < 0) w.fail(errc::corrupt, what + ": negative size " + std::to_string(v));
      t.shape.push_back(v);
    }
    for (const auto& d : tm.strides) {
      const int64_t v = concrete(d, "stride");
      // torch.as_strided refuses negative strides: no loader makes such a tensor.
      if (v < 0) w.fail(errc::corrupt, what + ": negative stride " + std::to_string(v));
      t.stride.push_back(v);
    }
    t.storage_offset = concrete(tm.storage_offset, "storage_offset");
    if (t.storage_offset < 0) w.fail(errc::corrupt, what + ": negative storage_offset");
    t.parameter = weights && p.is_param;
    t.requires_grad = t.parameter && tm.requires_grad;
    t.location = tm.device;
    if (several_) t.path.emplace_back(m_.name);
    if (!weights) t.path.emplace_back(std::string("<constants>"));
    t.path.emplace_back(p.fqn);

    if (g.first_fqn.empty()) {
      g.first_fqn = p.fqn;
      g.type = tm.type;
      // A meta export's files are empty and every one of its tensors names the same file
      // (their storages all start at address 0): no data, and no sharing either.
      g.no_data = tm.device == "meta" || e.uncompressed_size == 0;
      if (!g.no_data) g.storage = bind_storage(e, tm, w, what, weights);
    } else if (g.type != tm.type) {
      // torch.export.load would give this entry the first one's dtype: refused rather than
      // read as something the file does not say.
      w.fail(errc::corrupt, what + ": its file " + std::string(e.record) + " is " + name(tm.type) + " here but " +
                                name(g.type) + " for " + text::quote(g.first_fqn, 80));
    }
    if (g.no_data) {
      t.location = "meta";
    } else {
      t.storage = g.storage;
      check_view(t, c_.storages[*g.storage], w, what);
      ++c_.storages[*g.storage].tensor_count;
    }
    if (c_.tensors.size() >= opt_.max_tensors)
      throw_limit("more than " + std::to_string(opt_.max_tensors) + " tensors (raise with --max-tensors)", w.offset);
    if (weights) c_.keys.add(path_to_string(t.path), c_.tensors.size());
    c_.tensors.push_back(std::move(t));
    ++(weights ? m_.weights : m_.constants);
  }

  size_t bind_storage(const zip::entry& e, const pt2s::tensor_meta& tm, const where& w, const std::string& what,
                      bool weights) {
    if (e.method != 0)
      throw_unsupported("tensor file " + std::string(e.name) + " is compressed; torch.export.save writes them stored",
                        e.local_header_offset);
    const uint32_t size = element_size(tm.type);
    if (e.uncompressed_size % size != 0)
      w.fail(errc::corrupt, what + ": its file " + std::string(e.record) + " holds " +
                                std::to_string(e.uncompressed_size) + " bytes, not a whole number of " + name(tm.type) +
                                " elements");
    storage_record s;
    s.key = (several_ ? m_.name + "/" : std::string()) + (weights ? "weights/" : "constants/") +
            std::string(e.record.substr(e.record.rfind('/') + 1));
    s.type = tm.type;
    s.nbytes = e.uncompressed_size;
    s.file_offset = e.data_offset;
    s.location = tm.device;
    s.record = &e;
    s.crc32 = e.crc32;
    s.file = file_;
    c_.storages.push_back(std::move(s));
    return c_.storages.size() - 1;
  }

  // Every view within its file: numel * itemsize + offset, computed without overflow.
  void check_view(const tensor_record& t, const storage_record& s, const where& w, const std::string& what) {
    uint64_t numel = 1, last = uint64_t(t.storage_offset);
    for (size_t i = 0; i < t.shape.size(); ++i)
      if (!checked_mul(numel, uint64_t(t.shape[i]), &numel)) w.fail(errc::corrupt, what + ": element count overflows");
    if (numel == 0) return;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      uint64_t span;
      if (!checked_mul(uint64_t(t.shape[i] - 1), uint64_t(t.stride[i]), &span) || !checked_add(last, span, &last))
        w.fail(errc::corrupt, what + ": view extent overflows");
    }
    uint64_t end;
    if (!checked_add(last, 1, &end) || !checked_mul(end, element_size(t.type), &end) || end > s.nbytes)
      w.fail(errc::corrupt, what + ": the view needs " + (end > s.nbytes ? std::to_string(end) : std::string("more")) +
                                " bytes of " + std::string(s.record->record) + ", which holds " +
                                std::to_string(s.nbytes));
  }

  checkpoint& c_;
  uint32_t file_;
  const open_options& opt_;
  const zip::archive& ar_;
  pt2::model& m_;
  bool several_;
};

}  // namespace

bool has_pt2_format_record(const zip::archive& ar) {
  // Exactly "pt2", as is_pt2_package compares it: a torch.save archive that merely carries a
  // record of that name is still what torch.load reads.
  const zip::entry* f = ar.find("archive_format");
  if (!f || f->uncompressed_size != 3) return false;
  auto bytes = ar.read_record(*f);
  return std::string(bytes.begin(), bytes.end()) == "pt2";
}

void read_pt2(checkpoint& c, uint32_t file, const open_options& opt) {
  source_file& f = c.files[file];
  const zip::archive& ar = *f.zip;
  auto info = std::make_shared<pt2::archive_info>();
  info->root = ar.prefix();

  const zip::entry* format = ar.find("archive_format");
  const std::string format_text = small_record(ar, *format);
  if (format_text != "pt2")
    throw_unsupported("archive_format says " + text::quote(format_text, 64) + ", not 'pt2': not an archive this build reads",
                      format->data_offset);
  // torch.export.load reads only the version it writes; a missing record is version 0.
  info->archive_version = "0";
  if (const zip::entry* v = ar.find("archive_version")) {
    info->archive_version = small_record(ar, *v);
    if (info->archive_version != "0")
      throw_unsupported("pt2 archive_version " + text::quote(info->archive_version, 64) + " (this build reads version 0)",
                        v->data_offset);
  }
  // The payloads are raw bytes in the writer's byte order, which torch.export.load never swaps.
  if (const zip::entry* b = ar.find("byteorder")) {
    const std::string order = small_record(ar, *b);
    if (order == "big") throw_unsupported("a big-endian pt2 archive (record byteorder says 'big')", b->data_offset);
    if (order != "little") throw_corrupt("record " + std::string(b->name) + " must say 'little' or 'big'", b->data_offset);
  }
  f.format = file_format::pt2;
  c.format = file_format::pt2;
  c.byteorder = "little";
  if (opt.verify_crc)
    for (const auto& e : ar.entries()) ar.verify_crc(e);

  // What the records are, by folder (formats.md §14.2).
  std::vector<const zip::entry*> programs;
  std::set<std::string> aoti;
  static const char* const kSmall[] = {"archive_format", "archive_version", "byteorder", ".data/version",
                                       ".data/serialization_id"};
  for (const auto& e : ar.entries()) {
    const std::string_view r = e.record;
    if (starts_with(r, "models/")) {
      const std::string_view n = r.substr(7);
      if (!text::ends_with(n, ".json") || !plain_model_name(n.substr(0, n.size() - 5)))
        throw_unsupported("record " + std::string(e.name) + " under models/ is not models/<name>.json", e.local_header_offset);
      programs.push_back(&e);
    } else if (starts_with(r, "data/aotinductor/")) {
      const std::string_view rest = r.substr(17);
      aoti.insert(std::string(rest.substr(0, rest.find('/'))));
    } else if (starts_with(r, "extra/")) {
      info->extra_files.emplace_back(std::string(r.substr(6)), e.uncompressed_size);
    } else if (!starts_with(r, "data/weights/") && !starts_with(r, "data/constants/") &&
               !starts_with(r, "data/sample_inputs/") &&
               std::none_of(std::begin(kSmall), std::end(kSmall), [&](const char* k) { return r == k; })) {
      info->other_records.emplace_back(r);
    }
  }
  info->aoti_models.assign(aoti.begin(), aoti.end());
  if (programs.empty()) {
    if (!aoti.empty())
      throw_unsupported("an AOTInductor package (data/aotinductor/" + *aoti.begin() +
                        "/) without an ExportedProgram (models/*.json): this reader takes torch.export archives");
    throw_corrupt("a pt2 archive without a program: no models/<name>.json record");
  }

  const bool several = programs.size() > 1;
  for (const zip::entry* pe : programs) {
    pt2::model m;
    const std::string_view n = pe->record.substr(7);
    m.name = std::string(n.substr(0, n.size() - 5));
    m.key_prefix = several ? m.name + "/" : std::string();
    m.prog = parse_program(json_record(ar, *pe, opt), where_of(*pe), opt.read_pt2_graph);
    // Minor versions add optional fields; another major may mean anything (formats.md §14.5).
    if (m.prog.schema_major != 8)
      c.warnings.push_back(std::string(pe->record) + ": schema version " + std::to_string(*m.prog.schema_major) + "." +
                           std::to_string(m.prog.schema_minor.value_or(0)) +
                           "; this reader follows major version 8 (torch 2.11 loads major 8 only)");
    // torch.export.load prefers the single pickled dicts of older writers when present.
    for (const char* dir : {"data/weights/", "data/constants/"})
      if (const zip::entry* legacy = ar.find(std::string(dir) + m.name + ".pt"))
        throw_unsupported("legacy pickled payload " + std::string(legacy->name) +
                              " (written before the weights configs; torch.export.load unpickles it)",
                          legacy->local_header_offset);
    const std::string weights = "data/weights/" + m.name + "_weights_config.json";
    const std::string constants = "data/constants/" + m.name + "_constants_config.json";
    const zip::entry* wc = ar.find(weights);
    const zip::entry* cc = ar.find(constants);
    if (!wc) throw_corrupt("model '" + m.name + "' has no " + weights + " (torch.export.load requires it)", pe->local_header_offset);
    if (!cc) throw_corrupt("model '" + m.name + "' has no " + constants + " (torch.export.load requires it)", pe->local_header_offset);
    m.sample_inputs = ar.find("data/sample_inputs/" + m.name + ".pt") != nullptr;
    model_reader r(c, file, opt, m, several);
    r.read_config(*wc, true);
    r.read_config(*cc, false);
    info->models.push_back(std::move(m));
  }
  c.state_dict = value_path{};
  c.pt2 = std::move(info);
}

}  // namespace ckpt::detail

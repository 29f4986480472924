// ckpt::write_rekeyed_dcp through an in-memory opener (the buffered copy, not
// copy_file_range): a `.metadata` built the way PyTorch's pickler spells DCP's dataclasses,
// renamed in its three key places, the data file and a foreign file copied byte for byte,
// and the refusals that leave the staging directory empty.
#include <doctest/doctest.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/dcp_rekey.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "ckpt/pickle_writer.h"

using ckpt::pickle::kind;
using ckpt::pickle::value;
namespace pickle = ckpt::pickle;

namespace {

constexpr const char* kMd = "torch.distributed.checkpoint.metadata";

// A DCP Metadata tree: dataclasses as NEWOBJ(cls, ()) + BUILD(dict), torch.Size and the
// memory-format enum as REDUCE, the dtype a bare global (docs/formats.md §9.2).
struct md_tree {
  pickle::document doc;
  value* make(kind k) { return doc.make(k, 0); }
  value* str(const std::string& s) {
    value* v = make(kind::str);
    v->text = s;
    return v;
  }
  value* integer(int64_t i) {
    value* v = make(kind::integer);
    v->integer = i;
    return v;
  }
  value* tuple(std::vector<value*> items) {
    value* v = make(kind::tuple);
    v->items = items;
    return v;
  }
  value* dict(std::vector<value*> kv) {
    value* v = make(kind::dict);
    v->items = kv;
    return v;
  }
  value* global(const std::string& m, const std::string& n) {
    value* v = make(kind::global);
    v->items = {str(m), str(n)};
    return v;
  }
  value* call(pickle::object_op op, value* callable, value* args, value* state = nullptr) {
    value* v = make(kind::object);
    v->op = op;
    v->items.assign(pickle::kObjectSlots, nullptr);
    v->items[pickle::kCallable] = callable;
    v->items[pickle::kArgs] = args;
    v->state = state;
    return v;
  }
  value* dataclass(const std::string& module, const std::string& cls, value* state) {
    return call(pickle::object_op::newobj, global(module, cls), tuple({}), state);
  }
  value* size(std::vector<int64_t> dims) {
    std::vector<value*> d;
    for (int64_t x : dims) d.push_back(integer(x));
    return call(pickle::object_op::reduce, global("torch", "Size"), tuple({tuple(d)}));
  }

  // {key: float32 tensor of 2 elements, stored at bytes [0, 2) of __0_0.distcp}, planner_data
  // {key: path}; `key` is one str node shared by all three places, as CPython pickles it.
  std::vector<uint8_t> metadata(const std::string& key, std::vector<std::string> path) {
    value* k = str(key);
    value* props = dataclass(kMd, "TensorProperties", nullptr);
    props->state = tuple({global("torch", "float32"), make(kind::none), make(kind::boolean),
                          call(pickle::object_op::reduce, global(kMd, "_MEM_FORMAT_ENCODING"), tuple({integer(0)})),
                          make(kind::boolean)});
    value* chunk = dataclass(kMd, "ChunkStorageMetadata",
                             dict({str("offsets"), size({0}), str("sizes"), size({2})}));
    value* chunks = make(kind::list);
    chunks->items = {chunk};
    value* tensor = dataclass(kMd, "TensorStorageMetadata",
                              dict({str("properties"), props, str("size"), size({2}), str("chunks"), chunks}));
    value* index = dataclass(kMd, "MetadataIndex",
                             dict({str("fqn"), k, str("offset"), size({0}), str("index"), integer(0)}));
    value* info = dataclass("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                            dict({str("relative_path"), str("__0_0.distcp"), str("offset"), integer(0),
                                  str("length"), integer(2)}));
    std::vector<value*> p;
    for (const auto& e : path) p.push_back(e == key ? k : str(e));
    value* root = dataclass(kMd, "Metadata",
                            dict({str("state_dict_metadata"), dict({k, tensor}), str("planner_data"),
                                  dict({k, tuple(p)}), str("storage_data"), dict({index, info}),
                                  str("version"), str("1.0.0")}));
    return pickle::write(root, 2, &doc);
  }
};

struct scratch {
  std::string dir;
  scratch() {
    char tmpl[] = "/tmp/ckpt_dcp_rekey_XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~scratch() {
    for (const auto& n : names()) ::unlink((dir + "/" + n).c_str());
    ::rmdir(dir.c_str());
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    ::closedir(d);
    return out;
  }
  std::vector<uint8_t> read(const std::string& name) const {
    std::ifstream f(dir + "/" + name, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
};

std::vector<ckpt::key_op> strip_compiled() { return {ckpt::make_op(ckpt::key_op::strip_compiled)}; }

}  // namespace

TEST_CASE("write_rekeyed_dcp: an in-memory directory, renamed in every key place and copied") {
  md_tree t;
  ckpt::memory_opener in("<mem>");
  in.add("run/.metadata", t.metadata("model._orig_mod.w", {"model", "_orig_mod.w"}));
  in.add("run/__0_0.distcp", std::vector<uint8_t>{1, 2, 3});
  in.add("run/meta.pt", std::string_view("trainer state"));
  scratch out;
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  ckpt::dcp_rekey_options o;
  o.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };
  ckpt::dcp_rekey_result r = ckpt::write_rekeyed_dcp(in, "run", strip_compiled(), out.dir, o);
  CHECK(r.plan.changed == 1);
  CHECK(r.storage_renamed == 1);
  CHECK(r.planner_renamed == 1);
  CHECK(r.data_files == std::vector<std::string>{"__0_0.distcp"});
  CHECK(r.other_files == std::vector<std::string>{"meta.pt"});
  CHECK(r.bytes_copied == 3 + 13);
  REQUIRE(!progress.empty());
  CHECK(progress.back().first == progress.back().second);
  CHECK(out.read("__0_0.distcp") == std::vector<uint8_t>{1, 2, 3});
  CHECK(out.read("meta.pt").size() == 13);

  std::vector<uint8_t> bytes = out.read(".metadata");
  CHECK(bytes.size() == r.metadata_bytes);
  ckpt::dcp::metadata md = ckpt::dcp::decode_metadata(bytes.data(), bytes.size());
  REQUIRE(md.items.size() == 1);
  CHECK(md.items[0].fqn == "model.w");
  CHECK(md.storage_data.at(0).fqn == "model.w");
  REQUIRE(md.planner_data.size() == 1);
  CHECK(md.planner_data[0].fqn == "model.w");
  REQUIRE(md.planner_data[0].path.size() == 2);
  CHECK(md.planner_data[0].path[1].key == "w");
  CHECK(md.version == std::optional<std::string>("1.0.0"));
}

TEST_CASE("write_rekeyed_dcp: refusals write nothing") {
  md_tree t;
  scratch out;
  auto kind_of = [&](const ckpt::memory_opener& in, const std::vector<ckpt::key_op>& ops) {
    try {
      ckpt::write_rekeyed_dcp(in, "", ops, out.dir);
    } catch (const ckpt::error& e) {
      return e.kind();
    }
    return ckpt::errc::check_failed;  // not expected: the CHECKs below name the case
  };
  {
    // A one-element path spelling the key: the element shares the key's new name.
    ckpt::memory_opener in;
    in.add(".metadata", t.metadata("_orig_mod.w", {"_orig_mod.w"}));
    in.add("__0_0.distcp", std::vector<uint8_t>{1, 2});
    ckpt::dcp_rekey_options dry;
    dry.dry_run = true;
    CHECK(ckpt::write_rekeyed_dcp(in, "", strip_compiled(), out.dir, dry).plan.changed == 1);
    CHECK(out.names().empty());
    // The path is two levels and the edit changes both.
    ckpt::memory_opener two;
    two.add(".metadata", t.metadata("a._orig_mod.w", {"a", "_orig_mod", "w"}));
    two.add("__0_0.distcp", std::vector<uint8_t>{1, 2});
    CHECK(kind_of(two, {ckpt::make_rename_op("^a\\._orig_mod\\.w$=b.w")}) == ckpt::errc::unsupported);
    CHECK(out.names().empty());
  }
  {
    ckpt::memory_opener in;  // the data file is missing
    in.add(".metadata", t.metadata("_orig_mod.w", {"_orig_mod.w"}));
    CHECK(kind_of(in, strip_compiled()) == ckpt::errc::corrupt);
    in.add("__0_0.distcp", std::vector<uint8_t>{1});  // one byte short
    CHECK(kind_of(in, strip_compiled()) == ckpt::errc::corrupt);
    in.add("__0_0.distcp", std::vector<uint8_t>{1, 2});
    in.add("__1.metadata", std::string_view("rank-local"));
    CHECK(kind_of(in, strip_compiled()) == ckpt::errc::unsupported);
  }
  CHECK(out.names().empty());
}

// The I/O seams of issue 13 item 5: slices of a file that report errors in the file's own
// coordinates, file openers (disk and memory) that keep names read from files inside
// their root, and the layout decided from names before any byte is sniffed.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "ckpt/zip_reader.h"
#include "io/slice_source.h"
#include "model/layout.h"

using ckpt::errc;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> sample(const std::string& name) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/samples/" + name, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `inner` embedded at byte `pad` of a larger file, as a DCP writer places a chunk's
// torch.save archive inside a .distcp file, with other bytes on both sides.
std::shared_ptr<const ckpt::byte_source> embedded(const std::vector<uint8_t>& inner, uint64_t pad,
                                                  const std::string& name = "run/__0_0.distcp") {
  std::vector<uint8_t> file(pad, 0x5a);
  file.insert(file.end(), inner.begin(), inner.end());
  file.insert(file.end(), 333, 0xa5);
  return std::make_shared<ckpt::memory_source>(std::move(file), name);
}

struct failure {
  errc kind = errc::corrupt;
  std::string file, line;
  std::optional<uint64_t> offset;
};

template <class F>
std::optional<failure> failure_of(F&& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    return failure{e.kind(), e.file(), e.one_line(), e.offset()};
  }
  return std::nullopt;
}

std::optional<failure> open_fails(std::unique_ptr<ckpt::byte_source> src) {
  return failure_of([&] { (void)ckpt::open_checkpoint(std::move(src)); });
}

// The same damage read directly and read through a slice at `pad`: the slice's error names
// the parent file and the same byte, counted from the parent's start.
void expect_rebased(const std::vector<uint8_t>& damaged, uint64_t pad) {
  auto direct = open_fails(std::make_unique<ckpt::memory_source>(damaged, "chunk"));
  REQUIRE(direct);
  REQUIRE(direct->offset);
  auto parent = embedded(damaged, pad);
  auto sliced = open_fails(std::make_unique<ckpt::slice_source>(parent, pad, damaged.size()));
  REQUIRE(sliced);
  CHECK(sliced->kind == direct->kind);
  CHECK(sliced->file == "run/__0_0.distcp");
  REQUIRE(sliced->offset);
  CHECK(*sliced->offset == *direct->offset + pad);
  CHECK_MESSAGE(sliced->line.rfind("run/__0_0.distcp: byte " + std::to_string(*direct->offset + pad) + ": ", 0) == 0,
                sliced->line);
}

size_t last_of(const std::vector<uint8_t>& v, const std::string& needle) {
  for (size_t i = v.size() - needle.size() + 1; i-- > 0;)
    if (std::equal(needle.begin(), needle.end(), v.begin() + long(i))) return i;
  FAIL("not found: " << needle);
  return 0;
}

}  // namespace

TEST_SUITE("slice_source") {

TEST_CASE("reads its range of the parent, and is named after the parent") {
  std::vector<uint8_t> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i);
  auto parent = std::make_shared<ckpt::memory_source>(bytes, "p.distcp");
  ckpt::slice_source s(parent, 10, 20);
  CHECK(s.size() == 20);
  CHECK(s.name() == "p.distcp");
  CHECK(s.origin_offset() == 10);
  CHECK(s.read_vector(0, 3) == std::vector<uint8_t>{10, 11, 12});
  CHECK(s.read_vector(17, 3) == std::vector<uint8_t>{27, 28, 29});
  CHECK(s.bytes_read() == 6);
  // A slice of a slice counts from the file's start.
  auto outer = std::make_shared<ckpt::slice_source>(parent, 10, 20);
  ckpt::slice_source inner(outer, 5, 5);
  CHECK(inner.origin_offset() == 15);
  CHECK(inner.read_vector(0, 1) == std::vector<uint8_t>{15});
}

TEST_CASE("kept ends serve reads inside them from memory, the same bytes as the parent's") {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7);
  auto parent = std::make_shared<ckpt::memory_source>(bytes, "p.distcp");
  ckpt::slice_source s(parent, 100, 800);
  s.keep_ends(64);
  CHECK(parent->bytes_read() == 128);  // two reads of 64 bytes
  auto want = [&](uint64_t at, size_t n) { return std::vector<uint8_t>(bytes.begin() + 100 + at, bytes.begin() + 100 + at + n); };
  CHECK(s.read_vector(0, 64) == want(0, 64));    // the head
  CHECK(s.read_vector(740, 60) == want(740, 60));  // the tail
  CHECK(parent->bytes_read() == 128);
  CHECK(s.read_vector(60, 10) == want(60, 10));    // across the head's end: from the parent
  CHECK(s.read_vector(300, 20) == want(300, 20));  // the middle
  CHECK(s.read_vector(730, 20) == want(730, 20));  // across the tail's start
  CHECK(parent->bytes_read() == 178);
  CHECK(s.bytes_read() == 174);
  // Past the end: refused as without kept ends.
  CHECK(failure_of([&] { (void)s.read_vector(790, 20); }));
  s.drop_ends();
  CHECK(s.read_vector(0, 8) == want(0, 8));
  CHECK(parent->bytes_read() == 186);
  // A slice shorter than both ends is kept whole in one read.
  ckpt::slice_source small(parent, 0, 100);
  small.keep_ends(64);
  CHECK(parent->bytes_read() == 286);
  CHECK(small.read_vector(30, 60) == std::vector<uint8_t>(bytes.begin() + 30, bytes.begin() + 90));
  CHECK(parent->bytes_read() == 286);
}

TEST_CASE("a read past the slice's end is refused in the parent's coordinates") {
  auto parent = std::make_shared<ckpt::memory_source>(std::vector<uint8_t>(100), "p.distcp");
  ckpt::slice_source s(parent, 40, 20);
  // Bytes 60.. exist in the parent, but they are not the slice's: refused all the same.
  auto f = failure_of([&] { (void)s.read_vector(15, 10); });
  REQUIRE(f);
  CHECK(f->kind == errc::corrupt);
  CHECK(f->file == "p.distcp");
  CHECK(f->offset == 55);
  CHECK_MESSAGE(f->line.find("ends at byte 60") != std::string::npos, f->line);
}

TEST_CASE("a range that is not inside the parent is refused when the slice is made") {
  auto parent = std::make_shared<ckpt::memory_source>(std::vector<uint8_t>(100), "p.distcp");
  CHECK_NOTHROW(ckpt::slice_source(parent, 100, 0));
  CHECK_NOTHROW(ckpt::slice_source(parent, 0, 100));
  for (auto range : {std::pair<uint64_t, uint64_t>{90, 11}, {101, 0}, {~0ull, 2}, {1, ~0ull}}) {
    const uint64_t off = range.first, len = range.second;  // the lambda below cannot capture bindings
    auto f = failure_of([&] { ckpt::slice_source s(parent, off, len); });
    REQUIRE(f);
    CHECK(f->kind == errc::corrupt);
    CHECK(f->file == "p.distcp");
    CHECK(f->offset == off);
  }
}

TEST_CASE("a slice of a file maps into the file; a slice of memory does not") {
  char name[] = "/tmp/ckpt_slice_XXXXXX";
  int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "0123456789", 10) == 10);
  ::close(fd);
  auto file = std::make_shared<ckpt::file_source>(name);
  ckpt::slice_source s(file, 3, 4);
  CHECK(s.in_file().file == file.get());
  CHECK(s.in_file().offset == 3);
  ckpt::slice_source inner(std::make_shared<ckpt::slice_source>(file, 3, 4), 1, 2);
  CHECK(inner.in_file().offset == 4);
  CHECK(inner.read_vector(0, 2) == std::vector<uint8_t>{'4', '5'});
  CHECK(file->in_file().offset == 0);
  ::unlink(name);
  auto mem = std::make_shared<ckpt::memory_source>(std::vector<uint8_t>(10));
  CHECK(ckpt::slice_source(mem, 1, 2).in_file().file == nullptr);
}

TEST_CASE("a torch.save archive inside a slice reads as the file itself does") {
  const auto pt = sample("plain.pt");
  const ckpt::checkpoint direct = ckpt::open_checkpoint(std::make_unique<ckpt::memory_source>(pt, "plain.pt"));
  const ckpt::checkpoint sliced =
      ckpt::open_checkpoint(std::make_unique<ckpt::slice_source>(embedded(pt, 1577), 1577, pt.size()));
  CHECK(sliced.path == "run/__0_0.distcp");
  REQUIRE(sliced.tensors.size() == direct.tensors.size());
  REQUIRE(sliced.storages.size() == direct.storages.size());
  for (size_t i = 0; i < direct.storages.size(); ++i) {
    // Offsets are the slice's own: loaders read through the slice (or in_file()).
    CHECK(sliced.storages[i].file_offset == direct.storages[i].file_offset);
    const auto& s = sliced.storages[i];
    CHECK(sliced.files[0].source->read_vector(*s.file_offset, size_t(s.nbytes)) ==
          std::vector<uint8_t>(pt.begin() + long(*s.file_offset), pt.begin() + long(*s.file_offset + s.nbytes)));
  }
}

TEST_CASE("corrupt zip structure inside a slice: the parent's name and absolute offset") {
  auto pt = sample("plain.pt");
  pt[last_of(pt, "PK\x01\x02")] = 'X';  // the last central-directory header's signature
  expect_rebased(pt, 1577);
  // The end record itself: the reader searches for it from the end of the slice, not of
  // the file (the bytes after the slice are another chunk's).
  auto pt2 = sample("plain.pt");
  pt2[last_of(pt2, "PK\x05\x06") + 10] ^= 0x01;  // the entry count
  expect_rebased(pt2, 4096 + 3);
}

TEST_CASE("a corrupt pickle inside a slice: the parent's name and absolute offset") {
  auto pt = sample("plain.pt");
  ckpt::memory_source src(pt);
  auto ar = ckpt::zip::archive::open(src);
  const ckpt::zip::entry* pkl = nullptr;
  for (const auto& e : ar->entries())
    if (e.name.size() >= 8 && e.name.compare(e.name.size() - 8, 8, "data.pkl") == 0) pkl = &e;
  REQUIRE(pkl);
  REQUIRE(pkl->method == 0);  // torch.save stores records
  pt[pkl->data_offset + 2] = 0xff;  // after PROTO 2: no such opcode
  expect_rebased(pt, 999);
}

TEST_CASE("a corrupt safetensors header inside a slice: the parent's name and absolute offset") {
  auto st = sample("model.safetensors");
  // The header's first tensor entry loses its closing brace's partner: a JSON error with
  // an offset into the header.
  st[last_of(std::vector<uint8_t>(st.begin(), st.begin() + 200), "\"dtype\"")] = '!';
  expect_rebased(st, 12345);
}

TEST_CASE("a truncated chunk: the read past the slice names the parent and the byte") {
  auto pt = sample("plain.pt");
  auto parent = embedded(pt, 100);
  // The slice's length claims less than the archive: its end record is not found.
  auto f = open_fails(std::make_unique<ckpt::slice_source>(parent, 100, pt.size() / 2));
  REQUIRE(f);
  CHECK(f->file == "run/__0_0.distcp");
  if (f->offset) CHECK(*f->offset >= 100);
}

}  // TEST_SUITE

TEST_SUITE("file_opener") {

TEST_CASE("names from files cannot leave the root") {
  using ckpt::checked_relative_path;
  CHECK(checked_relative_path("model-00001-of-00002.safetensors") == "model-00001-of-00002.safetensors");
  CHECK(checked_relative_path("sub/x.bin") == "sub/x.bin");
  CHECK(checked_relative_path("") == "");
  CHECK(checked_relative_path("a..b/..c") == "a..b/..c");  // dots inside a name are a name
  CHECK(checked_relative_path("ab:c.bin") == "ab:c.bin");  // a colon is no drive past the first byte
  // The one rule of names read from files (relative_name_problem), as strict as the
  // strictest of the checks it replaced: what no writer writes is refused, not folded.
  for (const std::string& bad : std::vector<std::string>{"/etc/passwd", "..", "../x", "a/../../x", "a/..", "sub/../x", "//x",
                                std::string("a\0b", 3), "sub/./x.bin", "sub//x.bin", ".", "sub/", "\\x.bin",
                                "..\\x.bin", "a\\b.bin", "C:x.bin", "c:\\x.bin"}) {
    auto f = failure_of([&] { (void)checked_relative_path(bad); });
    REQUIRE_MESSAGE(f, bad);
    CHECK(f->kind == errc::unsafe);
    CHECK_MESSAGE(f->line.find("must stay inside its directory") != std::string::npos, f->line);
  }
}

TEST_CASE("memory opener: files, implied directories, listing, escaping names") {
  ckpt::memory_opener m("mem");
  m.add("run/.metadata", std::string_view("meta"));
  m.add("run/__0_0.distcp", std::string_view("chunk"));
  m.add("run/sub/x", std::string_view("x"));
  m.add("run.txt", std::string_view("t"));
  CHECK(m.stat("").kind == ckpt::file_kind::directory);
  CHECK(m.stat("run").kind == ckpt::file_kind::directory);
  CHECK(m.stat("run/sub").kind == ckpt::file_kind::directory);
  CHECK(m.stat("ru").kind == ckpt::file_kind::missing);
  CHECK(m.stat("run/.metadata").kind == ckpt::file_kind::regular);
  CHECK(m.stat("run/.metadata").size == 4);
  CHECK(m.list("") == std::vector<std::string>{"run", "run.txt"});
  CHECK(m.list("run") == std::vector<std::string>{".metadata", "__0_0.distcp", "sub"});
  auto src = m.open("run/__0_0.distcp");
  CHECK(src->name() == "mem/run/__0_0.distcp");
  CHECK(src->read_vector(0, 5) == std::vector<uint8_t>{'c', 'h', 'u', 'n', 'k'});
  auto dir = failure_of([&] { (void)m.open("run"); });
  REQUIRE(dir);
  CHECK(dir->kind == errc::usage);
  auto missing = failure_of([&] { (void)m.open("run/nope"); });
  REQUIRE(missing);
  CHECK(missing->kind == errc::io);
  for (const char* bad : {"../run/.metadata", "/run/.metadata", "run/../run.txt"}) {
    CHECK(failure_of([&] { (void)m.open(bad); })->kind == errc::unsafe);
    CHECK(failure_of([&] { (void)m.stat(bad); })->kind == errc::unsafe);
    CHECK(failure_of([&] { (void)m.list(bad); })->kind == errc::unsafe);
  }
}

TEST_CASE("disk opener: regular files only, names kept inside the root") {
  const fs::path root = fs::temp_directory_path() / ("ckpt_opener_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "run" / "sub");
  std::ofstream(root / "run" / "a.bin") << "abc";
  std::ofstream(root / "secret") << "s";
  REQUIRE(::mkfifo((root / "run" / "fifo").c_str(), 0600) == 0);
  ckpt::disk_opener d((root / "run").string());
  CHECK(d.list("") == std::vector<std::string>{"a.bin", "fifo", "sub"});
  CHECK(d.stat("a.bin").kind == ckpt::file_kind::regular);
  CHECK(d.stat("a.bin").size == 3);
  CHECK(d.stat("sub").kind == ckpt::file_kind::directory);
  CHECK(d.stat("fifo").kind == ckpt::file_kind::other);
  CHECK(d.stat("nope").kind == ckpt::file_kind::missing);
  auto src = d.open("a.bin");
  CHECK(src->name() == (root / "run" / "a.bin").string());
  CHECK(src->size() == 3);
  // A FIFO is refused at once, not waited on.
  auto fifo = failure_of([&] { (void)d.open("fifo"); });
  REQUIRE(fifo);
  CHECK(fifo->kind == errc::usage);
  CHECK_MESSAGE(fifo->line.find("a FIFO") != std::string::npos, fifo->line);
  // ../secret exists, and is not reachable.
  for (const std::string& bad : std::vector<std::string>{"../secret", (root / "secret").string(), "sub/../../secret"}) {
    auto f = failure_of([&] { (void)d.open(bad); });
    REQUIRE(f);
    CHECK(f->kind == errc::unsafe);
  }
  fs::remove_all(root);
}

}  // TEST_SUITE

TEST_SUITE("layout") {

using ckpt::detail::layout_kind;

struct row {
  std::vector<std::string> files;  // in the memory opener
  std::string path;                // what the user names
  std::optional<layout_kind> kind; // nullopt: refused
  std::string file;                // the file the layout names, or a word of the refusal
};

TEST_CASE("detected from names alone, ambiguous sets refused") {
  const std::vector<row> rows = {
      // A path that is not a directory is the file (open says if it is missing).
      {{"x.pt"}, "x.pt", layout_kind::single_file, "x.pt"},
      {{}, "missing.pt", layout_kind::single_file, "missing.pt"},
      {{"d/model.safetensors.index.json"}, "d/model.safetensors.index.json", layout_kind::hf_index,
       "d/model.safetensors.index.json"},
      {{"pytorch_model.bin.index.json"}, "pytorch_model.bin.index.json", layout_kind::hf_index,
       "pytorch_model.bin.index.json"},
      {{"model.safetensors.index.fp16.json"}, "model.safetensors.index.fp16.json", layout_kind::hf_index,
       "model.safetensors.index.fp16.json"},
      {{"config.json"}, "config.json", layout_kind::single_file, "config.json"},
      // Directories.
      {{"run/.metadata", "run/__0_0.distcp", "run/__1_0.distcp"}, "run", layout_kind::dcp, "run"},
      {{".metadata", "__0_0.distcp"}, "", layout_kind::dcp, ""},
      {{"hf/model.safetensors.index.json", "hf/model-00001-of-00002.safetensors",
        "hf/model-00002-of-00002.safetensors", "hf/config.json"},
       "hf", layout_kind::hf_index, "hf/model.safetensors.index.json"},
      {{"hf/model.safetensors", "hf/config.json"}, "hf", layout_kind::single_file, "hf/model.safetensors"},
      {{"hf/pytorch_model.bin", "hf/config.json"}, "hf", layout_kind::single_file, "hf/pytorch_model.bin"},
      // A Trainer checkpoint directory: the model, and files that are not the model.
      {{"c/model.safetensors", "c/optimizer.pt", "c/scheduler.pt", "c/rng_state.pth", "c/training_args.bin"},
       "c", layout_kind::single_file, "c/model.safetensors"},
      // HuggingFaceStorageWriter pieces (formats.md §9.10): the writer's names, no index.
      {{"p/shard-00001-model-00001-of-00001.safetensors", "p/shard-00002-model-00001-of-00001.safetensors"}, "p",
       layout_kind::dcp_safetensors, "p"},
      // Beside an index, the index wins; a name short of 5 digits is not the writer's.
      {{"p/model.safetensors.index.json", "p/shard-00001-model-00001-of-00001.safetensors"}, "p",
       layout_kind::hf_index, "p/model.safetensors.index.json"},
      {{"p/shard-1-model-1-of-1.safetensors"}, "p", std::nullopt, "without a checkpoint"},
      // Ambiguous or empty: refused, naming what was found.
      {{"hf/model.safetensors.index.json", "hf/pytorch_model.bin.index.json"}, "hf", std::nullopt,
       "not a regular file: a directory holding 2 Hugging Face shard indexes"},
      {{"hf/model.safetensors", "hf/pytorch_model.bin"}, "hf", std::nullopt, "both model.safetensors and pytorch_model.bin"},
      {{"m/.metadata", "m/model.safetensors.index.json"}, "m", std::nullopt, "both a torch.distributed.checkpoint"},
      {{"e/readme.txt"}, "e", std::nullopt, "without a checkpoint"},
      {{"e/sub/model.safetensors"}, "e", std::nullopt, "without a checkpoint"},
      // A directory named like a file is still a directory.
      {{"model.safetensors/x"}, "", std::nullopt, "without a checkpoint"},
      {{"d/model.safetensors/x", "d/pytorch_model.bin"}, "d", layout_kind::single_file, "d/pytorch_model.bin"},
  };
  for (const row& r : rows) {
    ckpt::memory_opener m("mem");
    for (const auto& f : r.files) m.add(f, std::string_view("bytes"));
    CAPTURE(r.path);
    CAPTURE(r.file);
    if (r.kind) {
      const auto l = ckpt::detail::detect_layout(m, r.path);
      CHECK(l.kind == *r.kind);
      CHECK(l.file == r.file);
    } else {
      auto f = failure_of([&] { (void)ckpt::detail::detect_layout(m, r.path); });
      REQUIRE(f);
      // As any directory was before layouts: the user must name a file (exit 2).
      CHECK(f->kind == errc::usage);
      CHECK(f->file == m.display(r.path));
      CHECK_MESSAGE(f->line.find(r.file) != std::string::npos, f->line);
    }
  }
}

TEST_CASE("DCP parts are the .distcp files, sorted") {
  ckpt::memory_opener m;
  for (const char* f : {"run/.metadata", "run/__1_0.distcp", "run/__0_0.distcp", "run/notes.txt"})
    m.add(f, std::string_view("b"));
  const auto l = ckpt::detail::detect_layout(m, "run");
  CHECK(l.parts == std::vector<std::string>{"__0_0.distcp", "__1_0.distcp"});
}

TEST_CASE("open_checkpoint decides the layout before sniffing") {
  ckpt::memory_opener m("mem");
  m.add("hf/model.safetensors", sample("model.safetensors"));
  m.add("hf/config.json", std::string_view("{}"));
  m.add("shards/model.safetensors.index.json", std::string_view("{\"weight_map\": {}}"));
  m.add("run/.metadata", std::string_view("not read"));
  m.add("run/__0_0.distcp", sample("plain.pt"));
  const ckpt::checkpoint c = ckpt::open_checkpoint("hf", {}, m);
  CHECK(c.path == "mem/hf/model.safetensors");
  CHECK(c.format == ckpt::file_format::safetensors);
  CHECK(c.tensors.size() == 8);

  // A shard set is read as one (hf_set_test.cpp): its index is parsed, not sniffed.
  for (const char* path : {"shards", "shards/model.safetensors.index.json"}) {
    auto hf = failure_of([&] { (void)ckpt::open_checkpoint(path, {}, m); });
    REQUIRE(hf);
    CHECK(hf->kind == errc::corrupt);
    CHECK(hf->line == "mem/shards/model.safetensors.index.json: index \"weight_map\" names no tensors");
  }
  // A DCP directory is read as one (model/open_dcp.cpp): here its .metadata is no pickle.
  auto dcp = failure_of([&] { (void)ckpt::open_checkpoint("run", {}, m); });
  REQUIRE(dcp);
  CHECK(dcp->kind == errc::corrupt);
  CHECK(dcp->file == "mem/run/.metadata");
  // A .distcp named directly is still a file: sniffed as today.
  auto part = failure_of([&] { (void)ckpt::open_checkpoint("run/__0_0.distcp", {}, m); });
  CHECK_FALSE(part);
  auto escape = failure_of([&] { (void)ckpt::open_checkpoint("../hf", {}, m); });
  REQUIRE(escape);
  CHECK(escape->kind == errc::unsafe);
}

}  // TEST_SUITE

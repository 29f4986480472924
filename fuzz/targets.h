// The fuzz targets' bodies, shared by the libFuzzer executables (fuzz/fuzz_<name>.cpp,
// clang + ASan/UBSan) and by the replay driver tests/tools/fuzz_replay.cpp (any compiler,
// no libFuzzer), so every crash fixture and seed runs through exactly the same code in the
// ordinary test suite.
//
// Each target takes one input and returns 0. Errors the library reports as ckpt::error are
// the expected outcome for most inputs and are swallowed. Anything else is a finding:
//  * a sanitizer report, a signal, a hang or an allocation over the fuzzer's limits;
//  * any other exception escaping (the library's contract is to throw only ckpt::error;
//    libFuzzer reports an uncaught exception as a crash);
//  * a broken invariant or a failed round trip, reported on stderr and then
//    __builtin_trap(), so it shows up as a crash with the reason just above the trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ckpt::fuzz {

/// pickle::parse on raw bytes (as data.pkl, then as a stacked stream), repr of the result,
/// pickle::write of it; the output must parse again and write back byte-identically.
int pickle_target(const uint8_t* data, size_t size);
/// zip::archive::open over memory_source, read_record and verify_crc of every entry, and
/// the reader's documented invariants (ranges inside the file, find() consistent).
int zip_index_target(const uint8_t* data, size_t size);
/// open_checkpoint over memory_source (format detection, zip -> pickle -> tensor table with
/// view validation, legacy streams, safetensors), the inspect JSON of the result, and
/// invariants of the tensor table; a second open with verify_crc when the first succeeds.
int torch_archive_target(const uint8_t* data, size_t size);
/// safetensors::read_header over memory_source.
int safetensors_target(const uint8_t* data, size_t size);
/// open_checkpoint on TorchScript archives. An input starting with "PK\3\4" is used as the
/// archive itself; any other input is data.pkl and constants.pkl (split at kPickleSplit),
/// which the target packs into a TorchScript-shaped archive with a storage record of the
/// right size for every storage id the pickles name, so mutations reach the tensor table.
int torchscript_meta_target(const uint8_t* data, size_t size);
/// An AOTInductor wrapper.cpp's text (src/formats/aoti_wrapper.cpp, docs/formats.md §15.3):
/// parse, then check every index the result holds against its own sizes.
int aoti_wrapper_target(const uint8_t* data, size_t size);
/// open_checkpoint of a torch zip (or TorchScript archive); if it parses, data.pkl is
/// rewritten with pickle::write and every record copied through zip::writer into a memfd,
/// and (torch zip) the file is also rekeyed with an identity mapping by rekey_file; each
/// output must re-open with an identical tensor table, or the target traps.
int rewrite_roundtrip_target(const uint8_t* data, size_t size);

/// `rekey --rename` and `--map` without a file: an input starting with '{' is a key map
/// (mapping_from_json) applied to its own keys; any other input is a --rename spec on its
/// first line and keys on the others. The plan must keep every key in order, a map must
/// rename exactly the keys it lists, collisions and empty keys must be reported, and every
/// key, new name and error message must come out of the escaper terminal-safe.
int rekey_ops_target(const uint8_t* data, size_t size);

/// dcp::decode_metadata on a DCP `.metadata` file: a decoded file names only globals of
/// the DCP vocabulary, its ranges do not overflow, and check_coverage agrees with an
/// element-by-element count of the chunk boxes on every tensor small enough to count.
int dcp_metadata_target(const uint8_t* data, size_t size);
/// hf::parse_index of a Hugging Face *.index.json, its invariants (sorted unique shards,
/// every key's shard in range and named safely), and hf::cross_check against shards built
/// from the index itself: none, then exactly one error for a key moved out of its shard and
/// one for a key held twice; tight limits give a limit error or the same index.
int hf_index_target(const uint8_t* data, size_t size);
/// The JSON readers of a torch.export archive (src/formats/pt2_program.cpp) on one text:
/// parse_payload_config and parse_program (only ckpt::error may escape; accepted path
/// names are plain file names, sizes and strides pair up, symbolic dims have text), and
/// the srepr and TreeSpec renderers, which must decline rather than throw.
int pt2_json_target(const uint8_t* data, size_t size);

/// The set readers over an in-memory directory (src/io/memory_opener.cpp): the input is
/// files separated by kFileSplit, each "NAME\nBYTES" (a Hugging Face index and its shards,
/// a DCP `.metadata` and its `.distcp` files, HuggingFaceStorageWriter pieces, ...).
/// open_checkpoint of the directory, with and without the chunk archives read; what opens
/// must have a sound tensor table, render as inspect JSON, and every assembled key must
/// pass plan_assembly (what materialize runs) or be refused by it with a ckpt::error.
int dcp_sets_target(const uint8_t* data, size_t size);

/// Separator of dcp_sets' files.
constexpr std::string_view kFileSplit = "\n--ckpt-fuzz-file--\n";

/// Separator of torchscript_meta's two-pickle input form.
constexpr std::string_view kPickleSplit = "\n--ckpt-fuzz-constants.pkl--\n";

struct target {
  const char* name;  // "pickle", "zip_index", ... (fuzz_<name> is the libFuzzer binary)
  int (*run)(const uint8_t* data, size_t size);
};

/// How far inputs got, for the replay driver's --verbose summary (not thread-safe; the
/// fuzzers and the driver run one input at a time).
struct counters {
  uint64_t parsed = 0;     // inputs the library accepted (open_checkpoint, parse, open, ...)
  uint64_t written = 0;    // pickle/zip outputs written and re-read (pickle, rewrite_roundtrip)
  uint64_t rekeyed = 0;    // identity rekeys written and re-read (rewrite_roundtrip)
};
counters& stats();

/// Every target, in a fixed order.
const target* targets_begin();
const target* targets_end();
/// The target called `name` (with or without the "fuzz_" prefix), or nullptr.
const target* find_target(std::string_view name);

}  // namespace ckpt::fuzz

// The checkpoint model: what a file holds, read from metadata alone. For every tensor it
// knows the dtype, shape, stride and storage offset, and for every storage the byte range
// in the file, so later stages (materialize, rekey) can read or copy exactly those bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/dim_list.h"
#include "ckpt/dtype.h"
#include "ckpt/key_table.h"
#include "ckpt/pickle.h"
#include "ckpt/safetensors.h"
#include "ckpt/zip_reader.h"

namespace ckpt {

namespace pt2 {
struct archive_info;
}

enum class file_format { torch_zip, torchscript, safetensors, torch_legacy, pt2 };
/// "torch-zip", "torchscript", "safetensors", "torch-legacy", "pt2" (a torch.export archive).
const char* format_name(file_format f);

/// One step from a container to its element: a dict key or attribute name (string), a
/// dict's integer key or a list/tuple index (integer).
using path_element = std::variant<std::string, int64_t>;
using value_path = std::vector<path_element>;
/// For humans: elements joined by `separator`, e.g. "state_dict/model.enc.weight"; with '.',
/// the name a module attribute path has in TorchScript ("blocks.0.attn.weight").
std::string path_to_string(const value_path& path, char separator = '/');

struct storage_record {
  std::string key;                     // "0" (torch: record data/0), tensor name (safetensors)
  dtype type = dtype::uint8;           // element type the bytes were saved as
  uint64_t nbytes = 0;
  std::optional<uint64_t> file_offset; // first data byte in the file; nullopt for meta
  std::string location;                // saved device string ("cpu", "cuda:0"), data only
  const zip::entry* record = nullptr;  // zip formats only
  uint32_t crc32 = 0;                  // from the zip central directory (0 if unknown)
  uint32_t file = 0;                   // index into checkpoint::files: where file_offset is
  size_t tensor_count = 0;
  // True when [file_offset, file_offset + nbytes) is not the data but a whole archive that
  // holds it: a DCP chunk opened from metadata alone (open_options::read_chunk_archives
  // false). Such bytes are never read as a tensor's data (read_plan refuses them).
  bool archive_range = false;
};

struct tensor_record;

/// How a quantized tensor's stored integers map to real values (_rebuild_qtensor's
/// quantizer_params). Per channel, torch saves the scales and zero points as tensors of
/// their own (older writers as lists); those tensors have storages but no key.
struct quantization {
  std::string scheme;               // "per_tensor_affine", "per_channel_affine",
                                    // "per_channel_affine_float_qparams"
  double scale = 0;                 // per tensor
  int64_t zero_point = 0;           // per tensor
  int64_t axis = 0;                 // per channel
  std::shared_ptr<const tensor_record> scales, zero_points;  // per channel, saved as tensors
  std::vector<double> scale_list, zero_point_list;           // per channel, saved as lists

  bool per_channel() const { return scheme != "per_tensor_affine"; }
};

struct tensor_kind;

struct tensor_record {
  value_path path;
  dtype type = dtype::float32;
  dim_list shape;                      // vector-like, rank <= 3 without a heap block
  dim_list stride;
  int64_t storage_offset = 0;          // in elements
  std::optional<size_t> storage;       // index into checkpoint::storages; nullopt: meta tensor
  bool parameter = false;
  bool requires_grad = false;
  // torch's conjugate and negative bits (x.conj(), x.conj().imag), from the rebuild call's
  // metadata dict: the stored bytes are the unconjugated, unnegated values (formats.md §3.3).
  bool conj = false;
  bool neg = false;
  std::string location;
  const pickle::value* node = nullptr; // the rebuild call in the pickle tree (torch formats)
  // Quantized dtypes only. Held by pointer: a quantization is large, and a million plain
  // tensors should not each carry an empty one.
  std::shared_ptr<const quantization> quant;
  // Sparse and nested tensors, and tensor subclasses (DTensor); null for a plain tensor.
  std::shared_ptr<const tensor_kind> kind;

  /// Elements and bytes stored: for a sparse or nested tensor, its components' sum.
  uint64_t numel() const;
  uint64_t nbytes() const;
  /// True for sparse and nested tensors: no storage of their own, data in components.
  bool composite() const;
};

/// A tensor that torch.save wrote as something other than one strided view of a storage.
///
/// Sparse and nested tensors (layout != "strided") have no storage of their own: the
/// record's `storage` is nullopt (it is NOT a meta tensor), `type` is their values' dtype,
/// `stride` is empty and `shape` is the logical size; a nested tensor's shape is
/// [number of tensors, then -1 for each dimension that the metadata does not fix].
/// Their data are the component tensors, each a plain tensor with a storage.
///
/// A DTensor's record is its local tensor (storage, shape and stride of this rank's
/// shard): `subclass` names the class, and the mesh and placements say how it is laid out.
struct tensor_kind {
  // "strided" (a subclass wrapping a plain tensor), "sparse_coo", "sparse_csr",
  // "sparse_csc", "sparse_bsr", "sparse_bsc", "nested" (strided nested tensor),
  // "jagged" (torch.nested's NestedTensor subclass).
  std::string layout = "strided";
  std::optional<bool> coalesced;  // sparse_coo: as saved (nullopt: the old 3-field form)
  int64_t ragged_dim = 0;         // jagged
  // In torch.save's order: ("indices", "values"); ("crow_indices" | "ccol_indices",
  // "col_indices" | "row_indices", "values"); ("buffer", "sizes", "strides",
  // "storage_offsets"); ("values", "offsets"[, "lengths"]); DTensor: ("mesh").
  std::vector<std::pair<std::string, std::shared_ptr<const tensor_record>>> components;

  std::string subclass;                      // "torch.distributed.tensor.DTensor"
  std::vector<int64_t> global_shape;         // DTensor: the whole tensor's size
  std::vector<int64_t> mesh_shape;           // DTensor: the device mesh (empty: not saved)
  std::vector<std::string> mesh_dim_names;   // DTensor: may be empty
  std::vector<std::string> placements;       // DTensor: "Shard(dim=0)", "Replicate()", ...

  bool sparse() const { return layout.compare(0, 7, "sparse_") == 0; }
  bool nested() const { return layout == "nested" || layout == "jagged"; }
  /// "sparse COO", "sparse CSR", ..., "nested", "jagged nested": for messages.
  std::string description() const;
};

/// A second path to a tensor object that already has a record (the pickle shared it).
struct tensor_alias {
  value_path path;
  size_t tensor;                       // index into checkpoint::tensors
};

/// A non-tensor entry worth showing: top-level values, the values of a state dict below
/// the root that are not tensors (a module's _extra_state), Lightning's hyper-parameters.
struct entry_summary {
  value_path path;
  std::string type;                    // "int", "str", "dict", "list", "object", ...
  std::string value;                   // short Python-like rendering
  /// The decoded value in the checkpoint's own pickle, for a caller that compares values
  /// (diff); valid until release_pickle. Null for a value decoded from a pickle of its own
  /// (a DCP BYTE_IO item, Lightning's meta.pt): open_options::entry_value_seen shows those.
  const pickle::value* node = nullptr;
  /// A DCP BYTE_IO item's own pickle holding tensors (a planner with flatten_state_dict=False
  /// saves whole nested dicts so): how many, which no key gives and no load reads.
  size_t tensors_inside = 0;
};

/// A tensor inside a value that open_options::entry_value_seen shows: its rebuild call in
/// that value, its dtype and shape, and (open_options::keep_entry_tensors) its record.
struct entry_tensor {
  const pickle::value* node = nullptr;
  dtype type = dtype::float32;
  std::vector<int64_t> shape;
  std::optional<size_t> record;  // index into checkpoint::tensors
};

struct open_options {
  pickle::limits pickle_limits;
  zip::open_options zip_limits;
  safetensors::limits safetensors_limits;
  /// Most tensors a checkpoint may hold, in every format (tensor records: every rebuild
  /// call of a torch pickle, TorchScript constants included; every safetensors entry).
  /// Per-tensor metadata costs memory and time, so this bounds both. open_checkpoint uses
  /// it in place of safetensors_limits.max_tensors.
  uint64_t max_tensors = 1'000'000;
  /// torch.export archives: the largest JSON record (a program, a payload config) parsed.
  /// A program of a large model is tens of MB; parsing costs about ten times its size.
  uint64_t max_json_bytes = 512ull << 20;
  /// Verify the CRC-32 of every zip record (reads all the data).
  bool verify_crc = false;
  /// torch.export archives: read each program's graph nodes and the metadata of its values
  /// (inspect, verify). False checks them as JSON only, leaves pt2::program::nodes empty and
  /// the signature's values without metadata (graph_read false): loading the weights needs
  /// the signature's names alone, and those two are most of a program's JSON.
  bool read_pt2_graph = true;
  /// torch.distributed.checkpoint directories: open every chunk's embedded torch.save
  /// archive, check it against `.metadata`, and point storages at the chunk's raw data.
  /// False reads `.metadata` alone (inspect): storages then carry the archive's byte range
  /// with storage_record::archive_range set, and tensor strides are the contiguous ones.
  bool read_chunk_archives = true;
  /// With read_chunk_archives: which chunks' archives to open, asked with the key, its
  /// global shape and the chunk's box (offsets, sizes). A chunk it declines is left as
  /// read_chunk_archives = false leaves every chunk: an archive range that no reader takes
  /// as data (read_plan and load_tensors refuse it), its archive neither read nor checked.
  /// Unset: every chunk. A tensor-parallel rank opens only the chunks its slices meet
  /// (ckpt::chunks_met_by, ckpt/slice.h): every rank reading the ends of every chunk's
  /// archive does not scale to checkpoints of hundreds of ranks.
  std::function<bool(const std::string& key, const dim_list& shape, const dim_list& offsets, const dim_list& sizes)>
      open_chunk;
  /// Called during open with each entry whose value is decoded from a pickle of its own
  /// (a DCP BYTE_IO item, each entry of Lightning's meta.pt): its path as in
  /// checkpoint::entries and the value, valid during the call only. Those pickles are
  /// dropped as soon as read (a document's blocks cost ~200 KB however small its value);
  /// diff walks each value here instead. `tensors` are the tensors inside the value (their
  /// rebuild calls in it), with their records when keep_entry_tensors is set.
  std::function<void(const value_path&, const pickle::value&, const std::vector<entry_tensor>& tensors)>
      entry_value_seen;
  /// Keep the tensors inside those values as records of the checkpoint (never as keys:
  /// their path is the entry's, then theirs in its value), storages and all, so that their
  /// values can be read (diff). Without it they are counted in the entry's summary only.
  bool keep_entry_tensors = false;
  /// What the caller will do with the checkpoint, so open_checkpoint builds nothing it will
  /// not use. Every tensor is read and checked the same way whatever the purpose: the same
  /// files open and the same ones are refused, with the same messages.
  enum class purpose {
    /// Everything below: tensors with their paths, aliases, storages, keys, entries.
    read,
    /// Rewriting the torch pickle while copying every data record verbatim (rekey), which
    /// reads the tree and the tensor records' `node`s and nothing else of the model. For a
    /// torch pickle, `aliases`, `keys` and `entries` stay empty and tensor records carry no
    /// `path`; in a zip archive (torch-zip, TorchScript) `storages` stay empty too, and a
    /// record's `storage` is the index its storage would have had (it still tells data from
    /// meta, but no record is behind it). For a million tensors that is ~300 MB less at
    /// open's peak. Multi-file layouts and safetensors are read as for `read`.
    rewrite_pickle,
  };
  purpose intent = purpose::read;
};

/// One file of a checkpoint, with the parsed structures its bytes hold. A checkpoint of one
/// file has one; a sharded or DCP checkpoint will have one per shard or chunk file.
struct source_file {
  std::string path;                                // as opened
  file_format format = file_format::torch_zip;
  uint64_t size = 0;
  std::unique_ptr<byte_source> source;
  std::unique_ptr<zip::archive> zip;               // torch-zip, torchscript
  std::unique_ptr<pickle::document> pickle;        // torch-zip, torchscript, torch-legacy
  std::vector<std::unique_ptr<pickle::document>> extra_pickles;  // TorchScript constants.pkl
  std::optional<safetensors::header> st_header;    // safetensors
  size_t tensors = 0;                              // tensor records read from this file
  /// An archive embedded in another file of the set (a DCP chunk inside a `.distcp`): that
  /// file's index in checkpoint::files and the archive's first byte in it (`size` is the
  /// archive's length; its bytes are not counted twice in file_size()). nullopt for a file.
  std::optional<uint32_t> within;
  uint64_t offset_within = 0;
};

/// How a checkpoint's files make one state dict (formats.md §1.1).
enum class checkpoint_layout {
  single_file,   // one file
  hf_shard_set,  // a Hugging Face index and the shards it names (formats.md §10)
  dcp,           // a torch.distributed.checkpoint directory (formats.md §9)
};
/// "file", "hf-shard-set", "dcp": the names inspect's JSON and text use.
const char* layout_name(checkpoint_layout l);

struct checkpoint {
  std::string path;
  file_format format = file_format::torch_zip;     // every file's
  checkpoint_layout layout = checkpoint_layout::single_file;
  /// The file that says what the set holds: the shard index, or the DCP `.metadata` (as
  /// messages name it); empty for a single file.
  std::string index_path;
  /// What wrote it, where the files say: a DCP `.metadata` version ("1.0.0"), ...
  std::string writer;
  /// What a loader tolerates but a reader should be told (an index's cross-check warnings,
  /// say), one line each, in the order found. Errors are thrown, never listed here.
  std::vector<std::string> warnings;
  /// The files, in the order storage_record::file numbers them; never empty once opened.
  /// A shard set's are its shards, in the order the loaders open them (sorted names).
  std::vector<source_file> files;
  /// Bytes read from files that hold no storage (a shard set's index, a DCP `.metadata`):
  /// part of bytes_read().
  uint64_t index_bytes_read = 0;

  std::vector<storage_record> storages;
  std::vector<tensor_record> tensors;
  std::vector<tensor_alias> aliases;
  std::vector<entry_summary> entries;
  /// The state dict's keys, in its order, each with the tensor record(s) holding it: a
  /// dict's string keys whose values are tensors (a tied tensor under each of its keys), a
  /// pickled module's state_dict() keys, every safetensors tensor. Empty when no state dict
  /// is found, and for TorchScript (whose parameters and buffers only LibTorch can name).
  key_table keys;

  /// Where the model's state dict is: {} for the root, {"state_dict"} in a Lightning
  /// checkpoint, ...; nullopt when nothing looks like one.
  std::optional<value_path> state_dict;
  const pickle::value* state_dict_node = nullptr;
  bool lightning = false;
  /// A pickled nn.Module (torch.save(model)) at `state_dict`: its class ("__main__.Net");
  /// `keys` are then the keys its state_dict() gives, found through _modules, _parameters
  /// and _buffers (state_dict_node is then the module's object node, not a dict).
  std::string module_class;
  /// Set (with module_class, and no state_dict) when the file cannot say what the pickled
  /// module's state_dict() gives: why ("module 'q' is a torch.ao...Linear, which ...").
  std::string module_unread;

  std::vector<std::string> globals;         // every global the pickle names, sorted, unique
  std::vector<std::string> unsafe_globals;  // those torch.load(weights_only=True) refuses
  // torch.save archives: records that torch.save never writes (security.md Z10). torch.load
  // ignores them; a scanner should see them.
  std::vector<std::string> unknown_records;
  std::string byteorder = "little";
  /// torch.save archives: the `.storage_alignment` record, read once, as torch.load reads
  /// it (Python's int()); 64, torch's default, when there is none; 0 when it is a number
  /// torch.load accepts but that is not positive or not below 2^63.
  uint64_t storage_alignment = 64;
  /// torch.export archives (format pt2): versions, programs, what is listed but not read
  /// (ckpt/pt2.h). Null for every other format.
  std::shared_ptr<const pt2::archive_info> pt2;

  /// Bytes of all files (an embedded archive's are its container's).
  uint64_t file_size() const;
  /// The only file, for operations that read or rewrite one file as a whole (rekey's
  /// writers, TorchScript through LibTorch, CRC checks of one archive). Throws
  /// errc::unsupported naming `operation` when the checkpoint has several.
  source_file& single_file(std::string_view operation);
  const source_file& single_file(std::string_view operation) const;
  /// Bytes read from every file so far (inspect's io.bytes_read).
  uint64_t bytes_read() const;
};

/// Frees c's decoded pickles: every file's pickle becomes null, extra_pickles empty, and
/// every pointer into them is cleared (state_dict_node, tensor_record::node, a quantizer's
/// channel tensors' nodes). Tensors (paths included), aliases, storages, records, entries
/// and keys stay. For callers that have taken what they need from the tree: for a million
/// tensors the tree is most of a checkpoint's memory.
void release_pickle(checkpoint& c);

/// Throws errc::unsafe when a TorchScript archive's data.pkl names globals outside
/// TorchScript's vocabulary and the weights_only allowlist: run before handing an archive
/// to LibTorch, whose unpickler would otherwise be the one to judge them.
void refuse_unsafe_torchscript(const zip::archive& ar, const pickle::limits& limits = {});

class file_opener;

/// The one file a checkpoint path names, decided from names before any byte is read:
/// `path` itself, or, for a directory, the model.safetensors or pytorch_model.bin it holds
/// alone, or the one Hugging Face shard index it holds (a shard set is named by its index);
/// a torch.distributed.checkpoint directory is returned as it is (open_checkpoint reads it
/// as a set). Throws errc::usage for a directory that holds no checkpoint or several.
std::string resolve_checkpoint_path(const std::string& path);

/// Every file that opening `path` reads, as messages name them: the one file, a shard
/// set's index and the shards it names that exist (a missing one is open_checkpoint's to
/// report), or a DCP directory's `.metadata`, `*.distcp` files and Lightning's meta.pt. Reads the index, no shard. For a command's output_set, which must know every
/// input (a shard is no more an output than the index is) before anything is written.
std::vector<std::string> checkpoint_input_files(const std::string& path);

/// Opens `path` (resolve_checkpoint_path first), detects its format by content, and reads
/// its metadata: never the tensor data (unless verify_crc). A shard index opens the whole
/// set as one checkpoint (formats.md §10.6). Throws ckpt::error naming the file and byte
/// offset.
checkpoint open_checkpoint(const std::string& path, const open_options& options = {});
/// The same for `path` below `fs`'s root ("" is the root): multi-file layouts in tests.
checkpoint open_checkpoint(const std::string& path, const open_options& options, const file_opener& fs);
/// The same over any byte source (tests, fuzzers). `src` is owned by the result.
checkpoint open_checkpoint(std::unique_ptr<byte_source> src, const open_options& options = {});

/// True for the globals PyTorch's weights_only unpickler accepts (torch/_weights_only_unpickler.py).
bool is_weights_only_safe_global(std::string_view module, std::string_view name);

}  // namespace ckpt
